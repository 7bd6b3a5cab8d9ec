"""Integration tests per verb, on Queue and AsyncQueue alike (the ``anyq`` fixture): each test
asserts the API result and the wire state (rows, set membership, lanes, ring, leases on the
server clock)."""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import echomq
from conftest import SyncOverAsync, server_ms, snapshot, wait_for
from echomq import ids
from echomq.errors import (
    InvalidArgument,
    InvalidId,
    JobGone,
    KindError,
    Locked,
    StaleToken,
    StateError,
    VersionFenceError,
)
from echomq.protocol.scripts import SCRIPTS
from echomq.server import EmbeddedServer

# Every test that reaches a server runs on both executors (tests/conftest.py).
pytestmark = pytest.mark.executors

LANE = "PRT0KHTOWnGLuC"
LANE_B = "tenant-b"
Enqueued = echomq.Enqueued
Job = echomq.Job

# --------------------------------------------------------------------------- helpers


def K(q: str, suffix: str) -> str:
    return "emq:{" + q + "}:" + suffix


def lane_key(q: str, g: str) -> str:
    return K(q, f"g:{g}:pending")


def row(r: redis.Redis, q: str, jid: str) -> dict[str, bytes]:
    return {f.decode(): v for f, v in r.hgetall(K(q, "job:" + jid)).items()}


def ring(r: redis.Redis, q: str) -> list[str]:
    return [x.decode() for x in r.lrange(K(q, "ring"), 0, -1)]


def smembers(r: redis.Redis, key: str) -> set[str]:
    return {x.decode() for x in r.smembers(key)}


def places(r: redis.Redis, q: str, jid: str) -> list[str]:
    """Every set of the queue that holds ``jid`` (D6: a live job is in exactly one)."""
    out = [
        s for s in ("pending", "active", "schedule", "dead") if r.zscore(K(q, s), jid) is not None
    ]
    prefix = K(q, "g:")
    for key in r.scan_iter(match=prefix + "*:pending", count=1000):
        if r.zscore(key, jid) is not None:
            out.append("lane " + key.decode()[len(prefix) : -len(":pending")])
    return out


def assert_lease(r: redis.Redis, q: str, jid: str, t0: int, t1: int, lease: int) -> None:
    score = r.zscore(K(q, "active"), jid)
    assert score is not None
    assert t0 + lease <= score <= t1 + lease


def queue_keys(r: redis.Redis, q: str) -> list[bytes]:
    return sorted(r.scan_iter(match=K(q, "*"), count=1000))


def lapsed(r: redis.Redis, q: str, n: int = 1) -> bool:
    """True once at least ``n`` leases of the queue have lapsed on the server clock."""
    return len(r.zrangebyscore(K(q, "active"), "-inf", server_ms(r))) >= n


def spy_commands(monkeypatch: pytest.MonkeyPatch, queue: Any) -> list[str]:
    """Record the command names the queue's client sends (not pipelines)."""
    client = queue.client
    orig = client.execute_command
    seen: list[str] = []
    if inspect.iscoroutinefunction(orig):

        async def aspy(*args: Any, **kw: Any) -> Any:
            seen.append(str(args[0]))
            return await orig(*args, **kw)

        monkeypatch.setattr(client, "execute_command", aspy)
    else:
        # The sync executor sends single commands through its own _command (a direct
        # connection per thread on a standalone server), not the client's execute_command.
        executor = queue._x
        direct = executor._command

        def spy(*args: Any, **kw: Any) -> Any:
            seen.append(str(args[0]))
            return direct(*args, **kw)

        monkeypatch.setattr(executor, "_command", spy)
    return seen


def make_dead(q: Any, payload: bytes = b"d", group: str | None = None) -> str:
    jid = q.enqueue(payload, group=group).id
    job = q.claim(lease_ms=60_000)
    assert job.id == jid
    assert q.retry(jid, job.token, delay_ms=0, max_attempts=1, error="boom") == "dead"
    return jid


# --------------------------------------------------------------------------- enqueue


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


# --------------------------------------------------------------------------- enqueue_many


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


# --------------------------------------------------------------------------- claim


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


# --------------------------------------------------------------------------- claim_batch


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


# --------------------------------------------------------------------------- complete


def test_complete_deletes_row_and_logs(anyq: Any, r: redis.Redis, qname: str) -> None:
    anyq.enqueue(b"x")
    job = anyq.claim()
    assert anyq.add_log(job.id, "working") == 1
    assert anyq.complete(job.id, job.token, result=b"r") is None
    jk = K(qname, "job:" + job.id)
    assert r.exists(jk, jk + ":logs") == 0
    assert places(r, qname, job.id) == []
    assert r.hget(K(qname, "metrics:completed"), "count") == b"1"
    assert anyq.counts()["completed"] == 1
    with pytest.raises(JobGone) as info:
        anyq.complete(job.id, job.token)
    assert info.value.job_id == job.id
    assert r.hget(K(qname, "metrics:completed"), "count") == b"1"
    assert anyq.check() == []


def test_complete_with_a_stale_token_changes_nothing(anyq: Any, r: redis.Redis, qname: str) -> None:
    anyq.enqueue(b"x")
    job = anyq.claim()
    before = snapshot(r, qname)
    with pytest.raises(StaleToken, match="complete token mismatch"):
        anyq.complete(job.id, job.token + 1)
    assert snapshot(r, qname) == before


def test_complete_of_a_grouped_job_frees_its_lane_slot(
    anyq: Any, r: redis.Redis, qname: str
) -> None:
    anyq.limit_lane(LANE, 1)
    first = anyq.enqueue(b"1", group=LANE).id
    second = anyq.enqueue(b"2", group=LANE).id
    job = anyq.claim()
    assert job.id == first and job.group == LANE
    assert r.hget(K(qname, "gactive"), LANE) == b"1"
    assert ring(r, qname) == []  # at its limit
    assert smembers(r, K(qname, "lanes")) == {LANE}
    assert anyq.claim() is None
    anyq.complete(job.id, job.token)
    assert r.hget(K(qname, "gactive"), LANE) is None
    assert ring(r, qname) == [LANE]
    assert anyq.claim().id == second
    assert anyq.check() == []


# --------------------------------------------------------------------------- retry


def test_retry_below_the_ceiling_schedules(anyq: Any, r: redis.Redis, qname: str) -> None:
    anyq.enqueue(b"x")
    job = anyq.claim()
    t0 = server_ms(r)
    assert anyq.retry(job.id, job.token, delay_ms=3_000, max_attempts=3, error="boom") == (
        "scheduled"
    )
    t1 = server_ms(r)
    score = r.zscore(K(qname, "schedule"), job.id)
    assert score is not None and t0 + 3_000 <= score <= t1 + 3_000
    assert row(r, qname, job.id) == {
        "state": b"scheduled",
        "attempts": b"1",
        "payload": b"x",
        "last_error": b"boom",
    }
    assert places(r, qname, job.id) == ["schedule"]
    assert r.exists(K(qname, "metrics:failed")) == 0
    assert anyq.counts()["failed"] == 0
    assert anyq.check() == []


def test_retry_with_zero_delay_still_goes_to_schedule(
    anyq: Any, r: redis.Redis, qname: str
) -> None:
    anyq.enqueue(b"x")
    job = anyq.claim()
    assert anyq.retry(job.id, job.token, delay_ms=0, max_attempts=5, error="e") == "scheduled"
    assert places(r, qname, job.id) == ["schedule"]
    assert anyq.claim() is None
    assert anyq.promote() == 1
    again = anyq.claim()
    assert again.id == job.id and again.token == 2


