"""Kept history (issue 24): keep_completed keeps completed rows in the `completed` set,
trimmed by count and age in the completing script; reprocess takes a dead or kept completed
job, now or with a delay. Queue-level tests run on both executors; the differential test
runs in test_kept_history_native.py."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

import echomq
from conftest import snapshot
from echomq import ids
from echomq.errors import InvalidArgument, JobGone, StateError

pytestmark = pytest.mark.executors


def finish(q: Any, payload: bytes = b"p", **kw: Any) -> str:
    """Enqueue, claim and complete one job; its id."""
    jid_ = q.enqueue(payload, **kw).id
    job = q.claim()
    assert job is not None and job.id == jid_
    q.complete(job.id, job.token, result=b"r:" + payload, keep_result_ms=60_000)
    return jid_


def test_off_by_default_completion_deletes(anyq: Any) -> None:
    done = finish(anyq)
    assert anyq.job_state(done) == "absent"
    assert anyq.browse("completed") == []
    assert anyq.counts()["kept"] == 0


def test_kept_row_state_browse_counts_get_job(anyq: Any, r: redis.Redis, qname: str) -> None:
    anyq.keep_completed(count=10)
    done = [finish(anyq, b"%d" % i) for i in range(3)]
    for i in done:
        assert anyq.job_state(i) == "completed"
    assert set(anyq.browse("completed")) == set(done)
    counts = anyq.counts()
    assert counts["kept"] == 3 and counts["completed"] == 3 and counts["pending"] == 0
    row = anyq.get_job(done[0])
    assert row is not None and row["state"] == "completed" and row["payload"] == b"0"
    assert int(str(row["finished_ms"])) > 0 and "lease_epoch" not in row
    assert anyq.result(done[0]).value == b"r:0"
    assert anyq.check() == []
    # No retired record while the row is kept: it is written when the row is deleted.
    assert not r.hexists(f"emq:{{{qname}}}:retired", done[0])


def test_trim_by_count_deletes_oldest_with_side_keys(anyq: Any, r: redis.Redis, qname: str) -> None:
    anyq.keep_completed(count=2)
    first = anyq.enqueue(b"a").id
    job = anyq.claim()
    anyq.add_log(first, "line")
    anyq.retry(job.id, job.token, delay_ms=0, max_attempts=5, error="boom")
    anyq.promote()
    job = anyq.claim()
    anyq.complete(job.id, job.token)
    assert r.exists(f"emq:{{{qname}}}:job:{first}:logs", f"emq:{{{qname}}}:job:{first}:errors") == 2
    later = [finish(anyq) for _ in range(2)]
    assert anyq.job_state(first) == "absent"
    assert r.exists(f"emq:{{{qname}}}:job:{first}:logs", f"emq:{{{qname}}}:job:{first}:errors") == 0
    assert set(anyq.browse("completed")) == set(later)
    # The trimmed row's last token is retired: a re-admission continues from it.
    assert r.hget(f"emq:{{{qname}}}:retired", first) == b"2"
    anyq.enqueue(b"again", id=first)
    assert anyq.claim().token == 3
    assert anyq.check() == []


def test_trim_by_age(anyq: Any) -> None:
    anyq.keep_completed(count=None, age_ms=150)
    old = finish(anyq)
    time.sleep(0.3)
    new = finish(anyq)
    assert anyq.job_state(old) == "absent"
    assert anyq.browse("completed") == [new]


def test_lowered_count_catches_up_bounded_per_call(anyq: Any) -> None:
    anyq.keep_completed(count=1000)
    for _ in range(150):
        finish(anyq)
    anyq.keep_completed(count=1)
    finish(anyq)  # one added: trims at most 1 + 100 this call
    assert anyq.counts()["kept"] == 151 - 101
    finish(anyq)
    assert anyq.counts()["kept"] == 1
    assert anyq.check() == []


def test_keep_off_again_and_settle_path(anyq: Any, qname: str) -> None:
    anyq.keep_completed(count=5)
    a = anyq.enqueue(b"a").id
    b = anyq.enqueue(b"b").id
    jobs = anyq.claim_batch(2)
    settled = anyq.settle(completed=[(j.id, j.token) for j in jobs], n=0)
    assert settled.completed == [None, None]
    assert {anyq.job_state(a), anyq.job_state(b)} == {"completed"}
    anyq.keep_completed(count=0)
    assert finish(anyq) and anyq.counts()["kept"] == 2  # off: the next completion deletes
    assert anyq.check() == []


def test_remove_and_readmission_of_kept(anyq: Any) -> None:
    anyq.keep_completed(count=10)
    done = finish(anyq)
    # A re-admission of a kept id is refused while the row is kept (as BullMQ's).
    assert anyq.enqueue(b"x", id=done).status == "duplicate"
    anyq.remove(done)
    assert anyq.job_state(done) == "absent" and anyq.browse("completed") == []
    assert anyq.enqueue(b"x", id=done).status == "enqueued"
    assert anyq.check() == []


def test_reprocess_completed_now_and_later(anyq: Any) -> None:
    anyq.keep_completed(count=10)
    a, b, c = finish(anyq, b"a"), finish(anyq, b"b"), finish(anyq, b"c", group="acme")
    anyq.reprocess(a)
    assert anyq.job_state(a) == "pending"
    row = anyq.get_job(a)
    assert row is not None and "finished_ms" not in row and row["floor"] == "1"
    assert anyq.result(a) is None  # a new incarnation: the kept result goes
    anyq.reprocess(b, delay_ms=60_000)
    assert anyq.job_state(b) == "scheduled"
    anyq.reprocess(c, at_ms=1)  # in the past: waiting now, in its lane
    assert anyq.job_state(c) == "pending" and anyq.lane_depth("acme") == 1
    job = anyq.claim()
    assert job.token == 2  # tokens continue
    anyq.complete(job.id, job.token)
    assert anyq.job_state(job.id) == "completed"
    assert anyq.check() == []


def test_reprocess_dead_with_delay(anyq: Any) -> None:
    jid_ = anyq.enqueue(b"d").id
    job = anyq.claim()
    anyq.retry(job.id, job.token, delay_ms=0, max_attempts=1, error="x")
    anyq.reprocess(jid_, delay_ms=60_000)
    assert anyq.job_state(jid_) == "scheduled"
    assert anyq.check() == []


def test_reprocess_all_completed(anyq: Any) -> None:
    anyq.keep_completed(count=10)
    done = {finish(anyq) for _ in range(3)}
    assert anyq.reprocess_all("completed", delay_ms=60_000) == 3
    assert {anyq.job_state(i) for i in done} == {"scheduled"}
    with pytest.raises(InvalidArgument):
        anyq.reprocess_all("pending")


def test_refusals_write_nothing(anyq: Any, r: redis.Redis, qname: str) -> None:
    anyq.keep_completed(count=10)
    waiting = anyq.enqueue(b"w").id
    held = anyq.enqueue(b"h").id
    later = anyq.enqueue(b"s", delay_ms=60_000).id
    done = anyq.enqueue(b"c").id
    for _ in range(2):
        anyq.claim()
    anyq.complete(waiting, 1)  # waiting was claimed first: it is the kept one
    before = snapshot(r, qname)
    for bad in (-1, 1.5, "3", True):
        with pytest.raises(InvalidArgument):
            anyq.keep_completed(count=bad)
    for bad_age in (0, -5, 2.0):
        with pytest.raises(InvalidArgument):
            anyq.keep_completed(count=5, age_ms=bad_age)
    with pytest.raises(InvalidArgument):
        anyq.keep_completed(count=0, age_ms=10)
    for live in (held, later, done):  # active, scheduled, pending
        with pytest.raises(StateError) as info:
            anyq.reprocess(live)
        assert info.value.reason == "not dead or completed"
    for kw in ({"delay_ms": -1}, {"delay_ms": 1.5}, {"at_ms": -1}, {"delay_ms": 1, "at_ms": 1}):
        with pytest.raises(InvalidArgument):
            anyq.reprocess(waiting, **kw)
    with pytest.raises(JobGone):
        anyq.reprocess(ids.mint())
    assert snapshot(r, qname) == before


def test_flow_parent_kept_with_its_children(url: str, qname: str) -> None:
    q = echomq.Queue(qname, url=url)
    q.keep_completed(count=10)
    flow = q.add_flow(echomq.FlowJob(b"parent", children=[echomq.FlowJob(b"child")]))
    child = q.claim()
    q.complete(child.id, child.token, result=b"c")
    parent = q.claim()
    q.complete(parent.id, parent.token)
    assert q.job_state(flow.parent_id) == "completed" and q.job_state(child.id) == "completed"
    assert q.children_values(flow.parent_id) == {child.id: b"c"}
    # A kept child reprocessed and completed again moves its record, never counts twice.
    q.reprocess(child.id)
    again = q.claim()
    q.complete(again.id, again.token, result=b"c2")
    assert q.children_values(flow.parent_id) == {child.id: b"c2"}
    assert q.check() == []
    q.keep_completed(count=0)
    q.close()


def test_kept_row_shows_its_run_time(anyq: Any) -> None:
    anyq.keep_completed(count=10)
    jid_ = anyq.enqueue(b"t").id
    job = anyq.claim()
    time.sleep(0.05)
    anyq.complete(job.id, job.token)
    row = anyq.get_job(jid_)
    assert row is not None
    run_ms = int(str(row["finished_ms"])) - int(str(row["claimed_ms"]))
    assert 40 <= run_ms < 5_000
    anyq.reprocess(jid_)
    row = anyq.get_job(jid_)
    assert row is not None and "claimed_ms" not in row and "finished_ms" not in row


def test_no_claim_stamp_while_keeping_is_off(anyq: Any) -> None:
    jid_ = anyq.enqueue(b"t").id
    anyq.claim()
    row = anyq.get_job(jid_)
    assert row is not None and "claimed_ms" not in row


def server_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def die(q: Any, payload: bytes = b"d") -> str:
    jid_ = q.enqueue(payload).id
    job = q.claim()
    assert q.retry(job.id, job.token, delay_ms=0, max_attempts=1, error="x") == "dead"
    return jid_


def test_keep_dead_bounds_by_count_longest_dead_first(
    anyq: Any, r: redis.Redis, qname: str
) -> None:
    anyq.keep_dead(count=2)
    dead = [die(anyq) for _ in range(4)]
    assert sorted(anyq.browse("dead")) == sorted(dead[2:])
    assert anyq.job_state(dead[0]) == "absent"
    assert r.exists(f"emq:{{{qname}}}:job:{dead[0]}:errors") == 0
    assert r.hget(f"emq:{{{qname}}}:retired", dead[0]) == b"1"
    anyq.keep_dead(None)  # unbounded again
    die(anyq)
    assert anyq.counts()["dead"] == 3
    assert anyq.check() == []


def test_keep_dead_on_the_stall_sweep_and_settle(anyq: Any) -> None:
    anyq.keep_dead(count=1)
    a = anyq.enqueue(b"a").id
    anyq.claim(lease_ms=1)
    b = anyq.enqueue(b"b").id
    anyq.claim(lease_ms=1)
    time.sleep(0.02)
    _recovered, died = anyq.sweep_stalled(max_stalled=1)
    assert sorted(died) == sorted([a, b]) and anyq.browse("dead") == [b]
    c = anyq.enqueue(b"c").id
    job = anyq.claim()
    anyq.settle(retried=[(job.id, job.token, 0, 1, "x")])
    assert anyq.browse("dead") == [c]
    assert anyq.check() == []


def test_keep_dead_refusals_write_nothing(anyq: Any, r: redis.Redis, qname: str) -> None:
    anyq.keep_dead(count=5)
    before = snapshot(r, qname)
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(InvalidArgument):
            anyq.keep_dead(count=bad)
    for age in (0, -5, 1.5, "9", 2**63):
        with pytest.raises(InvalidArgument):
            anyq.keep_dead(count=5, age_ms=age)
    assert snapshot(r, qname) == before


def test_dead_set_is_scored_by_the_time_of_death(anyq: Any, r: redis.Redis, qname: str) -> None:
    """D25: the dead set's score is the server time of death, so the newest death browses
    first even when it was minted first, and the console shows how long ago it died."""
    first = anyq.enqueue(b"first").id
    second = anyq.enqueue(b"second").id
    a = anyq.claim()
    b = anyq.claim()
    assert (a.id, b.id) == (first, second)
    t0 = server_ms(r)
    anyq.retry(second, b.token, delay_ms=0, max_attempts=1, error="x")
    time.sleep(0.01)
    anyq.retry(first, a.token, delay_ms=0, max_attempts=1, error="x")
    scores = dict(r.zrange(f"emq:{{{qname}}}:dead", 0, -1, withscores=True))
    assert t0 <= scores[second.encode()] < scores[first.encode()] <= server_ms(r)
    assert anyq.browse("dead") == [first, second]  # newest death first
    assert anyq.check() == []


def test_keep_dead_bounds_by_age(anyq: Any, r: redis.Redis, qname: str) -> None:
    """keep_dead(age_ms=): a death trims the jobs dead for longer than the bound (the age
    is read at the next dead-letter, as keep_completed's is at the next completion)."""
    anyq.keep_dead(None, age_ms=300)
    old = [die(anyq) for _ in range(3)]
    time.sleep(0.4)
    fresh = die(anyq)
    assert anyq.browse("dead") == [fresh]
    for jid_ in old:
        assert anyq.job_state(jid_) == "absent"
        assert r.exists(f"emq:{{{qname}}}:job:{jid_}:errors") == 0
    assert r.hget(f"emq:{{{qname}}}:meta", "keep_dead") == b":300"
    anyq.keep_dead(10, age_ms=60_000)  # both bounds: neither trims a fresh death
    assert r.hget(f"emq:{{{qname}}}:meta", "keep_dead") == b"10:60000"
    assert die(anyq) in anyq.browse("dead") and anyq.counts()["dead"] == 2
    assert anyq.check() == []


def test_a_dead_row_scored_0_before_d25_is_still_sound(
    anyq: Any, r: redis.Redis, qname: str
) -> None:
    """A dead set written before the time of death was its score (all 0) stays consistent:
    check() accepts it, it browses last, and an age bound trims it first."""
    legacy = die(anyq)
    r.zadd(f"emq:{{{qname}}}:dead", {legacy: 0})
    assert anyq.check() == []
    newer = die(anyq)
    assert anyq.browse("dead") == [newer, legacy]
    anyq.keep_dead(None, age_ms=60_000)
    die(anyq)
    assert anyq.job_state(legacy) == "absent" and anyq.job_state(newer) == "dead"


def test_app_sets_kept_history_for_its_queues_when_a_worker_starts(url: str, qname: str) -> None:
    from worker_support import InProcWorker

    from conftest import wait_for

    app = echomq.App(url=url, keep_completed=(2, 3_600_000), keep_dead=3)

    @app.task(queue=qname, max_attempts=1)
    def work(i: int) -> int:
        if i < 0:
            raise ValueError("no")
        return i * 2

    for i in range(4):
        work.enqueue(i)
    work.enqueue(-1)
    handle = InProcWorker(echomq.Worker(app, queues=[qname], beat_ms=100))
    try:
        q = app.queue(qname)
        wait_for(lambda: q.counts()["completed"] == 4 and q.counts()["dead"] == 1, timeout=60)
    finally:
        handle.stop()
    assert len(q.browse("completed")) == 2  # a task user keeps history without a raw Queue
    assert q.get_job(q.browse("completed")[0])["state"] == "completed"
    for bad in (
        {"keep_completed": -1},
        {"keep_completed": (1, 2, 3)},
        {"keep_dead": 0},
        {"keep_dead": (1, 0)},
    ):
        with pytest.raises(InvalidArgument):
            echomq.App(url=url, **bad)  # type: ignore[arg-type]
    app.close()


def test_an_id_named_twice_in_a_batch_is_stale_the_second_time(anyq: Any) -> None:
    """Found by the model: with rows kept, the second mention of a completed id in one settle
    is fenced on the kept row (StaleToken), as a separate complete would be, not JobGone."""
    anyq.keep_completed(count=1)
    anyq.enqueue(b"x")
    job = anyq.claim()
    out = anyq.settle(completed=[(job.id, job.token), (job.id, job.token)])
    assert out.completed[0] is None and isinstance(out.completed[1], echomq.StaleToken)
    assert anyq.job_state(job.id) == "completed"
    assert anyq.check() == []
