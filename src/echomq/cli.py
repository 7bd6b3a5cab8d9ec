"""The ``echomq`` command line: run workers, operate queues, run a server, run the demo.

The server comes from ``--url``, else ``ECHOMQ_URL``, else an ``echomq server`` recorded in
``./.echomq/``. ``worker``, ``server`` and ``demo`` start a private embedded server when none
is configured; the operator commands default to ``redis://127.0.0.1:6379/0``.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib
import json
import logging
import os
import re
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import click
import redis
import redis.exceptions

from echomq import (
    __version__,
    _connect,
    _console,
    _envelope,
    _executor,
    _inspect,
    _native,
    _registry,
    ids,
    keyspace,
)
from echomq import _protocol as _p
from echomq.app import App
from echomq.errors import (
    EchoMQError,
    InvalidArgument,
    JobGone,
    ServerNotRunning,
    ServerUnreachable,
    StateError,
)
from echomq.queue import Queue
from echomq.serializers import JSON
from echomq.server import EmbeddedServer, NoServerBinary, ServerStartError, state_dir

__all__ = ["main"]

F = TypeVar("F", bound=Callable[..., Any])


def _fail(message: str, code: int = 2) -> None:
    """One line ``error: ...`` on stderr, no traceback, and exit ``code`` (2: the command
    could not run; 1: it ran and the answer is "no", e.g. a queue that does not exist)."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _checked_url(url: str) -> str:
    try:
        return _connect.check_url(url)
    except InvalidArgument as exc:
        _fail(str(exc))
        raise  # unreachable; keeps type checkers quiet


def _resolved(ctx: click.Context, app_url: str | None = None) -> _connect.Resolved:
    """``echomq._connect.resolve_url`` for a command: a recorded server that is gone is one
    ``error:`` line; with ``-v`` the server and where it came from are printed (once)."""
    try:
        found = _connect.resolve_url(ctx.obj.get("url"), app_url)
    except EchoMQError as exc:
        _fail(str(exc))
        raise  # unreachable; keeps type checkers quiet
    if ctx.obj.get("verbose") and not ctx.obj.get("told"):
        ctx.obj["told"] = True
        click.echo(f"echomq: server {_shown(found.url)} ({found.source}: {found.reason})", err=True)
    return found


def _url(ctx: click.Context) -> str:
    """The server of an operator command (``echomq._connect.resolve_url``: ``--url``,
    ``ECHOMQ_URL``, a recorded ``echomq server``, the local default)."""
    return _checked_url(_resolved(ctx).url)


def _shown(url: str) -> str:
    """``url`` as printed: any password masked."""
    return _connect._redacted_text(url)


@contextlib.contextmanager
def _errors(url: str) -> Iterator[None]:
    """Turn the usual failures into one clear line and a non-zero exit."""
    try:
        yield
    except ServerUnreachable as exc:  # names the server and the time it waited
        _fail(str(exc))
    except redis.exceptions.AuthenticationError as exc:  # a ConnectionError: test it first
        _fail(f"the server at {_shown(url)} refused the credentials: {exc}")
    except redis.exceptions.ConnectionError as exc:
        _fail(f"cannot reach the server at {_shown(url)}: {exc}")
    except redis.exceptions.ResponseError as exc:
        _fail(f"the server at {_shown(url)} answered an error: {exc}")
    except redis.exceptions.RedisClusterException as exc:  # e.g. no node of it answers
        _fail(f"cannot use the cluster at {_shown(url)}: {exc}")
    except EchoMQError as exc:
        _fail(str(exc))


