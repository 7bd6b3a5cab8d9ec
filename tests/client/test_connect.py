"""Where the server is (one answer for every entry point), and the redis-py internals the
fence relies on (a test that fails loudly when a redis-py release moves one)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

import echomq
from echomq.cli import main
from echomq.cli._common import _server_for
from echomq.client import connect as _connect
from echomq.client import redispy as _redispy
from echomq.errors import InvalidArgument
from echomq.server import EmbeddedServer

# --------------------------------------------------------------------------- resolve_url


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private state dir and no ECHOMQ_URL: nothing configured unless a test says so."""
    monkeypatch.setenv("ECHOMQ_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("ECHOMQ_URL", raising=False)
    return tmp_path / "state"


def _record(home: Path, pid: int, port: int, url: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "server.json").write_text(json.dumps({"pid": pid, "port": port, "url": url}))


def test_precedence_explicit_app_env_recorded_default(
    home: Path, server: EmbeddedServer | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if server is None:
        pytest.skip("needs the suite's own server process (not ECHOMQ_TEST_URL)")
    assert _connect.resolve_url()[:2] == (_connect.DEFAULT_URL, "default")
    assert _connect.configured() is None
    _record(home, server.pid or 0, server.port, server.url)
    assert _connect.resolve_url()[:2] == (server.url, "recorded")
    monkeypatch.setenv("ECHOMQ_URL", "redis://env:1/0")
    assert _connect.resolve_url()[:2] == ("redis://env:1/0", "env")
    assert _connect.resolve_url(None, "redis://app:1/0")[:2] == ("redis://app:1/0", "app")
    found = _connect.resolve_url("redis://x:1/0", "redis://app:1/0")
    assert found[:2] == ("redis://x:1/0", "explicit")


def test_a_dead_or_reused_pid_is_not_a_recorded_server(
    home: Path, server: EmbeddedServer | None
) -> None:
    if server is None:
        pytest.skip("needs the suite's own server process")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _record(home, dead.pid, server.port, server.url)
    assert _connect.recorded_url() is None
    # A live pid that is not the recorded server (its pid was reused): not taken.
    _record(home, os.getpid(), server.port, server.url)
    if Path("/proc/self/cmdline").exists():
        assert _connect.recorded_url() is None
    _record(home, server.pid or 0, server.port, server.url)
    assert _connect.recorded_url() == server.url
    (home / "server.json").write_text("{not json")
    assert _connect.recorded_url() is None


def test_queue_finds_a_recorded_server_as_app_does(
    home: Path, server: EmbeddedServer | None, r: redis.Redis, qname: str
) -> None:
    if server is None:
        pytest.skip("needs the suite's own server process")
    _record(home, server.pid or 0, server.port, server.url)
    app = echomq.App()
    assert app.url == server.url
    # retry_for=0: a queue that looked elsewhere fails at once instead of riding it out.
    with echomq.Queue(qname, retry_for=0) as q:
        job = q.enqueue(b"found")
    assert r.exists(f"emq:{{{qname}}}:job:{job.id}") == 1
    app.close()


def test_app_url_does_no_network_io(
    home: Path, server: EmbeddedServer | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if server is None:
        pytest.skip("needs the suite's own server process")
    _record(home, server.pid or 0, server.port, server.url)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("App.url opened a socket")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    app = echomq.App()
    assert app.url == server.url
    assert app.url == server.url  # resolved once, cached


def test_app_url_precedes_the_environment(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ECHOMQ_URL", "redis://env:1/0")
    assert echomq.App("redis://app:1/0").url == "redis://app:1/0"
    assert echomq.App().url == "redis://env:1/0"


def test_the_choice_is_logged_once_with_its_reason(
    home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"redis://user:s3cret@logged-{os.getpid()}:1/0"
    with caplog.at_level(logging.INFO, logger="echomq"):
        _connect.resolve_url(url)
        _connect.resolve_url(url)
        echomq.App(url).url  # noqa: B018 - the property resolves
    lines = [r.getMessage() for r in caplog.records if f"logged-{os.getpid()}" in r.getMessage()]
    assert len(lines) == 2  # once as explicit, once as App(url=...)
    assert "passed explicitly" in lines[0] and "App(url=...)" in lines[1]
    assert all("s3cret" not in line and ":***@" in line for line in lines)


def test_app_no_longer_imports_the_process_manager() -> None:
    code = "import sys, echomq, echomq.app, echomq.worker; print('echomq.server' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_cli_worker_honours_the_apps_url_before_starting_a_server(home: Path) -> None:
    ctx = click.Context(main, obj={"url": None})
    with _server_for(ctx, purpose="worker", app_url="redis://app:1/0") as url:
        assert url == "redis://app:1/0"
    assert not (home / "worker").exists()  # no embedded server was started
    ctx = click.Context(main, obj={"url": "redis://flag:1/0"})
    with _server_for(ctx, purpose="worker", app_url="redis://app:1/0") as url:
        assert url == "redis://flag:1/0"


def test_cli_url_flag_and_environment(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    seen: list[str] = []

    @main.command("_probe_url", hidden=True)
    @click.pass_context
    def probe(ctx: click.Context) -> None:
        from echomq.cli._common import _url

        seen.append(_url(ctx))

    try:
        runner = CliRunner()
        assert (
            runner.invoke(main, ["_probe_url"], env={"ECHOMQ_URL": "redis://e:1/0"}).exit_code == 0
        )
        assert runner.invoke(main, ["--url", "redis://f:1/0", "_probe_url"]).exit_code == 0
        assert runner.invoke(main, ["_probe_url"], env={"ECHOMQ_URL": None}).exit_code == 0
    finally:
        main.commands.pop("_probe_url", None)
    assert seen == ["redis://e:1/0", "redis://f:1/0", _connect.DEFAULT_URL]


@pytest.mark.parametrize("bad", [123, b"redis://x", ["redis://x"]])
def test_a_url_that_is_not_a_str_is_refused(bad: Any) -> None:
    with pytest.raises(InvalidArgument):
        echomq.Queue("q", url=bad)
    with pytest.raises(InvalidArgument):
        echomq.App(bad).url  # noqa: B018 - the property resolves


@pytest.mark.parametrize(
    ("url", "plain", "cluster", "durable"),
    [
        ("unix:///tmp/s.sock", "unix:///tmp/s.sock", False, 0),
        ("unix:///tmp/s.sock?db=2&durable=1", "unix:///tmp/s.sock?db=2", False, 1),
        ("redis://:pw@h:1/3?durable=2", "redis://:pw@h:1/3", False, 2),
        ("redis+cluster://h:1/0?x=1", "redis://h:1/0?x=1", True, 0),
        ("rediss://h:1/0?cluster=true&durable=yes", "rediss://h:1/0", True, 1),
    ],
)
def test_parse_url_keeps_the_url_redis_py_needs(
    url: str, plain: str, cluster: bool, durable: int
) -> None:
    assert _connect.parse_url(url) == (plain, cluster, durable)


def test_a_unix_socket_url_works(server: EmbeddedServer | None, qname: str) -> None:
    if server is None or not server.unix_socket:
        pytest.skip("needs the suite's own server process and its unix socket")
    with echomq.Queue(qname, url=f"unix://{server.socket_path}") as q:
        q.enqueue(b"x")
        assert q.pending_size() == 1

    async def main_() -> None:
        async with echomq.AsyncQueue(qname, url=f"unix://{server.socket_path}") as aq:
            assert await aq.pending_size() == 1

    asyncio.run(main_())


# --------------------------------------------------------------------------- retry policy


def test_backoff_delay_is_capped_and_jittered() -> None:
    for attempt in range(1, 40):
        d = _connect.backoff_delay(attempt)
        ideal = min(1.0, 0.05 * 2 ** (attempt - 1))
        assert ideal / 2 <= d <= ideal
    assert _connect.backoff_delay(3, base=1.0, cap=2.0) <= 2.0


@pytest.mark.parametrize("bad", [-1, float("inf"), float("nan"), True, "1", None])
def test_retry_for_is_checked(bad: Any) -> None:
    with pytest.raises(InvalidArgument):
        _connect.check_retry_for(bad)


# --------------------------------------------------------------------------- redis-py internals


def test_pool_attributes_exist_on_real_clients(url: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        client.ping()
        pool = client.connection_pool
        for name in _redispy.POOL_ATTRIBUTES:
            assert hasattr(pool, name), f"redis-py moved ConnectionPool.{name}"
        assert isinstance(pool.connection_kwargs, dict)
        targets = _redispy.hook_targets(client)
        assert targets[0] is pool.connection_kwargs and len(targets) >= 2  # the live connection
        conn = targets[1]
        assert hasattr(conn, _redispy.CONNECT_HOOK), "redis-py moved Connection.redis_connect_func"
        # The fence hook lands where the pool passes it to the connections it makes.
        q = echomq.Queue("connect-attrs", client=client)
        assert getattr(pool.connection_kwargs[_redispy.CONNECT_HOOK], "_echomq_fence", False)
        assert getattr(getattr(conn, _redispy.CONNECT_HOOK), "_echomq_fence", False)
        made = pool.make_connection()
        assert getattr(getattr(made, _redispy.CONNECT_HOOK), "_echomq_fence", False)
        made.disconnect()
        q.close()
    finally:
        client.close()


def test_async_pool_attributes_exist_on_real_clients(url: str) -> None:
    async def main_() -> None:
        client = redis.asyncio.Redis.from_url(url)
        try:
            await client.ping()
            pool = client.connection_pool
            for name in _redispy.POOL_ATTRIBUTES:
                assert hasattr(pool, name), f"redis-py moved asyncio ConnectionPool.{name}"
            echomq.AsyncQueue("connect-attrs", client=client)
            hook = pool.connection_kwargs[_redispy.CONNECT_HOOK]
            assert getattr(hook, "_echomq_fence", False)
            made = pool.make_connection()
            assert getattr(getattr(made, _redispy.CONNECT_HOOK), "_echomq_fence", False)
        finally:
            await client.aclose()

    asyncio.run(main_())


def test_async_clients_pack_commands_in_c_with_redis_pys_bytes_and_errors(url: str) -> None:
    """echomq's asyncio clients pack with hiredis (_redispy.pack_in_c): the same bytes as
    redis-py's own packer, its DataError for what neither packs, and real round trips."""

    async def main_() -> None:
        client = _connect.async_client(url)
        try:
            pool = client.connection_pool
            assert hasattr(pool, "connection_class"), "redis-py moved Pool.connection_class"
            conn = pool.make_connection()
            cls = type(conn)
            assert cls.pack_command is not redis.asyncio.Connection.pack_command
            python_pack = cls.__mro__[1].pack_command  # the packer it replaces
            for args in [
                ("EVALSHA", "a" * 40, 2, "emq:{q}:k", b"\x00\xffbytes", 7, -3, "\u00e9t\u00e9"),
                ("CLIENT SETINFO", "LIB-NAME", "x"),  # a two-word command name splits
                (b"SCRIPT LOAD", "return 1"),
                ("SET", "k", memoryview(b"view")),  # hiredis refuses: redis-py's packer
                ("SET", "k", 1.5),
            ]:
                assert b"".join(conn.pack_command(*args)) == b"".join(python_pack(conn, *args))
            for bad in (True, None, object()):
                with pytest.raises(redis.exceptions.DataError):
                    conn.pack_command("SET", "k", bad)
            # Pipelines pack through it too, and the server reads what it sends.
            async with client.pipeline(transaction=False) as pipe:
                pipe.set("pack-c", b"\x00v")
                pipe.get("pack-c")
                assert await pipe.execute() == [True, b"\x00v"]
            pack_again = type(pool.make_connection())
            _redispy.pack_in_c(pool)  # idempotent: no subclass of the subclass
            assert type(pool.make_connection()) is pack_again is cls
        finally:
            await client.aclose()

    asyncio.run(main_())


@pytest.fixture(scope="module")
def one_node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    """The smallest real cluster: one primary owning every slot."""
    from echomq.server import free_port

    node = EmbeddedServer(
        tmp_path_factory.mktemp("cluster1"),
        port=free_port(cluster=True),
        appendonly=False,
        unix_socket=False,
        args=["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"],
    ).start()
    with redis.Redis(port=node.port) as c:
        c.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        for _ in range(200):
            if b"cluster_state:ok" in c.execute_command("CLUSTER", "INFO"):
                break
            asyncio.run(asyncio.sleep(0.05))
    yield node
    node.stop()


def test_cluster_attributes_exist_on_real_clients(one_node_cluster: EmbeddedServer) -> None:
    rc = RedisCluster(host="127.0.0.1", port=one_node_cluster.port)
    try:
        is_cluster, _prev = _redispy.cluster_connect_hook(rc)
        assert is_cluster, "redis-py moved RedisCluster.user_on_connect_func"
        assert callable(rc.nodes_manager.initialize), "redis-py moved RedisCluster.nodes_manager"
        q = echomq.Queue("connect-cluster", client=rc)
        assert q.pending_size() == 0  # fenced through the hook or the client
        _redispy.refresh_slots(rc)
        # EMQ.* keys are read locally (no COMMAND GETKEYS), the parser's other work unchanged.
        assert type(rc.commands_parser) in _redispy._ROUTING.values(), "the parser was not routed"
        emq = ("EMQ.CLAIM", 2, "emq:{a}:meta", "emq:{a}:pending", "x")
        assert rc.commands_parser.get_keys(None, *emq) == ["emq:{a}:meta", "emq:{a}:pending"]
        assert rc.determine_slot(*emq) == rc.keyslot("emq:{a}:meta")
        assert rc.determine_slot("GET", "emq:{b}:x") == rc.keyslot("emq:{b}:x")
        q.close()
    finally:
        rc.close()

    async def main_() -> None:
        arc = AsyncRedisCluster(host="127.0.0.1", port=one_node_cluster.port)
        try:
            await arc.initialize()
            node = arc.get_node_from_key("emq:{connect-cluster}:meta")
            connection_class, kwargs = _redispy.node_pool_kwargs(node)
            assert isinstance(connection_class, type) and "host" in kwargs
            assert _redispy.CONNECT_HOOK not in kwargs
            await _redispy.refresh_slots(arc)
            aq = echomq.AsyncQueue("connect-cluster", client=arc, durable=1)
            emq = ("EMQ.CLAIM", 2, "emq:{a}:meta", "emq:{a}:pending", "x")
            assert await arc._determine_slot(*emq) == arc.keyslot("emq:{a}:meta")
            assert await arc._determine_slot("GET", "emq:{b}:x") == arc.keyslot("emq:{b}:x")
            aq._x.durable_timeout_ms = 10
            with pytest.raises(echomq.DurabilityError) as info:
                await aq.enqueue(b"x")  # the durable path builds a node client
            assert info.value.job_id is not None
            await aq._x.close()
        finally:
            await arc.aclose()

    asyncio.run(main_())


def test_async_sends_make_no_task_and_keep_redis_pys_errors(url: str) -> None:
    """echomq's asyncio connections send a command the socket takes whole without
    asyncio.wait_for (a task and an event-loop turn per command on Python 3.11); a write
    that must wait drains through redis-py's own path, and a dead connection still fails
    the way redis-py reports it (ConnectionError, then a reconnect on the next call)."""

    async def main_() -> None:
        client = _connect.async_client(url)
        admin = redis.Redis.from_url(url)
        waits = 0
        real_wait_for = asyncio.wait_for

        def counting(*a: Any, **kw: Any) -> Any:
            nonlocal waits
            waits += 1
            return real_wait_for(*a, **kw)

        try:
            conn = client.connection_pool.make_connection()
            for name in ("_reader", "_writer", "health_check_interval", "next_health_check"):
                assert hasattr(conn, name), f"redis-py moved asyncio Connection.{name}"
            await client.ping()  # connected: the fast path applies from here
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(asyncio, "wait_for", counting)
                for i in range(50):
                    assert await client.set(f"send-{i}", i)
                assert waits == 0
                # 32 MiB in one command: more than the socket takes at once, so the rest is
                # drained through redis-py's send (its wait_for and its timeout).
                big = b"x" * (32 << 20)
                assert await client.set("send-big", big)
                assert waits >= 1
            assert await client.strlen("send-big") == len(big)
            # The server drops the connection: the next command fails as redis-py says it
            # (no retry on echomq's clients), and the one after reconnects.
            mine = await client.client_id()
            admin.client_kill_filter(_id=mine)
            with pytest.raises(redis.exceptions.ConnectionError):
                for _ in range(3):  # the first write may land before the reset is seen
                    await client.get("send-0")
            assert await client.get("send-1") == b"1"
        finally:
            await client.aclose()
            admin.close()

    asyncio.run(main_())
