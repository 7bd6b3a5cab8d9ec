"""The ``echomq`` command line: run workers, operate queues, run a server, run the demo.

The server comes from ``--url``, else ``ECHOMQ_URL``, else an ``echomq server`` recorded in
``./.echomq/``. ``worker``, ``server`` and ``demo`` start a private embedded server when none
is configured; the operator commands default to ``redis://127.0.0.1:6379/0``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import click
import redis
import redis.exceptions

from echomq import _connect, _envelope, _executor, keyspace
from echomq.app import App
from echomq.errors import EchoMQError, JobGone, StateError
from echomq.queue import Queue
from echomq.serializers import JSON
from echomq.server import EmbeddedServer, NoServerBinary, state_dir

__all__ = ["main"]

F = TypeVar("F", bound=Callable[..., Any])


def _fail(message: str, code: int = 2) -> None:
    click.echo(f"echomq: {message}", err=True)
    sys.exit(code)


def _url(ctx: click.Context) -> str:
    """The server of an operator command (``echomq._connect.resolve_url``: ``--url``,
    ``ECHOMQ_URL``, a recorded ``echomq server``, the local default)."""
    return _connect.resolve_url(ctx.obj.get("url")).url


@contextlib.contextmanager
def _errors(url: str) -> Iterator[None]:
    """Turn the usual failures into one clear line and a non-zero exit."""
    try:
        yield
    except redis.exceptions.ConnectionError as exc:
        _fail(f"cannot reach the server at {url}: {exc}")
    except redis.exceptions.AuthenticationError as exc:
        _fail(f"the server at {url} refused the credentials: {exc}")
    except redis.exceptions.ResponseError as exc:
        _fail(f"the server at {url} answered an error: {exc}")
    except EchoMQError as exc:
        _fail(str(exc))


@contextlib.contextmanager
def _server_for(ctx: click.Context, *, purpose: str, app_url: str | None = None) -> Iterator[str]:
    """The configured server (``--url``, then ``app_url`` — the loaded ``App(url=...)`` —,
    ``ECHOMQ_URL``, a recorded ``echomq server``), or when none is, a private embedded one
    for the duration of the command."""
    found = _connect.configured(ctx.obj.get("url"), app_url)
    if found is not None:
        yield _connect.resolve_url(ctx.obj.get("url"), app_url).url  # logs the choice
        return
    directory = state_dir() / purpose
    try:
        server = EmbeddedServer(directory).start()
    except NoServerBinary as exc:
        _fail(str(exc))
        raise  # unreachable; keeps type checkers quiet
    click.echo(
        f"echomq: no server configured; started an embedded one at {server.url} "
        f"(data in {directory})",
        err=True,
    )
    # Recorded like `echomq server`'s, so producers (App()) and other commands run from this
    # directory find it while it lives; the record goes with it.
    record = _record_server(server) if purpose == "worker" else None
    try:
        yield server.url
    finally:
        server.stop()
        if record is not None:
            with contextlib.suppress(FileNotFoundError):
                record.unlink()


def _record_server(srv: EmbeddedServer) -> Path:
    record = state_dir() / "server.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    info = {"pid": srv.pid, "port": srv.port, "url": srv.url, "socket": str(srv.socket_path)}
    record.write_text(json.dumps(info))
    return record


def _queue(ctx: click.Context, name: str) -> Queue:
    url = _url(ctx)
    try:
        # An operator command fails fast with a clear line; it does not ride out outages.
        return Queue(name, url=url, retry_for=0)
    except EchoMQError as exc:
        _fail(str(exc))
        raise


def _run(ctx: click.Context, fn: Callable[[], Any]) -> Any:
    url = _url(ctx)
    with _errors(url):
        return fn()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--url", envvar="ECHOMQ_URL", help="Server URL (redis://, rediss://, unix://). Env: ECHOMQ_URL."
)
@click.version_option(package_name="echomq")
@click.pass_context
def main(ctx: click.Context, url: str | None) -> None:
    """echomq: a reliable job queue on Valkey/Redis."""
    ctx.ensure_object(dict)
    # Only a --url typed on the command line is "explicit": ECHOMQ_URL is found (and its
    # place in the order kept, after App(url=...)) by echomq._connect.resolve_url.
    source = ctx.get_parameter_source("url")
    ctx.obj["url"] = url if source is click.core.ParameterSource.COMMANDLINE else None


# --------------------------------------------------------------------------- worker


def _load_app(spec: str) -> App:
    module_name, _, attr = spec.partition(":")
    if not module_name:
        _fail(f"expected MODULE:APP, got {spec!r}")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        _fail(f"cannot import {module_name!r}: {exc}")
    obj = getattr(module, attr or "app", None)
    if not isinstance(obj, App):
        _fail(f"{spec!r} is not an echomq.App (found {type(obj).__name__})")
    assert isinstance(obj, App)
    return obj


@main.command()
@click.argument("app_spec", metavar="MODULE:APP")
@click.option(
    "-q",
    "--queue",
    "queues",
    multiple=True,
    help="Queue to serve (repeat); default: all of the app's.",
)
@click.option("-c", "--concurrency", default=10, show_default=True, help="Jobs in flight at once.")
@click.option("--beat-ms", default=1000, show_default=True, help="Sweep rhythm and idle wait.")
@click.option(
    "--grace",
    "grace_s",
    default=10.0,
    show_default=True,
    help="Seconds in-flight jobs get after SIGTERM.",
)
@click.option(
    "--max-stalled", default=5, show_default=True, help="Stalls before a job is dead (0: never)."
)
@click.option("--log-level", default="INFO", show_default=True)
@click.option(
    "--metrics-port",
    type=int,
    default=None,
    help="Serve Prometheus /metrics on this port (needs echomq[web]; default: off).",
)
@click.option("--metrics-host", default="0.0.0.0", show_default=True, help="Its address.")
@click.pass_context
def worker(
    ctx: click.Context,
    app_spec: str,
    queues: tuple[str, ...],
    concurrency: int,
    beat_ms: int,
    grace_s: float,
    max_stalled: int,
    log_level: str,
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Run the tasks of MODULE:APP (e.g. myproject.tasks:app)."""
    import logging

    from echomq.worker import Worker

    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s[%(process)d] %(message)s",
    )
    if metrics_port is not None:
        _needs_web("echomq worker --metrics-port")
    app = _load_app(app_spec)
    # The app's own App(url=...) counts before ECHOMQ_URL and before starting a server.
    with _server_for(ctx, purpose="worker", app_url=app._url) as url:
        app.url = url
        hooks = None
        if metrics_port is not None:
            # Off unless asked: without the flag the worker has no hook at all.
            from prometheus_client import start_http_server

            from echomq import prometheus

            hooks = prometheus.PrometheusHooks().hooks()
            served = list(queues) or app.queues() or None
            start_http_server(
                metrics_port,
                addr=metrics_host,
                registry=prometheus.registry_for(url, queues=served),
            )
            logging.getLogger("echomq.worker").info(
                "metrics on http://%s:%d/metrics", metrics_host, metrics_port
            )
        try:
            w = Worker(
                app,
                list(queues) or None,
                concurrency,
                beat_ms=beat_ms,
                grace_s=grace_s,
                max_stalled=max_stalled,
                hooks=hooks,
            )
        except EchoMQError as exc:
            _fail(str(exc))
            return
        with _errors(url):
            w.run()
    _exit_past_stuck_handlers()


