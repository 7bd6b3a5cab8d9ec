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
from echomq import ids
from echomq.protocol import produce as _produce

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


RETIRED_GEN = 25_000  # include/common.lua, native/common.c
HELD_TTL_MS = 140_000  # 2 x ID_REPLAY_MS: a held-back generation's TTL (include/common.lua)


def plant_generation(r: redis.Redis, key: str, n: int, tag: str) -> None:
    """``n`` retired ids in ``key``, as a burst of deletions would have left them."""
    for start in range(0, n, 5000):
        fields = {
            ids.encode("JOB", hash((tag, i)) & (2**62 - 1)): "1" for i in range(start, start + 5000)
        }
        r.hset(key, mapping=fields)


def retire_a_batch(q: echomq.Queue, n: int = 64) -> None:
    """``n`` real completions in one settle call (a worker's batch: the script looks at the
    record's size on every batch of 64 or more)."""
    q.enqueue_many([b"x"] * n)
    held = q.claim_batch(n)
    assert len(held) == n
    assert q.complete_many((j.id, j.token) for j in held) == []


def untimed_ids(r: redis.Redis, qname: str) -> int:
    """How many retired ids live in generations without a TTL (those stay through any quiet
    spell; a generation with a TTL is gone after it)."""
    total = 0
    for gen in ("retired", "retired:old"):
        if r.exists(K(qname, gen)) and r.pttl(K(qname, gen)) == -1:
            total += r.hlen(K(qname, gen))
    return total