def test_retry_at_the_ceiling_is_dead(anyq: Any, r: redis.Redis, qname: str) -> None:
    anyq.enqueue(b"x")
    job = anyq.claim()
    assert anyq.retry(job.id, job.token, delay_ms=0, max_attempts=2, error="first") == "scheduled"
    anyq.promote()
    job = anyq.claim()
    assert job.token == 2
    assert anyq.retry(job.id, job.token, delay_ms=0, max_attempts=2, error="final") == "dead"
    assert places(r, qname, job.id) == ["dead"]
    assert (r.zscore(K(qname, "dead"), job.id) or 0) > 0  # the time of death (D25)
    assert row(r, qname, job.id) == {
        "state": b"dead",
        "attempts": b"2",
        "payload": b"x",
        "last_error": b"final",
    }
    assert r.hget(K(qname, "metrics:failed"), "count") == b"1"
    counts = anyq.counts()
    assert counts["dead"] == 1 and counts["failed"] == 1
    assert anyq.check() == []


def test_retry_of_a_grouped_job_to_dead(anyq: Any, r: redis.Redis, qname: str) -> None:
    jid = make_dead(anyq, group=LANE)
    assert places(r, qname, jid) == ["dead"]
    assert r.hget(K(qname, "gactive"), LANE) is None
    assert ring(r, qname) == []
    assert smembers(r, K(qname, "lanes")) == set()
    assert anyq.check() == []


def test_retry_stale_and_gone(anyq: Any, r: redis.Redis, qname: str) -> None:
    anyq.enqueue(b"x")
    job = anyq.claim()
    before = snapshot(r, qname)
    with pytest.raises(StaleToken, match="retry token mismatch"):
        anyq.retry(job.id, job.token + 1, delay_ms=0, max_attempts=3, error="e")
    assert snapshot(r, qname) == before
    with pytest.raises(JobGone):
        anyq.retry(ids.mint(), 1, delay_ms=0, max_attempts=3, error="e")
    assert snapshot(r, qname) == before


# --------------------------------------------------------------------------- delay


def test_delay_zero_returns_the_job_to_pending(anyq: Any, r: redis.Redis, qname: str) -> None:
    anyq.enqueue(b"x")
    job = anyq.claim()
    assert anyq.delay(job.id, job.token, 0) is None
    assert places(r, qname, job.id) == ["pending"]
    assert row(r, qname, job.id)["state"] == b"pending"
    assert row(r, qname, job.id)["attempts"] == b"1"  # delay mints nothing
    assert ring(r, qname) == ["*"]
    again = anyq.claim()
    assert again.id == job.id and again.token == 2
    assert anyq.check() == []


def test_delay_schedules_on_the_server_clock(anyq: Any, r: redis.Redis, qname: str) -> None:
    anyq.enqueue(b"x")
    job = anyq.claim()
    t0 = server_ms(r)
    anyq.delay(job.id, job.token, 8_000)
    t1 = server_ms(r)
    score = r.zscore(K(qname, "schedule"), job.id)
    assert score is not None and t0 + 8_000 <= score <= t1 + 8_000
    assert row(r, qname, job.id)["state"] == b"scheduled"
    assert row(r, qname, job.id)["attempts"] == b"1"
    assert places(r, qname, job.id) == ["schedule"]
    assert anyq.check() == []


def test_delay_zero_of_a_grouped_job_returns_it_to_its_lane(
    anyq: Any, r: redis.Redis, qname: str
) -> None:
    anyq.enqueue(b"x", group=LANE)
    job = anyq.claim()
    anyq.delay(job.id, job.token, 0)
    assert places(r, qname, job.id) == [f"lane {LANE}"]
    assert r.hget(K(qname, "gactive"), LANE) is None
    assert ring(r, qname) == [LANE]
    assert smembers(r, K(qname, "lanes")) == {LANE}
    assert anyq.check() == []


def test_delay_stale_and_gone(anyq: Any, r: redis.Redis, qname: str) -> None:
    anyq.enqueue(b"x")
    job = anyq.claim()
    before = snapshot(r, qname)
    with pytest.raises(StaleToken, match="delay token mismatch"):
        anyq.delay(job.id, job.token + 1, 0)
    with pytest.raises(JobGone):
        anyq.delay(ids.mint(), 1, 0)
    assert snapshot(r, qname) == before


# --------------------------------------------------------------------------- extend


def test_extend_pushes_the_lease(anyq: Any, r: redis.Redis, qname: str) -> None:
    anyq.enqueue(b"x")
    job = anyq.claim(lease_ms=1_000)
    t0 = server_ms(r)
    assert anyq.extend(job.id, job.token, lease_ms=60_000) is None
    t1 = server_ms(r)
    assert_lease(r, qname, job.id, t0, t1, 60_000)
    assert row(r, qname, job.id)["attempts"] == b"1"
    assert places(r, qname, job.id) == ["active"]
    before = snapshot(r, qname)
    with pytest.raises(StaleToken, match="extend token mismatch"):
        anyq.extend(job.id, job.token + 1, lease_ms=1_000)
    with pytest.raises(JobGone):
        anyq.extend(ids.mint(), 1, lease_ms=1_000)
    assert snapshot(r, qname) == before


def test_extend_many_reports_the_failed_ids(anyq: Any, r: redis.Redis, qname: str) -> None:
    for p in (b"a", b"b", b"c", b"d", b"e"):
        anyq.enqueue(p)
    a, b, c, d, e = anyq.claim_batch(5, lease_ms=2_000)
    anyq.complete(c.id, c.token)  # gone
    assert anyq.retry(e.id, e.token, delay_ms=60_000, max_attempts=9, error="x") == "scheduled"
    d_score = r.zscore(K(qname, "active"), d.id)
    t0 = server_ms(r)
    failed = anyq.extend_many(
        [(a.id, a.token), (c.id, c.token), (b.id, b.token), (d.id, d.token + 1), (e.id, e.token)],
        lease_ms=50_000,
    )
    t1 = server_ms(r)
    assert failed == [c.id, d.id, e.id]
    assert_lease(r, qname, a.id, t0, t1, 50_000)
    assert_lease(r, qname, b.id, t0, t1, 50_000)
    assert r.zscore(K(qname, "active"), d.id) == d_score
    assert places(r, qname, e.id) == ["schedule"]
    assert anyq.extend_many([], lease_ms=10) == []
    assert anyq.check() == []


# --------------------------------------------------------------------------- promote


def test_promote_moves_due_jobs_to_pending_and_lanes(anyq: Any, r: redis.Redis, qname: str) -> None:
    flat = anyq.enqueue(b"f", delay_ms=40).id
    grouped = anyq.enqueue(b"g", group=LANE, delay_ms=40).id
    later = anyq.enqueue(b"l", delay_ms=60_000).id
    assert row(r, qname, grouped)["group"] == LANE.encode()
    assert ring(r, qname) == [] and smembers(r, K(qname, "lanes")) == set()
    wait_for(lambda: len(r.zrangebyscore(K(qname, "schedule"), "-inf", server_ms(r))) == 2)
    assert anyq.promote() == 2
    assert places(r, qname, flat) == ["pending"]
    assert places(r, qname, grouped) == [f"lane {LANE}"]
    assert places(r, qname, later) == ["schedule"]
    assert row(r, qname, flat)["state"] == b"pending"
    assert row(r, qname, grouped)["state"] == b"pending"
    assert sorted(ring(r, qname)) == sorted(["*", LANE])
    assert smembers(r, K(qname, "lanes")) == {LANE}
    assert anyq.promote() == 0
    assert anyq.check() == []


def test_promote_respects_its_limit(anyq: Any, r: redis.Redis, qname: str) -> None:
    minted = [anyq.enqueue(b"x", delay_ms=20).id for _ in range(3)]
    wait_for(lambda: len(r.zrangebyscore(K(qname, "schedule"), "-inf", server_ms(r))) == 3)
    assert anyq.promote(limit=2) == 2
    assert anyq.pending_size() == 2
    assert anyq.promote() == 1
    assert [j.id for j in anyq.claim_batch(3)] == minted


# --------------------------------------------------------------------------- reap


def test_reap_returns_lapsed_leases_to_pending(anyq: Any, r: redis.Redis, qname: str) -> None:
    short = anyq.enqueue(b"s").id
    long = anyq.enqueue(b"l").id
    assert anyq.claim(lease_ms=50).id == short
    assert anyq.claim(lease_ms=60_000).id == long
    assert wait_for(anyq.reap) == 1
    assert places(r, qname, short) == ["pending"]
    assert row(r, qname, short)["state"] == b"pending"
    assert row(r, qname, short)["attempts"] == b"1"  # reap mints nothing
    assert places(r, qname, long) == ["active"]
    assert ring(r, qname) == ["*"]
    again = anyq.claim()
    assert again.id == short and again.token == 2
    assert anyq.check() == []


