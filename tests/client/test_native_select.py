"""Executor selection: ``executor=`` / ``?executor=`` / ``ECHOMQ_EXECUTOR`` / auto, and the
native executor against a real server that loads the trafikey module (built from native/).

Every test runs against real redis-server processes started here; the module tests build
the module from the repository's C source first (a failed build fails them).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

import echomq
from echomq.cli import main
from echomq.client import native as _native
from echomq.errors import ExecutorUnavailable, InvalidArgument
from echomq.server import EmbeddedServer
from echomq.testing import EmbeddedCluster


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    srv = EmbeddedServer(tmp_path_factory.mktemp("plain"), appendonly=False).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def native_srv(
    tmp_path_factory: pytest.TempPathFactory, module_so: Path
) -> Iterator[EmbeddedServer]:
    srv = EmbeddedServer(
        tmp_path_factory.mktemp("native"),
        appendonly=False,
        args=["--loadmodule", str(module_so)],
    ).start()
    yield srv
    srv.stop()


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ECHOMQ_EXECUTOR", raising=False)


def _cmd(r: redis.Redis, *args: Any) -> Any:
    return r.execute_command(*args)  # type: ignore[no-untyped-call]


def _calls(r: redis.Redis, command: str) -> int:
    stats: dict[str, Any] = r.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def _scripts_run(r: redis.Redis) -> int:
    """Scripts the server ran: EVAL, and EVALSHA less its failures (a NOSCRIPT refusal is
    counted as a failed call, then the EVAL fallback runs the script: one run, not two)."""
    stats: dict[str, Any] = r.info("commandstats")
    sha = stats.get("cmdstat_evalsha", {})
    ran = int(sha.get("calls", 0)) - int(sha.get("failed_calls", 0))
    return ran + int(stats.get("cmdstat_eval", {}).get("calls", 0))


# --------------------------------------------------------------------------- resolution


def test_resolution_order(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "redis://127.0.0.1:1/0"
    assert _native.resolve_executor() == "auto"
    monkeypatch.setenv("ECHOMQ_EXECUTOR", "lua")
    assert _native.resolve_executor(None, url) == "lua"
    assert _native.resolve_executor(None, url + "?executor=native") == "native"
    assert _native.resolve_executor("auto", url + "?executor=native") == "auto"
    assert _native.resolve_executor("NATIVE", None) == "native"


def test_resolution_reaches_the_wire(
    plain: EmbeddedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a plain server, whichever source asked for native decides whether the first call
    raises: explicit > URL > env > auto."""
    url = plain.url
    # explicit lua beats the URL's native
    with echomq.Queue("res1", url=url + "?executor=native", executor="lua") as q:
        q.enqueue(b"x")
        assert q.executor == "lua"
    # the URL's lua beats the env's native
    monkeypatch.setenv("ECHOMQ_EXECUTOR", "native")
    with echomq.Queue("res2", url=url + "?executor=lua") as q:
        q.enqueue(b"x")
        assert q.executor == "lua"
    # the env's native beats auto
    with echomq.Queue("res3", url=url) as q, pytest.raises(ExecutorUnavailable):
        q.enqueue(b"x")
    monkeypatch.setenv("ECHOMQ_EXECUTOR", "lua")
    # the URL's native beats the env's lua
    with (
        echomq.Queue("res4", url=url + "?executor=native") as q,
        pytest.raises(ExecutorUnavailable),
    ):
        q.enqueue(b"x")