@contextlib.contextmanager
def _server_for(
    ctx: click.Context,
    *,
    purpose: str,
    app_url: str | None = None,
    optional_module: Path | None = None,
) -> Iterator[str]:
    """The configured server (``--url``, then ``app_url`` — the loaded ``App(url=...)`` —,
    ``ECHOMQ_URL``, a recorded ``echomq server``), or when none is, a private embedded one
    for the duration of the command.
    ``optional_module``: a built trafikey to load if it can; a server that refuses it (a
    stale or foreign build) is started again without it, with a warning, on the Lua path."""
    try:
        found = _connect.configured(ctx.obj.get("url"), app_url)
    except ServerNotRunning as exc:
        # A worker's own server died with that worker: this one starts its own (the same
        # data dir). A recorded `echomq server` that is down is the user's to start.
        if not (purpose == "worker" and exc.by == "worker"):
            _fail(str(exc))
        found = None
    if found is not None:
        # logs the choice
        yield _checked_url(_resolved(ctx, app_url).url)
        return
    directory = state_dir() / purpose
    try:
        try:
            load = ["--loadmodule", str(optional_module)] if optional_module else []
            server = EmbeddedServer(directory, args=load).start()
        except ServerStartError as exc:
            if not optional_module:
                raise
            # The last log line says why, after its "pid:role date time #" prefix.
            last = str(exc).strip().splitlines()[-1] if str(exc).strip() else "no reason given"
            why = re.sub(r"^\d+:[A-Z] .*? [.#*-] ", "", last)
            click.echo(
                f"echomq: the server would not load the module {optional_module} ({why}); "
                "running on the Lua executor (rebuild it: echomq module build)",
                err=True,
            )
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
    record = _record_server(server, "worker") if purpose == "worker" else None
    try:
        yield server.url
    finally:
        server.stop()
        if record is not None:
            _unrecord(record, server)


def _record_server(srv: EmbeddedServer, by: str) -> Path:
    """Write ``server.json`` (atomically: a reader never sees half of it): the server's pid
    and URL for clients, ``owner`` (this process) and ``by`` for the next server here."""
    record = state_dir() / "server.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    info = {
        "pid": srv.pid,
        "port": srv.port,
        "url": srv.url,
        "socket": str(srv.socket_path),
        "owner": os.getpid(),
        "by": by,
    }
    partial = record.with_name(f".server.json.{os.getpid()}")
    partial.write_text(json.dumps(info))
    partial.replace(record)
    return record


def _unrecord(record: Path, srv: EmbeddedServer) -> None:
    """Delete ``record`` only while it is still ours: a server started here since owns it."""
    info = _connect.read_record(record.parent) or {}
    if info.get("owner") == os.getpid() and info.get("pid") == srv.pid:
        with contextlib.suppress(FileNotFoundError):
            record.unlink()


def _hold_lock(path: Path) -> Any:
    """An exclusive lock on ``path`` held for this process's life (the open file; the OS
    lets go when the process ends, however it ends), with our pid written in it; None when
    another process holds it."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a+")  # noqa: SIM115 - held open until exit, on purpose
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        return None
    f.truncate(0)
    f.write(str(os.getpid()))
    f.flush()
    return f


def _lock_holder(path: Path) -> str:
    try:
        return path.read_text().strip() or "?"
    except OSError:
        return "?"


def _port_free(port: int) -> bool:
    """Whether the server could bind 127.0.0.1:``port`` now. SO_REUSEADDR as the server sets
    it: the connections of clients a stopped server left in TIME_WAIT do not hold the port."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


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


def _queue_exists(q: Queue) -> bool:
    """Whether any key of the queue exists: one EXISTS over its registry of key types
    (PROTOCOL §1.3), then a SCAN for the rest (job rows, lane sets) when none does."""
    client: Any = q.client
    keys = [keyspace.queue_key(q.name, t) for t in sorted(keyspace.QUEUE_TYPES)]
    if int(client.execute_command("EXISTS", *keys)):
        return True
    # A queue name matches [A-Za-z0-9._-]: nothing in it is a glob character.
    return any(True for _ in client.scan_iter(match=f"emq:{{{q.name}}}:*", count=1000))


def _existing(
    ctx: click.Context, name: str, *, create: bool = False, verb: str = "", q: Queue | None = None
) -> Queue:
    """The queue ``name`` (or ``q``) for an operator command; exit 1 when it does not exist
    on the server (a typo would otherwise act on a queue nobody uses), unless ``create``."""
    q = q if q is not None else _queue(ctx, name)
    if not create and not _run(ctx, lambda: _queue_exists(q)):
        hint = f" (--create {verb} it anyway)" if verb else ""
        _fail(f"queue {name!r} does not exist on {_shown(_url(ctx))}{hint}", code=1)
    return q


