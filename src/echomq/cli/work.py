"""``echomq worker`` (a worker, or a supervised fleet of them) and ``echomq enqueue``."""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from echomq.cli._common import (
    _errors,
    _fail,
    _load_app,
    _needs_web,
    _queue,
    _run,
    _server_for,
    main,
)
from echomq.errors import (
    EchoMQError,
)
from echomq.protocol import envelope as _envelope
from echomq.serializers import JSON


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
    "--health-port",
    type=int,
    default=None,
    help="Serve the probes /livez and /readyz on this port (plain HTTP, no extra needed; "
    "with -p N the supervisor serves them for every child; default: off).",
)
@click.option("--health-host", default="0.0.0.0", show_default=True, help="Their address.")
@click.option(
    "--live-bound",
    "live_bound_s",
    type=float,
    default=30.0,
    show_default=True,
    help="Seconds the event loop may go without turning over before /livez answers 503.",
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
    health_port: int | None,
    health_host: str,
    live_bound_s: float,
    processes: str,
    max_jobs_per_child: int | None,
    max_memory_per_child: int | None,
) -> None:
    """Run the tasks of MODULE:APP (e.g. myproject.tasks:app)."""
    import logging

    from echomq.runtime import health as _health
    from echomq.runtime import supervisor as _supervisor
    from echomq.runtime.logfmt import formatter
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
        _needs_web("echomq worker --metrics-port", "prometheus_client")
    if health_port is not None and not 0 < health_port < 65536:
        _fail(f"--health-port must be a port in [1, 65535], got {health_port}")
    # Two stamps at least: a bound shorter would call a loop that turns over stalled.
    if not 2 * _health.STAMP_S <= live_bound_s < float("inf"):  # also refuses nan
        _fail(f"--live-bound must be >= {2 * _health.STAMP_S:g} seconds, got {live_bound_s}")
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
            if control_fd is not None:
                # The supervisor's crash-or-failed-start call rests on these two reports.
                hooks = _supervisor.reporting(hooks)
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
            # Set in a supervised child of a supervisor serving the probes (forked or
            # spawned; read once: a process the child starts is not one).
            health_dir = (
                os.environ.pop(_health.HEALTH_DIR_ENV, None) if control_fd is not None else None
            )
            if control_fd is not None and health_dir is not None:
                w.health = _health.WorkerHealth(live_bound_s, Path(health_dir) / f"{index}.json")
            elif control_fd is None and health_port is not None:
                w.health = _health.WorkerHealth(live_bound_s)
                _serve_health(w.health, health_host, health_port)
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
                "max_memory_per_child": max_memory_per_child, "health_port": health_port,
                "health_host": health_host, "live_bound_s": live_bound_s,
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
    """``echomq worker -p N``: the supervisor (``echomq.runtime.supervisor``); its exit status."""
    from echomq.runtime import supervisor as _supervisor

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
    if o["health_port"] is None:
        sup = _supervisor.Supervisor(
            n, run_child=run_one, spawn_argv=spawn_argv, grace_s=o["grace_s"]
        )
        return sup.run()
    from echomq.runtime import health as _health

    # The children stamp files here (forked ones inherit the variable, spawned ones get it
    # in their environment); the supervisor serves the probes from them.
    with tempfile.TemporaryDirectory(prefix="echomq-health-") as directory:
        os.environ[_health.HEALTH_DIR_ENV] = directory
        # Made before the server's thread starts: the start method (fork or spawn) is
        # chosen from the threads of the supervisor as the app's import left them.
        sup = _supervisor.Supervisor(
            n, run_child=run_one, spawn_argv=spawn_argv, grace_s=o["grace_s"]
        )
        probe = _health.FleetHealth(
            Path(directory), n, o["live_bound_s"], stopping=lambda: sup.signalled
        )
        server = _serve_health(probe, o["health_host"], o["health_port"])
        try:
            return sup.run()
        finally:
            server.shutdown()
            server.server_close()


def _serve_health(probe: Any, host: str, port: int) -> Any:
    """The probes' HTTP server (``echomq.runtime.health``), or exit 2 naming the port."""
    from echomq.runtime import health as _health

    try:
        server = _health.serve(probe, host, port)
    except OSError as exc:
        _fail(f"--health-port {port}: cannot listen on {host}:{port}: {exc}")
        raise  # unreachable
    logging.getLogger("echomq.worker").info(
        "health probes on http://%s:%d/livez and /readyz", host, port
    )
    return server


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
        # (see echomq.protocol.envelope), so the CLI need not know the app.
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
