"""``echomq server``, ``demo``, ``module``, ``dashboard`` and ``metrics``.

Servers and what runs beside them: ``echomq server``, ``demo``, ``module``,
``dashboard`` and ``metrics``."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import click

from echomq.cli._common import (
    _errors,
    _fail,
    _load_app,
    _needs_web,
    _port_free,
    _server_for,
    _shown,
    _url,
    main,
)
from echomq.client import connect as _connect
from echomq.client import native as _native
from echomq.ops.records import _hold_lock, _lock_holder, _record_server
from echomq.server import EmbeddedServer, NoServerBinary, ServerStartError, state_dir


@main.command()
@click.option("--port", type=int, help="TCP port on 127.0.0.1 (default: a free one).")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False),
    help="Data directory (default: server/ in the state dir, ./.echomq or the nearest above).",
)
@click.option(
    "--native",
    is_flag=True,
    help="Load the trafikey module (built first when missing): the native executor.",
)
def server(port: int | None, directory: str | None, native: bool) -> None:
    """Run a private valkey-server/redis-server in the foreground (AOF on) for other
    processes to share; its URL is printed and recorded in server.json of the state dir
    (ECHOMQ_HOME, else the nearest .echomq/ at or above the current directory, else
    ./.echomq, so one started in a project's subdirectory reuses the project's). Started
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
    stopping = []

    def on_signal(signum: int, frame: Any) -> None:
        stopping.append(signum)

    # SIGHUP too: a closed terminal stops the server cleanly (its AOF flushed). Installed
    # before the URL is printed: whoever reads it may signal at once, and a signal that
    # came before the handler would kill this process with the server left to die alone.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    _record_server(srv, "server")
    if moved:
        click.echo(moved, err=True)
    click.echo(
        f"echomq server: {srv.url} (unix socket {srv.socket_path}, data in {data}); Ctrl-C stops it"
    )
    click.echo(f"  export ECHOMQ_URL={srv.url}")
    if native:
        click.echo(f"  native executor: trafikey loaded from {args[1]}")
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
    _needs_web("echomq metrics", "prometheus_client")
    from echomq import prometheus

    url = _url(ctx)
    click.echo(f"echomq metrics: http://{host}:{port}/metrics on {url}", err=True)
    with _errors(url), contextlib.suppress(KeyboardInterrupt):
        if lanes is not None and lanes < 0:
            _fail(f"--lanes must be >= 0, got {lanes}")
        prometheus.serve(url, port=port, addr=host, queues=list(queues) or None, lanes=lanes)
