"""A sharded queue's routing (issue 43, decisions 4-6): a lane's jobs on its shard, a dedup id
exact across the logical queue, ids spread over every shard, by-id verbs finding a job on any
shard, claims rotating over the shards and settles going to the job's shard."""

from __future__ import annotations

from typing import Any

import pytest
import sharded_support
from sharded_support import N, holder, key_for_shard, shard_queues

import echomq
from echomq.client.shards import shard_of

pytestmark = pytest.mark.executors

sq = sharded_support.sq  # the fixture: a ShardedQueue, or an AsyncShardedQueue adapted


def test_the_layout_is_stored_and_shard_0_is_the_base_queue(sq: Any, qname: str, url: str) -> None:
    names = sq.shards()
    assert len(names) == N and names[0] == qname
    assert all(name.startswith(f"{qname}.shard{i}.") for i, name in enumerate(names) if i)
    with echomq.Queue(qname, url=url) as base:
        assert base.shards() == names  # what a plain client reads: the stored list


def test_a_lane_s_jobs_go_to_its_shard(sq: Any, url: str) -> None:
    lanes = [key_for_shard(i, N, "lane") for i in range(N)]
    sent = {lane: [sq.enqueue(b"x", group=lane).id for _ in range(3)] for lane in lanes}
    many = sq.enqueue_many([b"a", b"b"], group=lanes[1])
    sent[lanes[1]] += [e.id for e in many]
    with shard_queues(url, sq.shards()) as shards:
        for i, lane in enumerate(lanes):
            assert {holder(shards, j) for j in sent[lane]} == {i}
            assert shards[i].lane_depth(lane) == len(sent[lane])
            assert sq.lane_depth(lane) == len(sent[lane])
        # Lane verbs go to the lane's shard: a paused lane is paused there.
        sq.pause_lane(lanes[3])
        assert sq.claim_batch(100) != []
        assert {j.id for j in sq.claim_batch(100)} == set()
        assert sq.lane_depth(lanes[3]) == 3 and shards[3].lane_depth(lanes[3]) == 3
        sq.resume_lane(lanes[3])
        assert {j.id for j in sq.claim_batch(100)} == set(sent[lanes[3]])


def test_a_dedup_id_is_exact_across_the_logical_queue(sq: Any, url: str) -> None:
    for k in range(12):
        first = sq.enqueue(b"one", dedup=f"order-{k}")
        again = sq.enqueue(b"two", dedup=f"order-{k}")
        assert first.status == "enqueued"
        assert again == echomq.Enqueued(first.id, "deduplicated")
        assert sq.dedup_holder(f"order-{k}") == first.id
    assert sq.counts()["pending"] == 12
    with shard_queues(url, sq.shards()) as shards:
        for k in range(12):
            held = sq.dedup_holder(f"order-{k}")
            assert holder(shards, held) == shard_of(f"order-{k}", N)
    assert sq.dedup_holder("never") is None


def test_ids_spread_over_every_shard(sq: Any, url: str) -> None:
    ids = [sq.enqueue(b"x").id for _ in range(60)]
    ids += [e.id for e in sq.enqueue_many([b"m"] * 60)]
    mine = echomq.ids.encode("JOB", 4242)
    assert sq.enqueue(b"own", id=mine).id == mine
    assert sq.enqueue(b"own", id=mine).status == "duplicate"  # idempotent by id, one shard
    with shard_queues(url, sq.shards()) as shards:
        where = [holder(shards, j) for j in [*ids, mine]]
    # A job without a lane or dedup id is on its id's shard: the ids spread the jobs.
    assert where == [shard_of(j, N) for j in [*ids, mine]]
    assert set(where) == set(range(N))
    assert sq.counts()["pending"] == 121


def test_enqueue_many_keeps_input_order_over_shards(sq: Any, url: str) -> None:
    own = [echomq.ids.encode("JOB", 7000 + i) for i in range(8)]
    items: list[Any] = []
    for i, jid in enumerate(own):
        items += [(jid, f"own{i}"), f"minted{i}"]
    got = sq.enqueue_many(items)
    assert [e.status for e in got] == ["enqueued"] * 16
    assert [e.id for e in got[::2]] == own
    assert len({e.id for e in got}) == 16
    for e, item in zip(got, items, strict=True):
        payload = item[1] if isinstance(item, tuple) else item
        assert sq.get_job(e.id)["payload"] == payload.encode()


