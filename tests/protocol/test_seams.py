"""Where two features meet (issue 22): every per-job side key belongs to one incarnation of
its id, and a settle of one incarnation never touches the next. Each test here failed on the
code before its fix; each runs on both executors (the native module's twins included)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

import echomq
from conftest import command_calls, wait_for
from echomq import FlowJob, ids
from echomq.errors import JobFailed, StaleToken

pytestmark = pytest.mark.executors


def K(q: str, suffix: str) -> str:
    return "emq:{" + q + "}:" + suffix


def claim_id(q: echomq.Queue, jid: str, lease_ms: int = 30_000) -> echomq.Job:
    """Claim until ``jid`` comes up (the others are handed back at once)."""
    held = []
    try:
        while True:
            job = q.claim(lease_ms=lease_ms)
            assert job is not None, f"{jid} was not claimable"
            if job.id == jid:
                return job
            held.append(job)
    finally:
        for other in held:
            q.delay(other.id, other.token, 0)


def die(q: echomq.Queue, job: echomq.Job, error: str = "boom", **kw: Any) -> None:
    assert q.retry(job.id, job.token, delay_ms=0, max_attempts=1, error=error, **kw) == "dead"


# --------------------------------------------------------------------------- flows (D18)


def test_a_reprocessed_ignored_child_counts_once(q: echomq.Queue) -> None:
    added = q.add_flow(
        FlowJob(b"parent", children=[FlowJob(b"a", fail_parent=False), FlowJob(b"b")])
    )
    a, b = added.child_ids
    die(q, claim_id(q, a))
    assert q.dependencies(added.parent_id) == 1
    q.reprocess(a)
    job = claim_id(q, a)
    q.complete(job.id, job.token, result=b"late")
    # a counted once (its latest outcome, a result now): the parent still waits for b.
    assert q.job_state(added.parent_id) == "awaiting_children"
    assert q.dependencies(added.parent_id) == 1
    assert q.children_values(added.parent_id) == {a: b"late"}
    assert q.ignored_failures(added.parent_id) == {}
    job = claim_id(q, b)
    q.complete(job.id, job.token, result=b"b")
    assert q.job_state(added.parent_id) == "pending"
    assert q.check() == []


def test_a_reprocessed_cross_queue_child_counts_once(url: str, qname: str) -> None:
    with echomq.Queue(qname, url=url) as parent_q, echomq.Queue(qname + "-c", url=url) as cq:
        added = parent_q.add_flow(
            FlowJob(
                b"parent",
                children=[
                    FlowJob(b"a", queue=cq.name, fail_parent=False),
                    FlowJob(b"b", queue=cq.name),
                ],
            )
        )
        a, b = added.child_ids
        die(cq, claim_id(cq, a))
        cq.pump()
        assert parent_q.dependencies(added.parent_id) == 1
        cq.reprocess(a)
        job = claim_id(cq, a)
        cq.complete(job.id, job.token, result=b"late")
        cq.pump()
        assert parent_q.job_state(added.parent_id) == "awaiting_children"
        assert parent_q.dependencies(added.parent_id) == 1
        job = claim_id(cq, b)
        cq.complete(job.id, job.token)
        cq.pump()
        assert parent_q.job_state(added.parent_id) == "pending"
        assert parent_q.check() == [] and cq.check() == []


def test_removing_a_child_releases_its_parent(q: echomq.Queue) -> None:
    added = q.add_flow(FlowJob(b"parent", children=[FlowJob(b"a"), FlowJob(b"b")]))
    a, b = added.child_ids
    q.remove(a)
    assert q.dependencies(added.parent_id) == 1
    job = claim_id(q, b)
    q.complete(job.id, job.token, result=b"b")
    assert q.job_state(added.parent_id) == "pending"
    assert q.children_values(added.parent_id) == {b: b"b"}
    assert q.check() == []


def test_cancelling_a_waiting_child_releases_its_parent(q: echomq.Queue) -> None:
    added = q.add_flow(FlowJob(b"parent", children=[FlowJob(b"a")]))
    assert q.cancel(added.child_ids[0]) == "removed"
    assert q.job_state(added.parent_id) == "pending"
    assert q.check() == []


def test_removing_a_cross_queue_child_releases_its_parent(url: str, qname: str) -> None:
    with echomq.Queue(qname, url=url) as parent_q, echomq.Queue(qname + "-c", url=url) as cq:
        added = parent_q.add_flow(FlowJob(b"parent", children=[FlowJob(b"a", queue=cq.name)]))
        cq.remove(added.child_ids[0])
        cq.pump()
        assert parent_q.job_state(added.parent_id) == "pending"
        assert parent_q.check() == [] and cq.check() == []


def test_children_of_a_removed_parent_leave_no_orphan_keys(q: echomq.Queue, r: redis.Redis) -> None:
    added = q.add_flow(
        FlowJob(b"parent", children=[FlowJob(b"a"), FlowJob(b"b", fail_parent=False)])
    )
    a, b = added.child_ids
    q.remove(added.parent_id, children=False)  # the children run on
    job = claim_id(q, a)
    q.complete(job.id, job.token, result=b"a")
    die(q, claim_id(q, b))
    pk = K(q.name, "job:" + added.parent_id)
    left = [k for k in (":deps", ":processed", ":failed", ":unsuccessful") if r.exists(pk + k)]
    assert left == []
    assert q.check() == []


def test_a_fail_parent_child_of_a_removed_parent_leaves_no_orphan(
    q: echomq.Queue, r: redis.Redis
) -> None:
    added = q.add_flow(FlowJob(b"parent", children=[FlowJob(b"a")]))
    q.remove(added.parent_id, children=False)
    die(q, claim_id(q, added.child_ids[0]))
    assert r.exists(K(q.name, f"job:{added.parent_id}:failed")) == 0
    assert q.check() == []


# --------------------------------------------------------------------------- cancel (D22)


def test_the_cancel_flag_ends_with_its_run_on_retry(q: echomq.Queue, r: redis.Redis) -> None:
    jid = q.enqueue(b"x").id
    job = q.claim(lease_ms=30_000)
    assert job is not None and q.cancel(jid) == "signalled"
    # The handler failed before it saw the signal: the job runs again, not cancelled again.
    assert q.retry(jid, job.token, delay_ms=0, max_attempts=5, error="oops") == "scheduled"
    assert r.hexists(K(q.name, "job:" + jid), "cancel") == 0
    q.promote()
    job = q.claim(lease_ms=30_000)
    assert job is not None and job.id == jid
    assert q.extend_leases([(jid, job.token)], lease_ms=30_000) == ([], [])


def test_a_cancelled_then_reprocessed_job_is_not_cancelled_again(
    q: echomq.Queue, r: redis.Redis
) -> None:
    jid = q.enqueue(b"x").id
    job = q.claim(lease_ms=30_000)
    assert job is not None and q.cancel(jid) == "signalled"
    assert q.extend_leases([(jid, job.token)], lease_ms=30_000) == ([], [jid])
    die(q, job, "cancelled")
    q.reprocess(jid)
    assert r.hexists(K(q.name, "job:" + jid), "cancel") == 0
    job = q.claim(lease_ms=30_000)
    assert job is not None and job.id == jid
    assert q.extend_leases([(jid, job.token)], lease_ms=30_000) == ([], [])
    assert q.check() == []


@pytest.mark.parametrize("sweep", ["reap", "sweep_stalled"])
def test_a_lapsed_cancelled_job_is_not_run_again(q: echomq.Queue, sweep: str) -> None:
    jid = q.enqueue(b"x").id
    job = q.claim(lease_ms=30)
    assert job is not None and q.cancel(jid) == "signalled"
    time.sleep(0.06)
    if sweep == "reap":
        assert q.reap() == 0
    else:
        assert q.sweep_stalled(max_stalled=5) == ([], [jid])
    assert q.job_state(jid) == "dead"
    assert q.get_job(jid)["last_error"] == "cancelled"  # type: ignore[index]
    assert q.claim(lease_ms=1000) is None
    with pytest.raises(StaleToken):
        q.complete(jid, job.token)
    assert q.check() == []


def test_a_lapsed_cancel_remove_removes(q: echomq.Queue) -> None:
    jid = q.enqueue(b"x").id
    job = q.claim(lease_ms=30)
    assert job is not None and q.cancel(jid, remove=True) == "signalled"
    time.sleep(0.06)
    assert q.sweep_stalled(max_stalled=5) == ([], [jid])
    assert q.job_state(jid) == "absent"
    assert q.check() == []


# --------------------------------------------------------------------------- results (D17)


def test_a_readmitted_id_does_not_read_the_old_result(q: echomq.Queue) -> None:
    jid = ids.mint()
    q.enqueue(b"1", id=jid)
    job = q.claim()
    assert job is not None
    q.complete(jid, job.token, result=b"old", keep_result_ms=60_000)
    assert q.result(jid) is not None
    assert q.enqueue(b"2", id=jid).status == "enqueued"
    assert q.result(jid) is None
    with pytest.raises(TimeoutError):
        q.wait(jid, timeout_s=0.2)
    job = q.claim()
    assert job is not None
    q.complete(jid, job.token, result=b"new", keep_result_ms=60_000)
    assert q.wait(jid, timeout_s=1).value == b"new"


def test_a_reprocessed_job_does_not_read_its_old_failure(q: echomq.Queue) -> None:
    jid = q.enqueue(b"1").id
    job = q.claim()
    assert job is not None
    die(q, job, keep_result_ms=60_000)
    with pytest.raises(JobFailed):
        q.wait(jid, timeout_s=1)
    q.reprocess(jid)
    assert q.result(jid) is None
    job = q.claim()
    assert job is not None
    q.complete(jid, job.token, result=b"ok", keep_result_ms=60_000)
    assert q.wait(jid, timeout_s=1).value == b"ok"


def test_wait_on_a_dead_job_fails_at_once(q: echomq.Queue) -> None:
    jid = q.enqueue(b"1").id
    job = q.claim()
    assert job is not None
    die(q, job, "no luck")  # no keep_result_ms: only the row says dead
    blocked = command_calls(q.client, "blpop")
    with pytest.raises(JobFailed, match="no luck"):
        q.wait(jid, timeout_s=60)
    # At once: it read the dead row and never blocked (a clock could not say so on a busy
    # machine; the server's count of BLPOP calls does).
    assert command_calls(q.client, "blpop") == blocked


def test_wait_on_a_job_that_dies_while_waited_on_fails_at_once(q: echomq.Queue) -> None:
    jid = q.enqueue(b"1").id
    job = q.claim()
    assert job is not None
    got: list[BaseException] = []

    def waiter() -> None:
        try:
            q.wait(jid, timeout_s=60)
        except BaseException as exc:
            got.append(exc)

    t = threading.Thread(target=waiter)
    t.start()
    wait_for(lambda: q.client.exists(K(q.name, "want:" + jid)))
    die(q, job, "late failure")
    t.join(60)
    assert got and isinstance(got[0], JobFailed) and "late failure" in str(got[0])


def test_a_death_wakes_a_registered_waiter(q: echomq.Queue) -> None:
    """Why the waiter above fails at once rather than after its block (MAX_BLOCK_S): the
    death pushes the wake token a registered waiter blocks on. Asserted on the keys, not on
    a clock (issue 36): a waiter's marker, as a wait that timed out leaves it, then the death."""
    jid = q.enqueue(b"1").id
    job = q.claim()
    assert job is not None
    with pytest.raises(TimeoutError):
        q.wait(jid, timeout_s=0)  # registers the marker, finds nothing, does not block
    die(q, job, "late failure")
    assert q.client.llen(K(q.name, "notify:" + jid)) == 1
    with pytest.raises(JobFailed, match="late failure"):
        q.wait(jid, timeout_s=60)


