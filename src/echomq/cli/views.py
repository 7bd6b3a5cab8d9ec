"""Seeing a queue: ``stats``, ``workers``, ``browse``, ``job``, ``events``, ``top``...

Seeing a queue: ``stats``, ``workers``, ``browse``, ``job``, ``check``, ``events``,
``repeats`` and ``top``."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import functools
import json
import sys
import time
from typing import Any

import click

from echomq import ids, keyspace
from echomq.cli._common import (
    _checked_queues,
    _errors,
    _existing,
    _fail,
    _queue,
    _run,
    _shown,
    _url,
    aliases_help,
    canonical,
    main,
    state_choice,
)
from echomq.client import connect as _connect
from echomq.client import executor as _executor
from echomq.client import native as _native
from echomq.errors import (
    EchoMQError,
)
from echomq.ops import console as _console
from echomq.ops import sharded as _sharded
from echomq.ops import snapshots as _inspect
from echomq.protocol import calls as _p
from echomq.protocol import kernel as _k
from echomq.protocol import registry as _registry

_STATS = ("pending", "active", "schedule", "dead", "completed", "failed")
_BROWSE_STATES = ("pending", "active", "scheduled", "schedule", "dead", "completed")


def _stats_rows(url: str, names: list[str]) -> tuple[str, list[tuple[str, list[str]]]]:
    """The executor serving the queues (``lua`` or ``native``, as a Queue on ``url`` would
    pick it), and per queue: its name and its cells (the counts, lanes, paused), from one
    snapshot."""
    client = _executor.sync_client(url)
    try:
        # An operator view fails fast: no retries (retry_for=0), one pipeline for all.
        x = _executor.SyncExecutor(
            client, retry_for=0, executor=_native.resolve_executor(None, url)
        )
        # ... but rides out a failover (a few seconds: the slot map re-read, the reads
        # asked again) rather than print a dead primary's error.
        views = _inspect.riding_out(
            x,
            # A sharded queue: one row of its sums (echomq.ops.sharded).
            lambda: _sharded.snapshot(x, names or _inspect.discover(client), minutes=0),
            _connect.DEFAULT_RETRY_FOR,
            fail_fast=True,
        )
        fleet = x.pipeline([_registry.list_workers(_p.Keys(v.name)) for v in views])
        if x.executor is None:
            # Nothing ran (no queue): decide it as a call would, with MODULE LIST only (a
            # fence would write {emq}:version on a server echomq never used).
            x.select_executor()
    finally:
        client.close()
    return x.executor or "lua", [
        (
            v.name,
            [f"{v.counts.get(k, 0):,}" for k in _STATS]
            + [str(sum(1 for lane in v.lanes if lane.depth))]
            + [str(len(w)) if isinstance(w, list) else "?"]
            + [str(v.limit) if v.limit else ""]
            + ["yes" if v.paused else ""],
        )
        for v, w in zip(views, fleet, strict=True)
    ]


def _stats_view(url: str, names: list[str], width: int) -> Any:
    """A table when it fits ``width`` columns; else one block per queue, the whole name on
    its own line (folded only past ``width``) and its fields below, so nothing is cut."""
    from rich.console import Group
    from rich.measure import Measurement
    from rich.table import Table
    from rich.text import Text

    executor, rows = _stats_rows(url, names)
    title = f"echomq @ {_shown(url)} (executor: {executor})"
    table = Table(title=title, title_justify="left")
    for col in ("queue", *_STATS, "lanes", "workers", "limit", "paused"):
        table.add_column(col, justify="left" if col == "queue" else "right", no_wrap=True)
    for name, cells in rows:
        table.add_row(name, *cells)
    from rich.console import Console

    probe = Console(width=10_000)
    if Measurement.get(probe, probe.options, table).maximum <= width:
        return table
    lines: list[str] = [title]
    for name, cells in rows:
        lines.append("")
        lines += [name[i : i + width] for i in range(0, len(name), width)]
        shown = (*_STATS, "lanes", "workers", "limit")
        fields = [f"{k} {v}" for k, v in zip(shown, cells, strict=False) if v]
        if cells[-1]:
            fields.append("paused")
        line = ""
        for field in fields:
            if line and len(line) + 2 + len(field) > width:
                lines.append(line)
                line = ""
            line += "  " + field
        lines.append(line)
    return Group(*(Text(line, no_wrap=True, overflow="fold") for line in lines))


@main.command()
@click.argument("queues", nargs=-1)
@click.option("--watch", is_flag=True, help="Refresh live until Ctrl-C.")
@click.option(
    "--interval", default=1.0, show_default=True, help="Refresh interval in seconds (--watch)."
)
@click.pass_context
def stats(ctx: click.Context, queues: tuple[str, ...], watch: bool, interval: float) -> None:
    """Counts per state for QUEUES (default: every queue found on the server)."""
    from rich.console import Console
    from rich.live import Live

    url = _url(ctx)
    console = Console()
    for name in queues:
        try:
            keyspace.check_queue(name)
        except EchoMQError as exc:
            _fail(str(exc))
    for name in queues:  # a typo is said, not shown as a row of zeros
        _existing(ctx, name)
    with _errors(url):
        if not watch:
            console.print(_stats_view(url, list(queues), console.width))
            return
        first = _stats_view(url, list(queues), console.width)
        with (
            Live(first, console=console, refresh_per_second=4) as live,
            contextlib.suppress(KeyboardInterrupt),
        ):
            while True:
                time.sleep(interval)
                live.update(_stats_view(url, list(queues), console.width))


@main.command()
@click.argument("queues", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="One JSON array of the workers.")
@click.pass_context
def workers(ctx: click.Context, queues: tuple[str, ...], as_json: bool) -> None:
    """The live worker processes of QUEUES (default: every queue found on the server): one
    line each (its echomq version, the data layouts it serves, its executor), then the jobs
    it holds; a warning line when the fleet spans more releases than an upgrade may."""
    url = _url(ctx)
    _checked_queues(queues)
    with _errors(url):
        client = _executor.sync_client(url)
        try:
            x = _executor.SyncExecutor(
                client, retry_for=0, executor=_native.resolve_executor(None, url)
            )
            names = list(queues) or _inspect.discover(client)
            found = x.pipeline([_registry.list_workers(_p.Keys(n)) for n in names])
        finally:
            client.close()
    seen: dict[str, _registry.WorkerInfo] = {}
    for result in found:
        if isinstance(result, BaseException):
            raise result
        for w in result:
            seen.setdefault(w.id, w)
    listed = sorted(seen.values(), key=lambda w: (w.host, w.supervisor or "", w.started_ms))
    spread = _registry.version_spread(listed)
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(w) for w in listed], indent=2))
        if spread:
            click.echo(spread, err=True)
        return
    if not seen:
        click.echo("no live workers" + (f" on {', '.join(queues)}" if queues else ""))
        return
    for w in listed:
        up = max(0.0, w.last_beat_ms / 1000 - w.started_ms / 1000)
        sup = f" supervisor={w.supervisor}" if w.supervisor else ""
        pool = f" pool={w.pool}" if w.pool else ""
        click.echo(
            f"{w.id} version={w.version} layout={w.layouts} {w.executor} {w.host} pid={w.pid}"
            f"{sup} queues={','.join(w.queues)} c={w.concurrency}{pool} up={up:.0f}s "
            f"held={w.held}"
        )
        for j in w.jobs:
            click.echo(f"  {j.id} {j.task} for {max(0, w.last_beat_ms - j.since_ms) / 1000:.1f}s")
        if w.held > len(w.jobs):
            click.echo(f"  ... and {w.held - len(w.jobs)} more")
    if spread:
        click.echo(spread)


@main.command()
@click.argument("queue")
@click.option(
    "--state",
    default="pending",
    show_default=True,
    # "scheduled" is the state's name; "schedule" (its set's key) stays as an alias.
    type=state_choice(_BROWSE_STATES),
    callback=canonical,
    help="The state to list." + aliases_help(_BROWSE_STATES),
)
@click.option("-n", "count", default=20, show_default=True)
@click.option("--group", help="Browse one lane (pending only).")
@click.option("--ids", "ids_only", is_flag=True, help="Print the ids only, one a line.")
@click.pass_context
def browse(
    ctx: click.Context, queue: str, state: str, count: int, group: str | None, ids_only: bool
) -> None:
    """List the jobs in a state (pending, active, scheduled, dead, completed: the rows a
    queue keeps with keep_completed), newest first: id, task, arguments, attempts, priority,
    last error, age, and the run-at (scheduled), the finish time (completed) or the worker
    holding it (active), the columns of the dashboard's lists. A sharded queue's shards are
    merged: by time where the state has one, else taking turns, ``-n`` in all."""
    q = _existing(ctx, queue)
    # The CLI keeps "schedule" as a plain alias; Queue.browse warns on it (a deprecation).
    state = "scheduled" if state == "schedule" else state
    n = _run(ctx, lambda: _k._int("count", count, 1, 1000))

    def read() -> tuple[int, list[_console.JobRow]]:
        x = q._x
        (shards,) = _sharded.layouts(x, [q.name]).values()
        parts = []
        for name in shards:
            k = _p.Keys(name)
            page = _inspect.page(x, k, state, 0, n, group)
            parts.append(_console.rows(x, k, page.items, page.state))
        now_ms = int(x.run(_k._cmd(("TIME",), lambda r: int(r[0]) * 1000 + int(r[1]) // 1000)))
        return now_ms, _sharded.merged_rows(parts, n)

    now_ms, rows = _run(ctx, read)
    if ids_only:
        for row in rows:
            click.echo(row.id)
        return
    for line in _console.table(rows, "schedule" if state == "scheduled" else state, now_ms):
        click.echo(line)


def _show_value(value: str | bytes) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return repr(value)
    return value


def _enqueued(job_id: str) -> str:
    """When the job was enqueued: the time its id was minted (ids embed it), UTC, and how
    long ago by this machine's clock."""
    try:
        ms = ids.decode_time_ms(job_id)
    except ValueError:
        return "unknown"
    when = _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc)
    ago = max(0, int(time.time() - ms / 1000))
    span = (
        f"{ago // 86400}d {ago % 86400 // 3600}h"
        if ago >= 86400
        else (f"{ago // 3600}h {ago % 3600 // 60}m" if ago >= 3600 else f"{ago // 60}m {ago % 60}s")
    )
    return f"{when.isoformat(timespec='milliseconds').replace('+00:00', 'Z')} ({span} ago)"


