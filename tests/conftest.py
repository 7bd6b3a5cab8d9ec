"""Fixtures: real redis-server processes started and stopped by the tests themselves.

The session server runs on a free port in a temp dir (``ECHOMQ_TEST_URL`` points the suite
at another server instead). Each test gets a unique queue name, never a FLUSHALL, and a
SCRIPT FLUSH so the NOSCRIPT -> EVAL path runs all the time.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis
import redis.asyncio

import echomq
from echomq import _native
from echomq._scripts import SCRIPTS
from echomq.server import EmbeddedServer

# procs.py holds the subprocess helpers and the `spawn` fixture every process test uses;
# pytester runs a user's test file against echomq's own pytest plugin (test_testing_helpers).
pytest_plugins = ["procs", "pytester"]

_counter = itertools.count()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer | None]:
    if os.environ.get("ECHOMQ_TEST_URL"):
        yield None
        return
    srv = EmbeddedServer(tmp_path_factory.mktemp("redis"), appendonly=False).start()
    expect_server_kind(srv)
    _session_servers.append(srv)
    yield srv
    srv.stop()


# Servers this session started (never one it was pointed at): emptied after each module.
_session_servers: list[EmbeddedServer] = []


@pytest.fixture(autouse=True, scope="module")
def _empty_session_servers_after_module() -> Iterator[None]:
    """Every test names its queues uniquely, so a finished module's keys are never read
    again; but check() and the raw checkers SCAN the whole keyspace, and session servers
    that kept every module's keys (~48k by the end of a run) made those tests minutes
    slower. Each module starts from servers that hold only its own keys."""
    yield
    for srv in _session_servers:
        with contextlib.suppress(redis.ConnectionError), redis.Redis.from_url(srv.url) as c:
            c.flushall()


def expect_server_kind(srv: EmbeddedServer) -> None:
    """ECHOMQ_TEST_SERVER_NAME (set by test_valkey's nested run) is the INFO `server_name`
    the session's servers must report, so a run meant for Valkey cannot pass on Redis."""
    want = os.environ.get("ECHOMQ_TEST_SERVER_NAME")
    if want:
        with redis.Redis.from_url(srv.url) as c:
            got = c.info("server").get("server_name", "redis")
        assert got == want, f"{srv.url} is {got!r}, not {want!r}"


@pytest.fixture(scope="session")
def session_url(server: EmbeddedServer | None) -> str:
    return os.environ.get("ECHOMQ_TEST_URL") or (server.url if server else "")


# --------------------------------------------------------------------------- both executors
# A test module with `pytestmark = pytest.mark.executors` runs each test that reaches a server
# (through `url`/`redis_url`) twice: [lua] on the session server, [native] on one session
# server that loads trafikey, with `?executor=native` in `url` and ECHOMQ_EXECUTOR=native (so
# a Queue built from a raw client is native too). `@pytest.mark.executors("lua")` on one test
# keeps it on the Lua leg only (a test about EVAL/EVALSHA itself).

LEGS = ("lua", "native")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "executors(*legs): run the test on the lua and native executors"
    )
    _isolate_from_the_users_home()


_saved_env: dict[str, str] | None = None
_private_home: str | None = None


def _isolate_from_the_users_home() -> None:
    """The whole session, and every process it starts, runs with a HOME, XDG_CACHE_HOME and
    ECHOMQ_HOME of its own and none of the user's ECHOMQ_* settings (ECHOMQ_TEST_* stay:
    they steer the suite; so does ECHOMQ_SERVER_BIN, the binary the suite's servers run,
    which test_valkey's nested run sets): a module the user built into ~/.cache/echomq, a
    server recorded in ./.echomq, an ECHOMQ_URL or ECHOMQ_EXECUTOR in the shell can never
    change what a test sees. Set at configure time, before any fixture or test reads them."""
    global _saved_env, _private_home
    if _saved_env is not None:
        return
    import tempfile

    _saved_env = dict(os.environ)
    _private_home = tempfile.mkdtemp(prefix="echomq-test-home-")
    for key in [k for k in os.environ if k.startswith("ECHOMQ_")]:
        if not key.startswith("ECHOMQ_TEST_") and key != "ECHOMQ_SERVER_BIN":
            del os.environ[key]
    os.environ["HOME"] = os.path.join(_private_home, "home")
    os.environ["XDG_CACHE_HOME"] = os.path.join(_private_home, "cache")
    os.environ["ECHOMQ_HOME"] = os.path.join(_private_home, "state")
    os.makedirs(os.environ["HOME"])


def pytest_unconfigure(config: pytest.Config) -> None:
    global _saved_env, _private_home
    if _saved_env is None:
        return
    import shutil

    os.environ.clear()
    os.environ.update(_saved_env)
    _saved_env = None
    if _private_home is not None:
        shutil.rmtree(_private_home, ignore_errors=True)
        _private_home = None