async def test_async_wait_on_a_dead_job_fails_at_once(aq: echomq.AsyncQueue) -> None:
    jid = (await aq.enqueue(b"1")).id
    job = await aq.claim()
    assert job is not None
    assert await aq.retry(jid, job.token, delay_ms=0, max_attempts=1, error="x") == "dead"
    with pytest.raises(JobFailed):
        await aq.wait(jid, timeout_s=5)


def test_wait_on_a_parent_failed_by_its_child_fails(q: echomq.Queue) -> None:
    added = q.add_flow(FlowJob(b"parent", children=[FlowJob(b"a")]))
    die(q, claim_id(q, added.child_ids[0]))
    with pytest.raises(JobFailed, match="failed"):
        q.wait(added.parent_id, timeout_s=5)


# --------------------------------------------------------------------------- dedup (D20)


def test_a_dedup_id_of_255_characters_is_taken(q: echomq.Queue) -> None:
    did = "d" * 255
    first = q.enqueue(b"x", dedup=did)
    assert first.status == "enqueued"
    again = q.enqueue(b"y", dedup=did)
    assert again.status == "deduplicated" and again.id == first.id
    assert q.dedup_holder(did) == first.id


def test_debounce_on_a_reaped_job_is_not_lost_to_its_old_holder(q: echomq.Queue) -> None:
    first = q.enqueue(b"v1", dedup="k", dedup_mode="debounce", dedup_ttl_ms=60_000).id
    job = q.claim(lease_ms=30)
    assert job is not None
    time.sleep(0.06)
    assert q.reap() == 1  # back to pending, its lapsed holder still alive (D5)
    refused = q.enqueue(b"v2", dedup="k", dedup_mode="debounce", dedup_ttl_ms=60_000)
    assert refused.status == "deduplicated" and refused.id == first
    # The debounced payload must run: the old holder (which ran v1) can no longer settle.
    with pytest.raises(StaleToken):
        q.complete(first, job.token)
    again = q.claim()
    assert again is not None and again.payload == b"v2"
    assert q.check() == []