def test_reap_of_a_grouped_job_returns_it_to_its_lane(
    anyq: Any, r: redis.Redis, qname: str
) -> None:
    anyq.limit_lane(LANE, 1)
    jid = anyq.enqueue(b"x", group=LANE).id
    anyq.claim(lease_ms=50)
    assert r.hget(K(qname, "gactive"), LANE) == b"1"
    assert wait_for(anyq.reap) == 1
    assert places(r, qname, jid) == [f"lane {LANE}"]
    assert r.hget(K(qname, "gactive"), LANE) is None
    assert ring(r, qname) == [LANE]
    assert smembers(r, K(qname, "lanes")) == {LANE}
    assert anyq.check() == []


def test_reap_respects_its_limit(anyq: Any, r: redis.Redis, qname: str) -> None:
    for _ in range(3):
        anyq.enqueue(b"x")
    anyq.claim_batch(3, lease_ms=30)
    wait_for(lambda: lapsed(r, qname, 3))
    assert anyq.reap(limit=2) == 2
    assert anyq.reap() == 1
    assert anyq.pending_size() == 3
    assert anyq.reap() == 0


# --------------------------------------------------------------------------- sweep_stalled


def test_sweep_stalled_counts_then_kills(anyq: Any, r: redis.Redis, qname: str) -> None:
    jid = anyq.enqueue(b"x").id
    anyq.claim(lease_ms=40)
    assert anyq.sweep_stalled(max_stalled=2) == ([], [])  # not lapsed yet
    wait_for(lambda: lapsed(r, qname))
    assert anyq.sweep_stalled(max_stalled=2) == ([jid], [])
    assert row(r, qname, jid)["stalled"] == b"1"
    assert row(r, qname, jid)["state"] == b"pending"
    assert places(r, qname, jid) == ["pending"]
    assert anyq.claim(lease_ms=40).token == 2
    wait_for(lambda: lapsed(r, qname))
    assert anyq.sweep_stalled(max_stalled=2) == ([], [jid])
    assert row(r, qname, jid) == {
        "state": b"dead",
        "attempts": b"2",
        "payload": b"x",
        "stalled": b"2",
        "last_error": b"stalled",
    }
    assert places(r, qname, jid) == ["dead"]
    assert r.hget(K(qname, "metrics:failed"), "count") == b"1"
    assert anyq.check() == []


def test_sweep_stalled_default_kills_a_grouped_job(anyq: Any, r: redis.Redis, qname: str) -> None:
    jid = anyq.enqueue(b"x", group=LANE).id
    keep = anyq.enqueue(b"y", group=LANE_B).id
    anyq.claim(lease_ms=40)
    held = anyq.claim(lease_ms=60_000)
    assert held.id == keep
    wait_for(lambda: lapsed(r, qname))
    assert anyq.sweep_stalled() == ([], [jid])
    assert places(r, qname, jid) == ["dead"]
    assert row(r, qname, jid)["last_error"] == b"stalled"
    assert r.hget(K(qname, "gactive"), LANE) is None
    assert r.hget(K(qname, "gactive"), LANE_B) == b"1"
    assert places(r, qname, keep) == ["active"]
    assert anyq.counts()["failed"] == 1
    assert anyq.check() == []


# --------------------------------------------------------------------------- reprocess


def test_reprocess_a_dead_job(anyq: Any, r: redis.Redis, qname: str) -> None:
    jid = make_dead(anyq)
    assert anyq.reprocess(jid) is None
    # attempts stays (the token never goes down); floor = attempts: a fresh retry budget.
    assert row(r, qname, jid) == {
        "state": b"pending",
        "attempts": b"1",
        "payload": b"d",
        "floor": b"1",
    }
    assert places(r, qname, jid) == ["pending"]
    assert ring(r, qname) == ["*"]
    job = anyq.claim()
    assert job.id == jid and job.token == 2 and job.attempt == 1
    assert anyq.check() == []


def test_reprocess_gives_a_fresh_budget_and_refuses_the_old_token(anyq: Any) -> None:
    jid = make_dead(anyq)  # died at max_attempts=1 with token 1
    anyq.reprocess(jid)
    job = anyq.claim()
    assert job.id == jid and job.token == 2
    with pytest.raises(StaleToken):
        anyq.complete(jid, 1)
    # Its own attempt 1 of 2: scheduled again, not dead at once.
    assert anyq.retry(jid, 2, delay_ms=0, max_attempts=2, error="e") == "scheduled"
    anyq.promote()
    job = anyq.claim()
    assert job.token == 3 and job.attempt == 2
    assert anyq.retry(jid, 3, delay_ms=0, max_attempts=2, error="e") == "dead"


def test_reprocess_a_grouped_job_back_to_its_lane(anyq: Any, r: redis.Redis, qname: str) -> None:
    jid = make_dead(anyq, group=LANE)
    anyq.reprocess(jid)
    assert places(r, qname, jid) == [f"lane {LANE}"]
    assert row(r, qname, jid)["state"] == b"pending"
    assert "last_error" not in row(r, qname, jid)
    assert anyq.pending_size() == 0
    assert anyq.lane_depth(LANE) == 1
    assert ring(r, qname) == [LANE]
    assert smembers(r, K(qname, "lanes")) == {LANE}
    assert anyq.claim().group == LANE
    assert anyq.check() == []


def test_run_now_moves_one_scheduled_job_to_waiting(anyq: Any, r: redis.Redis, qname: str) -> None:
    later = anyq.enqueue(b"a", delay_ms=3_600_000).id
    other = anyq.enqueue(b"b", delay_ms=3_600_000).id
    lane = anyq.enqueue(b"c", delay_ms=3_600_000, group=LANE).id
    assert anyq.run_now(later) is None
    assert places(r, qname, later) == ["pending"]
    assert row(r, qname, later)["state"] == b"pending"
    assert places(r, qname, other) == ["schedule"]  # only the one asked for
    anyq.run_now(lane)
    assert places(r, qname, lane) == [f"lane {LANE}"]
    assert row(r, qname, lane)["state"] == b"pending"
    assert anyq.lane_depth(LANE) == 1
    assert {anyq.claim().id, anyq.claim().id} == {later, lane}
    assert anyq.claim() is None
    assert anyq.check() == []


def test_run_now_refuses_a_job_that_is_not_scheduled(anyq: Any, r: redis.Redis, qname: str) -> None:
    dead = make_dead(anyq)
    active = anyq.enqueue(b"x").id
    assert anyq.claim().id == active
    waiting = anyq.enqueue(b"w").id
    before = snapshot(r, qname)
    for jid in (waiting, dead, active):
        with pytest.raises(StateError):
            anyq.run_now(jid)
    with pytest.raises(JobGone):
        anyq.run_now(ids.mint())
    with pytest.raises(echomq.InvalidId):
        anyq.run_now("not-an-id")
    assert snapshot(r, qname) == before


def test_reprocess_refuses_a_job_that_is_not_dead(anyq: Any, r: redis.Redis, qname: str) -> None:
    waiting = anyq.enqueue(b"w").id
    held = anyq.enqueue(b"h", group=LANE).id
    anyq.claim()
    later = anyq.enqueue(b"s", delay_ms=60_000).id
    before = snapshot(r, qname)
    for jid in (waiting, held, later):
        with pytest.raises(StateError) as info:
            anyq.reprocess(jid)
        assert info.value.reason == "not dead or completed"
    assert snapshot(r, qname) == before
    with pytest.raises(JobGone):
        anyq.reprocess(ids.mint())


# --------------------------------------------------------------------------- remove