def _exit_past_stuck_handlers() -> None:
    """Sync handlers still running after the grace period were handed back to pending, but a
    thread cannot be stopped and the interpreter waits for every pool thread at exit: the
    worker would linger until they return. Exit now, as SIGTERM with a grace promises."""
    import logging
    import threading

    busy = [t for t in threading.enumerate() if t.name.startswith("echomq-job")]
    deadline = time.monotonic() + 0.5  # idle pool threads end at once after the shutdown
    for t in busy:
        t.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in busy):
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


# --------------------------------------------------------------------------- producing


@main.command()
@click.argument("queue")
@click.argument("payload", required=False)
@click.option(
    "--task",
    "task_name",
    help="Enqueue a task call: a JSON task envelope built from --args/--kwargs "
    "(a worker reads it whatever its app's serializer).",
)
@click.option(
    "--args", "args_json", default="[]", help="JSON list of positional arguments (with --task)."
)
@click.option(
    "--kwargs", "kwargs_json", default="{}", help="JSON object of keyword arguments (with --task)."
)
@click.option("--id", "job_id", help="Job id (a branded JOB id) for idempotent enqueue.")
@click.option("--group", help="Lane (tenant) name.")
@click.option("--delay-ms", type=int, help="Run after this many ms (server clock).")
@click.pass_context
def enqueue(
    ctx: click.Context,
    queue: str,
    payload: str | None,
    task_name: str | None,
    args_json: str,
    kwargs_json: str,
    job_id: str | None,
    group: str | None,
    delay_ms: int | None,
) -> None:
    """Enqueue PAYLOAD (or stdin with "-") or a --task call into QUEUE; prints the job id."""
    if task_name:
        try:
            args, kwargs = json.loads(args_json), json.loads(kwargs_json)
        except json.JSONDecodeError as exc:
            _fail(f"--args/--kwargs must be JSON: {exc}")
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            _fail("--args is a JSON list and --kwargs a JSON object")
        # Always JSON: a worker whose app uses another serializer reads a JSON envelope too
        # (see echomq._envelope), so the CLI need not know the app.
        try:
            data: bytes = _envelope.build(JSON(), task_name, args, kwargs)
        except (TypeError, ValueError) as exc:  # e.g. an integer past 64 bits
            _fail(f"--args/--kwargs cannot be encoded: {exc}")
    elif payload is None or payload == "-":
        data = sys.stdin.buffer.read()
    else:
        data = payload.encode()
    q = _queue(ctx, queue)
    result = _run(ctx, lambda: q.enqueue(data, id=job_id, group=group, delay_ms=delay_ms))
    click.echo(f"{result.id} {result.status}")


