"""`echomq server` as a user runs it from the quick start (issue 27 #2-#4): restarted in the
same directory it keeps its port and a running worker follows it; a second one is refused
and the first keeps its record and socket; a recorded server that is gone is one error line
for every client, never a silent fallback to 6379. Real processes, each test in a project
directory of its own (``./.echomq`` there, no ECHOMQ_HOME)."""

from __future__ import annotations

import json
import logging
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import echomq
from conftest import wait_for
from echomq.client import connect as _connect
from echomq.client import locate as _locate
from echomq.errors import ServerNotRunning
from procs import Proc, Spawner, pid_gone, wait_log

TASKS = """
import echomq

app = echomq.App()

@app.task(queue="emails", keep_result_ms=60_000)
def send_welcome(to: str) -> str:
    return f"welcome mail sent to {to}"
"""

PRODUCE = (
    "from tasks import send_welcome; "
    "print(send_welcome.enqueue('ada@example.com').wait(timeout_s=10))"
)

GONE = "the echomq server recorded in .echomq/ is not running: start it with `echomq server`"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A directory holding the quick start's tasks.py, and nothing configured."""
    path = tmp_path / "project"
    path.mkdir()
    (path / "tasks.py").write_text(textwrap.dedent(TASKS))
    return path


def bare_env(spawn: Spawner, project: Path) -> dict[str, str]:
    """No ECHOMQ_URL, no ECHOMQ_HOME: the state is ./.echomq of the project, as for a user."""
    return spawn.env(ECHOMQ_URL=None, ECHOMQ_HOME=None, PYTHONPATH=str(project))


def record(project: Path) -> dict[str, object]:
    path = project / ".echomq" / "server.json"
    wait_for(path.exists, timeout=60)
    info: dict[str, object] = json.loads(wait_for(path.read_text))
    return info


def start_server(spawn: Spawner, project: Path, *args: str) -> tuple[Proc, dict[str, object]]:
    srv = spawn.start("server", *args, env=bare_env(spawn, project), cwd=project)
    text = wait_log(srv, "export ECHOMQ_URL=")
    info = record(project)
    assert f"export ECHOMQ_URL={info['url']}" in text
    return srv, info


def stop(proc: Proc) -> None:
    proc.signal(signal.SIGTERM)
    assert proc.wait(60) == 0, proc.text()


