"""Operating a queue: cancel, retry, remove, lanes, limits, pause.

Operating a queue: cancel, run now, reschedule, remove, lanes, reprocess, priorities,
limits, pause and resume, sweep, unrepeat."""

from __future__ import annotations

import sys
from typing import Any

import click

from echomq import keyspace
from echomq.cli._common import (
    _CREATE,
    _existing,
    _fail,
    _queue,
    _run,
    aliases_help,
    canonical,
    main,
    state_choice,
)
from echomq.client.shards import shard_of
from echomq.errors import (
    EchoMQError,
    JobGone,
    StateError,
)
from echomq.ops import sharded as _sharded
from echomq.ops import snapshots as _inspect
from echomq.protocol import calls as _p
from echomq.protocol import kernel as _k


@main.command()
@click.argument("queue")
@click.argument("job_id")
@click.pass_context
def cancel(ctx: click.Context, queue: str, job_id: str) -> None:
    """Cancel a job: a waiting or scheduled one is removed, a running one is stopped by its
    worker at the next heartbeat and dead-lettered "cancelled"."""
    q = _existing(ctx, queue)
    click.echo(_run(ctx, lambda: q.cancel(job_id)))


@main.command("run-now")
@click.argument("queue")
@click.argument("job_ids", nargs=-1, required=True)
@click.pass_context
def run_now(ctx: click.Context, queue: str, job_ids: tuple[str, ...]) -> None:
    """Make scheduled jobs waiting now; prints "ID: waiting", "ID: gone" or "ID: not
    scheduled" per id and exits 1 when any was not moved."""
    for job_id in job_ids:  # every id is checked before anything is moved
        try:
            keyspace.check_id(job_id)
        except EchoMQError as exc:
            _fail(str(exc))
    q = _existing(ctx, queue)

    def go() -> int:
        missed = 0
        for job_id in job_ids:
            try:
                q.run_now(job_id)
            except JobGone:
                missed += 1
                click.echo(f"{job_id}: gone")
                continue
            except StateError:
                missed += 1
                click.echo(f"{job_id}: not scheduled")
                continue
            click.echo(f"{job_id}: waiting")
        return missed

    sys.exit(1 if _run(ctx, go) else 0)


@main.command()
@click.argument("queue")
@click.argument("job_id")
@click.option("--delay-ms", type=int, help="Run it this many ms from now (server clock).")
@click.option("--at-ms", type=int, help="Run it at this unix ms (this machine's clock).")
@click.pass_context
def reschedule(
    ctx: click.Context, queue: str, job_id: str, delay_ms: int | None, at_ms: int | None
) -> None:
    """Change a scheduled job's run time; exits 1 when the job is gone or not scheduled."""
    q = _existing(ctx, queue)

    def go() -> str:
        try:
            q.reschedule(job_id, delay_ms, at_ms=at_ms)
        except JobGone:
            return "gone"
        except StateError:
            return "not scheduled"
        return "rescheduled"

    said = _run(ctx, go)
    click.echo(f"{job_id}: {said}")
    sys.exit(0 if said == "rescheduled" else 1)


@main.command("cancel-all")
@click.argument("queue")
@click.pass_context
def cancel_all(ctx: click.Context, queue: str) -> None:
    """Cancel every waiting and scheduled job of QUEUE (removed) and signal every running one
    (its worker stops it and dead-letters it "cancelled"); prints the two counts."""
    q = _existing(ctx, queue)
    got = _run(ctx, q.cancel_all)
    click.echo(f"removed {got['removed']}, signalled {got['signalled']}")


@main.command()
@click.argument("queue")
@click.argument("job_ids", nargs=-1, required=True)
@click.option(
    "--keep-children",
    is_flag=True,
    help="Remove a flow parent alone; by default its waiting descendants go with it.",
)
@click.pass_context
def remove(ctx: click.Context, queue: str, job_ids: tuple[str, ...], keep_children: bool) -> None:
    """Delete jobs wherever they are (a flow parent with its waiting descendants); prints
    "ID: removed" or "ID: gone" per id and exits 1 when any was gone."""
    for job_id in job_ids:  # every id is checked before anything is deleted
        try:
            keyspace.check_id(job_id)
        except EchoMQError as exc:
            _fail(str(exc))
    q = _existing(ctx, queue)

    def go() -> int:
        gone = 0
        for job_id in job_ids:
            try:
                q.remove(job_id, children=not keep_children)
            except JobGone:
                gone += 1
                click.echo(f"{job_id}: gone")
                continue
            click.echo(f"{job_id}: removed")
        return gone

    sys.exit(1 if _run(ctx, go) else 0)


