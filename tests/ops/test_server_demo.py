"""The embedded server (``echomq server``, and a ``worker`` with no URL configured), the
missing-binary error, and the demo in its shortened mode — all as real processes."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

import echomq
from conftest import wait_for
from echomq.client import connect as _connect
from echomq.client import native as _native
from echomq.server import EmbeddedServer
from procs import TESTS_DIR, Proc, Spawner, pid_gone, pids_in, wait_log


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """An ECHOMQ_HOME of the test's own (the state dir of embedded servers)."""
    path = tmp_path / "home"
    path.mkdir()
    return path


def no_url_env(spawn: Spawner, home: Path, **extra: str) -> dict[str, str]:
    return spawn.env(ECHOMQ_URL=None, ECHOMQ_HOME=str(home), **extra)


def ping(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_connect_timeout=1)
    try:
        return bool(client.ping())
    except redis.exceptions.ConnectionError:
        return False
    finally:
        client.close()


# --------------------------------------------------------------------------- echomq server


def recorded_server(spawn: Spawner, home: Path, cwd: Path) -> tuple[Proc, dict[str, Any]]:
    """``echomq server`` started in ``cwd`` (made here), once it recorded itself in
    ``home``: the process and its record."""
    cwd.mkdir()
    srv = spawn.start("server", env=no_url_env(spawn, home), cwd=cwd)
    record = home / "server.json"
    wait_for(record.exists, timeout=60)
    return srv, json.loads(wait_for(record.read_text))