@pytest.mark.parametrize("where", ["pending", "lane", "active", "active-lane", "schedule", "dead"])
def test_remove_from_every_place(anyq: Any, r: redis.Redis, qname: str, where: str) -> None:
    if where == "pending":
        jid = anyq.enqueue(b"x").id
    elif where == "lane":
        jid = anyq.enqueue(b"x", group=LANE).id
    elif where == "active":
        jid = anyq.enqueue(b"x").id
        anyq.claim()
    elif where == "active-lane":
        anyq.limit_lane(LANE, 1)
        jid = anyq.enqueue(b"x", group=LANE).id
        anyq.claim()
        waiting = anyq.enqueue(b"y", group=LANE).id
        assert ring(r, qname) == []  # LANE is at its limit
    elif where == "schedule":
        jid = anyq.enqueue(b"x", delay_ms=60_000).id
    else:
        jid = make_dead(anyq)
    anyq.add_log(jid, "a line")
    assert anyq.remove(jid) is None
    jk = K(qname, "job:" + jid)
    assert r.exists(jk, jk + ":logs") == 0
    assert places(r, qname, jid) == []
    assert anyq.job_state(jid) == "absent"
    if where == "active-lane":
        assert r.hget(K(qname, "gactive"), LANE) is None
        assert ring(r, qname) == [LANE]  # the freed slot makes the lane serviceable
        assert anyq.claim().id == waiting
    else:
        assert ring(r, qname) == []
        assert smembers(r, K(qname, "lanes")) == set()
        assert r.exists(K(qname, "gactive")) == 0
    assert anyq.check() == []
    with pytest.raises(JobGone):
        anyq.remove(jid)


def test_remove_refuses_a_locked_job(anyq: Any, r: redis.Redis, qname: str) -> None:
    jid = anyq.enqueue(b"x").id
    r.set(K(qname, f"job:{jid}:lock"), "worker-1")
    before = snapshot(r, qname)
    with pytest.raises(Locked):
        anyq.remove(jid)
    assert snapshot(r, qname) == before


# --------------------------------------------------------------------------- reads


def test_browse_every_state_newest_first(anyq: Any, r: redis.Redis, qname: str) -> None:
    d1, d2 = make_dead(anyq), make_dead(anyq)
    a1 = anyq.enqueue(b"a1").id
    assert anyq.claim(lease_ms=10_000).id == a1
    a2 = anyq.enqueue(b"a2").id
    assert anyq.claim(lease_ms=20_000).id == a2
    s1 = anyq.enqueue(b"s1", delay_ms=10_000).id
    s2 = anyq.enqueue(b"s2", delay_ms=20_000).id
    p1, p2, p3 = (anyq.enqueue(b"p").id for _ in range(3))
    l1, l2 = (anyq.enqueue(b"l", group=LANE).id for _ in range(2))
    assert anyq.browse() == [p3, p2, p1]
    assert anyq.browse("pending", 2) == [p3, p2]
    assert anyq.browse("pending", group=LANE) == [l2, l1]
    assert anyq.browse("active") == [a2, a1]
    assert anyq.browse("scheduled") == [s2, s1]
    assert anyq.browse("scheduled", 1) == [s2]
    assert anyq.browse("dead") == [d2, d1]
    assert anyq.browse("dead", 1) == [d2]
    for bad in ("wait", "complete", "PENDING", ""):
        with pytest.raises(InvalidArgument):
            anyq.browse(bad)


def test_pending_size_counts_the_flat_set_only(anyq: Any) -> None:
    for _ in range(2):
        anyq.enqueue(b"f")
    for _ in range(3):
        anyq.enqueue(b"l", group=LANE)
    anyq.enqueue(b"s", delay_ms=60_000)
    assert anyq.pending_size() == 2
    assert anyq.counts()["pending"] == 5


def test_counts_every_state(anyq: Any, r: redis.Redis, qname: str) -> None:
    assert anyq.counts() == {
        "pending": 0,
        "active": 0,
        "schedule": 0,
        "dead": 0,
        "completed": 0,
        "failed": 0,
        "kept": 0,
    }
    anyq.enqueue(b"c")
    done = anyq.claim()
    anyq.complete(done.id, done.token)
    make_dead(anyq)
    anyq.enqueue(b"a")
    anyq.claim()
    anyq.enqueue(b"s", delay_ms=60_000)
    anyq.enqueue(b"p1")
    anyq.enqueue(b"p2")
    anyq.enqueue(b"l1", group=LANE)
    anyq.pause_lane(LANE)  # a paused lane's backlog is still pending (D14)
    assert anyq.counts() == {
        "pending": 3,
        "active": 1,
        "schedule": 1,
        "dead": 1,
        "completed": 1,
        "failed": 1,
        "kept": 0,
    }
    assert anyq.check() == []


def test_get_job_returns_the_payload_verbatim(anyq: Any, r: redis.Redis, qname: str) -> None:
    payload = b"line1\r\nline2\x00\xff\xfe\r\n"
    e = anyq.enqueue(payload)
    job = anyq.get_job(e.id)
    assert job == {"state": "pending", "attempts": "0", "payload": payload}
    assert isinstance(job["payload"], bytes)
    assert anyq.claim().payload == payload
    grouped = anyq.enqueue(b"", group=LANE).id
    assert anyq.get_job(grouped) == {
        "state": "pending",
        "attempts": "0",
        "payload": b"",
        "group": LANE,
    }
    assert anyq.claim().payload == b""
    assert anyq.get_job(ids.mint()) is None


def test_job_state_every_answer(anyq: Any, r: redis.Redis, qname: str) -> None:
    dead = make_dead(anyq, group=LANE_B)
    assert anyq.job_state(dead) == "dead"
    flat = anyq.enqueue(b"x").id
    assert anyq.job_state(flat) == "pending"
    assert anyq.claim().id == flat
    assert anyq.job_state(flat) == "active"
    grouped = anyq.enqueue(b"x", group=LANE).id
    assert anyq.job_state(grouped) == "pending"
    later = anyq.enqueue(b"x", delay_ms=60_000).id
    assert anyq.job_state(later) == "scheduled"
    parent = ids.mint()
    r.hset(K(qname, "job:" + parent), mapping={"state": "awaiting_children", "attempts": "0"})
    assert anyq.job_state(parent) == "awaiting_children"
    lost = ids.mint()
    r.hset(K(qname, "job:" + lost), mapping={"state": "pending", "attempts": "0"})
    assert anyq.job_state(lost) == "unknown"
    assert anyq.job_state(ids.mint()) == "absent"
    assert any(lost in v for v in anyq.check())
    r.delete(K(qname, "job:" + lost))
    assert anyq.check() == []


# --------------------------------------------------------------------------- pause


def test_pause_resume_is_paused(anyq: Any, r: redis.Redis, qname: str) -> None:
    assert anyq.is_paused() is False
    e = anyq.enqueue(b"x")
    anyq.enqueue(b"y", group=LANE)
    anyq.pause()
    anyq.pause()
    assert anyq.is_paused() is True
    assert r.hget(K(qname, "meta"), "paused") == b"1"
    assert anyq.claim() is None
    assert anyq.claim_batch(5) == []
    assert anyq.pending_size() == 1 and anyq.lane_depth(LANE) == 1
    r.delete(K(qname, "wake"))
    anyq.resume()
    assert anyq.is_paused() is False
    assert r.hexists(K(qname, "meta"), "paused") is False
    assert r.llen(K(qname, "wake")) > 0  # parked consumers are woken
    anyq.resume()
    assert {j.id for j in anyq.claim_batch(5)} >= {e.id}
    assert anyq.check() == []


# --------------------------------------------------------------------------- lanes


def test_pause_and_resume_a_lane(anyq: Any, r: redis.Redis, qname: str) -> None:
    a = anyq.enqueue(b"a", group=LANE).id
    b = anyq.enqueue(b"b", group=LANE_B).id
    anyq.pause_lane(LANE)
    assert smembers(r, K(qname, "paused")) == {LANE}
    assert ring(r, qname) == [LANE_B]
    assert anyq.lanes() == sorted([LANE, LANE_B])  # the registry keeps paused lanes
    assert anyq.claim().id == b
    assert anyq.claim() is None
    assert anyq.lane_depth(LANE) == 1
    assert anyq.lanes() == [LANE]
    assert anyq.check() == []
    anyq.resume_lane(LANE)
    assert smembers(r, K(qname, "paused")) == set()
    assert ring(r, qname) == [LANE]
    assert anyq.claim().id == a
    assert anyq.lanes() == []
    assert anyq.check() == []