def test_an_apps_url_chooses_the_executor(
    native_srv: EmbeddedServer, plain: EmbeddedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """App(url="...?executor=") reaches its queues and tasks as it does Queue(url=...): the
    app opens one client for its queues, so the option must travel apart from the URL (it
    was dropped once, and every App ran on auto)."""
    monkeypatch.delenv("ECHOMQ_EXECUTOR", raising=False)
    r = redis.Redis.from_url(native_srv.url)
    for mode in ("lua", "native"):
        app = echomq.App(native_srv.url + f"?executor={mode}")
        task = app.task(queue=f"app-{mode}", name="t")(lambda i: None)
        before = r.info("commandstats").get("cmdstat_emq.enqueue", {}).get("calls", 0)
        task.enqueue(1)
        after = r.info("commandstats").get("cmdstat_emq.enqueue", {}).get("calls", 0)
        assert app.queue(f"app-{mode}").executor == mode
        assert after - before == (1 if mode == "native" else 0), mode
        app.close()
    r.close()
    # A URL asking for native on a server without the module refuses, as Queue does.
    app = echomq.App(plain.url + "?executor=native")
    task = app.task(queue="app-plain", name="t")(lambda i: None)
    with pytest.raises(ExecutorUnavailable):
        task.enqueue(1)
    app.close()


async def test_an_apps_url_chooses_the_async_executor(native_srv: EmbeddedServer) -> None:
    app = echomq.App(native_srv.url + "?executor=lua")
    task = app.task(queue="app-async", name="t")(lambda i: None)
    await task.aenqueue(1)
    assert app.aqueue("app-async").executor == "lua"
    await app.aclose()


@pytest.mark.parametrize("where", ["argument", "url", "env"])
def test_bad_value_is_typed_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    with EmbeddedServer(tmp_path, appendonly=False) as srv:
        r = redis.Redis.from_url(srv.url)
        before = _calls(r, "evalsha") + _calls(r, "eval") + _calls(r, "set")
        url = srv.url + ("?executor=turbo" if where == "url" else "")
        if where == "env":
            monkeypatch.setenv("ECHOMQ_EXECUTOR", "turbo")
        for cls in (echomq.Queue, echomq.AsyncQueue):
            kwargs: dict[str, Any] = {"executor": "turbo"} if where == "argument" else {}
            with pytest.raises(InvalidArgument, match="turbo"):
                cls("bad", url=url, **kwargs)
        assert r.dbsize() == 0
        assert _calls(r, "evalsha") + _calls(r, "eval") + _calls(r, "set") == before
        r.close()


def test_executor_argument_type_checked() -> None:
    with pytest.raises(InvalidArgument):
        echomq.Queue("x", url="redis://127.0.0.1:1/0", executor=3)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- a plain server


def test_auto_on_plain_server_is_lua(plain: EmbeddedServer) -> None:
    with echomq.Queue("auto-plain", url=plain.url) as q:
        assert q.executor is None  # not decided before the first call
        q.enqueue(b"x")
        assert q.executor == "lua"


async def test_async_auto_on_plain_server_is_lua(plain: EmbeddedServer) -> None:
    async with echomq.AsyncQueue("auto-plain-a", url=plain.url) as q:
        await q.enqueue(b"x")
        assert q.executor == "lua"


def test_native_on_plain_server_raises_at_connect(plain: EmbeddedServer) -> None:
    r = redis.Redis.from_url(plain.url)
    with echomq.Queue("native-plain", url=plain.url, executor="native") as q:
        with pytest.raises(ExecutorUnavailable, match="does not load the trafikey"):
            q.enqueue(b"x")
        assert q.executor is None
    assert r.exists("emq:{native-plain}:pending") == 0
    r.close()


async def test_async_native_on_plain_server_raises(plain: EmbeddedServer) -> None:
    async with echomq.AsyncQueue("native-plain-a", url=plain.url, executor="native") as q:
        with pytest.raises(ExecutorUnavailable):
            await q.enqueue(b"x")


def test_module_list_refused_by_acl(plain: EmbeddedServer) -> None:
    """A user without MODULE: auto runs Lua, native is refused with the reason."""
    admin = redis.Redis.from_url(plain.url)
    _cmd(admin, "ACL", "SETUSER", "nomod", "on", ">pw", "~*", "&*", "+@all", "-module")
    url = f"redis://nomod:pw@127.0.0.1:{plain.port}/0"
    try:
        with echomq.Queue("acl", url=url) as q:
            q.enqueue(b"x")
            assert q.executor == "lua"
        with (
            echomq.Queue("acl", url=url, executor="native") as q,
            pytest.raises(ExecutorUnavailable, match="refused MODULE LIST"),
        ):
            q.enqueue(b"x")
    finally:
        _cmd(admin, "ACL", "DELUSER", "nomod")
        admin.close()


def test_decide_versions() -> None:
    entry = [b"name", b"trafikey", b"ver", _native.MODULE_VERSION, b"path", b"/x.so"]
    other = [b"name", b"trafikey", b"ver", _native.MODULE_VERSION + 1]
    assert _native.decide("auto", [[entry]]) is True
    assert _native.decide("auto", [[entry], []]) is False  # one primary without it
    assert _native.decide("auto", [[other]]) is False
    with pytest.raises(ExecutorUnavailable, match="version"):
        _native.decide("native", [[other]])
    assert _native.decide("lua", [[entry]]) is False


# --------------------------------------------------------------------------- with the module


@pytest.mark.module
def test_auto_with_module_runs_twins_natively(native_srv: EmbeddedServer) -> None:
    r = redis.Redis.from_url(native_srv.url)
    assert _native.loaded_version(_cmd(r, "MODULE", "LIST")) == _native.MODULE_VERSION
    enq0, evalsha0 = _calls(r, "emq.enqueue"), _scripts_run(r)
    ext0, rep0 = _calls(r, "emq.extend"), _calls(r, "emq.reprocess")
    with echomq.Queue("nat", url=native_srv.url) as q:
        sent = q.enqueue(b"hello", group="g1")
        assert q.executor == "native"
        assert _calls(r, "emq.enqueue") == enq0 + 1
        # the enqueue went as EMQ.ENQUEUE: only the version fence's commands, and one script,
        # the minter's node lease (node_lease has no twin: a script on both executors)
        assert _scripts_run(r) == evalsha0 + 1
        cl0 = _calls(r, "emq.claim")
        job = q.claim(lease_ms=5_000)
        assert job is not None and job.id == sent.id and job.payload == b"hello"
        assert _calls(r, "emq.claim") == cl0 + 1
        # a verb without a twin (pause_lane) still runs as a script
        q.pause_lane("g2")
        assert _scripts_run(r) > evalsha0
        q.extend(job.id, job.token, lease_ms=10_000)
        assert _calls(r, "emq.extend") == ext0 + 1
        assert q.retry(job.id, job.token, delay_ms=0, max_attempts=1, error="boom") == "dead"
        q.reprocess(job.id)
        assert _calls(r, "emq.reprocess") == rep0 + 1
        again = q.claim(lease_ms=5_000)
        assert again is not None and again.id == job.id
        co0 = _calls(r, "emq.complete")
        q.complete(again.id, again.token)
        assert _calls(r, "emq.complete") == co0 + 1
        assert q.counts()["completed"] == 1
        # a pipeline (enqueue_many) carries the twin too
        before = _calls(r, "emq.enqueue")
        done = q.enqueue_many([b"a", b"b", b"c"])
        assert all(isinstance(d, echomq.Enqueued) for d in done)
        assert _calls(r, "emq.enqueue") > before
        assert q.pending_size() == 3
        assert q.check() == []
    r.close()


@pytest.mark.module
async def test_async_native_round_trip(native_srv: EmbeddedServer) -> None:
    r = redis.Redis.from_url(native_srv.url)
    enq0 = _calls(r, "emq.enqueue")
    async with echomq.AsyncQueue("nat-a", url=native_srv.url, executor="native") as q:
        sent = await q.enqueue(b"x")
        assert q.executor == "native"
        job = await q.claim(lease_ms=5_000)
        assert job is not None and job.id == sent.id
        await q.extend(job.id, job.token, lease_ms=8_000)
        await q.complete(job.id, job.token)
    assert _calls(r, "emq.enqueue") == enq0 + 1
    r.close()


@pytest.mark.module
def test_lua_forced_on_module_server(native_srv: EmbeddedServer) -> None:
    r = redis.Redis.from_url(native_srv.url)
    enq0 = _calls(r, "emq.enqueue")
    with echomq.Queue("nat-lua", url=native_srv.url, executor="lua") as q:
        q.enqueue(b"x")
        assert q.executor == "lua"
    assert _calls(r, "emq.enqueue") == enq0
    r.close()


# --------------------------------------------------------------------------- the command line


@pytest.mark.module
def test_module_build_prints_a_loadable_line(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    result = CliRunner().invoke(main, ["module", "build", "--dest", str(dest)])
    assert result.exit_code == 0, result.output
    line = result.stdout.strip().splitlines()[-1]
    assert line.startswith("--loadmodule /")
    path = Path(line.split(" ", 1)[1])
    assert path.is_file() and path.parent == dest.resolve()
    with EmbeddedServer(tmp_path / "srv", appendonly=False, args=["--loadmodule", str(path)]) as s:
        r = redis.Redis.from_url(s.url)
        modules = _cmd(r, "MODULE", "LIST")
        assert _native.loaded_version(modules) == _native.MODULE_VERSION
        r.close()


def test_module_path_honours_xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    result = CliRunner().invoke(main, ["module", "path"])
    assert result.exit_code == 1
    assert str(tmp_path / "echomq" / f"trafikey-{_native.MODULE_VERSION}") in result.output


def test_stats_names_lua(plain: EmbeddedServer) -> None:
    result = CliRunner().invoke(main, ["--url", plain.url, "stats"])
    assert result.exit_code == 0, result.output
    assert "executor: lua" in result.output


@pytest.mark.module
def test_stats_names_native(native_srv: EmbeddedServer) -> None:
    result = CliRunner().invoke(main, ["--url", native_srv.url, "stats"])
    assert result.exit_code == 0, result.output
    assert "executor: native" in result.output


@pytest.mark.module
def test_server_native_builds_and_loads(tmp_path: Path) -> None:
    """`echomq server --native` with an empty cache: builds the module, then serves it."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "ECHOMQ_HOME": str(tmp_path)}
    env.pop("ECHOMQ_URL", None)
    cmd = [sys.executable, "-m", "echomq", "server", "--native", "--dir", str(tmp_path / "data")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().decode()
        assert first.startswith("echomq server: redis://"), first
        url = first.split()[2]
        lines = [proc.stdout.readline().decode() for _ in range(2)]
        assert "native executor: trafikey loaded from" in lines[1], lines
        assert (
            tmp_path / "cache" / "echomq" / f"trafikey-{_native.MODULE_VERSION}" / "trafikey.so"
        ).is_file()
        with echomq.Queue("srv-native", url=url) as q:
            q.enqueue(b"x")
            assert q.executor == "native"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
    assert proc.returncode == 0


# --------------------------------------------------------------------------- cluster


@pytest.mark.cluster
@pytest.mark.module
@pytest.mark.parametrize("loaded", [True, False])
async def test_cluster_native_only_when_every_primary_has_it(
    tmp_path: Path, module_so: Path, loaded: bool
) -> None:
    args = ["--loadmodule", str(module_so)] if loaded else []
    with EmbeddedCluster(tmp_path, masters=3, replicas=0, args=args) as c:
        with echomq.Queue("cq", url=c.url) as q:
            q.enqueue(b"x")
            assert q.executor == ("native" if loaded else "lua")
            job = q.claim(lease_ms=5_000)
            assert job is not None
            q.extend(job.id, job.token, lease_ms=5_000)
            q.complete(job.id, job.token)
        async with echomq.AsyncQueue("cq", url=c.url) as aq:
            await aq.enqueue(b"y")
            assert aq.executor == ("native" if loaded else "lua")
        if not loaded:
            with (
                echomq.Queue("cq", url=c.url, executor="native") as q,
                pytest.raises(ExecutorUnavailable),
            ):
                q.enqueue(b"z")


# --------------------------------------------------------------------------- losing the module


@pytest.mark.parametrize("mode", ["auto", "native"])
def test_a_server_that_answers_emq_as_unknown(
    redis_url: str, qname: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An executor that chose native meets a server without the module (on a cluster: a
    promoted replica without it; simulated here by the choice made beforehand). A single call
    and a pipeline: ``auto`` resends them as Lua (one WARNING); ``native`` raises, or gives
    the pipeline's refused calls, ``ExecutorUnavailable`` naming the server."""
    import logging

    from echomq.client.executor import SyncExecutor
    from echomq.protocol import calls as _p

    x = SyncExecutor(redis.Redis.from_url(redis_url), owned=True, executor="lua")
    try:
        k = _p.Keys(qname)
        assert x.call(_p.claim(k, 1_000)) is None  # fenced, on Lua
        x.mode, x.native = mode, True  # as if it had been decided where the module was
        with caplog.at_level(logging.WARNING, logger="echomq"):
            if mode == "auto":
                assert x.call(_p.claim(k, 1_000)) is None
                assert x.executor == "lua"
                assert x.pipeline([_p.claim(k, 1_000), _p.pending_size(k)]) == [None, 0]
            else:
                with pytest.raises(ExecutorUnavailable, match="does not load the trafikey"):
                    x.call(_p.claim(k, 1_000))
                got = x.pipeline([_p.claim(k, 1_000), _p.pending_size(k)])
                assert isinstance(got[0], ExecutorUnavailable) and got[1] == 0, got
        warned = [r for r in caplog.records if "trafikey" in r.getMessage()]
        assert len(warned) == (1 if mode == "auto" else 0)
    finally:
        x.close()
