"""The per-verb integration tests of reads and admin verbs: browse, counts, get_job,
job_state, pause and resume (queue and lanes), lane limits and weights, reassign,
drain, obliterate, progress and logs.
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
    lane_key,
    make_dead,
    places,
    queue_keys,
    ring,
    row,
    smembers,
)

import echomq
from conftest import snapshot, wait_for
from echomq import ids
from echomq.errors import (
    InvalidArgument,
    InvalidId,
    JobGone,
    StateError,
)

# Every test that reaches a server runs on both executors (tests/conftest.py).
pytestmark = pytest.mark.executors


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


def test_a_layout_only_grows_and_every_client_gets_the_stored_one(
    anyq: Any, r: redis.Redis, qname: str, url: str
) -> None:
    """Issue 43: ``propose_shards`` stores a layout that extends the stored one and answers
    the stored one either way; ``shards()`` reads it; a job is never touched."""
    from echomq.client import shards as layouts
    from echomq.protocol import kernel

    meta = K(qname, "meta")
    jid = anyq.enqueue(b"x").id
    before = snapshot(r, qname)
    assert anyq.shards() == [qname]
    assert anyq.propose_shards([qname]) == [qname]  # one shard: nothing is stored
    assert snapshot(r, qname) == before
    three = layouts.layout(qname, 3)
    assert anyq.propose_shards(three) == three
    assert r.hget(meta, "shards") == ",".join(three).encode()
    assert anyq.propose_shards(layouts.layout(qname, 2)) == three  # shorter: kept
    other = [qname, qname + ".shard1.x", qname + ".shard2.x", qname + ".shard3.x"]
    assert anyq.propose_shards(other) == three  # longer but not an extension: kept
    assert anyq.propose_shards(three) == three  # a resend: the same
    six = layouts.grow(qname, three, 6)
    assert six[:3] == three and len(set(six)) == 6
    assert anyq.propose_shards(six) == six and anyq.shards() == six
    assert anyq.get_job(jid) is not None and anyq.counts()["pending"] == 1
    # The script checks what a client did not: a malformed layout is an error, nothing written.
    stored = snapshot(r, qname)
    with echomq.Queue(qname, url=url) as raw:
        for bad in ("other,x", f"{qname},", f"{qname},a b", f"{qname},{qname}"):
            call = kernel._call("propose_shards", (meta,), (K(qname, ""), bad), lambda v: v)
            with pytest.raises(redis.ResponseError, match="propose_shards"):
                raw._x.run(call)
    assert snapshot(r, qname) == stored