def test_limit_lane_caps_active_and_none_removes_it(anyq: Any, r: redis.Redis, qname: str) -> None:
    anyq.limit_lane(LANE, 2)
    assert r.hget(K(qname, "glimit"), LANE) == b"2"
    for _ in range(5):
        anyq.enqueue(b"l", group=LANE)
    for _ in range(2):
        anyq.enqueue(b"f")
    jobs = anyq.claim_batch(10)
    assert Counter(j.group for j in jobs) == {LANE: 2, None: 2}
    assert r.hget(K(qname, "gactive"), LANE) == b"2"
    assert ring(r, qname) == []
    assert anyq.lane_depth(LANE) == 3
    assert anyq.lanes() == [LANE]
    assert anyq.claim() is None
    assert anyq.check() == []
    held = next(j for j in jobs if j.group == LANE)
    anyq.complete(held.id, held.token)
    assert ring(r, qname) == [LANE]
    assert anyq.claim().group == LANE
    assert anyq.claim() is None
    anyq.limit_lane(LANE, None)
    assert r.hexists(K(qname, "glimit"), LANE) is False
    assert ring(r, qname) == [LANE]
    assert len(anyq.claim_batch(10)) == 2
    assert anyq.check() == []


def test_limit_lane_below_current_active(anyq: Any, r: redis.Redis, qname: str) -> None:
    for _ in range(4):
        anyq.enqueue(b"l", group=LANE)
    anyq.claim_batch(2)
    assert ring(r, qname) == [LANE]
    anyq.limit_lane(LANE, 1)
    assert ring(r, qname) == []
    assert anyq.claim() is None
    anyq.limit_lane(LANE, 3)
    assert ring(r, qname) == [LANE]
    assert anyq.claim().group == LANE
    assert anyq.claim() is None
    assert anyq.check() == []


def test_weight_lane_field(anyq: Any, r: redis.Redis, qname: str) -> None:
    anyq.weight_lane(LANE, 3)
    assert r.hget(K(qname, "gweight"), LANE) == b"3"
    anyq.weight_lane(LANE, 1)  # the default clears the field
    assert r.hexists(K(qname, "gweight"), LANE) is False


@pytest.mark.parametrize("batch", [False, True], ids=["claim", "claim_batch"])
def test_weights_are_honoured(anyq: Any, batch: bool) -> None:
    anyq.weight_lane(LANE, 3)
    anyq.enqueue_many([b"a"] * 300, group=LANE)
    anyq.enqueue_many([b"b"] * 300, group=LANE_B)
    anyq.enqueue_many([b"f"] * 300)
    jobs: list[Job] = []
    if batch:
        for _ in range(40):
            jobs += anyq.claim_batch(10)
    else:
        jobs = [anyq.claim() for _ in range(400)]
    assert len(jobs) == 400
    got = Counter(j.group for j in jobs)
    for group, expected in ((LANE, 240), (LANE_B, 80), (None, 80)):
        assert abs(got[group] - expected) <= expected * 0.1, got


def test_reassign_moves_a_waiting_job(anyq: Any, r: redis.Redis, qname: str) -> None:
    jid = anyq.enqueue(b"x").id
    assert anyq.reassign(jid, LANE) == "reassigned"
    assert row(r, qname, jid)["group"] == LANE.encode()
    assert places(r, qname, jid) == [f"lane {LANE}"]
    assert anyq.pending_size() == 0
    assert ring(r, qname) == [LANE]
    assert anyq.lanes() == [LANE]
    assert anyq.check() == []
    assert anyq.reassign(jid, LANE) == "noop"
    assert anyq.reassign(jid, LANE_B) == "reassigned"
    assert places(r, qname, jid) == [f"lane {LANE_B}"]
    assert ring(r, qname) == [LANE_B]
    assert anyq.lanes() == [LANE_B]
    assert r.exists(lane_key(qname, LANE)) == 0
    assert anyq.claim().group == LANE_B
    assert anyq.check() == []


def test_reassign_a_scheduled_job(anyq: Any, r: redis.Redis, qname: str) -> None:
    jid = anyq.enqueue(b"x", delay_ms=30).id
    assert anyq.reassign(jid, LANE) == "reassigned"
    assert places(r, qname, jid) == ["schedule"]
    wait_for(anyq.promote)
    assert places(r, qname, jid) == [f"lane {LANE}"]
    assert anyq.check() == []


def test_reassign_refuses_held_and_dead_jobs(anyq: Any, r: redis.Redis, qname: str) -> None:
    held = anyq.enqueue(b"x").id
    anyq.claim()
    dead = make_dead(anyq)
    before = snapshot(r, qname)
    for jid in (held, dead):
        with pytest.raises(StateError) as info:
            anyq.reassign(jid, LANE)
        assert info.value.reason == "not pending"
    assert snapshot(r, qname) == before
    with pytest.raises(JobGone):
        anyq.reassign(ids.mint(), LANE)


# --------------------------------------------------------------------------- drain / obliterate


def test_drain_flat_and_lanes(anyq: Any, r: redis.Redis, qname: str) -> None:
    held = anyq.enqueue(b"held").id
    assert anyq.claim().id == held
    later = anyq.enqueue(b"later", delay_ms=60_000).id
    flat = [anyq.enqueue(b"f").id for _ in range(3)]
    lane_a = [anyq.enqueue(b"a", group=LANE).id for _ in range(2)]
    lane_b = anyq.enqueue(b"b", group=LANE_B).id
    anyq.pause_lane(LANE_B)
    anyq.add_log(flat[0], "a line")
    assert anyq.drain() == 6
    for jid in [*flat, *lane_a, lane_b]:
        jk = K(qname, "job:" + jid)
        assert r.exists(jk, jk + ":logs") == 0
    assert r.exists(K(qname, "pending"), lane_key(qname, LANE), lane_key(qname, LANE_B)) == 0
    assert smembers(r, K(qname, "lanes")) == set()
    assert ring(r, qname) == []
    assert smembers(r, K(qname, "paused")) == {LANE_B}  # lane settings survive
    assert places(r, qname, held) == ["active"]
    assert places(r, qname, later) == ["schedule"]
    assert anyq.check() == []
    assert anyq.drain() == 0
    assert anyq.drain(include_scheduled=True) == 1
    assert r.exists(K(qname, "job:" + later), K(qname, "schedule")) == 0
    assert places(r, qname, held) == ["active"]
    assert anyq.check() == []


def test_drain_beyond_one_budget(anyq: Any, r: redis.Redis, qname: str) -> None:
    anyq.enqueue_many([b"x"] * 1200)
    anyq.enqueue_many([b"y"] * 300, group=LANE)
    assert anyq.drain() == 1500
    assert [k for k in queue_keys(r, qname) if b":job:" in k] == []
    assert r.exists(K(qname, "pending"), lane_key(qname, LANE), K(qname, "lanes")) == 0
    assert anyq.counts()["pending"] == 0
    assert anyq.check() == []


def test_obliterate_refused_unless_paused(anyq: Any, r: redis.Redis, qname: str) -> None:
    anyq.enqueue(b"x")
    before = snapshot(r, qname)
    with pytest.raises(StateError) as info:
        anyq.obliterate()
    assert info.value.reason == "not paused"
    with pytest.raises(StateError):
        anyq.obliterate(force=True)
    assert snapshot(r, qname) == before


def test_obliterate_refuses_active_jobs_without_force(
    anyq: Any, r: redis.Redis, qname: str
) -> None:
    anyq.enqueue(b"x")
    anyq.claim()
    anyq.pause()
    before = snapshot(r, qname)
    with pytest.raises(StateError) as info:
        anyq.obliterate()
    assert info.value.reason == "active jobs present"
    assert snapshot(r, qname) == before
    anyq.obliterate(force=True)
    assert queue_keys(r, qname) == []