# --------------------------------------------------------------------------- check() on side keys


@pytest.mark.parametrize(
    ("plant", "named"),
    [
        (lambda r, p, j: r.set(p + f"job:{j}:deps", 2), "orphaned flow key"),
        (lambda r, p, j: r.hset(p + f"job:{j}:processed", "x", "1"), "orphaned flow key"),
        (
            lambda r, p, j: (
                r.hset(p + "job:" + j, "state", "awaiting_children"),
                r.zrem(p + "pending", j),
                r.set(p + f"job:{j}:deps", -1),
            ),
            "is negative",
        ),
        (
            lambda r, p, j: (
                r.hset(p + "job:" + j, "state", "awaiting_children"),
                r.zrem(p + "pending", j),
                r.set(p + f"job:{j}:deps", 0),
            ),
            "its release was missed",
        ),
        (lambda r, p, j: r.hset(p + f"result:{j}", "result", "old"), "older incarnation"),
        (lambda r, p, j: r.set(p + "de:gone", ids.mint()), "which is gone"),
        (lambda r, p, j: r.hset(p + "job:" + j, "cancel", "1"), "outlived its run"),
    ],
)
def test_check_names_side_key_violations(
    q: echomq.Queue, r: redis.Redis, plant: Any, named: str
) -> None:
    jid = ids.mint()
    q.enqueue(b"x", id=jid if "orphaned" not in named else None)
    assert q.check() == []
    orphan = ids.mint()
    plant(r, K(q.name, ""), jid if "orphaned" not in named else orphan)
    found = q.check()
    assert any(named in line for line in found), found