def test_server_records_itself_and_stops_clean(spawn: Spawner, home: Path, tmp_path: Path) -> None:
    cwd = tmp_path / "cwd"
    srv, info = recorded_server(spawn, home, cwd)
    record = home / "server.json"
    assert set(info) == {"pid", "port", "url", "socket", "owner", "by", "pidns", "run_id"}
    assert (info["owner"], info["by"]) == (srv.pid, "server")
    assert info["url"] == f"redis://127.0.0.1:{info['port']}/0"
    with redis.Redis.from_url(info["url"]) as client:  # for a reader in another PID namespace
        assert info["run_id"] == client.info("server")["run_id"]
    assert info["pidns"] == _connect.pid_namespace()
    wait_log(srv, f"export ECHOMQ_URL={info['url']}")
    assert ping(info["url"])
    assert Path(info["socket"]).parent == (home / "server").resolve()
    assert not pid_gone(info["pid"])
    assert info["pid"] in pids_in(home)  # the server runs in the state dir

    # Other commands in the same state dir find the recorded server without a URL.
    stats = subprocess.run(
        [sys.executable, "-m", "echomq", "enqueue", "found-it", "x"],
        env=no_url_env(spawn, home),
        cwd=cwd,
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert stats.returncode == 0, stats.stderr
    with echomq.Queue("found-it", url=info["url"]) as q:
        assert q.counts()["pending"] == 1

    srv.signal(signal.SIGTERM)
    assert srv.wait(60) == 0
    assert "echomq server: stopped" in srv.text()
    # The record stays (issue 27 #2, #4): the next `echomq server` here takes its port, and
    # a client started meanwhile is told the server is down instead of trying 6379.
    assert json.loads(record.read_text()) == info
    wait_for(lambda: pid_gone(info["pid"]), timeout=60)
    assert not ping(info["url"])
    assert pids_in(home) == []
    assert not (cwd / ".echomq").exists()  # ECHOMQ_HOME, not the cwd, holds the state


def test_server_dies_with_its_owner(spawn: Spawner, home: Path) -> None:
    srv = spawn.start("server", "--dir", str(home / "data"), env=no_url_env(spawn, home))
    record = home / "server.json"
    wait_for(record.exists, timeout=60)
    info = json.loads(wait_for(record.read_text))
    assert (home / "data").is_dir()
    assert info["pid"] in pids_in(home)
    srv.signal(signal.SIGKILL)  # the owner crashes: the server must not outlive it
    srv.wait(60)
    wait_for(lambda: pid_gone(info["pid"]), timeout=60)
    assert pids_in(home) == []


def test_worker_without_url_runs_its_own_server(
    spawn: Spawner, home: Path, qname: str, tmp_path: Path
) -> None:
    env = no_url_env(spawn, home, EMQ_TEST_QUEUE=qname)
    w = spawn.start("worker", "apps.basic:app", env=env, cwd=tmp_path)
    text = wait_log(w, "serving")
    m = re.search(r"started an embedded one at (redis://127\.0\.0\.1:\d+/0)", text)
    assert m, text
    embedded = m.group(1)
    assert pids_in(home) != []  # the server runs, its data in ECHOMQ_HOME
    with echomq.Queue(qname, url=embedded) as q:
        e = q.enqueue(json.dumps({"task": "count", "args": [1], "kwargs": {}}))
        wait_for(lambda: q.counts()["completed"] == 1)
        assert q.job_state(e.id) == "absent"
    w.signal(signal.SIGTERM)
    assert w.wait(60) == 0, w.text()
    assert pids_in(home) == []  # nothing left behind
    assert not ping(embedded)


@pytest.mark.parametrize("command", [["server"], ["worker", "apps.basic:app"], ["demo", "--quick"]])
@pytest.mark.parametrize("how", ["env", "path"])
def test_no_server_binary_is_one_line(
    spawn: Spawner, home: Path, tmp_path: Path, command: list[str], how: str
) -> None:
    if how == "env":
        env = no_url_env(spawn, home, ECHOMQ_SERVER_BIN="/nonexistent")
    else:
        empty = tmp_path / "empty-bin"
        empty.mkdir()
        env = no_url_env(spawn, home, PATH=str(empty))
    done = subprocess.run(
        [sys.executable, "-m", "echomq", *command],
        env=env,
        cwd=TESTS_DIR,
        capture_output=True,
        timeout=30,
        check=False,
    )
    err = done.stderr.decode().strip()
    assert done.returncode == 2, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: ") and "install" in err and "ECHOMQ_URL" in err, err
    assert pids_in(home) == []


@pytest.mark.parametrize("command", [["demo", "--quick"], ["server", "--native"]])
def test_no_server_binary_with_a_built_module_is_one_line(
    spawn: Spawner, home: Path, tmp_path: Path, command: list[str]
) -> None:
    """Issue 27 #1: with a module in the cache dir (as `echomq module build` leaves it) the
    missing binary was taken for a server that refused the module."""
    cache = tmp_path / "cache"
    built = cache / "echomq" / f"{_native.MODULE_NAME}-{_native.MODULE_VERSION}"
    built.mkdir(parents=True)
    (built / f"{_native.MODULE_NAME}.so").write_bytes(b"not loaded: no server runs")
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    env = no_url_env(spawn, home, PATH=str(empty), XDG_CACHE_HOME=str(cache))
    done = subprocess.run(
        [sys.executable, "-m", "echomq", *command],
        env=env,
        cwd=TESTS_DIR,
        capture_output=True,
        timeout=30,
        check=False,
    )
    err = done.stderr.decode().strip()
    assert done.returncode == 2, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: no valkey-server or redis-server on PATH"), err
    assert "would not load" not in err


def test_the_suite_never_reads_the_users_home(spawn: Spawner, tmp_path: Path) -> None:
    """Issue 27 #1: conftest gives the session, and procs.Spawner each child, a HOME, cache
    dir and ECHOMQ_HOME of their own, and drops the user's ECHOMQ_* settings."""
    import os
    import pwd

    users = pwd.getpwuid(os.getuid()).pw_dir
    for where in (Path.home(), _native.cache_dir(), echomq.server.state_dir().resolve()):
        assert not str(where).startswith(users + os.sep) and str(where) != users, where
    kept = {k for k in os.environ if k.startswith("ECHOMQ_") and "TEST" not in k}
    assert kept - {"ECHOMQ_SERVER_BIN"} == {"ECHOMQ_HOME", "ECHOMQ_CEILING_DIRS"}, kept
    env = spawn.env()
    for key in ("HOME", "XDG_CACHE_HOME", "ECHOMQ_HOME"):
        assert Path(env[key]).is_relative_to(tmp_path), (key, env[key])


def test_a_missing_binary_is_not_a_start_failure() -> None:
    from echomq.server import NoServerBinary, ServerStartError

    assert not issubclass(NoServerBinary, ServerStartError)
    assert not issubclass(NoServerBinary, RuntimeError)


# --------------------------------------------------------------------------- demo


@pytest.mark.slow  # a whole demo run
def test_demo_quick_against_the_test_server(spawn: Spawner, home: Path, tmp_path: Path) -> None:
    demo = spawn.start(
        "demo", "--quick", env=spawn.env(ECHOMQ_HOME=str(home), COLUMNS="160"), cwd=tmp_path
    )
    rc = demo.wait(150)
    out = demo.text()
    assert rc == 0, out
    assert "demo ok" in out
    assert "SIGKILL worker" in out
    assert "consistency check: clean" in out


@pytest.mark.slow  # a whole demo run
def test_demo_quick_with_an_embedded_server(spawn: Spawner, home: Path, tmp_path: Path) -> None:
    env = spawn.env(ECHOMQ_URL=None, ECHOMQ_HOME=str(home), COLUMNS="160")
    demo = spawn.start("demo", "--jobs", "1000", env=env, cwd=tmp_path)
    rc = demo.wait(150)
    out = demo.text()
    assert rc == 0, out
    assert "started an embedded one" in out and "demo ok" in out
    assert pids_in(home) == []


def test_the_readme_demo_command_runs(spawn: Spawner, home: Path, tmp_path: Path) -> None:
    """The README's first command, ``scripts/demo``, as a newcomer runs it (here against the
    test's server, with ``--quick``): it finds or makes the project venv, then runs the demo.
    In CI the venv is the one scripts/check just made, so no install happens here."""
    script = TESTS_DIR.parent / "scripts" / "demo"
    env = spawn.env(ECHOMQ_HOME=str(home), COLUMNS="160")
    done = subprocess.run(
        ["bash", str(script), "--quick"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "demo ok" in done.stdout
    assert "consistency check: clean" in done.stdout


def test_demo_runs_on_lua_when_the_built_module_will_not_load(
    spawn: Spawner, home: Path, tmp_path: Path
) -> None:
    """A stale or broken build in the module cache must not stop a newcomer's demo: the
    embedded server is started again without it, and the demo says so and runs on Lua."""
    so = tmp_path / "cache" / "echomq" / f"trafikey-{_native.MODULE_VERSION}" / "trafikey.so"
    so.parent.mkdir(parents=True)
    so.write_text("not a shared object")
    env = spawn.env(
        ECHOMQ_URL=None, ECHOMQ_HOME=str(home), XDG_CACHE_HOME=str(tmp_path / "cache"),
        COLUMNS="160",
    )  # fmt: skip
    demo = spawn.start("demo", "--jobs", "300", "--no-kill", env=env, cwd=tmp_path)
    rc = demo.wait(150)
    out = demo.text()
    assert rc == 0, out
    assert f"the server would not load the module {so}" in out
    assert "Can't load module" in out and "running on the Lua executor" in out
    assert "executor: lua" in out and "demo ok" in out
    assert pids_in(home) == []


def test_stop_outlasts_a_refused_sigterm(tmp_path: Path) -> None:
    """The server refuses a SIGTERM while it writes its first AOF, which a replica does right
    after its sync, and does not act on it later. stop() sends it again until it is taken; it
    used to wait out its whole timeout and SIGKILL the server (10 s per replica test)."""
    primary = EmbeddedServer(
        tmp_path / "primary", appendonly=False, args=["--repl-diskless-sync-delay", "0"]
    ).start()
    try:
        with redis.Redis(port=primary.port) as pr:
            # Enough data that the replica's first AOF takes a while to write.
            pr.eval("for i = 1, 400000 do redis.call('SET', 'k' .. i, i) end", 0)
            replica = EmbeddedServer(
                tmp_path / "replica", args=["--replicaof", "127.0.0.1", str(primary.port)]
            ).start()
            with redis.Redis(port=replica.port) as rr:
                wait_for(lambda: rr.info("replication")["master_link_status"] == "up")
                assert rr.dbsize() == 400000
            replica.stop(timeout=60)
            assert replica.proc is not None
            # Not SIGKILLed at the end of the timeout: the SIGTERM was taken (the outcome
            # says what an elapsed-time bound did, on a machine of any speed; issue 36).
            assert replica.proc.returncode == 0, replica.proc.returncode
    finally:
        primary.stop()


@pytest.mark.slow  # a (short) demo run
def test_demo_beside_a_recorded_server_runs_on_its_own(
    spawn: Spawner, home: Path, tmp_path: Path
) -> None:
    """Issue 36 #7: a recorded `echomq server` is the user's, holding their queues: the demo
    (20k jobs, a worker killed) runs on a private server of its own unless a server is
    named outright (--url, ECHOMQ_URL)."""
    cwd = tmp_path / "cwd"
    srv, info = recorded_server(spawn, home, cwd)
    wait_log(srv, f"export ECHOMQ_URL={info['url']}")
    env = no_url_env(spawn, home, COLUMNS="160")
    demo = spawn.start("demo", "--jobs", "200", "--workers", "1", "--no-kill", env=env, cwd=cwd)
    rc = demo.wait(150)
    out = demo.text()
    assert rc == 0, out
    assert "echomq: the demo runs on its own server; started an embedded one at" in out, out
    assert info["url"] not in out, out
    user = redis.Redis.from_url(info["url"])
    try:
        assert user.dbsize() == 0  # nothing of the demo's in the user's server
    finally:
        user.close()
