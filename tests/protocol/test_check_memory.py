"""check() names the leftovers the memory review (issue 37) found it could not see: a key
that lives by its TTL alone written without one (a replay marker, a rate-limit counter), a
retired generation grown past its bound with no TTL, a repeat whose spec is out of step with
its index entry or its slot counter, a lane's active counter above what is active. Each bad
state is planted with raw writes; the normal runs around them stay clean."""

from __future__ import annotations

import pytest
import redis

import echomq
from echomq import ids

pytestmark = pytest.mark.executors


def K(q: str, suffix: str) -> str:
    return "emq:{" + q + "}:" + suffix


def only(found: list[str], needle: str) -> list[str]:
    return [line for line in found if needle in line]


def test_a_replay_marker_without_a_ttl(q: echomq.Queue, r: redis.Redis, qname: str) -> None:
    assert q.enqueue(b"x", id=ids.mint()).status == "enqueued"  # a named id keeps a marker
    [key] = r.scan_iter(match=K(qname, "recent:*"))
    assert q.check() == []
    r.persist(key)
    name = key.decode()[len(K(qname, "")) :]
    assert q.check() == [f"the replay marker {name} has no TTL: it never expires"]
    r.pexpire(key, 60_000)
    r.set(K(qname, "recent:00112233aabb"), b"e")  # an enqueue_many call's marker, no PX
    assert q.check() == ["the replay marker recent:00112233aabb has no TTL: it never expires"]


def test_a_rate_limit_counter_without_a_ttl(q: echomq.Queue, r: redis.Redis, qname: str) -> None:
    q.rate_limit(5, 60_000)
    q.rate_limit_lane("A", 5, 60_000)
    q.enqueue(b"x")
    q.enqueue(b"y", group="A")
    assert len(q.claim_batch(2)) == 2
    assert r.pttl(K(qname, "limiter")) > 0 and r.pttl(K(qname, "limiter:A")) > 0
    assert q.check() == []
    r.persist(K(qname, "limiter"))
    r.persist(K(qname, "limiter:A"))
    assert sorted(q.check()) == [
        "the rate-limit counter limiter has no TTL: it never expires",
        "the rate-limit counter limiter:A has no TTL: it never expires",
    ]


def test_a_kept_result_without_a_ttl(q: echomq.Queue, r: redis.Redis, qname: str) -> None:
    q.enqueue(b"x")
    job = q.claim()
    assert job is not None
    q.complete(job.id, job.token, result=b"done", keep_result_ms=60_000)
    assert q.check() == []
    r.persist(K(qname, "result:" + job.id))
    assert q.check() == [f"the kept result result:{job.id} has no TTL: it never expires"]


def test_a_grown_retired_generation_without_a_ttl(
    q: echomq.Queue, r: redis.Redis, qname: str
) -> None:
    gen = K(qname, "retired:old")
    r.hset(gen, mapping={ids.encode("JOB", i): "1" for i in range(50_001)})
    assert only(q.check(), "retired") == [
        "the retired record's retired:old holds 50001 ids and no TTL: it never shrinks"
    ]
    r.pexpire(gen, 140_000)  # what a held-back generation carries (include/common.lua)
    assert q.check() == []
    r.delete(gen)


def test_repeats_out_of_step_with_their_index_and_slots(
    q: echomq.Queue, r: redis.Redis, qname: str
) -> None:
    q.repeat("a", b"a", every_ms=60_000)
    q.repeat("b", b"b", every_ms=60_000, limit=2)
    q.repeat("c", b"c", every_ms=60_000)
    q.pause_repeat("c")
    assert q.check() == []
    index = K(qname, "repeat")
    r.zrem(index, "a")  # a spec with no entry: never fires
    r.hset(K(qname, "repeat:b"), "fired", 3)  # spent (past its limit), yet due
    r.zadd(index, {"b": 5})
    r.zadd(index, {"c": 1})  # paused, yet due
    r.zadd(index, {"ghost": 1})  # an entry with no spec
    assert sorted(q.check()) == sorted(
        [
            "repeat a has a spec but no entry in the repeat index: it never fires",
            "repeat b is spent (fired 3 of 2) but due at 5: it would fire again",
            "repeat c is paused but due at 1: it would fire",
            "the repeat index lists ghost, which has no spec",
        ]
    )


def test_a_repeat_slot_out_of_step_with_the_slot_counter(
    q: echomq.Queue, r: redis.Redis, qname: str
) -> None:
    q.repeat("a", b"a", every_ms=60_000)
    q.repeat("b", b"b", every_ms=60_000)
    assert q.check() == []
    slot = (r.hget(K(qname, "repeat:b"), "slot") or b"").decode()
    r.rpush(K(qname, "repeatfree"), slot)  # b's slot also free: the next repeat takes it
    assert q.check() == [
        f"repeat b holds slot {slot}, which is also free: a new repeat may take it"
    ]
    r.delete(K(qname, "repeatfree"))
    r.hset(K(qname, "meta"), "repeat_slots", slot)  # the counter behind a held slot
    assert q.check() == [
        f"repeat b holds slot {slot}, not below the {slot} slots minted: a new repeat may take it"
    ]


def test_a_lane_s_active_counter_above_active(q: echomq.Queue, r: redis.Redis, qname: str) -> None:
    """The lane concurrency counter (`gactive`) is what limit_lane's room is taken from: one
    above what is active holds the lane below its limit for good."""
    q.limit_lane("A", 2)
    q.limit(3)
    q.enqueue(b"x", group="A")
    assert q.claim() is not None
    assert q.check() == []
    r.hincrby(K(qname, "gactive"), "A", 1)
    assert q.check() == ["gactive A is 2 but 1 are active"]
