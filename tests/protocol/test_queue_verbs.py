"""Integration tests per verb, on Queue and AsyncQueue: enqueue, enqueue_many, claim and
claim_batch. The other verb families are in test_queue_verbs_settle.py (settle and
return verbs), test_queue_verbs_admin.py (reads, pauses, lanes, drains, logs) and
test_queue_verbs_fences.py (stale tokens, script loading, fences, settle calls).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import redis
from queue_verbs_support import (
    LANE,
    LANE_B,
    Job,
    K,
    assert_lease,
    lane_key,
    places,
    queue_keys,
    ring,
    row,
    smembers,
    spy_commands,
)

import echomq
from conftest import server_ms, snapshot
from echomq import ids
from echomq.errors import (
    KindError,
)

# Every test that reaches a server runs on both executors (tests/conftest.py).
pytestmark = pytest.mark.executors


Enqueued = echomq.Enqueued


def test_enqueue_writes_row_and_pending(anyq: Any, r: redis.Redis, qname: str) -> None:
    e = anyq.enqueue(b"hello")
    assert isinstance(e, Enqueued)
    assert e.status == "enqueued"
    assert ids.parse(e.id)[0] == "JOB"
    assert row(r, qname, e.id) == {"state": b"pending", "attempts": b"0", "payload": b"hello"}
    assert r.zscore(K(qname, "pending"), e.id) == 0
    assert places(r, qname, e.id) == ["pending"]
    assert ring(r, qname) == ["*"]
    assert r.llen(K(qname, "wake")) >= 1
    assert anyq.pending_size() == 1
    assert anyq.check() == []


def test_a_full_wake_list_is_left_unwritten(q: echomq.Queue, r: redis.Redis, qname: str) -> None:
    """Waking reads LLEN first (PROTOCOL §3): with 64 tokens kept no worker is parked, so an
    enqueue (plain path and general path), a bulk enqueue and a resume write no token and no
    trim: a WATCH on the list survives them. Below 64 the tokens are topped up to 64, never
    past."""
    wake = K(qname, "wake")
    q.enqueue(b"first")  # the ring's first job goes the general path
    r.delete(wake)
    r.rpush(wake, *["1"] * 64)
    with r.pipeline() as pipe:
        pipe.watch(wake)
        q.enqueue(b"plain")
        q.enqueue(b"lane", group=LANE)
        q.enqueue_many([b"a", b"b", b"c"])
        q.pause()
        q.resume()
        pipe.multi()
        pipe.llen(wake)
        assert pipe.execute() == [64]  # no WatchError: nothing wrote the list
    r.ltrim(wake, 0, 61)  # 62 kept: two tokens of room
    q.enqueue_many([b"d", b"e", b"f"])
    assert r.lrange(wake, 0, -1) == [b"1"] * 64
    r.delete(wake)
    q.enqueue(b"g")
    assert r.lrange(wake, 0, -1) == [b"1"]
    assert q.check() == []


def test_enqueue_str_payload_is_utf8(anyq: Any, r: redis.Redis, qname: str) -> None:
    e = anyq.enqueue("h\u00e9llo \u2603")
    assert row(r, qname, e.id)["payload"] == "h\u00e9llo \u2603".encode()


def test_enqueue_duplicate_leaves_row_untouched(anyq: Any, r: redis.Redis, qname: str) -> None:
    jid = ids.mint()
    assert anyq.enqueue(b"first", id=jid) == Enqueued(jid, "enqueued")
    before = snapshot(r, qname)
    assert anyq.enqueue(b"second", id=jid) == Enqueued(jid, "duplicate")
    assert anyq.enqueue(b"third", id=jid, group=LANE) == Enqueued(jid, "duplicate")
    assert anyq.enqueue(b"fourth", id=jid, delay_ms=10_000) == Enqueued(jid, "duplicate")
    assert snapshot(r, qname) == before
    # A held job is still a duplicate (the id is the receipt).
    job = anyq.claim()
    before = snapshot(r, qname)
    assert anyq.enqueue(b"fifth", id=jid).status == "duplicate"
    assert snapshot(r, qname) == before
    assert row(r, qname, job.id)["payload"] == b"first"


@pytest.mark.parametrize("group", [None, LANE])
def test_enqueue_kind_error_writes_nothing(
    anyq: Any, r: redis.Redis, qname: str, group: str | None
) -> None:
    anyq.enqueue(b"other", group=group)
    before = snapshot(r, qname)
    oid = ids.mint("ORD")
    with pytest.raises(KindError) as info:
        anyq.enqueue(b"x", id=oid, group=group)
    assert info.value.reason == "job id must be JOB-namespaced"
    assert snapshot(r, qname) == before
    assert r.exists(K(qname, "job:" + oid)) == 0
    with pytest.raises(KindError):
        anyq.enqueue(b"x", id=oid, delay_ms=1000)
    assert snapshot(r, qname) == before


def test_enqueue_delay_ms_schedules_on_the_server_clock(
    anyq: Any, r: redis.Redis, qname: str
) -> None:
    t0 = server_ms(r)
    e = anyq.enqueue(b"x", delay_ms=5_000)
    t1 = server_ms(r)
    assert e.status == "scheduled"
    score = r.zscore(K(qname, "schedule"), e.id)
    assert score is not None and t0 + 5_000 <= score <= t1 + 5_000
    assert row(r, qname, e.id) == {"state": b"scheduled", "attempts": b"0", "payload": b"x"}
    assert places(r, qname, e.id) == ["schedule"]
    assert ring(r, qname) == []
    assert anyq.claim() is None
    assert anyq.check() == []


def test_enqueue_at_ms_and_immediate_forms(anyq: Any, r: redis.Redis, qname: str) -> None:
    at = server_ms(r) + 60_000
    e = anyq.enqueue(b"later", at_ms=at)
    assert e.status == "scheduled"
    assert r.zscore(K(qname, "schedule"), e.id) == at  # the caller's absolute ms, verbatim
    past = anyq.enqueue(b"past", at_ms=server_ms(r) - 1_000)
    zero = anyq.enqueue(b"zero", delay_ms=0)
    epoch = anyq.enqueue(b"epoch", at_ms=0)
    for now in (past, zero, epoch):
        assert now.status == "enqueued"
        assert places(r, qname, now.id) == ["pending"]
        assert row(r, qname, now.id)["state"] == b"pending"
    assert anyq.counts()["schedule"] == 1
    assert anyq.check() == []


def test_enqueue_into_a_lane(anyq: Any, r: redis.Redis, qname: str) -> None:
    e = anyq.enqueue(b"x", group=LANE)
    assert e.status == "enqueued"
    assert row(r, qname, e.id) == {
        "state": b"pending",
        "attempts": b"0",
        "payload": b"x",
        "group": LANE.encode(),
    }
    assert places(r, qname, e.id) == [f"lane {LANE}"]
    assert r.zscore(lane_key(qname, LANE), e.id) == 0
    assert smembers(r, K(qname, "lanes")) == {LANE}
    assert ring(r, qname) == [LANE]
    assert anyq.pending_size() == 0
    assert anyq.lane_depth(LANE) == 1
    assert anyq.lanes() == [LANE]
    assert anyq.counts()["pending"] == 1
    assert anyq.job_state(e.id) == "pending"
    assert anyq.check() == []


def test_enqueue_many_mixed_items_in_order(anyq: Any, r: redis.Redis, qname: str) -> None:
    fixed = ids.mint()
    oid = ids.mint("ORD")
    out = anyq.enqueue_many([b"a", (fixed, "b"), (oid, b"c"), (fixed, b"dup"), "e"])
    assert len(out) == 5
    assert isinstance(out[0], Enqueued) and out[0].status == "enqueued"
    assert out[1] == Enqueued(fixed, "enqueued")
    assert isinstance(out[2], KindError)
    assert out[3] == Enqueued(fixed, "duplicate")
    assert isinstance(out[4], Enqueued) and out[4].status == "enqueued"
    assert out[0].id < out[4].id  # minted ids increase in input order
    assert row(r, qname, out[0].id)["payload"] == b"a"
    assert row(r, qname, fixed)["payload"] == b"b"
    assert row(r, qname, out[4].id)["payload"] == b"e"
    assert r.exists(K(qname, "job:" + oid)) == 0
    pending = [m.decode() for m in r.zrange(K(qname, "pending"), 0, -1)]
    assert sorted(pending) == sorted([out[0].id, fixed, out[4].id])
    assert ring(r, qname) == ["*"]
    assert anyq.check() == []


def test_enqueue_many_empty_is_empty(anyq: Any, r: redis.Redis, qname: str) -> None:
    assert anyq.enqueue_many([]) == []
    assert anyq.enqueue_many(iter(())) == []
    assert queue_keys(r, qname) == []


def test_enqueue_many_minted_ids_increase_and_claim_in_order(
    anyq: Any, r: redis.Redis, qname: str
) -> None:
    out = anyq.enqueue_many(b"%d" % i for i in range(50))
    minted = [e.id for e in out]
    assert all(e.status == "enqueued" for e in out)
    assert minted == sorted(minted) and len(set(minted)) == 50
    jobs = anyq.claim_batch(50)
    assert [j.id for j in jobs] == minted
    assert [j.payload for j in jobs] == [b"%d" % i for i in range(50)]


def test_enqueue_many_into_a_lane_and_schedule(anyq: Any, r: redis.Redis, qname: str) -> None:
    lane = anyq.enqueue_many([b"a", b"b"], group=LANE)
    assert [e.status for e in lane] == ["enqueued", "enqueued"]
    assert anyq.lane_depth(LANE) == 2
    assert ring(r, qname) == [LANE]
    assert smembers(r, K(qname, "lanes")) == {LANE}
    for e in lane:
        assert row(r, qname, e.id)["group"] == LANE.encode()
    later = anyq.enqueue_many([b"c"], delay_ms=60_000)
    assert later[0].status == "scheduled"
    assert places(r, qname, later[0].id) == ["schedule"]
    assert anyq.check() == []


def test_enqueue_many_spans_several_script_calls(anyq: Any, r: redis.Redis, qname: str) -> None:
    # More than 1000 items, and payloads over 1 MiB in total: several calls, one verdict list.
    out = anyq.enqueue_many([b"x"] * 1500 + [b"y" * 400_000] * 4)
    assert len(out) == 1504
    assert all(isinstance(e, Enqueued) and e.status == "enqueued" for e in out)
    minted = [e.id for e in out]
    assert minted == sorted(minted)
    assert anyq.pending_size() == 1504
    assert row(r, qname, minted[-1])["payload"] == b"y" * 400_000


def test_claim_leases_on_the_server_clock(anyq: Any, r: redis.Redis, qname: str) -> None:
    e = anyq.enqueue(b"payload")
    t0 = server_ms(r)
    job = anyq.claim(lease_ms=4_000)
    t1 = server_ms(r)
    assert job == Job(e.id, b"payload", 1, None)
    assert_lease(r, qname, e.id, t0, t1, 4_000)
    assert row(r, qname, e.id) == {
        "state": b"active",
        "attempts": b"1",
        "payload": b"payload",
        "lease_epoch": b"1",
    }
    assert places(r, qname, e.id) == ["active"]
    assert ring(r, qname) == []
    assert anyq.claim() is None
    assert anyq.check() == []


def test_claim_is_fifo(anyq: Any) -> None:
    minted = [anyq.enqueue(p).id for p in (b"a", b"b", b"c")]
    assert [anyq.claim().id for _ in range(3)] == minted
    assert anyq.claim() is None


def test_claim_skips_ghosts(anyq: Any, r: redis.Redis, qname: str) -> None:
    live = anyq.enqueue(b"live").id
    ghost = ids.encode("JOB", 1)  # sorts before every minted id: popped first
    r.zadd(K(qname, "pending"), {ghost: 0})
    job = anyq.claim()
    assert job.id == live
    assert r.exists(K(qname, "job:" + ghost)) == 0  # never resurrected as a junk row
    assert r.zcard(K(qname, "pending")) == 0
    assert anyq.claim() is None
    assert anyq.check() == []


def test_claim_skips_ghosts_in_lanes_and_moves_on(anyq: Any, r: redis.Redis, qname: str) -> None:
    doomed = anyq.enqueue(b"a", group=LANE).id
    live = anyq.enqueue(b"b", group=LANE_B).id
    assert ring(r, qname) == [LANE, LANE_B]
    r.delete(K(qname, "job:" + doomed))  # LANE now holds only a ghost
    job = anyq.claim()
    assert job.id == live
    assert job.group == LANE_B
    assert r.exists(lane_key(qname, LANE), lane_key(qname, LANE_B)) == 0
    assert ring(r, qname) == []
    assert smembers(r, K(qname, "lanes")) == set()
    assert anyq.check() == []


def test_claim_of_only_ghosts_is_empty(anyq: Any, r: redis.Redis, qname: str) -> None:
    ghost = ids.mint()
    r.zadd(K(qname, "pending"), {ghost: 0})
    r.rpush(K(qname, "ring"), "*")
    assert anyq.claim() is None
    assert r.exists(K(qname, "job:" + ghost), K(qname, "pending"), K(qname, "ring")) == 0


@pytest.mark.executors("lua")  # counts EVALSHA calls; the twin is one EMQ.CLAIM
def test_claim_reads_pause_inside_the_script(
    anyq: Any, r: redis.Redis, qname: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    e = anyq.enqueue(b"x")
    anyq.pause()
    assert r.hget(K(qname, "meta"), "paused") == b"1"
    seen = spy_commands(monkeypatch, anyq)
    assert anyq.claim() is None
    assert anyq.claim_batch(3) == []
    # No host-side pre-read of the flag: each claim is one script call.
    assert set(seen) <= {"EVALSHA", "EVAL"} and seen.count("EVALSHA") == 2
    assert r.zscore(K(qname, "pending"), e.id) == 0
    assert row(r, qname, e.id)["attempts"] == b"0"
    anyq.resume()
    # The flag is read on the server at claim time, however it was set.
    r.hset(K(qname, "meta"), "paused", "1")
    assert anyq.claim() is None
    r.hdel(K(qname, "meta"), "paused")
    assert anyq.claim().id == e.id


def test_claim_alternates_flat_and_lanes(anyq: Any) -> None:
    for _ in range(4):
        anyq.enqueue(b"f")
    for _ in range(4):
        anyq.enqueue(b"l", group=LANE)
    groups = [anyq.claim().group for _ in range(8)]
    assert groups == [None, LANE] * 4
    assert anyq.claim() is None


def test_claim_batch_fills_to_n_on_one_deadline(anyq: Any, r: redis.Redis, qname: str) -> None:
    minted = [anyq.enqueue(b"%d" % i).id for i in range(5)]
    t0 = server_ms(r)
    jobs = anyq.claim_batch(3, lease_ms=7_000)
    t1 = server_ms(r)
    assert [j.id for j in jobs] == minted[:3]
    assert [j.payload for j in jobs] == [b"0", b"1", b"2"]
    assert all(j.token == 1 and j.group is None for j in jobs)
    scores = {r.zscore(K(qname, "active"), j.id) for j in jobs}
    assert len(scores) == 1
    for j in jobs:
        assert_lease(r, qname, j.id, t0, t1, 7_000)
        assert row(r, qname, j.id)["state"] == b"active"
    short = anyq.claim_batch(10)
    assert [j.id for j in short] == minted[3:]
    assert anyq.claim_batch(4) == []
    assert anyq.check() == []


def test_claim_batch_serves_flat_and_lanes(anyq: Any, r: redis.Redis, qname: str) -> None:
    for _ in range(3):
        anyq.enqueue(b"f")
        anyq.enqueue(b"a", group=LANE)
        anyq.enqueue(b"b", group=LANE_B)
    jobs = anyq.claim_batch(9)
    assert len(jobs) == 9
    assert Counter(j.group for j in jobs) == {None: 3, LANE: 3, LANE_B: 3}
    assert r.hget(K(qname, "gactive"), LANE) == b"3"
    assert r.hget(K(qname, "gactive"), LANE_B) == b"3"
    assert ring(r, qname) == []
    assert smembers(r, K(qname, "lanes")) == set()
    assert anyq.claim_batch(1) == []
    assert anyq.check() == []
