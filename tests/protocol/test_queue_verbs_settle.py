"""The per-verb integration tests of the verbs that move a held or parked job: complete,
retry, delay, extend, promote, reap, sweep_stalled, reprocess, run_now and remove.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
from queue_verbs_support import (
    LANE,
    LANE_B,
    K,
    assert_lease,
    lapsed,
    make_dead,
    places,
    ring,
    row,
    smembers,
)

import echomq
from conftest import server_ms, snapshot, wait_for
from echomq import ids
from echomq.errors import (
    JobGone,
    Locked,
    StaleToken,
    StateError,
)

# Every test that reaches a server runs on both executors (tests/conftest.py).
pytestmark = pytest.mark.executors


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