# --------------------------------------------------------------------------- operating


def _discover_queues(client: Any) -> list[str]:
    found = (keyspace.queue_of(key) for key in client.scan_iter(match="emq:{*", count=1000))
    return sorted({name for name in found if name is not None})


def _stats_table(url: str, names: list[str]) -> Any:
    from rich.table import Table

    table = Table(title=f"echomq @ {url}", title_justify="left")
    for col in (
        "queue",
        "pending",
        "active",
        "schedule",
        "dead",
        "completed",
        "failed",
        "lanes",
        "paused",
    ):
        table.add_column(col, justify="left" if col == "queue" else "right")
    client = _executor.sync_client(url)
    try:
        for name in names or _discover_queues(client):
            q = Queue(name, client=client)
            c = q.counts()
            table.add_row(
                name,
                *(
                    f"{c[k]:,}"
                    for k in ("pending", "active", "schedule", "dead", "completed", "failed")
                ),
                str(len(q.lanes())),
                "yes" if q.is_paused() else "",
            )
    finally:
        client.close()
    return table


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
    with _errors(url):
        if not watch:
            console.print(_stats_table(url, list(queues)))
            return
        first = _stats_table(url, list(queues))
        with (
            Live(first, console=console, refresh_per_second=4) as live,
            contextlib.suppress(KeyboardInterrupt),
        ):
            while True:
                time.sleep(interval)
                live.update(_stats_table(url, list(queues)))


@main.command()
@click.argument("queue")
@click.option(
    "--state",
    default="pending",
    show_default=True,
    # "scheduled" is the state's name; "schedule" (its set's key) stays as an alias.
    type=click.Choice(["pending", "active", "scheduled", "schedule", "dead"]),
)
@click.option("-n", "count", default=20, show_default=True)
@click.option("--group", help="Browse one lane (pending only).")
@click.pass_context
def browse(ctx: click.Context, queue: str, state: str, count: int, group: str | None) -> None:
    """List job ids in a state (pending, active, scheduled, dead), newest first."""
    q = _queue(ctx, queue)
    for job_id in _run(ctx, lambda: q.browse(state, count, group=group)):
        click.echo(job_id)


def _show_value(value: str | bytes) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return repr(value)
    return value


@main.command()
@click.argument("queue")
@click.argument("job_id")
@click.pass_context
def job(ctx: click.Context, queue: str, job_id: str) -> None:
    """Show one job: where it is, its row (``dedup``: the dedup id it holds, ``cancel``: a
    cancel is pending), its logs, and its kept result once it finished."""
    q = _queue(ctx, queue)

    def show() -> int:
        state = q.job_state(job_id)
        row = q.get_job(job_id)
        click.echo(f"id: {job_id}\nplace: {state}")
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
            click.echo(f"{field}: {_show_value(value)}")
        lines = q.logs(job_id)
        if lines:
            click.echo("logs:")
            for line in lines:
                click.echo(f"  {_show_value(line)}")
        return 0

    sys.exit(_run(ctx, show))


@main.command()
@click.argument("queue")
@click.argument("job_id")
@click.pass_context
def cancel(ctx: click.Context, queue: str, job_id: str) -> None:
    """Cancel a job: a waiting or scheduled one is removed, a running one is stopped by its
    worker at the next heartbeat and dead-lettered "cancelled"."""
    q = _queue(ctx, queue)
    click.echo(_run(ctx, lambda: q.cancel(job_id)))