def test_obliterate_deletes_every_key(anyq: Any, r: redis.Redis, qname: str) -> None:
    done = anyq.enqueue(b"c").id
    job = anyq.claim()
    assert job.id == done
    anyq.complete(job.id, job.token)
    make_dead(anyq, group=LANE_B)
    anyq.enqueue(b"s", delay_ms=60_000)
    for _ in range(3):
        anyq.enqueue(b"l", group=LANE)
    anyq.limit_lane(LANE, 5)
    anyq.weight_lane(LANE, 2)
    anyq.pause_lane(LANE_B)
    anyq.enqueue(b"b", group=LANE_B)
    flat = anyq.enqueue(b"f").id
    anyq.add_log(flat, "line")
    anyq.update_progress(flat, "10")
    anyq.pause()
    assert len(queue_keys(r, qname)) > 10
    anyq.obliterate()
    assert queue_keys(r, qname) == []
    # The name is free again: a fresh, unpaused queue.
    assert anyq.is_paused() is False
    assert anyq.enqueue(b"new").status == "enqueued"
    assert anyq.check() == []


# --------------------------------------------------------------------------- progress / logs


def test_update_progress_emits_an_event(anyq: Any, r: redis.Redis, qname: str) -> None:
    # D15: progress is an entry of the queue's event stream (no longer a PUBLISH).
    jid = anyq.enqueue(b"x").id
    anyq.enable_events(100)
    anyq.update_progress(jid, "50%")
    text = 'caf\u00e9 \u2713 "q" a/b\n'
    anyq.update_progress(jid, text)
    entries = r.xrange(K(qname, "events"))
    assert [e[1] for e in entries] == [
        {b"event": b"progress", b"id": jid.encode(), b"progress": b"50%"},
        {b"event": b"progress", b"id": jid.encode(), b"progress": text.encode()},
    ]
    assert row(r, qname, jid)["progress"] == text.encode()
    with pytest.raises(JobGone):
        anyq.update_progress(ids.mint(), "1")
    assert anyq.check() == []


def test_add_log_and_logs(anyq: Any, r: redis.Redis, qname: str) -> None:
    jid = anyq.enqueue(b"x").id
    assert anyq.logs(jid) == []
    assert anyq.add_log(jid, "one") == 1
    assert anyq.add_log(jid, "two") == 2
    assert anyq.add_log(jid, "three") == 3
    assert anyq.logs(jid) == [b"one", b"two", b"three"]
    assert anyq.add_log(jid, "four", keep=2) == 2
    assert anyq.logs(jid) == [b"three", b"four"]
    assert r.lrange(K(qname, f"job:{jid}:logs"), 0, -1) == [b"three", b"four"]
    assert anyq.add_log(jid, "five", keep=10) == 3
    gone = ids.mint()
    with pytest.raises(JobGone):
        anyq.add_log(gone, "x")
    with pytest.raises(JobGone):
        anyq.logs(gone)
    assert r.exists(K(qname, f"job:{gone}:logs")) == 0
    assert anyq.check() == []


def test_clear_logs_keeps_the_newest_and_answers_how_many_went(
    anyq: Any, r: redis.Redis, qname: str
) -> None:
    """Issue 38 item 6: ``clear_logs(id, keep=)`` (BullMQ's ``job.clearLogs(keepLogs)``)."""
    jid = anyq.enqueue(b"x").id
    logs_key = K(qname, f"job:{jid}:logs")
    assert anyq.clear_logs(jid) == 0  # no lines yet: nothing removed, nothing written
    assert r.exists(logs_key) == 0
    for line in ("one", "two", "three", "four"):
        anyq.add_log(jid, line)
    assert anyq.clear_logs(jid, keep=2) == 2
    assert anyq.logs(jid) == [b"three", b"four"]
    assert anyq.clear_logs(jid, keep=2) == 0  # a second copy: the same newest two
    assert anyq.clear_logs(jid, keep=5) == 0
    assert anyq.logs(jid) == [b"three", b"four"]
    assert anyq.clear_logs(jid) == 2
    assert anyq.logs(jid) == [] and r.exists(logs_key) == 0  # the LIST key is gone
    assert anyq.add_log(jid, "again") == 1  # the log starts over
    before = snapshot(r, qname)
    for bad in (-1, 2**63, 1.5, "2", True, None):
        with pytest.raises(InvalidArgument):
            anyq.clear_logs(jid, keep=bad)
    for bad_id in ("", "a:b", "x" * 300, "job0khtownGLuC"):
        with pytest.raises(InvalidId):
            anyq.clear_logs(bad_id)
    assert snapshot(r, qname) == before  # bad input writes nothing
    gone = ids.mint()
    with pytest.raises(JobGone):
        anyq.clear_logs(gone)
    assert r.exists(K(qname, f"job:{gone}:logs")) == 0
    assert anyq.check() == []


def test_clear_logs_composes_with_the_lifecycle(anyq: Any, r: redis.Redis, qname: str) -> None:
    """The composition rule (PROTOCOL §2.4): clear_logs against a held job, a reap, a
    reprocess, a removal, a cancel and a re-admission of the id."""
    readmit = ids.encode("JOB", 38)
    anyq.enqueue(b"x", id=readmit)
    job = anyq.claim(lease_ms=60_000)
    anyq.add_log(job.id, "run 1")
    anyq.add_log(job.id, "run 1 again")
    assert anyq.clear_logs(job.id, keep=1) == 1  # a held job: its lease is untouched
    assert anyq.job_state(job.id) == "active"
    assert anyq.retry(job.id, job.token, delay_ms=0, max_attempts=1, error="boom") == "dead"
    assert anyq.job_state(job.id) == "dead" and anyq.logs(job.id) == [b"run 1 again"]
    anyq.reprocess(job.id)  # logs survive a reprocess; clearing them starts the rerun clean
    assert anyq.clear_logs(job.id) == 1
    rerun = anyq.claim(lease_ms=40)
    anyq.add_log(rerun.id, "run 2")
    assert wait_for(anyq.reap) == 1  # reaped: pending again, still clearable
    assert anyq.clear_logs(rerun.id) == 1
    anyq.add_log(rerun.id, "before remove")
    anyq.remove(rerun.id)  # the row and its logs go together
    with pytest.raises(JobGone):
        anyq.clear_logs(rerun.id)
    assert r.exists(K(qname, f"job:{rerun.id}:logs")) == 0
    anyq.enqueue(b"y", id=readmit)  # a re-admission starts with no lines
    assert anyq.logs(readmit) == [] and anyq.clear_logs(readmit) == 0
    anyq.add_log(readmit, "waiting")
    assert anyq.cancel(readmit) == "removed"  # a cancel of a waiting job removes it
    with pytest.raises(JobGone):
        anyq.clear_logs(readmit)
    assert anyq.check() == []


# --------------------------------------------------------------------------- D5 settling


def test_stale_token_after_reap_and_reclaim(anyq: Any, r: redis.Redis, qname: str) -> None:
    anyq.enqueue(b"x")
    old = anyq.claim(lease_ms=40)
    assert wait_for(anyq.reap) == 1
    new = anyq.claim(lease_ms=60_000)
    assert new.id == old.id and new.token == old.token + 1
    before = snapshot(r, qname)
    with pytest.raises(StaleToken, match="complete token mismatch"):
        anyq.complete(old.id, old.token)
    with pytest.raises(StaleToken, match="retry token mismatch"):
        anyq.retry(old.id, old.token, delay_ms=0, max_attempts=1, error="late")
    with pytest.raises(StaleToken, match="delay token mismatch"):
        anyq.delay(old.id, old.token, 0)
    with pytest.raises(StaleToken, match="extend token mismatch"):
        anyq.extend(old.id, old.token, lease_ms=1_000)
    assert anyq.extend_many([(old.id, old.token)], lease_ms=1_000) == [old.id]
    assert snapshot(r, qname) == before
    anyq.complete(new.id, new.token)
    assert anyq.check() == []


