"""Auto-pipelining of asyncio enqueues (issue 28, src/echomq/client/autopipe.py): the enqueues that
concurrent coroutines make on one AsyncQueue (or App) in one loop turn go out as one pipeline
write; each caller gets its own receipt or its own typed error; a batch whose connection is
killed admits every caller's job exactly once (the replay markers answer the resends)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import echomq
from echomq import ids
from echomq.errors import InvalidArgument, KindError
from echomq.server import EmbeddedServer

pytestmark = pytest.mark.executors


def K(q: str, suffix: str) -> str:
    return "emq:{" + q + "}:" + suffix


class Writes:
    """Counts the writes an asyncio client's connections make to their sockets (one per
    command, or per whole pipeline: one round trip each), and the script calls they carry."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, client: Any) -> None:
        cls = client.connection_pool.connection_class
        orig = cls.send_packed_command
        self.writes = 0
        self.calls = 0

        async def counting(conn: Any, command: Any, check_health: bool = True) -> None:
            data = b"".join(command) if isinstance(command, list) else bytes(command)
            self.writes += 1
            self.calls += data.count(b"EVALSHA") + data.count(b"EMQ.ENQUEUE")
            await orig(conn, command, check_health)

        monkeypatch.setattr(cls, "send_packed_command", counting)


