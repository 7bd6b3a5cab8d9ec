"""trafikey's key-API paths (issue 15, the cost work): the reads and writes that no longer go
through RedisModule_Call must still behave like the commands they replace for everything a
client can observe besides the reply and the keyspace (which the conformance tests compare):

- a write through the key API invalidates a WATCH on the key it wrote (the EXEC aborts);
- a call that only reads a watched key leaves the WATCH alone (the EXEC runs);
- a planted key of the wrong type fails the call with the server's WRONGTYPE text, as the
  script's redis.call raises it (writes made before it stay made, as with a script).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis

import echomq
from echomq.errors import StaleToken
from echomq.server import EmbeddedServer
from native_fixtures import build, empty_queues, loaded_server

Q = "kapi"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    with loaded_server(tmp_path_factory.mktemp("keyapi"), build()) as srv:
        yield srv


@pytest.fixture
def r(server: EmbeddedServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.url)
    empty_queues(client, (Q,))
    try:
        yield client
    finally:
        client.close()


def _exec_after(r: redis.Redis, key: str, action: Callable[[], object]) -> bool:
    """WATCH key, run action (an EMQ.* call on another connection), then MULTI/EXEC:
    True when the EXEC ran, False when the WATCH aborted it."""
    with r.pipeline(transaction=True) as p:
        p.watch(key)  # type: ignore[no-untyped-call]
        action()
        p.multi()
        p.set(f"emq:{{{Q}}}:probe", "1")
        try:
            p.execute()
        except redis.WatchError:
            return False
        return True


def test_key_api_writes_abort_a_watch(r: redis.Redis, server: EmbeddedServer) -> None:
    with echomq.Queue(Q, url=server.url, executor="native") as q:
        jid = q.enqueue(b"a").id
        row = f"emq:{{{Q}}}:job:{jid}"
        active = f"emq:{{{Q}}}:active"
        assert r.exists(row) == 1
        claimed: list[echomq.Job | None] = []
        # EMQ.CLAIM writes the row (HSET) and the active set (ZADD) through the key API.
        assert _exec_after(r, row, lambda: claimed.append(q.claim())) is False
        assert claimed[0] is not None
        assert claimed[0].id == jid
        assert r.hget(row, "state") == b"active"
        jid2 = q.enqueue(b"b").id
        assert _exec_after(r, active, q.claim) is False
        assert r.zscore(active, jid2) is not None
        # The pending set of a fresh enqueue (ZADD) and the new row (HSET).
        pending = f"emq:{{{Q}}}:pending"
        assert _exec_after(r, pending, lambda: q.enqueue(b"c")) is False


def test_a_call_that_only_reads_a_key_keeps_the_watch(
    r: redis.Redis, server: EmbeddedServer
) -> None:
    with echomq.Queue(Q, url=server.url, executor="native") as q:
        jid = q.enqueue(b"a").id
        job = q.claim()
        assert job is not None and job.id == jid
        row = f"emq:{{{Q}}}:job:{jid}"
        # A stale token: EMQ.COMPLETE reads the row's fence (key API) and refuses.
        with pytest.raises(StaleToken):
            q.complete(jid, job.token + 1)

        def stale() -> None:
            with pytest.raises(StaleToken):
                q.complete(jid, job.token + 1)

        assert _exec_after(r, row, stale) is True


def test_wrongtype_on_a_planted_key_is_the_servers_error(r: redis.Redis) -> None:
    base = f"emq:{{{Q}}}:"
    r.set(base + "pending", "planted")  # EMQ.ENQUEUE's ZADD (key API) meets a string
    jid = echomq.ids.mint()
    with pytest.raises(redis.ResponseError) as err:
        r.execute_command(  # type: ignore[no-untyped-call]
            "EMQ.ENQUEUE",
            2,
            base + "job:" + jid,
            base + "meta",
            base,
            jid,
            "p",
            "",
            "now",
            "0",
            "f",
        )
    assert str(err.value) == "WRONGTYPE Operation against a key holding the wrong kind of value"