@main.command()
@click.argument("queue")
@click.argument("job_ids", nargs=-1)
@click.option("--all", "everything", is_flag=True, help="Reprocess every dead job of QUEUE.")
@click.pass_context
def reprocess(ctx: click.Context, queue: str, job_ids: tuple[str, ...], everything: bool) -> None:
    """Send dead jobs back to pending (a grouped job back to its lane)."""
    q = _queue(ctx, queue)

    def go() -> int:
        if not everything:
            for job_id in job_ids:
                q.reprocess(job_id)
            return len(job_ids)
        # Count each job once, and only when this command moved it: while workers run, a
        # reprocessed job may die again and reappear in the dead set (it is not taken a
        # second time, so the loop ends), and one may be removed or reprocessed by someone
        # else between the browse and the reprocess (not counted).
        seen: set[str] = set()
        moved = 0
        while batch := [j for j in q.browse("dead", 1000) if j not in seen]:
            for job_id in batch:
                seen.add(job_id)
                try:
                    q.reprocess(job_id)
                except (JobGone, StateError):
                    continue
                moved += 1
        return moved

    if not job_ids and not everything:
        _fail("name job ids or pass --all")
    click.echo(f"reprocessed {_run(ctx, go)} job(s)")


@main.command()
@click.argument("queue")
@click.option("--lane", help="Pause one lane instead of the whole queue.")
@click.pass_context
def pause(ctx: click.Context, queue: str, lane: str | None) -> None:
    """Stop claims of QUEUE (or of one lane)."""
    q = _queue(ctx, queue)
    _run(ctx, (lambda: q.pause_lane(lane)) if lane else q.pause)
    click.echo(f"paused {queue}" + (f" lane {lane}" if lane else ""))


@main.command()
@click.argument("queue")
@click.option("--lane", help="Resume one lane instead of the whole queue.")
@click.pass_context
def resume(ctx: click.Context, queue: str, lane: str | None) -> None:
    """Let claims of QUEUE (or of one lane) through again."""
    q = _queue(ctx, queue)
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
    q = _queue(ctx, queue)

    def go() -> tuple[int, int, int]:
        promoted = q.promote(10_000)
        if max_stalled > 0:
            recovered, dead = q.sweep_stalled(max_stalled=max_stalled, limit=10_000)
            return promoted, len(recovered), len(dead)
        return promoted, q.reap(10_000), 0

    promoted, recovered, dead = _run(ctx, go)
    click.echo(f"promoted {promoted}, recovered {recovered}, dead {dead}")


@main.command()
@click.argument("queues", nargs=-1, required=True)
@click.pass_context
def check(ctx: click.Context, queues: tuple[str, ...]) -> None:
    """Run the consistency checker; exits 1 when any violation is found."""
    bad = 0
    for name in queues:
        q = _queue(ctx, name)
        violations = _run(ctx, q.check)
        for line in violations:
            click.echo(f"{name}: {line}")
        bad += len(violations)
        if not violations:
            click.echo(f"{name}: ok")
    sys.exit(1 if bad else 0)


# --------------------------------------------------------------------------- server and demo


@main.command()
@click.option("--port", type=int, help="TCP port on 127.0.0.1 (default: a free one).")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False),
    help="Data directory (default ./.echomq/server).",
)
def server(port: int | None, directory: str | None) -> None:
    """Run a private valkey-server/redis-server in the foreground (AOF on) for other
    processes to share; its URL is printed and recorded in ./.echomq/server.json."""
    data = Path(directory) if directory else state_dir() / "server"
    try:
        srv = EmbeddedServer(data, port=port, die_with_parent=True).start()
    except NoServerBinary as exc:
        _fail(str(exc))
        return
    record = _record_server(srv)
    click.echo(
        f"echomq server: {srv.url} (unix socket {srv.socket_path}, data in {data}); Ctrl-C stops it"
    )
    click.echo(f"  export ECHOMQ_URL={srv.url}")
    stopping = []

    def on_signal(signum: int, frame: Any) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        while not stopping and srv.proc is not None and srv.proc.poll() is None:
            time.sleep(0.2)
    finally:
        srv.stop()
        with contextlib.suppress(FileNotFoundError):
            record.unlink()
    click.echo("echomq server: stopped")