@main.command()
@click.argument("queue")
@click.argument("lane", required=False)
@click.option("--weight", type=int, help="Set LANE's share (default 1).")
@click.option("--limit", type=int, help="Set LANE's cap on jobs in flight (>= 1).")
@click.option("--no-limit", is_flag=True, help="Remove LANE's cap.")
@click.option("--pause/--resume", "pause_it", default=None, help="Pause or resume LANE.")
@_CREATE
@click.pass_context
def lanes(
    ctx: click.Context,
    queue: str,
    lane: str | None,
    weight: int | None,
    limit: int | None,
    no_limit: bool,
    pause_it: bool | None,
    create: bool,
) -> None:
    """List QUEUE's lanes (depth, active, limit, weight, paused), or set LANE's weight,
    limit and pause; exit 1 when QUEUE does not exist (--create: set it anyway)."""
    setting = weight is not None or limit is not None or no_limit or pause_it is not None
    if setting and lane is None:
        _fail("name the LANE to set")
    if limit is not None and no_limit:
        _fail("--limit and --no-limit exclude each other")
    if limit is not None and limit < 1:
        _fail(f"--limit must be >= 1 (--no-limit removes the cap), got {limit}")
    if weight is not None and not 1 <= weight <= 1_000_000:
        _fail(f"--weight must be in [1, 1000000], got {weight}")
    q = _queue(ctx, queue)

    # Every change is built (and so checked) before the first one is sent: bad input
    # writes nothing.
    def build(k: _k.Keys) -> list[Any]:
        changes: list[Any] = []
        if lane is not None:
            keyspace.check_lane(lane)
        if lane is not None and weight is not None:
            changes.append(_p.weight_lane(k, lane, weight))
        if lane is not None and (limit is not None or no_limit):
            changes.append(_p.limit_lane(k, lane, None if no_limit else limit))
        if lane is not None and pause_it is not None:
            changes.append((_p.pause_lane if pause_it else _p.resume_lane)(k, lane))
        return changes

    try:
        changes = build(q._k)
    except EchoMQError as exc:
        _fail(str(exc))
    _existing(ctx, queue, create=create and setting, verb="sets" if setting else "", q=q)

    def go() -> list[_inspect.LaneView]:
        (shards,) = _sharded.layouts(q._x, [q.name]).values()
        if changes and lane is not None and len(shards) > 1:  # the lane's shard (issue 43)
            changes[:] = build(_k.Keys(shards[shard_of(lane, len(shards))]))
        for change in changes:
            q._x.run(change)
        (view,) = _sharded.snapshot(q._x, [q.name], minutes=0)  # a sharded queue: all lanes
        return [v for v in view.lanes if lane is None or v.name == lane]

    rows = _run(ctx, go)
    if lane is not None and not rows:
        rows = [_inspect.LaneView(lane)]  # a lane nothing has touched: its defaults
    table = [("lane", "depth", "active", "limit", "weight", "paused")]
    for v in rows:
        cap = "-" if v.limit is None else str(v.limit)
        table.append((v.name, str(v.depth), str(v.active), cap, str(v.weight), _yes(v.paused)))
    if len(table) == 1:
        click.echo(f"{queue}: no lanes")
        return
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        cells = [row[0].ljust(widths[0])]
        cells += [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        click.echo("  ".join(cells).rstrip())


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


@main.command()
@click.argument("queue")
@click.argument("job_ids", nargs=-1)
@click.option("--all", "everything", is_flag=True, help="Reprocess every job of --state.")
@click.option(
    "--state",
    type=state_choice(("dead", "completed")),
    callback=canonical,
    default="dead",
    show_default=True,
    help="With --all: the dead jobs, or the kept completed ones." + aliases_help(("dead",)),
)
@click.option("--delay-ms", type=int, default=None, help="Run them after this delay.")
@click.pass_context
def reprocess(
    ctx: click.Context,
    queue: str,
    job_ids: tuple[str, ...],
    everything: bool,
    state: str,
    delay_ms: int | None,
) -> None:
    """Send dead (or kept completed) jobs back to pending (a grouped job back to its lane),
    or to the schedule with --delay-ms."""
    if not job_ids and not everything:
        _fail("name job ids or pass --all")
    q = _existing(ctx, queue)

    def go() -> int:
        if not everything:
            for job_id in job_ids:
                q.reprocess(job_id, delay_ms=delay_ms)
            return len(job_ids)
        # Each job once, counted only when this command moved it (Queue.reprocess_all).
        return q.reprocess_all(state, delay_ms=delay_ms)

    click.echo(f"reprocessed {_run(ctx, go)} job(s)")


@main.command("change-priority")
@click.argument("queue")
@click.argument("job_id")
@click.argument("priority", type=int)
@click.pass_context
def change_priority(ctx: click.Context, queue: str, job_id: str, priority: int) -> None:
    """Set a waiting or scheduled job's PRIORITY (0..2097152, lower runs first); prints
    "ID: priority P", "ID: gone" or "ID: not waiting or scheduled" and exits 1 unless set."""
    try:
        keyspace.check_id(job_id)
        _k._priority(priority)
    except EchoMQError as exc:
        _fail(str(exc))
    q = _existing(ctx, queue)

    def go() -> int:
        try:
            q.change_priority(job_id, priority)
        except JobGone:
            click.echo(f"{job_id}: gone")
            return 1
        except StateError:
            click.echo(f"{job_id}: not waiting or scheduled")
            return 1
        click.echo(f"{job_id}: priority {priority}")
        return 0

    sys.exit(_run(ctx, go))


@main.command("limit")
@click.argument("queue")
@click.argument("n")
@_CREATE
@click.pass_context
def limit(ctx: click.Context, queue: str, n: str, create: bool) -> None:
    """At most N jobs of QUEUE active at once across every worker, lanes included ("none"
    removes the limit); exit 1 when QUEUE does not exist."""
    value: int | None = None
    if n.lower() != "none":
        try:
            value = int(n)
            _k._int("n", value, 1)
        except (ValueError, EchoMQError):
            _fail(f"N must be a positive integer or 'none', got {n!r}")
    q = _existing(ctx, queue, create=create, verb="limits")
    _run(ctx, lambda: q.limit(value))
    click.echo(f"limited {queue} to {value}" if value else f"unlimited {queue}")


@main.command()
@click.argument("queue")
@click.option("--lane", help="Pause one lane instead of the whole queue.")
@_CREATE
@click.pass_context
def pause(ctx: click.Context, queue: str, lane: str | None, create: bool) -> None:
    """Stop claims of QUEUE (or of one lane); exit 1 when QUEUE does not exist."""
    q = _existing(ctx, queue, create=create, verb="pauses")
    _run(ctx, (lambda: q.pause_lane(lane)) if lane else q.pause)
    click.echo(f"paused {queue}" + (f" lane {lane}" if lane else ""))


@main.command()
@click.argument("queue")
@click.option("--lane", help="Resume one lane instead of the whole queue.")
@_CREATE
@click.pass_context
def resume(ctx: click.Context, queue: str, lane: str | None, create: bool) -> None:
    """Let claims of QUEUE (or of one lane) through again; exit 1 when QUEUE does not exist."""
    q = _existing(ctx, queue, create=create, verb="resumes")
    _run(ctx, (lambda: q.resume_lane(lane)) if lane else q.resume)
    click.echo(f"resumed {queue}" + (f" lane {lane}" if lane else ""))


@main.command()
@click.argument("queue")
@click.option(
    "--max-stalled",
    default=5,
    show_default=True,
    help="Stalls before a job is dead (0: reap only).",
)
@click.pass_context
def sweep(ctx: click.Context, queue: str, max_stalled: int) -> None:
    """Run the sweeps once: promote due jobs, recover lapsed leases."""
    q = _existing(ctx, queue)

    def go() -> tuple[int, int, int]:
        promoted = q.promote(10_000)
        if max_stalled > 0:
            recovered, dead = q.sweep_stalled(max_stalled=max_stalled, limit=10_000)
            return promoted, len(recovered), len(dead)
        return promoted, q.reap(10_000), 0

    promoted, recovered, dead = _run(ctx, go)
    click.echo(f"promoted {promoted}, recovered {recovered}, dead {dead}")


@main.command()
@click.argument("queue")
@click.argument("name")
@click.pass_context
def unrepeat(ctx: click.Context, queue: str, name: str) -> None:
    """Unregister the repeatable job NAME of QUEUE (exit 1 when it was not registered)."""
    q = _queue(ctx, queue)
    if not _run(ctx, lambda: q.unrepeat(name)):
        click.echo(f"{name}: not registered", err=True)
        sys.exit(1)
    click.echo(f"{name}: removed")


def _flip_repeat(ctx: click.Context, queue: str, name: str, pause: bool) -> None:
    q = _queue(ctx, queue)
    flip = q.pause_repeat if pause else q.resume_repeat
    if not _run(ctx, lambda: flip(name)):
        click.echo(f"{name}: not registered", err=True)
        sys.exit(1)
    click.echo(f"{name}: {'paused' if pause else 'resumed'}")


@main.command("pause-repeat")
@click.argument("queue")
@click.argument("name")
@click.pass_context
def pause_repeat(ctx: click.Context, queue: str, name: str) -> None:
    """Pause the repeatable job NAME of QUEUE: it fires no more until resume-repeat, and a
    worker start registering it again keeps it paused (exit 1 when it is not registered)."""
    _flip_repeat(ctx, queue, name, pause=True)


@main.command("resume-repeat")
@click.argument("queue")
@click.argument("name")
@click.pass_context
def resume_repeat(ctx: click.Context, queue: str, name: str) -> None:
    """Resume the paused repeatable job NAME of QUEUE: its next fire is computed from now
    (exit 1 when it is not registered)."""
    _flip_repeat(ctx, queue, name, pause=False)