@pytest.mark.parametrize("grouped", [False, True], ids=["flat", "lane"])
@pytest.mark.parametrize("verb", ["complete", "retry", "delay-0", "delay", "extend", "extend_many"])
def test_settle_a_reaped_unclaimed_job(
    anyq: Any, r: redis.Redis, qname: str, verb: str, grouped: bool
) -> None:
    group = LANE if grouped else None
    waiting = f"lane {LANE}" if grouped else "pending"
    jid = anyq.enqueue(b"x", group=group).id
    job = anyq.claim(lease_ms=40)
    assert wait_for(anyq.reap) == 1
    assert places(r, qname, jid) == [waiting]
    if verb == "complete":
        anyq.complete(jid, job.token)
        expected: list[str] = []
    elif verb == "retry":
        assert anyq.retry(jid, job.token, delay_ms=60_000, max_attempts=5, error="e") == (
            "scheduled"
        )
        expected = ["schedule"]
    elif verb == "delay-0":
        anyq.delay(jid, job.token, 0)
        expected = [waiting]
    elif verb == "delay":
        anyq.delay(jid, job.token, 60_000)
        expected = ["schedule"]
    else:
        t0 = server_ms(r)
        if verb == "extend":
            anyq.extend(jid, job.token, lease_ms=60_000)
        else:
            assert anyq.extend_many([(jid, job.token)], lease_ms=60_000) == []
        t1 = server_ms(r)
        assert_lease(r, qname, jid, t0, t1, 60_000)
        assert row(r, qname, jid)["state"] == b"active"  # re-armed
        expected = ["active"]
    assert places(r, qname, jid) == expected  # exactly one place (or none once completed)
    gactive = r.hget(K(qname, "gactive"), LANE)
    assert gactive == (b"1" if grouped and expected == ["active"] else None)
    if expected == [waiting]:
        assert ring(r, qname) == [LANE if grouped else "*"]
    else:
        assert ring(r, qname) == []
        assert smembers(r, K(qname, "lanes")) == set()
    assert anyq.check() == []


def test_settling_a_settled_lease_is_stale(anyq: Any, r: redis.Redis, qname: str) -> None:
    anyq.enqueue(b"x")
    job = anyq.claim()
    anyq.retry(job.id, job.token, delay_ms=60_000, max_attempts=5, error="e")
    before = snapshot(r, qname)
    with pytest.raises(StaleToken, match="complete lease settled"):
        anyq.complete(job.id, job.token)
    with pytest.raises(StaleToken, match="extend lease settled"):
        anyq.extend(job.id, job.token, lease_ms=1_000)
    with pytest.raises(StaleToken, match="retry lease settled"):
        anyq.retry(job.id, job.token, delay_ms=0, max_attempts=5, error="e")
    with pytest.raises(StaleToken, match="delay lease settled"):
        anyq.delay(job.id, job.token, 0)
    assert snapshot(r, qname) == before
    dead = make_dead(anyq)
    with pytest.raises(StaleToken, match="complete lease settled"):
        anyq.complete(dead, 1)
    assert places(r, qname, dead) == ["dead"]


@pytest.mark.parametrize("grouped", [False, True], ids=["flat", "lane"])
@pytest.mark.parametrize("route", ["retry-promote", "delay-0", "dead-reprocess", "stall-reprocess"])
def test_a_released_lease_never_settles_again(
    anyq: Any, r: redis.Redis, qname: str, route: str, grouped: bool
) -> None:
    """Regression (D5 vs D13): a job back in pending because its holder released it (not
    because its lease lapsed) keeps its attempts, but the holder's token must not settle it
    a second time: each lease generation settles at most once."""
    jid = anyq.enqueue(b"x", group=LANE if grouped else None).id
    job = anyq.claim(lease_ms=60_000 if route != "stall-reprocess" else 40)
    if route == "retry-promote":
        assert anyq.retry(jid, job.token, delay_ms=0, max_attempts=5, error="e") == "scheduled"
        assert wait_for(anyq.promote) == 1
    elif route == "delay-0":
        anyq.delay(jid, job.token, 0)
    elif route == "dead-reprocess":
        assert anyq.retry(jid, job.token, delay_ms=0, max_attempts=1, error="e") == "dead"
        anyq.reprocess(jid)
    else:
        assert wait_for(lambda: anyq.sweep_stalled(max_stalled=1)[1]) == [jid]
        anyq.reprocess(jid)
    assert anyq.job_state(jid) == "pending"
    before = snapshot(r, qname)
    for verb in ("complete", "retry", "delay", "extend"):
        with pytest.raises(StaleToken, match=f"{verb} lease settled"):
            if verb == "complete":
                anyq.complete(jid, job.token)
            elif verb == "retry":
                anyq.retry(jid, job.token, delay_ms=0, max_attempts=9, error="late")
            elif verb == "delay":
                anyq.delay(jid, job.token, 0)
            else:
                anyq.extend(jid, job.token, lease_ms=1_000)
    assert anyq.extend_many([(jid, job.token)], lease_ms=1_000) == [jid]
    assert snapshot(r, qname) == before
    again = anyq.claim(lease_ms=60_000)
    assert again.id == jid and again.token == job.token + 1
    anyq.complete(jid, again.token)
    counts = anyq.counts()
    assert counts["completed"] == 1
    assert anyq.check() == []


def test_a_never_claimed_job_cannot_be_settled(anyq: Any, r: redis.Redis, qname: str) -> None:
    jid = anyq.enqueue(b"x").id
    before = snapshot(r, qname)
    with pytest.raises(StaleToken):
        anyq.complete(jid, 1)
    with pytest.raises(StaleToken):
        anyq.extend(jid, 1, lease_ms=1_000)
    assert snapshot(r, qname) == before


# --------------------------------------------------------------------------- NOSCRIPT


def test_script_flush_between_calls(anyq: Any, r: redis.Redis, qname: str) -> None:
    anyq.enqueue(b"a")
    r.script_flush()
    job = anyq.claim(lease_ms=5_000)
    r.script_flush()
    out = anyq.enqueue_many([b"b", b"c"])  # the pipeline path
    assert [e.status for e in out] == ["enqueued", "enqueued"]
    r.script_flush()
    anyq.complete(job.id, job.token)
    r.script_flush()
    assert len(anyq.claim_batch(5)) == 2
    r.script_flush()
    assert anyq.counts()["active"] == 2
    assert anyq.check() == []