def test_drain_takes_the_parents_it_releases(q: echomq.Queue) -> None:
    # Dropping a drained child releases its parent into a waiting set; whether the same
    # drain then took the parent depended on the order it walked the sets (the model's F11).
    flat = q.add_flow(FlowJob(b"p1", children=[FlowJob(b"c", group="zz")]))
    lane = q.add_flow(FlowJob(b"p2", group="aa", children=[FlowJob(b"c")]))
    assert q.drain() == 4
    assert q.job_state(flat.parent_id) == "absent"
    assert q.job_state(lane.parent_id) == "absent"
    assert q.counts()["pending"] == 0
    assert q.check() == []


@pytest.mark.parametrize("sweep", ["reap", "sweep_stalled"])
def test_a_sweep_that_releases_a_parent_keeps_the_flat_set_served(
    q: echomq.Queue, sweep: str
) -> None:
    # The model's F12: the sweep parks the flat job, then a lapsed cancel(remove=True) of the
    # only child releases the parent mid-loop; touch()'s fast path skipped the ring sync and
    # the flat set fell out of the ring (claim answered None with two jobs waiting).
    a = q.enqueue(b"a").id
    added = q.add_flow(FlowJob(b"p", children=[FlowJob(b"c")]))
    held = q.claim_batch(2, lease_ms=20)
    assert {j.id for j in held} == {a, added.child_ids[0]}
    assert q.cancel(added.child_ids[0], remove=True) == "signalled"
    time.sleep(0.05)
    if sweep == "reap":
        q.reap()
    else:
        q.sweep_stalled(max_stalled=5)
    assert q.check() == []
    got = {j.id for j in q.claim_batch(5, lease_ms=1000)}
    assert got == {a, added.parent_id}