def _errors_of(view: Any, row: dict[str, str | bytes]) -> list[str]:
    """The errors of the job's failed attempts, oldest first (the server keeps the last 10
    beside the row, ``attempt N: text``; a reprocessed job counts its attempts afresh)."""
    return [_show_value(e) for e in view.errors]


def _attempts_line(row: dict[str, str | bytes]) -> str:
    """The attempts the ceiling counts (``attempts - floor``, as ``Job.attempt`` does), then
    how many claims the row saw when some are not counted (shutdown hand-backs, RateLimit
    push-backs, an earlier incarnation's)."""
    attempts = _show_value(row.get("attempts", "0"))
    floor = _show_value(row.get("floor", "0"))
    most = row.get("max_attempts")
    try:
        counted, claims = str(int(attempts) - int(floor)), int(attempts)
    except ValueError:  # a malformed row: shown as stored
        counted, claims = attempts, 0
    line = f"attempts: {counted}" + (f" of {_show_value(most)}" if most else "")
    if claims and floor not in ("", "0"):
        line += f" (claimed {claims} times; {floor} not counted: hand-backs, push-backs, reruns)"
    return line


@main.command()
@click.argument("queue")
@click.argument("job_id")
@click.pass_context
def job(ctx: click.Context, queue: str, job_id: str) -> None:
    """Show one job: where it is, when it was enqueued, its attempts and their errors, its
    row (``dedup``: the dedup id it holds, ``cancel``: a cancel is pending), its logs, and
    its kept result once it finished."""
    q = _queue(ctx, queue)

    def show() -> int:
        view = _inspect.job_view(q._x, q._k, job_id)
        state, row = view.place, view.row
        click.echo(f"id: {job_id}\nplace: {state}")
        if row is not None:
            click.echo(f"enqueued: {_enqueued(job_id)}")
            click.echo(_attempts_line(row))
            errors = _errors_of(view, row)
            if errors:
                click.echo("errors:")
                for text in errors:
                    click.echo(f"  {text}")
        kept = q.result(job_id)
        if kept is not None:
            # D17: the outcome outlives the row for its TTL.
            outcome = f"error: {kept.error}" if kept.error is not None else "result: "
            if kept.error is None:
                outcome += _show_value(kept.value)
            click.echo(f"kept {outcome}\nfinished_ms: {kept.finished_ms}")
        if row is None:
            return 0 if kept is not None else 1
        for field, value in sorted(row.items()):
            if field not in ("attempts", "max_attempts", "errors", "floor"):  # shown above
                click.echo(f"{field}: {_show_value(value)}")
        lines = view.logs
        if lines:
            click.echo("logs:")
            for line in lines:
                click.echo(f"  {_show_value(line)}")
        return 0

    sys.exit(_run(ctx, show))


