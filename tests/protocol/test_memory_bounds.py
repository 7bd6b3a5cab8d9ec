"""Every key the client library writes has an owner or a TTL, whatever the number of servers
and databases one process talks to, and every memory bound the docs state holds after a
burst and through a quiet hour (issue 37, docs/RELIABILITY.md, docs/CAPACITY.md).

No test here sleeps for the quiet hour: a key's TTL is read (a key with a TTL of at most X is
gone after a quiet hour by the server's own clock), and a decision the scripts take from a
stored server time (`meta` `retired_closed`) is moved by writing that time back."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

import echomq
from echomq import _produce, ids

pytestmark = pytest.mark.executors


def K(q: str, suffix: str) -> str:
    return "emq:{" + q + "}:" + suffix


def db_url(url: str, db: int) -> str:
    """``url`` (``redis://host:port/0`` plus an optional ``?query``) on database ``db``."""
    head, sep, query = url.partition("?")
    return head.rsplit("/", 1)[0] + f"/{db}" + sep + query


@pytest.fixture
def other_db(url: str, redis_url: str, qname: str) -> Iterator[tuple[echomq.Queue, redis.Redis]]:
    """The same queue name on database 1 of the same server, and a raw client on it (its
    keys are the test's own: the queue name is unique to the test)."""
    q1 = echomq.Queue(qname, url=db_url(url, 1))
    r1 = redis.Redis.from_url(db_url(redis_url, 1))
    yield q1, r1
    for key in r1.scan_iter(match=K(qname, "*"), count=1000):
        r1.delete(key)
    q1.close()
    r1.close()


def markers_without_ttl(r: redis.Redis, qname: str) -> list[bytes]:
    return [k for k in r.scan_iter(match=K(qname, "recent:*"), count=1000) if r.pttl(k) == -1]


def test_a_process_on_two_databases_leaves_no_marker_without_a_ttl(
    q: echomq.Queue,
    r: redis.Redis,
    qname: str,
    other_db: tuple[echomq.Queue, redis.Redis],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Finding M1: the replay marker keys' TTL bookkeeping (which keys this process has
    already given a TTL, _produce) was per queue *name*: a process that enqueues into the
    same queue name on two databases (or servers) set the TTL on the first one's key and then
    wrote the other one's markers with no TTL: keys that never expire. Both queues here call
    in one second of the client's clock (pinned, so the test does not depend on timing)."""
    monkeypatch.setattr(_produce, "_second", lambda: 1_800_000_123)
    q1, r1 = other_db
    for i in range(40):  # named ids keep a marker (another call may name them again)
        assert q.enqueue(b"a%d" % i, id=ids.mint()).status == "enqueued"
        assert q1.enqueue(b"b%d" % i, id=ids.mint()).status == "enqueued"
    for client in (r, r1):
        keys = list(client.scan_iter(match=K(qname, "recent:*"), count=1000))
        assert keys, "the named enqueues keep markers"
        assert markers_without_ttl(client, qname) == []
        for key in keys:  # gone after a quiet hour: replay_ms + 2 s at most
            replay_ms = int(key.decode().split(":")[3])
            assert 0 < client.pttl(key) <= replay_ms + 2000
    assert q1.check() == [] and q.check() == []