@pytest.mark.parametrize("verb", ["settle", "complete_many"])
def test_a_batch_that_completes_a_parent_then_its_child_leaves_no_orphan(
    q: echomq.Queue, r: redis.Redis, verb: str
) -> None:
    # The model's F14: a batch completion deletes its rows at its end, so a child completed
    # after its parent in the same batch still found the parent's row (its flow keys already
    # forgotten) and wrote a fresh processed record and deps = -1 under the gone parent.
    added = q.add_flow(FlowJob(b"p", children=[FlowJob(b"c", fail_parent=False)]))
    pid, (cid,) = added.parent_id, added.child_ids
    die(q, claim_id(q, cid))  # ignored: counted, the parent is released
    parent = claim_id(q, pid)
    q.reprocess(cid)
    child = claim_id(q, cid)
    pairs = [(parent.id, parent.token), (child.id, child.token)]
    if verb == "settle":
        assert q.settle(completed=pairs).completed == [None, None]
    else:
        assert q.complete_many(pairs) == []
    assert r.keys(K(q.name, f"job:{pid}*")) == []
    assert q.check() == []


@pytest.mark.parametrize("end", ["remove", "complete"])
def test_an_old_child_never_counts_toward_a_new_flow_under_its_parent_id(
    q: echomq.Queue, end: str
) -> None:
    # The parent id re-used for a new flow (add_flow with a caller-named id) while a child of
    # the old flow still lives: the old child's settle must not count toward the new parent,
    # whose own child still waits (a child carried no parent incarnation before).
    pid = ids.mint()
    old = q.add_flow(
        FlowJob(b"p1", id=pid, children=[FlowJob(b"old", fail_parent=False), FlowJob(b"o2")])
    )
    stale, other = old.child_ids
    if end == "complete":
        # The old flow runs to its end, its ignored child counted by a death, then reprocessed.
        die(q, claim_id(q, stale))
        job = claim_id(q, other)
        q.complete(job.id, job.token)
        job = claim_id(q, pid)
        q.complete(job.id, job.token)
        q.reprocess(stale)
    else:
        q.remove(pid, children=False)  # the parent alone: its old child lives on
        q.remove(other)
    new = q.add_flow(FlowJob(b"p2", id=pid, children=[FlowJob(b"new")], group="held"))
    q.pause_lane("held")  # the new parent, once released, stays waiting where we can see it
    job = claim_id(q, stale)
    q.complete(job.id, job.token, result=b"old")
    assert q.job_state(pid) == "awaiting_children"
    assert q.dependencies(pid) == 1
    assert q.children_values(pid) == {}
    job = claim_id(q, new.child_ids[0])
    q.complete(job.id, job.token, result=b"new")
    assert q.job_state(pid) == "pending"
    assert q.children_values(pid) == {new.child_ids[0]: b"new"}
    assert q.check() == []