@main.command()
@click.argument("queues", nargs=-1, required=True)
@click.pass_context
def check(ctx: click.Context, queues: tuple[str, ...]) -> None:
    """Run the consistency checker; exits 1 when any violation is found. A sharded queue is
    checked shard by shard, a violation prefixed with its shard's name."""
    bad = 0
    for name in queues:
        q = _existing(ctx, name)
        violations = _run(ctx, functools.partial(_sharded.check, q._x, q.name))
        for line in violations:
            click.echo(f"{name}: {line}")
        bad += len(violations)
        if not violations:
            click.echo(f"{name}: ok")
    sys.exit(1 if bad else 0)


@main.command()
@click.argument("queue")
@click.option("--follow", "-f", is_flag=True, help="Keep waiting for new events.")
@click.option(
    "--after", default="0", show_default=True, help="Start after this stream id ($: new only)."
)
@click.option("-n", "count", default=100, show_default=True, help="Events per read.")
@click.option("--enable", is_flag=True, help="Turn QUEUE's events on (kept: --maxlen).")
@click.option("--disable", is_flag=True, help="Turn QUEUE's events off.")
@click.option("--maxlen", default=10_000, show_default=True, help="Events kept (--enable), about.")
@click.pass_context
def events(
    ctx: click.Context,
    queue: str,
    follow: bool,
    after: str,
    count: int,
    enable: bool,
    disable: bool,
    maxlen: int,
) -> None:
    """Print QUEUE's lifecycle events; --enable turns them on (they are off by default)."""
    if enable and disable:
        _fail("--enable or --disable, not both")
    q = _queue(ctx, queue)
    if enable:
        # Turning events on before the first job is the point (a queue with no job yet has
        # no keys): not refused, but said, since a typo would make a queue nobody uses.
        fresh = not _run(ctx, lambda: _inspect.queue_exists(q.client, q.name))
        _run(ctx, lambda: q.enable_events(maxlen))
        click.echo(f"events on for {queue}")
        if fresh:
            note = f"note: {queue} has no job yet; its events are kept from its first"
            click.echo(note, err=True)
        return
    _existing(ctx, queue, q=q)
    if disable:
        _run(ctx, q.disable_events)
        click.echo(f"events off for {queue}")
        return
    meta = _p.Keys(queue).meta
    bound = _run(ctx, lambda: q._x.run(_k._cmd(("HGET", meta, "events"), lambda r: r)))
    if not bound:
        # Said on stderr: stdout stays the (empty) list a script reads.
        click.echo(
            f"events are off for {queue}: `echomq events {queue} --enable` turns them on",
            err=True,
        )

    def show() -> None:
        last = after
        while True:
            batch = q.events(after=last, count=count, block_ms=5_000 if follow else None)
            for e in batch:
                extras = " ".join(f"{k}={v}" for k, v in sorted(e.fields.items()))
                click.echo(
                    f"{e.stream_id} {e.event} {e.id or '-'}" + (f" {extras}" if extras else "")
                )
                last = e.stream_id
            if not follow and len(batch) < count:
                return

    with contextlib.suppress(KeyboardInterrupt):
        _run(ctx, show)