@pytest.fixture(autouse=True, scope="session")
def _valkey_run_beside_the_suite(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """Start test_valkey's nested run at the session's first test when it is selected: it
    then runs beside the rest of the suite instead of after it (test_valkey.Nested says why
    that is safe). A run the test never waited for is stopped at the session's end."""
    import test_valkey

    if any(item.nodeid == test_valkey.NESTED_NODE for item in request.session.items):
        test_valkey.start_nested(tmp_path_factory.mktemp("valkey-nested"))
    yield
    test_valkey.stop_nested()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("executors")
    if marker is None or not {"url", "redis_url"} & set(metafunc.fixturenames):
        return  # a test that never reaches a server has nothing to compare
    legs = [leg for leg in LEGS if leg in (marker.args or LEGS)]
    metafunc.parametrize("executor", legs, indirect=True, ids=legs)


@pytest.fixture(scope="session")
def module_so(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """trafikey.so built once a session by make -C on a copy of native/ (the tree another
    helper may be editing is never written to, and a rebuild there cannot change the file a
    running server mapped). A failed build is an error of every test using it, never a skip."""
    return _native.build(tmp_path_factory.mktemp("trafikey"))


@pytest.fixture(scope="session")
def module_server(
    tmp_path_factory: pytest.TempPathFactory, module_so: Path
) -> Iterator[EmbeddedServer]:
    srv = EmbeddedServer(
        tmp_path_factory.mktemp("redis-native"),
        appendonly=False,
        args=["--loadmodule", str(module_so)],
    ).start()
    expect_server_kind(srv)
    _session_servers.append(srv)
    yield srv
    srv.stop()


@pytest.fixture
def executor(request: pytest.FixtureRequest) -> str | None:
    """The leg of an `executors`-marked test; None for every other test."""
    return cast("str | None", getattr(request, "param", None))


@pytest.fixture
def redis_url(request: pytest.FixtureRequest, executor: str | None, session_url: str) -> str:
    """The leg's server, with no echomq option (for raw redis clients)."""
    if executor != "native":
        return session_url
    srv: EmbeddedServer = request.getfixturevalue("module_server")
    return srv.url


@pytest.fixture
def url(executor: str | None, redis_url: str) -> str:
    return redis_url + "?executor=native" if executor == "native" else redis_url


@pytest.fixture(autouse=True)
def _executor_leg(request: pytest.FixtureRequest) -> Iterator[None]:
    """Pins ECHOMQ_EXECUTOR to the leg, and on the native leg proves no twin ran as Lua.

    The check: SCRIPT FLUSH before the test, and after it SCRIPT EXISTS of every script that
    has a native twin (_native.TWINS) must be all false. EVALSHA -> NOSCRIPT -> EVAL is the
    only way a script runs from the Lua executor, and EVAL caches the script, so a twin that
    went as Lua on this leg leaves its sha behind. Two round trips a test; it cannot be
    fooled by a queue's reported `executor`, and it follows TWINS as twins are added."""
    leg = getattr(getattr(request.node, "callspec", None), "params", {}).get("executor")
    if leg is None:
        yield
        return
    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    monkeypatch.setenv("ECHOMQ_EXECUTOR", leg)
    if leg != "native":
        yield
        return
    client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
    shas = {name: SCRIPTS[name].sha for name in sorted(_native.TWINS)}
    try:
        client.script_flush()
        yield
        cached = client.script_exists(*shas.values())
        ran_as_lua = [name for name, hit in zip(shas, cached, strict=True) if hit]
        assert not ran_as_lua, f"on the native leg these twins ran as Lua scripts: {ran_as_lua}"
    finally:
        client.close()


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    """A raw client for asserting wire state (bytes replies)."""
    client = redis.Redis.from_url(redis_url)
    client.script_flush()
    yield client
    client.close()


@pytest.fixture
def qname(request: pytest.FixtureRequest) -> str:
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:80]
    return f"t{next(_counter)}-{os.getpid()}-{name}"


@pytest.fixture
def q(url: str, qname: str, r: redis.Redis) -> Iterator[echomq.Queue]:
    queue = echomq.Queue(qname, url=url)
    yield queue
    queue.close()


@pytest.fixture
async def aq(url: str, qname: str, r: redis.Redis) -> AsyncIterator[echomq.AsyncQueue]:
    queue = echomq.AsyncQueue(qname, url=url)
    yield queue
    await queue.aclose()


@pytest.fixture(params=["sync", "async"])
def anyq(request: pytest.FixtureRequest, url: str, qname: str, r: redis.Redis) -> Iterator[Any]:
    """The same test on Queue and on AsyncQueue (driven through a small sync adapter)."""
    if request.param == "sync":
        queue = echomq.Queue(qname, url=url)
        yield queue
        queue.close()
    else:
        adapter = SyncOverAsync(echomq.AsyncQueue(qname, url=url))
        yield adapter
        adapter.close()


class SyncOverAsync:
    """Runs every AsyncQueue verb to completion on a private loop, so one test body covers
    both classes. Only used by tests."""

    def __init__(self, aq: echomq.AsyncQueue) -> None:
        import asyncio

        self._aq = aq
        self._loop = asyncio.new_event_loop()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._aq, name)
        if not callable(attr):
            return attr

        def run(*args: Any, **kwargs: Any) -> Any:
            return self._loop.run_until_complete(attr(*args, **kwargs))

        return run

    def close(self) -> None:
        self._loop.run_until_complete(self._aq.aclose())
        self._loop.close()


def wait_for(pred: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll ``pred`` until it returns a truthy value; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def snapshot(r: redis.Redis, queue: str) -> dict[bytes, Any]:
    """Every key of the queue with its type and full content (for 'nothing written' tests)."""
    out: dict[bytes, Any] = {}
    for key in sorted(r.scan_iter(match=f"emq:{{{queue}}}:*", count=1000)):
        kind = r.type(key)
        if kind == b"hash":
            out[key] = ("hash", r.hgetall(key))
        elif kind == b"zset":
            out[key] = ("zset", r.zrange(key, 0, -1, withscores=True))
        elif kind == b"list":
            out[key] = ("list", r.lrange(key, 0, -1))
        elif kind == b"set":
            out[key] = ("set", r.smembers(key))
        else:
            out[key] = (kind, r.dump(key))
    return out


def server_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def tmp_server(path: Path, **kw: Any) -> EmbeddedServer:
    return EmbeddedServer(path, **kw).start()