def run(
    project: Path, spawn: Spawner, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args,
        env=bare_env(spawn, project),
        cwd=project,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def produce(project: Path, spawn: Spawner) -> subprocess.CompletedProcess[str]:
    return run(project, spawn, sys.executable, "-c", PRODUCE)


def test_quick_start_survives_a_server_restart(spawn: Spawner, project: Path) -> None:
    srv, first = start_server(spawn, project)
    worker = spawn.start(
        "worker", "tasks:app", "-c", "20", env=bare_env(spawn, project), cwd=project
    )
    wait_log(worker, "serving")
    done = produce(project, spawn)
    assert done.stdout.strip() == "welcome mail sent to ada@example.com", done.stderr

    stop(srv)
    wait_for(lambda: pid_gone(int(str(first["pid"]))), timeout=10)
    again, second = start_server(spawn, project)
    assert second["port"] == first["port"], (first, second)
    assert second["url"] == first["url"]
    # The worker, started against the first run, reconnects to the second on its own.
    done = produce(project, spawn)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "welcome mail sent to ada@example.com", done.stderr
    assert worker.popen.poll() is None
    stop(worker)
    stop(again)


def test_a_taken_port_is_reported_on_restart(spawn: Spawner, project: Path) -> None:
    srv, first = start_server(spawn, project)
    stop(srv)
    port = int(str(first["port"]))
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        again, second = start_server(spawn, project)
        assert second["port"] != port
        text = again.text()
        assert f"port {port} of the last run is taken" in text, text
        stop(again)


def test_a_second_server_is_refused_and_the_first_keeps_its_state(
    spawn: Spawner, project: Path
) -> None:
    srv, info = start_server(spawn, project)
    assert info["owner"] == srv.pid
    sock = Path(str(info["socket"]))
    assert sock.exists()
    for args in ([], ["--dir", str(project / "elsewhere")]):
        done = run(project, spawn, sys.executable, "-m", "echomq", "server", *args)
        assert done.returncode == 2, done
        lines = done.stderr.splitlines()
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith("error: an echomq server already runs in"), lines
        assert f"(pid {srv.pid} at {info['url']})" in lines[0], lines
    # The refused ones touched nothing of the first's: its record, its socket, its server.
    assert record(project) == info
    assert sock.exists()
    with echomq.Queue("still-here", url=str(info["url"])) as q:
        assert q.counts()["pending"] == 0
    stop(srv)


def test_a_second_server_on_the_same_data_dir_is_refused(spawn: Spawner, project: Path) -> None:
    srv, info = start_server(spawn, project)
    env = {**bare_env(spawn, project), "ECHOMQ_HOME": str(project / "other-state")}
    data = str(project / ".echomq" / "server")
    done = subprocess.run(
        [sys.executable, "-m", "echomq", "server", "--dir", data],
        env=env,
        cwd=project,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2, done
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert f"(pid {srv.pid}" in done.stderr
    assert Path(str(info["socket"])).exists()
    stop(srv)


@pytest.mark.parametrize("how", ["stopped", "killed"])
def test_a_recorded_server_that_is_gone_fails_every_client(
    spawn: Spawner, project: Path, how: str
) -> None:
    srv, info = start_server(spawn, project)
    if how == "stopped":
        stop(srv)
    else:  # a crash of its owner (the server dies with it): the record stays behind
        srv.signal(signal.SIGKILL)
        srv.wait(60)
    wait_for(lambda: pid_gone(int(str(info["pid"]))), timeout=10)
    for args in (
        [sys.executable, "-m", "echomq", "stats"],
        [sys.executable, "-m", "echomq", "worker", "tasks:app"],
        [sys.executable, "-c", PRODUCE],
    ):
        # (`echomq demo` is no client of a recorded server: it runs on its own, issue 36.)
        done = run(project, spawn, *args)
        assert done.returncode != 0, (args, done)
        if args[1] == "-m":
            assert done.returncode == 2
            assert done.stderr.splitlines() == [
                f"error: {GONE} (or delete .echomq/server.json to stop using it)"
            ], args
        else:
            assert f"echomq.errors.ServerNotRunning: {GONE}" in done.stderr, done.stderr
        assert "6379" not in done.stderr


def test_a_worker_replaces_the_record_of_its_own_dead_server(spawn: Spawner, project: Path) -> None:
    """A worker with nothing configured records its own server; killed, it leaves that record
    behind. The next worker here starts its own again instead of failing."""
    env = bare_env(spawn, project)
    first = spawn.start("worker", "tasks:app", env=env, cwd=project)
    wait_log(first, "serving")
    info = record(project)
    assert info["by"] == "worker"
    first.signal(signal.SIGKILL)
    first.wait(60)
    wait_for(lambda: pid_gone(int(str(info["pid"]))), timeout=10)
    second = spawn.start("worker", "tasks:app", env=env, cwd=project)
    wait_log(second, "serving")
    assert record(project)["owner"] == second.pid
    done = produce(project, spawn)
    assert done.stdout.strip() == "welcome mail sent to ada@example.com", done.stderr
    stop(second)
    assert not (project / ".echomq" / "server.json").exists()  # its own record goes with it


# --------------------------------------------------------------------------- resolution


@pytest.fixture
def nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ECHOMQ_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("ECHOMQ_URL", raising=False)
    monkeypatch.setattr(_locate, "_logged", set())
    return tmp_path / "state"


def test_the_default_server_is_a_warning(nothing: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="echomq"):
        assert _connect.resolve_url().source == "default"
        _connect.resolve_url("redis://chosen:1/0")
    levels = {r.getMessage().split(" (")[0]: r.levelno for r in caplog.records}
    assert levels == {
        f"echomq server {_connect.DEFAULT_URL}": logging.WARNING,
        "echomq server redis://chosen:1/0": logging.INFO,
    }


def test_a_dead_record_raises_where_the_url_is_resolved(nothing: Path) -> None:
    nothing.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (nothing / "server.json").write_text(
        json.dumps({"pid": dead.pid, "port": 1, "url": "redis://127.0.0.1:1/0"})
    )
    with pytest.raises(ServerNotRunning, match="is not running: start it with `echomq server`"):
        _connect.resolve_url()
    with pytest.raises(ServerNotRunning):
        echomq.Queue("q")
    with pytest.raises(ServerNotRunning):
        _ = echomq.App().url
    (nothing / "server.json").write_text("{half a reco")
    with pytest.raises(ServerNotRunning):
        _connect.resolve_url()
    # Something configured first wins, as before: the record is not read.
    assert _connect.resolve_url("redis://x:1/0").url == "redis://x:1/0"


def test_verbose_names_the_server_and_its_source(spawn: Spawner, url: str, project: Path) -> None:
    done = run(project, spawn, sys.executable, "-m", "echomq", "-v", "--url", url, "stats")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0] == f"echomq: server {url} (explicit: passed explicitly)"
    env = {**bare_env(spawn, project), "ECHOMQ_URL": url}
    done = subprocess.run(
        [sys.executable, "-m", "echomq", "-v", "stats"],
        env=env,
        cwd=project,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0] == f"echomq: server {url} (env: ECHOMQ_URL)"


def test_a_server_deletes_only_the_socket_it_made(tmp_path: Path) -> None:
    """Issue 27 #3, below the CLI: the first server crashed and another took the directory's
    socket path; cleaning up after the first must leave the second one's socket. (A server
    stopped cleanly unlinks its socket path itself, whoever's it is now: that is why the
    CLI refuses a second `echomq server` before it starts one.)"""
    from echomq.server import EmbeddedServer

    first = EmbeddedServer(tmp_path / "data", appendonly=False).start()
    second = EmbeddedServer(tmp_path / "data", appendonly=False)
    try:
        first.kill()
        second.start()  # the server unlinks a stale socket file and binds its own
        first.stop()
        assert second.socket_path.exists()
        with echomq.Queue("sock", url=f"unix://{second.socket_path}") as q:
            assert q.counts()["pending"] == 0
        second.stop()
        assert not second.socket_path.exists()  # its own: deleted
    finally:
        first.stop()
        second.stop()