_CREATE = click.option(
    "--create", is_flag=True, help="Act even when QUEUE does not exist yet (no keys on the server)."
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--url", envvar="ECHOMQ_URL", help="Server URL (redis://, rediss://, unix://). Env: ECHOMQ_URL."
)
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="Print the server a command uses and where that choice came from.",
)
# The version the package itself holds, not the installed metadata: an editable install's
# metadata stays at the version it was installed with until pip runs again.
@click.version_option(version=__version__, prog_name="echomq")
@click.pass_context
def main(ctx: click.Context, url: str | None, verbose: bool) -> None:
    """echomq: a reliable job queue on Valkey/Redis."""
    ctx.ensure_object(dict)
    ctx.obj["verbose"] = verbose
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
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            _fail(
                f"cannot import {module_name!r}: no module named {missing!r} (from {os.getcwd()})"
            )
        _import_failed(module_name, exc)  # the module itself imports something missing
    except Exception as exc:  # the user's module raised while it was imported
        _import_failed(module_name, exc)
    obj = getattr(module, attr or "app", None)
    if not isinstance(obj, App):
        _fail(f"{spec!r} is not an echomq.App (found {type(obj).__name__})")
    assert isinstance(obj, App)
    return obj


def _import_failed(module_name: str, exc: BaseException) -> None:
    """The error is in the user's module: show where (its traceback), then one line."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:  # from the user's first frame on
        name = tb.tb_frame.f_code.co_filename
        if name != __file__ and not name.startswith("<frozen") and "importlib" not in name:
            break
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)
    _fail(f"importing {module_name!r} raised {type(exc).__name__}: {exc} (traceback above)")


def _log_level(value: str) -> int:
    """A ``--log-level`` as a level number: a name (any case) or a number."""
    names = {
        "CRITICAL": logging.CRITICAL,
        "FATAL": logging.FATAL,
        "ERROR": logging.ERROR,
        "WARNING": logging.WARNING,
        "WARN": logging.WARNING,
        "INFO": logging.INFO,
        "DEBUG": logging.DEBUG,
        "NOTSET": logging.NOTSET,
    }
    text = value.strip().upper()
    if text in names:
        return names[text]
    if text.isdigit():
        return int(text)
    _fail(
        f"--log-level {value!r} is not a level: use DEBUG, INFO, WARNING, ERROR or CRITICAL "
        "(or a number)"
    )
    raise AssertionError  # unreachable


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
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Log lines as text, or one JSON object per line (ts, level, logger, msg, fields).",
)
@click.option(
    "--metrics-port",
    type=int,
    default=None,
    help="Serve Prometheus /metrics on this port (needs echomq[web]; default: off).",
)
@click.option("--metrics-host", default="0.0.0.0", show_default=True, help="Its address.")
@click.option(
    "--metrics-queues/--no-metrics-queues",
    default=True,
    show_default=True,
    help="Also export the server-wide queue gauges (depths, lanes) on --metrics-port; with "
    "-p N only the first worker process does. In a fleet, turn it off and run one "
    "`echomq metrics`.",
)
@click.option(
    "--metrics-lanes",
    type=int,
    default=None,
    help="Lanes per queue with a label of their own (the deepest); the rest are summed as "
    'lane="~other" (default 50).',
)
@click.option(
    "-p",
    "--processes",
    default="1",
    show_default=True,
    help="Worker processes, each with its own -c slots (auto: one per CPU); > 1 starts a "
    "supervisor.",
)
@click.option(
    "--max-jobs-per-child",
    type=int,
    default=None,
    help="Recycle a worker process gracefully after it claimed this many jobs (supervised).",
)
@click.option(
    "--max-memory-per-child",
    type=int,
    default=None,
    help="Recycle a worker process gracefully past this resident memory, in MiB (supervised).",
)
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
    log_format: str,
    metrics_port: int | None,
    metrics_host: str,
    metrics_queues: bool,
    metrics_lanes: int | None,
    processes: str,
    max_jobs_per_child: int | None,
    max_memory_per_child: int | None,
) -> None:
    """Run the tasks of MODULE:APP (e.g. myproject.tasks:app)."""
    import logging

    from echomq import _supervisor
    from echomq._logfmt import formatter
    from echomq.worker import Worker

    level = _log_level(log_level)
    handler = logging.StreamHandler()
    handler.setFormatter(formatter(log_format))
    logging.basicConfig(level=level, handlers=[handler])
    n = _processes(processes)
    for name, value in (
        ("--max-jobs-per-child", max_jobs_per_child),
        ("--max-memory-per-child", max_memory_per_child),
        ("--metrics-lanes", metrics_lanes),
    ):
        if value is not None and value < 1:
            _fail(f"{name} must be >= 1, got {value}")
    if metrics_port is not None:
        _needs_web("echomq worker --metrics-port")
    # Set: a spawned, supervised child (read once: a process it starts is not one).
    control = os.environ.pop(_supervisor.CONTROL_FD_ENV, None)
    if control is not None and not control.isdigit():
        _fail(f"{_supervisor.CONTROL_FD_ENV} must be a file descriptor, got {control!r}")
    supervised = control is None and (n > 1 or bool(max_jobs_per_child or max_memory_per_child))
    app = _load_app(app_spec)
    # The app's own App(url=...) counts before ECHOMQ_URL and before starting a server.
    with _server_for(ctx, purpose="worker", app_url=app._url) as url:
        app.url = url

        def run_one(index: int, control_fd: int | None) -> int:
            hooks = None
            if metrics_port is not None:
                # Off unless asked: without the flag the worker has no hook at all.
                from prometheus_client import start_http_server

                from echomq import prometheus

                hooks = prometheus.PrometheusHooks().hooks()
                served = list(queues) or app.queues() or None
                port = metrics_port + index  # one port per worker process of a supervisor
                start_http_server(
                    port,
                    addr=metrics_host,
                    registry=prometheus.registry_for(
                        url,
                        queues=served,
                        server_metrics=metrics_queues and index == 0,
                        lanes=metrics_lanes,
                        # Multiprocess mode aggregates every process's files: one port of
                        # the fleet exports them, the others would count them again.
                        worker_metrics=index == 0 or not os.environ.get("PROMETHEUS_MULTIPROC_DIR"),
                    ),
                )
                logging.getLogger("echomq.worker").info(
                    "metrics on http://%s:%d/metrics", metrics_host, port
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
                    max_jobs=max_jobs_per_child if control_fd is not None else None,
                )
            except EchoMQError as exc:
                _fail(str(exc))
                raise  # unreachable
            with _errors(url):
                if control_fd is None:
                    w.run()
                    return 0
                return _supervisor.run_child_worker(
                    w,
                    control_fd,
                    max_memory=None if max_memory_per_child is None else max_memory_per_child << 20,
                )
            raise AssertionError  # unreachable: _errors exits

        if control is not None:
            code = run_one(int(os.environ.get(_supervisor.INDEX_ENV, "0")), int(control))
        elif not supervised:
            code = run_one(0, None)
        else:
            options = {
                "queues": queues, "concurrency": concurrency, "beat_ms": beat_ms,
                "grace_s": grace_s, "max_stalled": max_stalled, "log_level": log_level,
                "log_format": log_format, "metrics_port": metrics_port,
                "metrics_host": metrics_host, "metrics_queues": metrics_queues,
                "metrics_lanes": metrics_lanes, "max_jobs_per_child": max_jobs_per_child,
                "max_memory_per_child": max_memory_per_child,
            }  # fmt: skip
            code = _supervise(ctx, url, app_spec, n, run_one, **options)
    # Out of _server_for: an embedded server is stopped before any early exit below.
    if not supervised:
        _exit_past_stuck_handlers(code)
    if code:
        sys.exit(code)


def _supervise(
    ctx: click.Context,
    url: str,
    app_spec: str,
    n: int,
    run_one: Callable[[int, int], int],
    **o: Any,
) -> int:
    """``echomq worker -p N``: the supervisor (``echomq._supervisor``); its exit status."""
    from echomq import _supervisor

    def spawn_argv(index: int) -> list[str]:
        # The same options; the URL by the environment (not on a command line ps shows)
        # unless it was given there already.
        argv = [sys.executable, "-m", "echomq"]
        if ctx.obj.get("url"):
            argv += ["--url", ctx.obj["url"]]
        argv += ["worker", app_spec, "-c", str(o["concurrency"]), "--beat-ms", str(o["beat_ms"])]
        argv += ["--grace", str(o["grace_s"]), "--max-stalled", str(o["max_stalled"])]
        argv += ["--log-level", o["log_level"], "--log-format", o["log_format"]]
        for name in o["queues"]:
            argv += ["-q", name]
        if o["metrics_port"] is not None:
            argv += ["--metrics-port", str(o["metrics_port"]), "--metrics-host", o["metrics_host"]]
            argv += ["--metrics-queues" if o["metrics_queues"] else "--no-metrics-queues"]
            if o["metrics_lanes"] is not None:
                argv += ["--metrics-lanes", str(o["metrics_lanes"])]
        if o["max_jobs_per_child"] is not None:
            argv += ["--max-jobs-per-child", str(o["max_jobs_per_child"])]
        if o["max_memory_per_child"] is not None:
            argv += ["--max-memory-per-child", str(o["max_memory_per_child"])]
        return argv

    if not ctx.obj.get("url"):
        os.environ["ECHOMQ_URL"] = url  # a spawned child finds the same server
    sup = _supervisor.Supervisor(n, run_child=run_one, spawn_argv=spawn_argv, grace_s=o["grace_s"])
    return sup.run()


def _processes(value: str) -> int:
    """``-p``: a count >= 1, or ``auto`` (one per CPU this process may use)."""
    text = value.strip().lower()
    if text == "auto":
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except (AttributeError, OSError):
            return max(1, os.cpu_count() or 1)
    if text.isdigit() and int(text) >= 1:
        return int(text)
    _fail(f"-p/--processes must be a count >= 1 or 'auto', got {value!r}")
    raise AssertionError  # unreachable


def _exit_past_stuck_handlers(code: int = 0) -> None:
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
        os._exit(code)


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


_STATS = ("pending", "active", "schedule", "dead", "completed", "failed")


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
            lambda: _inspect.snapshot(x, names or _discover_queues(client), minutes=0),
            _connect.DEFAULT_RETRY_FOR,
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
@click.pass_context
def workers(ctx: click.Context, queues: tuple[str, ...]) -> None:
    """The live worker processes of QUEUES (default: every queue found on the server): one
    line each, then the jobs it holds."""
    url = _url(ctx)
    for name in queues:
        try:
            keyspace.check_queue(name)
        except EchoMQError as exc:
            _fail(str(exc))
    with _errors(url):
        client = _executor.sync_client(url)
        try:
            x = _executor.SyncExecutor(
                client, retry_for=0, executor=_native.resolve_executor(None, url)
            )
            names = list(queues) or _discover_queues(client)
            found = x.pipeline([_registry.list_workers(_p.Keys(n)) for n in names])
        finally:
            client.close()
    seen: dict[str, _registry.WorkerInfo] = {}
    for result in found:
        if isinstance(result, BaseException):
            raise result
        for w in result:
            seen.setdefault(w.id, w)
    if not seen:
        click.echo("no live workers" + (f" on {', '.join(queues)}" if queues else ""))
        return
    for w in sorted(seen.values(), key=lambda w: (w.host, w.supervisor or "", w.started_ms)):
        up = max(0.0, w.last_beat_ms / 1000 - w.started_ms / 1000)
        sup = f" supervisor={w.supervisor}" if w.supervisor else ""
        pool = f" pool={w.pool}" if w.pool else ""
        click.echo(
            f"{w.id} {w.host} pid={w.pid}{sup} queues={','.join(w.queues)} "
            f"c={w.concurrency}{pool} {w.executor} v{w.version} up={up:.0f}s held={w.held}"
        )
        for j in w.jobs:
            click.echo(f"  {j.id} {j.task} for {max(0, w.last_beat_ms - j.since_ms) / 1000:.1f}s")
        if w.held > len(w.jobs):
            click.echo(f"  ... and {w.held - len(w.jobs)} more")


@main.command()
@click.argument("queue")
@click.option(
    "--state",
    default="pending",
    show_default=True,
    # "scheduled" is the state's name; "schedule" (its set's key) stays as an alias.
    type=click.Choice(["pending", "active", "scheduled", "schedule", "dead", "completed"]),
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
    holding it (active), the columns of the dashboard's lists."""
    q = _existing(ctx, queue)
    if ids_only:
        for job_id in _run(ctx, lambda: q.browse(state, count, group=group)):
            click.echo(job_id)
        return

    def read() -> tuple[int, list[_console.JobRow]]:
        x = q._x
        k = q._k
        page = _inspect.page(x, k, state, 0, _p._int("count", count, 1, 1000), group)
        now_ms = int(x.run(_p._cmd(("TIME",), lambda r: int(r[0]) * 1000 + int(r[1]) // 1000)))
        return now_ms, _console.rows(x, k, page.items, page.state)

    now_ms, rows = _run(ctx, read)
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
            attempts = _show_value(row.get("attempts", "0"))
            most = row.get("max_attempts")
            click.echo(f"attempts: {attempts}" + (f" of {_show_value(most)}" if most else ""))
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
            if field not in ("attempts", "max_attempts", "errors"):  # shown above
                click.echo(f"{field}: {_show_value(value)}")
        lines = view.logs
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
    changes: list[Any] = []
    try:
        if lane is not None:
            keyspace.check_lane(lane)
        if lane is not None and weight is not None:
            changes.append(_p.weight_lane(q._k, lane, weight))
        if lane is not None and (limit is not None or no_limit):
            changes.append(_p.limit_lane(q._k, lane, None if no_limit else limit))
        if lane is not None and pause_it is not None:
            changes.append((_p.pause_lane if pause_it else _p.resume_lane)(q._k, lane))
    except EchoMQError as exc:
        _fail(str(exc))
    _existing(ctx, queue, create=create and setting, verb="sets" if setting else "", q=q)

    def go() -> list[_inspect.LaneView]:
        for change in changes:
            q._x.run(change)
        (view,) = _inspect.snapshot(q._x, [q.name], minutes=0)
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
    type=click.Choice(["dead", "completed"]),
    default="dead",
    show_default=True,
    help="With --all: the dead jobs, or the kept completed ones.",
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
        _p._priority(priority)
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
            _p._int("n", value, 1)
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
@click.argument("queues", nargs=-1, required=True)
@click.pass_context
def check(ctx: click.Context, queues: tuple[str, ...]) -> None:
    """Run the consistency checker; exits 1 when any violation is found."""
    bad = 0
    for name in queues:
        q = _existing(ctx, name)
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
@click.option(
    "--native",
    is_flag=True,
    help="Load the trafikey module (built first when missing): the native executor.",
)
def server(port: int | None, directory: str | None, native: bool) -> None:
    """Run a private valkey-server/redis-server in the foreground (AOF on) for other
    processes to share; its URL is printed and recorded in ./.echomq/server.json. Started
    again in the same directory it keeps the recorded port, so clients follow a restart;
    a second one while the first runs is refused."""
    state = state_dir()
    data = Path(directory) if directory else state / "server"
    # One server per state dir (its server.json) and per data dir (its AOF and socket),
    # held until this process ends: a second one would share both and, when it stopped,
    # take the first one's record and socket with it.
    held = []  # the open lock files: referenced until the process ends
    for lock in (state / "server.lock", data / "echomq.lock"):
        held.append(_hold_lock(lock))
        if held[-1] is None:
            info = _connect.read_record() or {}
            pid = _lock_holder(lock)
            where = f" at {_shown(str(info['url']))}" if info.get("url") else ""
            _fail(
                f"an echomq server already runs in {lock.parent}/ (pid {pid}{where}): stop it "
                "first, or give this one another ECHOMQ_HOME and --dir"
            )
    live = _connect.recorded_url()
    info = _connect.read_record() or {}
    if live is not None:  # a worker's own server (it takes no lock) is serving here
        owner = info.get("owner") or info.get("pid")
        _fail(f"an echomq server already runs in {state}/ (pid {owner} at {_shown(live)})")
    moved = ""
    if port is None and isinstance(info.get("port"), int):
        if _port_free(info["port"]):
            port = info["port"]  # the last run's: clients started against it reconnect
        else:
            moved = (
                f"echomq server: port {info['port']} of the last run is taken; clients "
                f"started against it must be restarted (or given the new URL)"
            )
    args = ["--loadmodule", str(_module_or_build())] if native else []
    try:
        srv = EmbeddedServer(data, port=port, die_with_parent=True, args=args).start()
    except NoServerBinary as exc:
        _fail(str(exc))
        return
    except ServerStartError as exc:  # the server refused to start (e.g. the module failed to load)
        _fail(str(exc))
        return
    _record_server(srv, "server")
    if moved:
        click.echo(moved, err=True)
    click.echo(
        f"echomq server: {srv.url} (unix socket {srv.socket_path}, data in {data}); Ctrl-C stops it"
    )
    click.echo(f"  export ECHOMQ_URL={srv.url}")
    if native:
        click.echo(f"  native executor: trafikey loaded from {args[1]}")
    stopping = []

    def on_signal(signum: int, frame: Any) -> None:
        stopping.append(signum)

    # SIGHUP too: a closed terminal stops the server cleanly (its AOF flushed).
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        while not stopping and srv.proc is not None and srv.proc.poll() is None:
            time.sleep(0.2)
    finally:
        srv.stop()
    # The record stays: a client started while the server is down fails with one line
    # naming it (never a silent fallback to another server), and the next `echomq server`
    # here takes the same port.
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
    # The embedded server loads the native module when one is built (echomq module build).
    built = _native.built_module()
    with _server_for(ctx, purpose="demo", optional_module=built) as url, _errors(url):
        sys.exit(
            run_demo(url, jobs=jobs, workers=workers, concurrency=concurrency, kill=not no_kill)
        )


def _module_or_build() -> Path:
    """The built trafikey module, built into the cache dir first when missing."""
    found = _native.built_module()
    if found is not None:
        return found
    click.echo(f"echomq: building trafikey into {_native.cache_dir()}", err=True)
    try:
        return _native.build()
    except _native.ModuleBuildError as exc:
        _fail(str(exc))
        raise  # unreachable; keeps type checkers quiet


@main.group()
def module() -> None:
    """Build and locate the trafikey server module (the native executor)."""


@module.command("build")
@click.option(
    "--dest",
    type=click.Path(file_okay=False),
    help="Directory for trafikey.so (default: the user cache dir, see `echomq module path`).",
)
def module_build(dest: str | None) -> None:
    """Compile the module's C source (shipped with echomq) and print the --loadmodule line."""
    try:
        path = _native.build(dest)
    except _native.ModuleBuildError as exc:
        _fail(str(exc))
        return
    click.echo(f"built {path}", err=True)
    click.echo(f"--loadmodule {path}")


@module.command("path")
def module_path() -> None:
    """Print where the built module is (exit 1, naming the expected place, when not built)."""
    found = _native.built_module()
    if found is None:
        where = _native.cache_dir() / f"{_native.MODULE_NAME}.so"
        _fail(f"trafikey is not built (expected at {where}); run: echomq module build", code=1)
        return
    click.echo(str(found))


# --------------------------------------------------------------------------- seeing inside


def _needs_web(what: str) -> None:
    try:
        import prometheus_client  # noqa: F401
        import starlette  # noqa: F401
    except ImportError:
        _fail(
            f"{what} needs the web extra: pip install 'echomq[web]' "
            "(from a clone of the repository: pip install '.[web]')"
        )


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
@click.option(
    "--lanes",
    type=int,
    default=None,
    help="Lanes per queue with a label of their own (the deepest); the rest are summed as "
    'lane="~other" (default 50).',
)
@click.pass_context
def metrics_command(
    ctx: click.Context, host: str, port: int, queues: tuple[str, ...], lanes: int | None
) -> None:
    """Serve Prometheus metrics on /metrics (PROMETHEUS_MULTIPROC_DIR: every worker's too)."""
    _needs_web("echomq metrics")
    from echomq import prometheus

    url = _url(ctx)
    click.echo(f"echomq metrics: http://{host}:{port}/metrics on {url}", err=True)
    with _errors(url), contextlib.suppress(KeyboardInterrupt):
        if lanes is not None and lanes < 0:
            _fail(f"--lanes must be >= 0, got {lanes}")
        prometheus.serve(url, port=port, addr=host, queues=list(queues) or None, lanes=lanes)


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
    q = _existing(ctx, queue)
    if enable or disable:
        _run(ctx, (lambda: q.enable_events(maxlen)) if enable else q.disable_events)
        click.echo(f"events {'on' if enable else 'off'} for {queue}")
        return
    meta = _p.Keys(queue).meta
    bound = _run(ctx, lambda: q._x.run(_p._cmd(("HGET", meta, "events"), lambda r: r)))
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


@main.command("pause-repeat")
@click.argument("queue")
@click.argument("name")
@click.pass_context
def pause_repeat(ctx: click.Context, queue: str, name: str) -> None:
    """Pause the repeatable job NAME of QUEUE: it fires no more until resume-repeat, and a
    worker start registering it again keeps it paused (exit 1 when it is not registered)."""
    q = _queue(ctx, queue)
    if not _run(ctx, lambda: q.pause_repeat(name)):
        click.echo(f"{name}: not registered", err=True)
        sys.exit(1)
    click.echo(f"{name}: paused")


@main.command("resume-repeat")
@click.argument("queue")
@click.argument("name")
@click.pass_context
def resume_repeat(ctx: click.Context, queue: str, name: str) -> None:
    """Resume the paused repeatable job NAME of QUEUE: its next fire is computed from now
    (exit 1 when it is not registered)."""
    q = _queue(ctx, queue)
    if not _run(ctx, lambda: q.resume_repeat(name)):
        click.echo(f"{name}: not registered", err=True)
        sys.exit(1)
    click.echo(f"{name}: resumed")


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