def test_by_id_verbs_find_a_job_on_any_shard(sq: Any, url: str) -> None:
    # Lanes place jobs away from their ids' shards: each verb must locate them.
    lanes = [key_for_shard(i, N, "g") for i in range(N)]
    jobs = [sq.enqueue(f"p{i}", group=lanes[i % N]).id for i in range(8)]
    later = sq.enqueue(b"later", delay_ms=3_600_000, group=lanes[2]).id
    with shard_queues(url, sq.shards()) as shards:
        assert [holder(shards, j) for j in jobs] == [i % N for i in range(8)]
    assert [sq.job_state(j) for j in jobs] == ["pending"] * 8
    assert sq.get_job(jobs[1])["payload"] == b"p1"
    assert sq.job_state(echomq.ids.encode("JOB", 1)) == "absent"
    assert sq.get_job(echomq.ids.encode("JOB", 1)) is None
    sq.update_payload(jobs[2], b"new")
    assert sq.get_job(jobs[2])["payload"] == b"new"
    sq.change_priority(jobs[3], 5)
    assert sq.add_log(jobs[3], "line") == 1 and sq.logs(jobs[3]) == [b"line"]
    assert sq.clear_logs(jobs[3]) == 1
    sq.update_progress(jobs[3], "50%")
    assert sq.job_state(later) == "scheduled"
    sq.reschedule(later, 7_200_000)
    sq.run_now(later)
    assert sq.job_state(later) == "pending"
    assert sq.cancel(jobs[4]) == "removed"
    assert sq.cancel(jobs[4]) == "absent"
    sq.remove(jobs[5])
    assert sq.job_state(jobs[5]) == "absent"
    with pytest.raises(echomq.JobGone):
        sq.remove(jobs[5])
    assert sq.counts()["pending"] == 7  # 8 + the one run now - 2 gone


def test_claims_rotate_and_never_park_on_an_empty_shard(sq: Any, url: str) -> None:
    lanes = [key_for_shard(i, N, "r") for i in range(N)]
    only = sq.enqueue(b"x", group=lanes[2]).id
    for _ in range(N):  # whatever shard a claim starts at, it finds the one job
        job = sq.claim()
        assert job is not None and job.id == only
        sq.delay(job.id, job.token, 0)  # back to pending, same shard
    for lane in lanes:
        for _ in range(3):
            sq.enqueue(b"y", group=lane)
    with shard_queues(url, sq.shards()) as shards:
        got = [sq.claim() for _ in range(N)]
        # Each claim starts one shard later: N claims take from N different shards.
        assert len({holder(shards, j.id) for j in got}) == N
        batch = sq.claim_batch(9)
        assert len(batch) == 9  # filled from several shards
        assert len({holder(shards, j.id) for j in batch}) >= 3
    assert sq.claim_batch(10) == []
    assert sq.claim() is None


def test_settles_go_to_the_job_s_shard(sq: Any, url: str) -> None:
    lanes = [key_for_shard(i, N, "s") for i in range(N)]
    for i in range(12):
        sq.enqueue(f"j{i}", group=lanes[i % N])
    a, b, c, d = (sq.claim() for _ in range(4))
    sq.complete(a.id, a.token, result=b"done", keep_result_ms=60_000)
    assert sq.result(a.id).value == b"done"
    assert sq.wait(a.id, timeout_s=5).value == b"done"
    assert sq.retry(b.id, b.token, delay_ms=0, max_attempts=1, error="boom") == "dead"
    assert sq.errors(b.id) == ["attempt 1: boom"]
    with pytest.raises(echomq.StaleToken):
        sq.complete(c.id, c.token + 1)
    sq.extend(c.id, c.token, lease_ms=60_000)
    assert sq.extend_many([(c.id, c.token), (d.id, d.token + 1)], lease_ms=60_000) == [d.id]
    assert sq.complete_many([(c.id, c.token), (d.id, d.token)]) == []
    more = sq.claim_batch(4)
    done = sq.settle(
        completed=[(more[0].id, more[0].token), (more[1].id, more[1].token + 1)],
        retried=[(more[2].id, more[2].token, 0, 1, "bad")],
        n=3,
    )
    assert done.completed[0] is None and isinstance(done.completed[1], echomq.StaleToken)
    assert done.retried == ["dead"] and len(done.jobs) == 3
    assert sq.reprocess(b.id) is None and sq.job_state(b.id) == "pending"
    c2 = sq.counts()
    assert (c2["dead"], c2["active"], c2["pending"]) == (1, 5, 2)
    with shard_queues(url, sq.shards()) as shards:
        assert sum(s.counts()["active"] for s in shards) == 5
        assert sum(s.check() == [] for s in shards) == N


def test_a_flow_lands_whole_on_one_shard(sq: Any, url: str) -> None:
    lane = key_for_shard(3, N, "f")
    kids = [echomq.FlowJob(f"k{i}") for i in range(3)]
    added = sq.add_flow(echomq.FlowJob(b"parent", group=lane, children=kids))
    assert sq.dependencies(added.parent_id) == 3
    with shard_queues(url, sq.shards()) as shards:
        assert holder(shards, added.parent_id) == 3
        assert {holder(shards, c) for c in added.child_ids} == {3}
    for _ in range(3):
        job = sq.claim()
        sq.complete(job.id, job.token, result=b"v", keep_result_ms=60_000)
    assert sq.dependencies(added.parent_id) == 0
    assert set(sq.children_values(added.parent_id).values()) == {b"v"}
    assert sq.ignored_failures(added.parent_id) == {}