@main.command()
@click.option("--jobs", default=20_000, show_default=True, help="How many jobs to run.")
@click.option("--workers", default=3, show_default=True, help="Worker processes.")
@click.option("--concurrency", default=32, show_default=True, help="Jobs in flight per worker.")
@click.option("--quick", is_flag=True, help="A shortened run (2,000 jobs) for CI.")
@click.option("--no-kill", is_flag=True, help="Do not SIGKILL a worker mid-run.")
@click.pass_context
def demo(
    ctx: click.Context, jobs: int, workers: int, concurrency: int, quick: bool, no_kill: bool
) -> None:
    """Run ~20k jobs over several tenants with flaky and poison jobs, kill a worker
    mid-run, and print what happened."""
    from echomq.demo import run_demo

    if quick:
        jobs = min(jobs, 2_000)
    with _server_for(ctx, purpose="demo") as url, _errors(url):
        sys.exit(
            run_demo(url, jobs=jobs, workers=workers, concurrency=concurrency, kill=not no_kill)
        )


# --------------------------------------------------------------------------- seeing inside


def _needs_web(what: str) -> None:
    try:
        import prometheus_client  # noqa: F401
        import starlette  # noqa: F401
    except ImportError:
        _fail(f"{what} needs the web extra: pip install 'echomq[web]'")


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=8808, show_default=True, help="TCP port.")
@click.option("--read-only", is_flag=True, help="Hide and refuse every action.")
@click.option("--app", "app_spec", metavar="MODULE:APP", help="Decode payloads with this app.")
@click.option("-q", "--queue", "queues", multiple=True, help="Show only these queues (repeat).")
@click.pass_context
def dashboard(
    ctx: click.Context,
    host: str,
    port: int,
    read_only: bool,
    app_spec: str | None,
    queues: tuple[str, ...],
) -> None:
    """Serve the web dashboard (actions need ECHOMQ_DASHBOARD_TOKEN)."""
    _needs_web("the dashboard")
    import uvicorn

    from echomq.web import create_app

    url = _url(ctx)
    app = _load_app(app_spec) if app_spec else None
    with _errors(url):
        web = create_app(url, read_only=read_only, app=app, queues=list(queues) or None)
    mode = (
        "read-only" if read_only or not os.environ.get("ECHOMQ_DASHBOARD_TOKEN") else "actions on"
    )
    click.echo(f"echomq dashboard: http://{host}:{port}/ ({mode}) on {url}", err=True)
    uvicorn.run(web, host=host, port=port, log_level="warning")


@main.command("metrics")
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to bind.")
@click.option("--port", default=9808, show_default=True, help="TCP port.")
@click.option("-q", "--queue", "queues", multiple=True, help="Report only these queues (repeat).")
@click.pass_context
def metrics_command(ctx: click.Context, host: str, port: int, queues: tuple[str, ...]) -> None:
    """Serve Prometheus metrics on /metrics (PROMETHEUS_MULTIPROC_DIR: every worker's too)."""
    _needs_web("echomq metrics")
    from echomq import prometheus

    url = _url(ctx)
    click.echo(f"echomq metrics: http://{host}:{port}/metrics on {url}", err=True)
    with _errors(url), contextlib.suppress(KeyboardInterrupt):
        prometheus.serve(url, port=port, addr=host, queues=list(queues) or None)


@main.command()
@click.argument("queue")
@click.option("--follow", "-f", is_flag=True, help="Keep waiting for new events.")
@click.option(
    "--after", default="0", show_default=True, help="Start after this stream id ($: new only)."
)
@click.option("-n", "count", default=100, show_default=True, help="Events per read.")
@click.pass_context
def events(ctx: click.Context, queue: str, follow: bool, after: str, count: int) -> None:
    """Print QUEUE's lifecycle events (enable them with Queue.enable_events)."""
    q = _queue(ctx, queue)

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
    """List QUEUE's repeatable jobs, soonest first: name, next fire (UTC), schedule."""
    import datetime as _dt

    q = _queue(ctx, queue)
    for rep in _run(ctx, q.repeats):
        when = _dt.datetime.fromtimestamp(rep.next_ms / 1000, _dt.timezone.utc)
        sched = f"every {rep.every_ms} ms" if rep.every_ms else f"cron '{rep.cron}' {rep.tz}"
        extra = "".join(f" {k}={v}" for k, v in (("group", rep.group), ("owner", rep.owner)) if v)
        click.echo(f"{rep.name} {when.isoformat(timespec='milliseconds')} {sched}{extra}")


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