@main.command()
@click.argument("queue")
@click.pass_context
def repeats(ctx: click.Context, queue: str) -> None:
    """List QUEUE's repeatable jobs, soonest first: name, next fire (UTC, "paused" for a
    paused one, "ended" for a spent one), schedule, its limits with the fires counted, and
    its last fire (UTC)."""
    import datetime as _dt

    q = _queue(ctx, queue)
    for rep in _run(ctx, q.repeats):
        if rep.paused:  # issue 26: it fires no more until resume-repeat
            at = "paused"
        elif rep.next_ms is None:  # spent: its limit reached or its end passed (issue 24)
            at = "ended"
        else:
            when = _dt.datetime.fromtimestamp(rep.next_ms / 1000, _dt.timezone.utc)
            at = when.isoformat(timespec="milliseconds")
        sched = f"every {rep.every_ms} ms" if rep.every_ms else f"cron '{rep.cron}' {rep.tz}"
        shown: list[tuple[str, object]] = [("group", rep.group), ("owner", rep.owner)]
        if rep.limit is not None or rep.until_ms is not None:
            shown += [("limit", rep.limit), ("until_ms", rep.until_ms), ("fired", rep.fired)]
        if rep.last_ms is not None:
            last = _dt.datetime.fromtimestamp(rep.last_ms / 1000, _dt.timezone.utc)
            shown.append(("last", last.isoformat(timespec="milliseconds")))
        extra = "".join(f" {k}={v}" for k, v in shown if v is not None and v != "")
        click.echo(f"{rep.name} {at} {sched}{extra}")


@main.command()
@click.argument("queues", nargs=-1)
@click.option("--interval", default=1.0, show_default=True, help="Refresh interval in seconds.")
@click.pass_context
def top(ctx: click.Context, queues: tuple[str, ...], interval: float) -> None:
    """A live view of QUEUES (default: all): sets, rates, lanes, lease health."""
    from echomq.top import run_top

    url = _url(ctx)
    with _errors(url):
        run_top(url, queues, interval)