@pytest.mark.executors("lua")  # about EVALSHA -> NOSCRIPT -> EVAL itself
def test_error_mapping_is_identical_on_eval_and_evalsha(
    anyq: Any, r: redis.Redis, qname: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    anyq.enqueue(b"x")
    job = anyq.claim()
    seen = spy_commands(monkeypatch, anyq)
    sha = SCRIPTS["complete"].sha
    r.script_flush()
    assert r.script_exists(sha) == [False]
    with pytest.raises(StaleToken) as cold:
        anyq.complete(job.id, job.token + 1)
    assert seen == ["EVALSHA", "EVAL"]  # NOSCRIPT, then EVAL
    assert r.script_exists(sha) == [True]
    with pytest.raises(StaleToken) as warm:
        anyq.complete(job.id, job.token + 1)
    assert seen == ["EVALSHA", "EVAL", "EVALSHA"]
    assert str(cold.value) == str(warm.value) == "EMQSTALE complete token mismatch"
    oid = ids.mint("ORD")
    r.script_flush()
    with pytest.raises(KindError) as cold_kind:
        anyq.enqueue(b"x", id=oid)
    with pytest.raises(KindError) as warm_kind:
        anyq.enqueue(b"x", id=oid)
    assert str(cold_kind.value) == str(warm_kind.value)
    # The pipeline path: per-item verdicts, cold and warm.
    r.script_flush()
    cold_many = anyq.enqueue_many([(oid, b"x")])
    warm_many = anyq.enqueue_many([(oid, b"x")])
    assert isinstance(cold_many[0], KindError) and isinstance(warm_many[0], KindError)
    assert str(cold_many[0]) == str(warm_many[0]) == str(cold_kind.value)


# --------------------------------------------------------------------------- version fence


@pytest.fixture(scope="module")
def fence_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A dedicated server: {emq}:version is global, so these tests must not share one."""
    srv = EmbeddedServer(Path(tmp_path_factory.mktemp("fence")), appendonly=False).start()
    yield srv.url
    srv.stop()


@pytest.fixture
def fr(fence_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(fence_url)
    yield client
    client.close()


def _queue(kind: str, name: str, url: str) -> Any:
    if kind == "sync":
        return echomq.Queue(name, url=url)
    return SyncOverAsync(echomq.AsyncQueue(name, url=url))


VERSION = "{emq}:version"


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_fence_claims_an_absent_version(fr: redis.Redis, fence_url: str, kind: str) -> None:
    fr.delete(VERSION)
    queue = _queue(kind, f"fence-absent-{kind}", fence_url)
    try:
        assert queue.pending_size() == 0
        assert fr.get(VERSION) == echomq.WIRE_VERSION.encode()
    finally:
        queue.close()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_fence_refuses_a_foreign_version(fr: redis.Redis, fence_url: str, kind: str) -> None:
    name = f"fence-foreign-{kind}"
    fr.set(VERSION, "echomq:2.4.2")
    queue = _queue(kind, name, fence_url)
    try:
        with pytest.raises(VersionFenceError) as info:
            queue.enqueue(b"x")
        assert info.value.found == "echomq:2.4.2"
        assert info.value.expected == echomq.WIRE_VERSION
        with pytest.raises(VersionFenceError):
            queue.pending_size()
        assert fr.get(VERSION) == b"echomq:2.4.2"  # never overwritten
        assert queue_keys(fr, name) == []
    finally:
        queue.close()
        fr.set(VERSION, echomq.WIRE_VERSION)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_fence_reruns_after_a_reconnect(fr: redis.Redis, fence_url: str, kind: str) -> None:
    name = f"fence-reconnect-{kind}"
    fr.set(VERSION, echomq.WIRE_VERSION)
    queue = _queue(kind, name, fence_url)
    try:
        queue.enqueue(b"x")
        fr.set(VERSION, "echomq:9.9.9")
        # The fence runs per connection: the live one keeps serving...
        assert queue.pending_size() == 1
        # ...until it is gone; the reconnect fences again and refuses.
        assert fr.client_kill_filter(_type="normal", skipme=True) >= 1
        with pytest.raises((VersionFenceError, redis.ConnectionError)) as info:
            queue.pending_size()
        if kind == "async" and isinstance(info.value, redis.ConnectionError):
            # redis-py's asyncio pool may hand out the dead connection once; the driver's
            # error propagates (never replayed) and the next call reconnects, fenced.
            with pytest.raises(VersionFenceError) as info:
                queue.pending_size()
        assert isinstance(info.value, VersionFenceError)
        assert info.value.found == "echomq:9.9.9"
        with pytest.raises(VersionFenceError):
            queue.enqueue(b"y")
        assert fr.get(VERSION) == b"echomq:9.9.9"
        assert fr.zcard(K(name, "pending")) == 1
        fr.set(VERSION, echomq.WIRE_VERSION)
        assert queue.pending_size() == 1
    finally:
        queue.close()
        fr.set(VERSION, echomq.WIRE_VERSION)


def test_fence_server_runs_apart(fence_url: str, redis_url: str) -> None:
    # The fence tests above must never touch the session server's version key.
    assert fence_url != redis_url
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.get(VERSION) in (None, echomq.WIRE_VERSION.encode())
    finally:
        client.close()


# --------------------------------------------------------------------------- settle


def test_settle_completes_retries_and_claims_in_one_call(
    anyq: Any, r: redis.Redis, qname: str
) -> None:
    ids_ = [e.id for e in anyq.enqueue_many([b"a", b"b", b"c", b"d", b"e"])]
    a, b, c = anyq.claim_batch(3, lease_ms=60_000)
    out = anyq.settle(
        completed=[(a.id, a.token), (b.id, b.token + 1)],
        retried=[(c.id, c.token, 60_000, 5, "boom"), (ids_[4], 1, 0, 5, "never claimed")],
        n=5,
        lease_ms=60_000,
    )
    assert out.completed[0] is None
    assert isinstance(out.completed[1], StaleToken)
    assert out.retried[0] == "scheduled"
    assert isinstance(out.retried[1], StaleToken)  # a pending, never-claimed job
    assert [j.id for j in out.jobs] == ids_[3:]  # claimed after the settles, oldest first
    assert all(j.token == 1 for j in out.jobs)
    assert places(r, qname, a.id) == []
    assert places(r, qname, b.id) == ["active"]
    assert places(r, qname, c.id) == ["schedule"]
    assert row(r, qname, c.id)["last_error"] == b"boom"
    counts = anyq.counts()
    assert counts["completed"] == 1 and counts["active"] == 3 and counts["schedule"] == 1
    assert anyq.check() == []


def test_settle_dead_letters_at_the_ceiling_and_reports_gone(anyq: Any, qname: str) -> None:
    anyq.enqueue(b"x")
    job = anyq.claim()
    gone = ids.mint()
    out = anyq.settle(retried=[(job.id, job.token, 0, 1, "fatal"), (gone, 1, 0, 1, "x")])
    assert out.retried[0] == "dead"
    assert isinstance(out.retried[1], JobGone)
    assert out.jobs == []
    assert anyq.counts()["failed"] == 1
    assert anyq.check() == []


def test_settle_claim_respects_pause_and_lanes(anyq: Any, qname: str) -> None:
    anyq.enqueue_many([b"1", b"2"], group="A")
    anyq.enqueue_many([b"3", b"4"], group="B")
    anyq.pause()
    assert anyq.settle(n=4).jobs == []
    anyq.resume()
    groups = [j.group for j in anyq.settle(n=4).jobs]
    assert groups == ["A", "B", "A", "B"]
    assert anyq.check() == []


def test_complete_many_returns_the_refused_ids(anyq: Any, qname: str) -> None:
    anyq.enqueue_many([b"1", b"2", b"3"])
    a, b, c = anyq.claim_batch(3)
    gone = ids.mint()
    assert anyq.complete_many([(a.id, a.token), (b.id, 99), (gone, 1), (c.id, c.token)]) == [
        b.id,
        gone,
    ]
    assert anyq.complete_many([]) == []
    assert anyq.counts()["completed"] == 2
    assert anyq.check() == []


def test_errors_keep_each_failed_attempt_and_go_with_the_row(anyq: Any, r: redis.Redis) -> None:
    jid = anyq.enqueue(b"e").id
    for n in range(1, 13):
        job = anyq.claim()
        assert job.id == jid
        verdict = anyq.retry(jid, job.token, delay_ms=0, max_attempts=12, error=f"boom {n}")
        if verdict == "scheduled":
            anyq.promote()
    assert verdict == "dead"
    errors = anyq.errors(jid)
    assert errors == [f"attempt {n}: boom {n}" for n in range(3, 13)]  # the last 10
    anyq.remove(jid)
    assert not r.exists(f"emq:{{{anyq.name}}}:job:{jid}:errors")
    with pytest.raises(JobGone):
        anyq.errors(jid)


def test_a_completed_job_takes_its_errors_with_it(anyq: Any, r: redis.Redis) -> None:
    """Both completion paths (complete, and the worker's batch settle) delete <row>:errors."""
    for batch in (False, True):
        jid = anyq.enqueue(b"e").id
        job = anyq.claim()
        assert anyq.retry(jid, job.token, delay_ms=0, max_attempts=3, error="once") == "scheduled"
        anyq.promote()
        job = anyq.claim()
        assert anyq.errors(jid) == ["attempt 1: once"]
        if batch:
            assert anyq.settle(completed=[(jid, job.token)]).completed == [None]
        else:
            anyq.complete(jid, job.token)
        row = f"emq:{{{anyq.name}}}:job:{jid}"
        assert not r.exists(row, row + ":errors")