def test_an_old_cross_queue_child_never_counts_toward_a_new_flow(url: str, qname: str) -> None:
    # The same through the outbox: the old child's entry carries its flow's mark, and the
    # pump delivers nothing to the new flow's parent under the re-used id.
    with echomq.Queue(qname, url=url) as pq, echomq.Queue(qname + "-c", url=url) as cq:
        pid = ids.mint()
        old = pq.add_flow(FlowJob(b"p1", id=pid, children=[FlowJob(b"old", queue=cq.name)]))
        pq.remove(pid)
        new = pq.add_flow(FlowJob(b"p2", id=pid, children=[FlowJob(b"new", queue=cq.name)]))
        job = claim_id(cq, old.child_ids[0])
        cq.complete(job.id, job.token, result=b"old")
        assert cq.pump() == 1
        assert pq.job_state(pid) == "awaiting_children"
        assert pq.dependencies(pid) == 1 and pq.children_values(pid) == {}
        job = claim_id(cq, new.child_ids[0])
        cq.complete(job.id, job.token, result=b"new")
        assert cq.pump() == 1
        assert pq.job_state(pid) == "pending"
        assert pq.children_values(pid) == {new.child_ids[0]: b"new"}
        assert pq.check() == [] and cq.check() == []


def test_a_flow_written_before_marks_still_counts(q: echomq.Queue, r: redis.Redis) -> None:
    # Rows written before the `flow` mark existed have none, on the parent and the child
    # alike: they still match (and an unmarked outbox entry is delivered as before).
    added = q.add_flow(FlowJob(b"p", children=[FlowJob(b"a"), FlowJob(b"b")]))
    pid, (a, b) = added.parent_id, added.child_ids
    for jid in (pid, a, b):
        r.hdel(K(q.name, "job:" + jid), "flow")
    job = claim_id(q, a)
    q.complete(job.id, job.token, result=b"a")
    assert q.dependencies(pid) == 1
    assert q.children_values(pid) == {a: b"a"}
    r.rpush(K(q.name, "flow:outbox"), f"{q.name}\0{pid}\0{b}\0".encode() + b"b")
    assert q.pump() == 1
    assert q.job_state(pid) == "pending"
    assert q.children_values(pid) == {a: b"a", b: b"b"}


def test_a_parent_id_readmitted_by_add_flow_does_not_read_the_old_result(
    q: echomq.Queue,
) -> None:
    # Found by the model's deep run once add_flow could re-use a gone root's id: flow_add
    # wrote an inner node without the admission's cleanup, so the new parent's waiter read
    # the old incarnation's kept result.
    pid = ids.mint()
    q.add_flow(FlowJob(b"p1", id=pid, children=[FlowJob(b"c")]))
    child = q.claim(lease_ms=10_000)
    assert child is not None
    q.complete(child.id, child.token)
    job = claim_id(q, pid)
    q.complete(job.id, job.token, result=b"old", keep_result_ms=60_000)
    assert q.result(pid) is not None
    q.add_flow(FlowJob(b"p2", id=pid, children=[FlowJob(b"c2")]))
    assert q.result(pid) is None
    with pytest.raises(TimeoutError):
        q.wait(pid, timeout_s=0)
    assert q.check() == []
