"""Priorities (issue 24): lower runs first, FIFO within one priority, in the flat set and in
every lane; the ring stays fair between lanes; a job keeps its priority through every way back
to waiting; change_priority; and the queue-wide concurrency limit (``Queue.limit``). Both
executors, real servers."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from worker_support import InProcWorker

import echomq
from conftest import wait_for
from echomq.errors import JobGone, StateError
from echomq.protocol import control as _ctl

pytestmark = pytest.mark.executors

LANE_A, LANE_B = "lane-a", "lane-b"


def _drain(q: Any, n: int) -> list[str]:
    """Claim and complete n jobs, one by one: the claim order."""
    out = []
    for _ in range(n):
        job = q.claim(lease_ms=60_000)
        assert job is not None
        out.append(job.id)
        q.complete(job.id, job.token)
    return out


def _row(r: redis.Redis, qname: str, jid: str) -> dict[bytes, bytes]:
    return r.hgetall(f"emq:{{{qname}}}:job:{jid}")


def test_lower_priority_runs_first_fifo_within(anyq: Any) -> None:
    plan = [5, 0, 5, 1, 0, 2**21, 1]
    ids = [anyq.enqueue(f"j{i}".encode(), priority=p).id for i, p in enumerate(plan)]
    want = [jid for _, _, jid in sorted((p, i, ids[i]) for i, p in enumerate(plan))]
    assert _drain(anyq, len(plan)) == want
    assert anyq.check() == []


def test_priority_inside_a_lane_and_batches(anyq: Any) -> None:
    lo = anyq.enqueue(b"lo", group=LANE_A, priority=9).id
    hi = anyq.enqueue(b"hi", group=LANE_A, priority=1).id
    mid = anyq.enqueue_many([b"m1", b"m2"], group=LANE_A, priority=4)
    jobs = anyq.claim_batch(4, lease_ms=60_000)
    assert [j.id for j in jobs] == [hi, mid[0].id, mid[1].id, lo]


def test_ring_stays_fair_between_lanes(anyq: Any) -> None:
    """A lane of urgent jobs does not starve a lane of low-priority ones: priority orders a
    set, the ring alternates between sets."""
    for i in range(4):
        anyq.enqueue(f"a{i}".encode(), group=LANE_A, priority=0)
        anyq.enqueue(f"b{i}".encode(), group=LANE_B, priority=1000)
    lanes = []
    for _ in range(8):
        job = anyq.claim(lease_ms=60_000)
        lanes.append(job.group)
        anyq.complete(job.id, job.token)
    assert lanes.count(LANE_A) == lanes.count(LANE_B) == 4
    assert all(lanes[i] != lanes[i + 1] for i in range(7))


def test_default_job_pays_no_byte(q: echomq.Queue, r: redis.Redis, qname: str) -> None:
    plain = q.enqueue(b"x").id
    zero = q.enqueue(b"x", priority=0).id
    urgent = q.enqueue(b"x", priority=7).id
    assert b"priority" not in _row(r, qname, plain)
    assert _row(r, qname, zero) == _row(r, qname, plain)
    assert _row(r, qname, urgent)[b"priority"] == b"7"
    assert r.zscore(f"emq:{{{qname}}}:pending", urgent) == 7.0


def _score(r: redis.Redis, qname: str, jid: str, lane: str | None = None) -> float | None:
    key = f"emq:{{{qname}}}:g:{lane}:pending" if lane else f"emq:{{{qname}}}:pending"
    return r.zscore(key, jid)


@pytest.mark.parametrize("lane", [None, LANE_A])
def test_priority_kept_through_every_way_back(
    q: echomq.Queue, r: redis.Redis, qname: str, lane: str | None
) -> None:
    jid = q.enqueue(b"x", group=lane, priority=3).id
    q.enqueue(b"filler", group=lane, priority=10)

    def claim_it() -> Any:
        job = q.claim(lease_ms=60_000)
        assert job is not None and job.id == jid  # priority 3 before 10, every time
        return job

    # retry -> schedule -> promote
    job = claim_it()
    assert q.retry(jid, job.token, delay_ms=0, max_attempts=10, error="e") == "scheduled"
    assert q.promote() == 1
    assert _score(r, qname, jid, lane) == 3.0
    # delay(0) and delay(ms) -> run_now
    job = claim_it()
    q.delay(jid, job.token, 0)
    assert _score(r, qname, jid, lane) == 3.0
    job = claim_it()
    q.delay(jid, job.token, 600_000)
    q.run_now(jid)
    assert _score(r, qname, jid, lane) == 3.0
    # reap of a lapsed lease
    job = claim_it()
    r.zadd(f"emq:{{{qname}}}:active", {jid: 1})
    assert q.reap() == 1
    assert _score(r, qname, jid, lane) == 3.0
    # the counted stall sweep
    job = claim_it()
    r.zadd(f"emq:{{{qname}}}:active", {jid: 1})
    assert q.sweep_stalled(max_stalled=5) == ([jid], [])
    assert _score(r, qname, jid, lane) == 3.0
    # push-back (a handler's RateLimit) -> promote
    job = claim_it()
    q._x.call(_ctl.push_back(q._k, jid, job.token, 0))
    q.promote()
    assert _score(r, qname, jid, lane) == 3.0
    # dead -> reprocess
    job = claim_it()
    assert q.retry(jid, job.token, delay_ms=0, max_attempts=1, error="e") == "dead"
    assert (r.zscore(f"emq:{{{qname}}}:dead", jid) or 0) > 3.0  # the time of death, not 3 (D25)
    q.reprocess(jid)
    assert _score(r, qname, jid, lane) == 3.0
    # reassign to another lane
    assert q.reassign(jid, LANE_B) == "reassigned"
    assert _score(r, qname, jid, LANE_B) == 3.0
    assert q.check() == []


def test_change_priority_waiting_and_scheduled(anyq: Any, r: redis.Redis, qname: str) -> None:
    a = anyq.enqueue(b"a").id
    b = anyq.enqueue(b"b", group=LANE_A, priority=5).id
    later = anyq.enqueue(b"later", delay_ms=600_000).id
    anyq.change_priority(a, 9)
    anyq.change_priority(b, 0)
    anyq.change_priority(later, 2)
    assert _score(r, qname, a) == 9.0
    assert _score(r, qname, b, LANE_A) == 0.0
    assert b"priority" not in _row(r, qname, b)  # 0 deletes the field
    assert _row(r, qname, later)[b"priority"] == b"2"
    assert r.zscore(f"emq:{{{qname}}}:schedule", later) > 1000  # still its run time
    anyq.run_now(later)
    assert _score(r, qname, later) == 2.0
    first = anyq.enqueue(b"first", priority=1).id
    anyq.remove(b)  # the flat set alone: the ring would alternate with the lane
    assert [j.id for j in anyq.claim_batch(3, lease_ms=60_000)] == [first, later, a]
    assert anyq.check() == []


def test_change_priority_refusals_write_nothing(anyq: Any, r: redis.Redis, qname: str) -> None:
    from conftest import snapshot

    held = anyq.enqueue(b"held").id
    job = anyq.claim(lease_ms=60_000)
    dead = anyq.enqueue(b"dead").id
    d = anyq.claim(lease_ms=60_000)
    anyq.retry(dead, d.token, delay_ms=0, max_attempts=1, error="e")
    parent = anyq.add_flow(echomq.FlowJob(b"p", children=[echomq.FlowJob(b"c")])).parent_id
    before = snapshot(r, qname)
    for jid in (job.id, dead, parent):
        with pytest.raises(StateError):
            anyq.change_priority(jid, 1)
    with pytest.raises(JobGone):
        anyq.change_priority("JOB0KHTOWnGLuC", 1)
    assert snapshot(r, qname) == before
    assert held == job.id


def test_flow_priorities(q: echomq.Queue, r: redis.Redis, qname: str) -> None:
    flow = echomq.FlowJob(
        b"parent",
        priority=4,
        children=[echomq.FlowJob(b"c1", priority=2), echomq.FlowJob(b"c2", priority=1)],
    )
    added = q.add_flow(flow)
    c1, c2 = added.child_ids
    assert [j.id for j in q.claim_batch(2, lease_ms=60_000)] == [c2, c1]
    other = q.enqueue(b"other", priority=5).id
    for cid in (c1, c2):
        q.complete(cid, 1)
    assert _score(r, qname, added.parent_id) == 4.0  # released with its priority
    assert [j.id for j in q.claim_batch(2, lease_ms=60_000)] == [added.parent_id, other]


def test_browse_and_page_follow_claim_order(q: echomq.Queue) -> None:
    from echomq.ops import snapshots as _inspect

    ids = [q.enqueue(b"x", priority=p).id for p in (2, 0, 1, 0)]
    claim_order = [ids[1], ids[3], ids[2], ids[0]]
    assert q.browse("pending") == claim_order[::-1]
    page = _inspect.page(q._x, q._k, "pending", 1, 2)
    assert [i for i, _ in page.items] == claim_order[::-1][1:3]
    assert page.total == 4


def test_task_and_options_priority(url: str, qname: str, r: redis.Redis) -> None:
    app = echomq.App(url=url)

    @app.task(queue=qname, priority=7)
    def work(x: int) -> int:
        return x

    plain = work.enqueue(1).id
    urgent = work.options(priority=1).enqueue(2).id
    many = work.enqueue_many([((3,), {})], priority=0)
    assert _row(r, qname, plain)[b"priority"] == b"7"
    assert _row(r, qname, urgent)[b"priority"] == b"1"
    assert b"priority" not in _row(r, qname, many[0].id)
    with pytest.raises(echomq.InvalidArgument):
        work.options(priority=-1)
    with pytest.raises(echomq.InvalidArgument):

        @app.task(queue=qname, priority=True)
        def bad() -> None: ...


# ----------------------------------------------------------------- the queue-wide limit


def test_limit_caps_claims_across_lanes(anyq: Any, qname: str) -> None:
    for i in range(3):
        anyq.enqueue(f"f{i}".encode())
        anyq.enqueue(f"a{i}".encode(), group=LANE_A)
    anyq.limit(2)
    assert anyq.get_limit() == 2
    first = anyq.claim(lease_ms=60_000)
    batch = anyq.claim_batch(5, lease_ms=60_000)
    assert len(batch) == 1  # the room left
    assert anyq.claim(lease_ms=60_000) is None
    assert anyq.claim_batch(3, lease_ms=60_000) == []
    anyq.complete(first.id, first.token)
    assert len(anyq.claim_batch(3, lease_ms=60_000)) == 1
    anyq.limit(None)
    assert anyq.get_limit() is None
    assert len(anyq.claim_batch(10, lease_ms=60_000)) == 3
    assert anyq.check() == []


def test_limit_holds_in_settle(q: echomq.Queue) -> None:
    for i in range(6):
        q.enqueue(f"j{i}".encode())
    q.limit(3)
    jobs = q.claim_batch(10, lease_ms=60_000)
    assert len(jobs) == 3
    done = q.settle(completed=[(jobs[0].id, jobs[0].token)], n=10, lease_ms=60_000)
    assert len(done.jobs) == 1  # one slot freed, one job claimed


def test_limited_worker_does_not_spin(url: str, qname: str, r: redis.Redis) -> None:
    """A worker whose queue is at its limit (held by someone else) parks on the wake list
    instead of claiming in a loop: it sends about one claim a beat."""
    q = echomq.Queue(qname, url=url)
    app = echomq.App(url=url)
    ran: list[str] = []

    @app.task(queue=qname, name="work")
    def work() -> None:
        ran.append("x")

    for _ in range(20):
        work.enqueue()
    q.limit(1)
    held = q.claim(lease_ms=60_000)
    assert held is not None

    w = InProcWorker(echomq.Worker(app, queues=[qname], concurrency=4))
    try:
        # Its first second spends the wake tokens the 20 enqueues left (one empty claim each,
        # at most 64: bounded, as for a lane at its limit); then it is as quiet as an idle
        # worker: its beat, heartbeat and one claim a beat.
        time.sleep(1.5)
        r.config_resetstat()
        time.sleep(2.0)
        calls = sum(
            int(v["calls"])
            for k, v in r.info("commandstats").items()
            if k in ("cmdstat_evalsha", "cmdstat_eval") or k.startswith("cmdstat_emq.")
        )
        # About ten script calls in 2 s (an idle worker makes as many); a hot loop makes
        # thousands.
        assert calls < 30, calls
        assert ran == []
        q.complete(held.id, held.token)
        q.limit(None)  # wakes the worker
        wait_for(lambda: len(ran) == 19, timeout=60)
    finally:
        w.stop()
        q.close()
        app.close()


def test_oldest_waiting_sees_past_the_head(q: echomq.Queue) -> None:
    """The dashboard's and top's "oldest waiting": the head of a prioritised set is the next
    to run, not the oldest; the oldest is found in whichever band holds it (flat and lane)."""
    from echomq import ids
    from echomq.ops import snapshots as _inspect

    for group in (None, LANE_A):
        old = q.enqueue(b"old", group=group, priority=9).id
        time.sleep(0.01)
        q.enqueue(b"urgent", group=group, priority=1)
        q.enqueue(b"mid", group=group, priority=5)
        view = _inspect.snapshot(q._x, [q.name], lanes=True)[0]
        lane = [v for v in view.lanes if v.name == LANE_A]
        got = lane[0].oldest_ms if group else view.oldest_waiting_ms
        assert got == ids.decode_time_ms(old)