def test_a_burst_s_retired_record_is_gone_after_a_quiet_spell(
    q: echomq.Queue, r: redis.Redis, qname: str
) -> None:
    """Finding M2: the retired record rotates only when a deletion finds the current
    generation full *and* the one before closed ID_REPLAY_MS (70 s) ago; during a burst the
    current generation grows past RETIRED_GEN (every retirement of the last 70 s is kept for
    a minted id's resend). When the burst ends -- a quiet queue, no further deletion to rotate
    it -- that grown generation stayed forever (60,000 ids here: ~4 MB; 700,000 after a
    10,000/s burst), against RELIABILITY's "the larger of 25,000-50,000 retirements and
    70-140 s of them". Now a generation the rotation had to hold back takes a TTL of
    2 x ID_REPLAY_MS (kept by the RENAME that makes it retired:old): the server drops it
    after the burst, and a normal generation still has none."""
    meta = K(qname, "meta")
    # The burst, planted: a generation closed just now (retired:old) and the current one
    # grown to 60,000 ids behind it; then the burst's last batch of deletions.
    plant_generation(r, K(qname, "retired:old"), RETIRED_GEN, "old")
    plant_generation(r, K(qname, "retired"), 60_000, "cur")
    sec, usec = r.time()
    r.hset(meta, "retired_closed", int(sec) * 1000 + int(usec) // 1000)
    retire_a_batch(q)
    assert r.hlen(K(qname, "retired")) == 60_064  # held back: nothing rotated
    ttl = r.pttl(K(qname, "retired"))
    assert 0 < ttl <= HELD_TTL_MS  # gone after a quiet spell of 140 s
    assert untimed_ids(r, qname) <= 2 * RETIRED_GEN  # what stays: two generations at most

    # Traffic after it: once the generation before was closed 70 s ago, the next deletions
    # rotate; the grown generation keeps its TTL as retired:old, the new one has none.
    closed = int(r.hget(meta, "retired_closed") or 0)
    r.hset(meta, "retired_closed", closed - 70_001)  # as if 70 s went by
    retire_a_batch(q)
    assert r.hlen(K(qname, "retired:old")) == 60_128 and not r.exists(K(qname, "retired"))
    assert 0 < r.pttl(K(qname, "retired:old")) <= HELD_TTL_MS
    retire_a_batch(q)
    assert r.pttl(K(qname, "retired")) == -1  # a normal generation: no TTL
    assert untimed_ids(r, qname) <= 2 * RETIRED_GEN
    assert q.check() == []


def test_single_deletions_of_ids_that_end_alike_still_rotate_the_record(
    q: echomq.Queue, r: redis.Redis, qname: str
) -> None:
    """Finding M3: a small settle call looked at the record's size only when its first id's
    last byte was a multiple of 8. Ids a caller names may all end alike (here every id is
    `encode('JOB', n)` with n = 10 mod 62: they all end in 'A', byte 65): their single
    deletions never looked, the generation never rotated and grew without bound. 200 such
    completions on a full generation whose rotation is free must rotate it."""
    plant_generation(r, K(qname, "retired"), RETIRED_GEN, "full")
    r.hset(K(qname, "meta"), "retired_closed", 1)  # the generation before closed long ago
    for i in range(200):
        jid = ids.encode("JOB", (1_000_000 + i) * 62 + 10)
        assert jid.endswith("A")
        q.enqueue(b"x", id=jid)
        job = q.claim()
        assert job is not None and job.id == jid
        q.complete(job.id, job.token)
    assert r.hlen(K(qname, "retired:old")) >= RETIRED_GEN  # rotated
    assert r.hlen(K(qname, "retired")) < 200
    assert q.check() == []


# What a queue may keep with no TTL after its traffic stopped, each with its owner and
# the bound the docs state (PROTOCOL §1.3, docs/CAPACITY.md): the queue's own state.
OWNED = {
    "meta", "pending", "active", "schedule", "dead", "completed", "ring", "inring",
    "ringstale", "lanes", "paused", "glimit", "gactive", "gweight", "wake", "grate",
    "ratewait", "repeat", "repeatfree", "flow:outbox", "events", "metrics:completed",
    "metrics:failed", "metrics:completed:data", "metrics:failed:data", "retired",
    "retired:old",
}  # fmt: skip


def untimed(r: redis.Redis, qname: str) -> dict[str, int]:
    """Every key of the queue without a TTL, by suffix, with its size."""
    base = K(qname, "")
    out: dict[str, int] = {}
    for key in r.scan_iter(match=base + "*", count=1000):
        if r.pttl(key) != -1:
            continue
        kind, name = r.type(key), key.decode()[len(base) :]
        size = {b"hash": r.hlen, b"zset": r.zcard, b"list": r.llen, b"set": r.scard}
        out[name] = size[kind](key) if kind in size else (r.xlen(key) if kind == b"stream" else 1)
    return out


def burst(q: echomq.Queue, n: int) -> None:
    """Every kind of traffic that writes a side key: minted and named ids, a batch, a lane with
    rate and concurrency limits, kept results, a waiter, events; then everything completes."""
    q.enable_events(maxlen=100)
    q.rate_limit(10_000, 60_000)
    q.rate_limit_lane("A", 10_000, 60_000)
    q.limit_lane("A", 50)
    for i in range(n):
        q.enqueue(b"m%d" % i)
        q.enqueue(b"n%d" % i, id=ids.mint())
        q.enqueue(b"g%d" % i, group="A", dedup=f"d{i}")
    q.enqueue_many([b"b%d" % i for i in range(n)])
    q.enqueue_many([(ids.mint(), b"c%d" % i) for i in range(n)])
    done = 0
    while True:
        held = q.claim_batch(100)
        if not held:
            break
        for j in held:
            q.complete(j.id, j.token, result=b"r", keep_result_ms=60_000)
        done += len(held)
    assert done == 5 * n
    kept = q.result(j.id)
    assert kept is not None


def test_after_a_burst_only_owned_keys_stay_and_within_their_bounds(
    q: echomq.Queue,
    r: redis.Redis,
    qname: str,
    other_db: tuple[echomq.Queue, redis.Redis],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The quiet hour, read from the keys: after a burst on one queue name on two databases
    of one process, every key either carries a TTL (so it is gone after the hour: the
    longest here is a kept result's 60 s, a marker's replay_ms + 2 s, a held-back retired
    generation's 140 s) or is the queue's own state, listed in OWNED with its bound."""
    monkeypatch.setattr(_produce, "_second", lambda: 1_800_000_456)  # one marker second
    q1, r1 = other_db
    for queue, client in ((q, r), (q1, r1)):
        burst(queue, 150)
        left = untimed(client, qname)
        assert set(left) <= OWNED, set(left) - OWNED
        assert left.get("wake", 0) <= 64
        assert left.get("events", 0) <= 200  # MAXLEN ~ 100: whole macro nodes past it
        assert left.get("metrics:completed:data", 0) <= 1440
        assert left.get("retired", 0) + left.get("retired:old", 0) <= 2 * RETIRED_GEN
        for gone in ("pending", "active", "schedule", "lanes", "inring", "gactive"):
            assert left.get(gone, 0) == 0, gone
        for key in client.scan_iter(match=K(qname, "*"), count=1000):
            assert client.pttl(key) <= 140_000, key  # every timed key: gone within the hour
        assert queue.check() == []