def top_level_calls(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return sum(
        int(v["calls"])
        for k, v in stats.items()
        if k in ("cmdstat_evalsha", "cmdstat_eval") or k.startswith("cmdstat_emq.")
    )


async def test_concurrent_enqueues_go_out_in_one_write(
    aq: echomq.AsyncQueue, r: redis.Redis, qname: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Fenced, executor chosen, script cached, and the connections a burst uses are open.
    await asyncio.gather(*(aq.enqueue(b"warm") for _ in range(100)))
    writes = Writes(monkeypatch, aq.client)
    r.config_resetstat()
    got = await asyncio.gather(*(aq.enqueue(str(i).encode()) for i in range(100)))
    assert [e.status for e in got] == ["enqueued"] * 100
    assert len({e.id for e in got}) == 100
    # The first call goes at once (nothing was in flight), the 99 others in one write.
    assert writes.writes == 2, (writes.writes, writes.calls)
    assert writes.calls == 100
    assert top_level_calls(r) == 100  # each enqueue sent once
    pending = {m.decode() for m in r.zrange(K(qname, "pending"), 0, -1)}
    assert pending >= {e.id for e in got} and len(pending) == 200
    for e, i in zip(got, range(100), strict=True):
        assert r.hget(K(qname, "job:" + e.id), "payload") == str(i).encode()


async def test_a_lone_enqueue_is_not_pipelined(
    aq: echomq.AsyncQueue, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    await aq.enqueue(b"warm")
    writes = Writes(monkeypatch, aq.client)
    for i in range(5):
        assert (await aq.enqueue(str(i).encode())).status == "enqueued"
    assert (writes.writes, writes.calls) == (5, 5)


async def test_each_caller_gets_its_own_error_and_the_others_succeed(
    aq: echomq.AsyncQueue, r: redis.Redis, qname: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = ids.mint()
    await aq.enqueue(b"first", id=taken)
    await asyncio.gather(aq.enqueue(b"warm"), aq.enqueue(b"warm"))  # two connections open
    writes = Writes(monkeypatch, aq.client)
    r.config_resetstat()
    calls = [aq.enqueue(str(i).encode()) for i in range(10)]
    calls.insert(3, aq.enqueue(b"not a job", id=ids.encode("USR", 7)))  # refused by the server
    calls.insert(6, aq.enqueue(b"bad", delay_ms=-1))  # refused before anything is sent
    calls.insert(9, aq.enqueue(b"again", id=taken))  # its own receipt: duplicate
    got = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(got[3], KindError), got[3]
    assert isinstance(got[6], InvalidArgument), got[6]
    assert isinstance(got[9], echomq.Enqueued) and got[9].status == "duplicate"
    assert got[9].id == taken
    good = [g for i, g in enumerate(got) if i not in (3, 6, 9)]
    assert all(isinstance(g, echomq.Enqueued) and g.status == "enqueued" for g in good), got
    assert writes.writes == 2  # the first call alone, then the batch
    assert top_level_calls(r) == 12  # 10 good, the refused kind, the duplicate
    assert r.hget(K(qname, "job:" + taken), "payload") == b"first"
    assert not r.exists(K(qname, "job:" + ids.encode("USR", 7)))
    assert r.zcard(K(qname, "pending")) == 13


async def test_task_aenqueue_on_an_app_is_coalesced(
    url: str, r: redis.Redis, qname: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = echomq.App(url)
    task = app.task(queue=qname, name="t")(lambda i: i)
    try:
        await asyncio.gather(task.aenqueue(0), task.aenqueue(0))
        writes = Writes(monkeypatch, app.aqueue(qname).client)
        got = await asyncio.gather(*(task.aenqueue(i) for i in range(50)))
        assert [e.status for e in got] == ["enqueued"] * 50
        assert (writes.writes, writes.calls) == (2, 50)
        assert r.zcard(K(qname, "pending")) == 52
    finally:
        await app.aclose()


async def test_a_cancelled_caller_does_not_strand_the_others(
    aq: echomq.AsyncQueue, r: redis.Redis, qname: str
) -> None:
    await aq.enqueue(b"warm")
    first = asyncio.ensure_future(aq.enqueue(b"leader"))  # leads the batch of this turn
    rest = [asyncio.ensure_future(aq.enqueue(str(i).encode())) for i in range(5)]
    await asyncio.sleep(0)
    first.cancel()  # while it waits for the batch to form
    got = await asyncio.wait_for(asyncio.gather(*rest), 60)
    assert [e.status for e in got] == ["enqueued"] * 5
    assert first.cancelled()
    assert r.zcard(K(qname, "pending")) in (6, 7)  # the leader's own may or may not go


# --------------------------------------------------------------------------- killed mid-batch


@pytest.fixture(params=["lua", "native"])
def leg(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def own_server(tmp_path: Path, leg: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A private server (CLIENT KILL must not reach the session's other clients), with the
    module on the native leg."""
    args = []
    if leg == "native":
        args = ["--loadmodule", str(request.getfixturevalue("module_so"))]
    srv = EmbeddedServer(tmp_path, appendonly=False, args=args).start()
    yield srv.url
    srv.stop()


def _kill_after_send(
    monkeypatch: pytest.MonkeyPatch, client: Any, admin: redis.Redis, before: Any
) -> dict[str, int]:
    """On the first write that carries a batch of enqueues: run ``before(admin)`` once the
    write is out (it waits for what the server must have done), then kill every client
    connection but the admin's (CLIENT KILL) and drop this end's socket with whatever it
    received unread (the replies may be in the kernel's buffer already: a killed connection
    loses what the client had not read), so the batch's replies are lost."""
    cls = client.connection_pool.connection_class
    orig = cls.send_packed_command
    seen = {"kills": 0, "calls": 0}

    async def send(conn: Any, command: Any, check_health: bool = True) -> None:
        data = b"".join(command) if isinstance(command, list) else bytes(command)
        n = data.count(b"EVALSHA") + data.count(b"EMQ.ENQUEUE")
        seen["calls"] += n
        await orig(conn, command, check_health)
        if n > 1 and not seen["kills"]:
            seen["kills"] += 1
            before(admin)
            admin.client_kill_filter(_type="normal", skipme=True)
            admin.client_unpause()
            conn._writer.transport.abort()

    monkeypatch.setattr(cls, "send_packed_command", send)
    return seen


def _wait_zcard(r: redis.Redis, key: str, n: int) -> None:
    deadline = time.monotonic() + 10
    while r.zcard(key) < n:
        assert time.monotonic() < deadline, (r.zcard(key), n)
        time.sleep(0.005)


@pytest.mark.parametrize("landed", [True, False], ids=["replies-lost", "nothing-landed"])
async def test_a_batch_killed_mid_flight_admits_every_job_exactly_once(
    own_server: str, leg: str, monkeypatch: pytest.MonkeyPatch, landed: bool
) -> None:
    """replies-lost: the server ran the whole batch, then the connection was killed before
    any reply was read: every resend finds its first copy's marker (``replayed``).
    nothing-landed: the server was paused before the batch arrived and the connection killed
    while it waited: every resend is its call's first landing and is admitted."""
    n = 60
    name = f"kill-{landed}"
    admin = redis.Redis.from_url(own_server)
    aq = echomq.AsyncQueue(name, url=own_server, executor=leg)
    try:
        await aq.enqueue(b"warm")
        if not landed:
            admin.client_pause(10_000, all=False)  # WRITE: scripts wait, CLIENT KILL runs

        def before(a: redis.Redis) -> None:
            if landed:
                _wait_zcard(a, K(name, "pending"), n + 1)
            else:
                time.sleep(0.2)  # the batch reaches the server and waits behind the pause
                assert a.zcard(K(name, "pending")) == 1

        seen = _kill_after_send(monkeypatch, aq.client, admin, before)
        try:
            got = await asyncio.wait_for(
                asyncio.gather(*(aq.enqueue(str(i).encode()) for i in range(n))), 30
            )
        finally:
            admin.client_unpause()  # the hook's already, unless it never ran
        assert seen["kills"] == 1
        # The first call went alone (nothing was in flight), the others in the batch, then
        # every caller of the batch resent its call.
        assert seen["calls"] >= 2 * n - 1
        assert [e.status for e in got] == ["enqueued"] * n
        pending = {m.decode() for m in admin.zrange(K(name, "pending"), 0, -1)}
        assert len(pending) == n + 1  # the warm-up and one job per call, none twice
        assert {e.id for e in got} <= pending
        for e, i in zip(got, range(n), strict=True):
            assert admin.hget(K(name, "job:" + e.id), "payload") == str(i).encode()
        assert aq.executor == leg
        assert await aq.check() == []
    finally:
        await aq.aclose()
        admin.close()


async def test_a_batch_to_a_server_that_lost_the_module_goes_as_scripts(
    tmp_path: Path, module_so: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of EMQ.ENQUEUE to a server that no longer has the module (as after the
    promotion of a replica without it): the unknown commands did not run, so they go again
    through the executor, which decides for Lua (``auto``); every caller is admitted once."""
    monkeypatch.delenv("ECHOMQ_EXECUTOR", raising=False)
    args = ["--loadmodule", str(module_so), "--enable-module-command", "yes"]
    srv = EmbeddedServer(tmp_path, appendonly=False, args=args).start()
    admin = redis.Redis.from_url(srv.url)
    aq = echomq.AsyncQueue("lost", url=srv.url, executor="auto")
    try:
        await asyncio.gather(*(aq.enqueue(b"warm") for _ in range(3)))
        assert aq.executor == "native"
        admin.execute_command("MODULE", "UNLOAD", "trafikey")
        got = await asyncio.gather(*(aq.enqueue(str(i).encode()) for i in range(50)))
        assert [e.status for e in got] == ["enqueued"] * 50
        assert aq.executor == "lua"
        assert admin.zcard(K("lost", "pending")) == 53
        assert await aq.check() == []
    finally:
        await aq.aclose()
        admin.close()
        srv.stop()


async def test_a_batch_past_the_socket_timeout_fails_as_a_timeout(
    url: str, qname: str, r: redis.Redis
) -> None:
    """A batch's replies share one deadline (the connection's socket timeout): a server that
    answers nothing past it fails every caller with redis-py's TimeoutError (a transient
    error, as a per-reply timeout gave), and the connection goes (no late reply is read as
    the next call's). A queue that rides out outages resends each call once the server
    answers, each admitted once."""
    import redis.asyncio

    where = r.connection_pool.connection_kwargs
    client = redis.asyncio.Redis(
        host=where.get("host", "127.0.0.1"), port=where.get("port", 6379), socket_timeout=0.3
    )
    q = echomq.AsyncQueue(qname, client=client, retry_for=0)
    try:
        await asyncio.gather(q.enqueue(b"warm"), q.enqueue(b"warm"))  # two connections open
        r.execute_command("CLIENT", "PAUSE", 1500, "ALL")
        got = await asyncio.gather(
            *(q.enqueue(b"%d" % i) for i in range(20)), return_exceptions=True
        )
        timed_out = [g for g in got if isinstance(g, redis.exceptions.TimeoutError)]
        # The batch (every call but the first, which went alone) timed out as one.
        assert len(timed_out) >= 19, got
        assert all(isinstance(g, (echomq.Enqueued, redis.exceptions.TimeoutError)) for g in got)
        time.sleep(1.3)  # the pause ends; the paused calls ran or never arrived
        after = await asyncio.gather(*(q.enqueue(b"x%d" % i) for i in range(5)))
        assert all(a.status == "enqueued" for a in after)
    finally:
        await q.aclose()
        await client.aclose()
    riding = echomq.AsyncQueue(qname, url=url, retry_for=10)
    try:
        riding.client.connection_pool.connection_kwargs["socket_timeout"] = 0.3
        await asyncio.gather(riding.enqueue(b"w"), riding.enqueue(b"w"))
        r.execute_command("CLIENT", "PAUSE", 1000, "ALL")
        sent = [ids.mint() for _ in range(20)]
        got = await asyncio.gather(*(riding.enqueue(b"r", id=j) for j in sent))
        assert [g.id for g in got] == sent
        assert all(g.status in ("enqueued", "replayed") for g in got), got
    finally:
        await riding.aclose()
    assert all(r.exists(K(qname, "job:" + j)) for j in sent)
