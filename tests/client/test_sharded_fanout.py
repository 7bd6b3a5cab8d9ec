"""A sharded queue's fan-out (issue 43, decision 7) against the per-shard truth: counts,
browse, check, drain, pauses, obliterate; and its layout over time (decisions 3 and 9): two
clients with different N agree on the stored list, growth keeps every job, shrink refused."""

from __future__ import annotations

from typing import Any

import pytest
import redis
import sharded_support
from sharded_support import N, holder, key_for_shard, shard_queues

import echomq
from conftest import SyncOverAsync, snapshot
from echomq.client.shards import shard_of

pytestmark = pytest.mark.executors

sq = sharded_support.sq  # the fixture: a ShardedQueue, or an AsyncShardedQueue adapted


def _fill(sq: Any) -> list[str]:
    """Jobs in every state on every shard: pending (flat and lanes), scheduled, active, dead."""
    lanes = [key_for_shard(i, N, "lane") for i in range(N)]
    ids = [sq.enqueue(f"p{i}").id for i in range(20)]
    ids += [sq.enqueue(f"g{i}", group=lanes[i % N]).id for i in range(8)]
    ids += [sq.enqueue(f"s{i}", delay_ms=3_600_000, group=lanes[i % N]).id for i in range(4)]
    for job in sq.claim_batch(6)[:2]:  # 2 dead, 4 active
        sq.retry(job.id, job.token, delay_ms=0, max_attempts=1, error="x")
    return ids


def test_counts_and_sizes_sum_the_shards(sq: Any, url: str) -> None:
    _fill(sq)
    with shard_queues(url, sq.shards()) as shards:
        per = [s.counts() for s in shards]
        assert sq.counts() == {k: sum(c[k] for c in per) for k in per[0]}
        assert sum(c["pending"] for c in per if c["pending"]) == sq.counts()["pending"]
        assert sq.pending_size() == sum(s.pending_size() for s in shards)
        assert sorted(sq.lanes()) == sorted({ln for s in shards for ln in s.lanes()})
        assert sum(1 for c in per if c["pending"] + c["active"]) >= 2
    c = sq.counts()
    assert c["pending"] + c["active"] + c["schedule"] + c["dead"] == 32


def test_browse_merges_the_shards_by_rank(sq: Any, url: str) -> None:
    _fill(sq)
    with shard_queues(url, sq.shards()) as shards:
        for state in ("pending", "active", "scheduled", "dead"):
            every = {j for s in shards for j in s.browse(state, 1000)}
            assert set(sq.browse(state, 1000)) == every, state
        # Newest first over the shards: the flat pending jobs all have priority 0, ties in
        # mint order, so the merge is the ids in reverse.
        flat = sq.browse("pending", 5)
        assert flat == sorted({j for s in shards for j in s.browse("pending", 1000)})[::-1][:5]
        lane = key_for_shard(1, N, "lane")
        assert sq.browse("pending", 10, group=lane) == shards[1].browse("pending", 10, group=lane)
    with pytest.warns(DeprecationWarning):
        assert len(sq.browse("schedule", 2)) == 2  # the deprecated spelling still works


def test_browse_orders_priorities_as_one_queue_would(sq: Any, r: redis.Redis) -> None:
    ids = {sq.enqueue(f"p{i}", priority=i % 3).id: i % 3 for i in range(24)}
    names = sq.shards()

    def score(jid: str) -> float:
        found = [r.zscore(f"emq:{{{name}}}:pending", jid) for name in names]
        (s,) = [x for x in found if x is not None]
        return float(s)

    page = sq.browse("pending", 24)
    assert sorted(page) == sorted(ids)
    ranks = [(score(j), j) for j in page]
    assert ranks == sorted(ranks, reverse=True)  # the reverse claim order, over the shards
    assert {ids[j] for j in page[:8]} == {2}  # the lowest priority (runs last) comes first
    assert sq.browse("pending", 5) == page[:5]


def test_check_names_the_shard_of_a_violation(sq: Any, url: str, r: redis.Redis) -> None:
    _fill(sq)
    assert sq.check() == []
    names = sq.shards()
    # Break shard 2: a pending id with no row.
    r.zadd(f"emq:{{{names[2]}}}:pending", {echomq.ids.encode("JOB", 99): 0})
    found = sq.check()
    assert found and all(line.startswith(f"{names[2]}: ") for line in found)
    with shard_queues(url, names) as shards:
        assert [f"{names[2]}: {v}" for v in shards[2].check()] == found


def test_drain_pause_and_obliterate_cover_every_shard(sq: Any, url: str, r: redis.Redis) -> None:
    _fill(sq)
    names = sq.shards()
    with shard_queues(url, names) as shards:
        waiting = sum(s.counts()["pending"] for s in shards)
        assert sq.drain() == waiting
        assert sum(s.counts()["pending"] for s in shards) == 0
        assert sq.drain(include_scheduled=True) == 4
        sq.pause()
        assert sq.is_paused() and all(s.is_paused() for s in shards)
        shards[1].resume()
        assert not sq.is_paused()  # True only when every shard is paused
        with pytest.raises(echomq.StateError):
            sq.obliterate()  # shard 1 is not paused: refused before any shard is touched
        assert all(snapshot(r, name) for name in names)
        sq.resume()
        assert not any(s.is_paused() for s in shards)
        sq.pause()
    sq.obliterate(force=True)  # active jobs (held by nobody here) need force, as on one queue
    assert all(snapshot(r, name) == {} for name in names)


def test_fan_out_settings_and_sweeps(sq: Any, url: str) -> None:
    _fill(sq)
    sq.keep_dead(5)
    sq.keep_completed(10, 60_000)
    sq.enable_events(100)
    with shard_queues(url, sq.shards()) as shards:
        assert sq.promote() == 0 and sq.reap() == 0 and sq.fire_due() == 0
        assert sq.sweep_stalled() == ([], [])
        assert sq.pump() == 0
        assert sq.metrics("failed", minutes=2)[0] == sum(
            s.metrics("failed", minutes=2)[0] for s in shards
        )
        dead = sum(s.counts()["dead"] for s in shards)
        assert dead == 2 and sq.reprocess_all() == dead
        sq.disable_events()
        assert sq.rate_limit_ttl() == 0
        sq.clear_rate_limit()
        lane = key_for_shard(3, N, "lane")
        sq.rate_limit_lane(lane, 5, 1000)
        sq.limit_lane(lane, 2)
        sq.weight_lane(lane, 3)
        assert shards[3].rate_limit_ttl(lane) == sq.rate_limit_ttl(lane)
        sq.clear_rate_limit(lane)
        assert sq.get_limit() is None
        for s in shards:
            s.limit(2)  # the documented by-hand alternative to a queue-wide limit
        assert sq.get_limit() == 2 * N
        counts = sq.cancel_all()
        assert counts["removed"] + counts["signalled"] > 0
        assert sq.counts()["pending"] == 0


def test_repeats_live_on_one_shard(sq: Any, url: str) -> None:
    lane = key_for_shard(2, N, "lane")
    assert sq.repeat("tick", b"t", every_ms=60_000, group=lane) == "registered"
    assert sq.repeat("tick", b"t", every_ms=120_000, group=lane) == "updated"
    assert shard_of("tick", N) != 2  # without the lane it would move: refused (FINDINGS S2)
    with pytest.raises(echomq.ShardsError, match="unrepeat it first"):
        sq.repeat("tick", b"t", every_ms=60_000)
    [rep] = sq.repeats()  # never on two shards
    assert (rep.name, rep.group, rep.every_ms) == ("tick", lane, 120_000)
    assert sq.pause_repeat("tick") and sq.resume_repeat("tick")
    assert sq.unrepeat("tick") and not sq.unrepeat("tick")
    assert sq.repeats() == []


def test_two_clients_with_different_n_agree(url: str, qname: str) -> None:
    with echomq.Queue(qname, url=url, shards=3) as three:
        first = three.shards()
        assert len(first) == 3
        with echomq.Queue(qname, url=url, shards=5) as five:
            grown = five.shards()
        assert grown[:3] == first and len(grown) == 5  # grown, never re-laid
        assert three.shards() == grown  # the stored list wins over its own N
        with echomq.Queue(qname, url=url, shards=2) as two:
            assert two.shards() == grown  # "at least N": more stored is used as it is
        aq = SyncOverAsync(echomq.AsyncQueue(qname, url=url, shards=4))
        assert aq.shards() == grown
        aq.close()
        with echomq.Queue(qname, url=url) as plain:
            assert plain.shards() == grown


def test_reshard_grows_and_keeps_every_job(sq: Any, url: str) -> None:
    before = [sq.enqueue(f"b{i}").id for i in range(40)]
    lane = key_for_shard(0, N, "keep")
    before += [sq.enqueue("l", group=lane).id for _ in range(4)]
    old = sq.shards()
    grown = sq.reshard(N + 2)
    assert grown[:N] == old and len(grown) == N + 2
    assert sq.reshard(N + 2) == grown  # idempotent
    with pytest.raises(echomq.ShardsError, match="obliterate"):
        sq.reshard(N + 1)
    after = [sq.enqueue(f"a{i}").id for i in range(40)]
    with shard_queues(url, grown) as shards:
        for jid in before:  # nothing moved
            assert grown[holder(shards, jid)] in old
        assert any(holder(shards, j) >= N for j in after)  # new jobs reach the new shards
        assert sum(s.counts()["pending"] for s in shards) == 84
    claimed: list[str] = []
    while batch := sq.claim_batch(16):
        claimed += [j.id for j in batch]
    assert sorted(claimed) == sorted(before + after)  # each job once, none lost


def test_a_client_follows_a_reshard_made_by_another(url: str, qname: str) -> None:
    with echomq.Queue(qname, url=url, shards=2) as old, echomq.Queue(qname, url=url) as base:
        assert len(old.shards()) == 2
        with echomq.Queue(qname, url=url, shards=2) as other:
            grown = other.reshard(6)
            lane = key_for_shard(5, 6, "late")
            late = other.enqueue(b"on a new shard", group=lane).id
        with shard_queues(url, grown) as shards:
            assert holder(shards, late) == 5
        # A verb by id that finds the job on no shard it knows reads the list again.
        assert old.get_job(late)["payload"] == b"on a new shard"
        assert old.counts()["pending"] == 1
        assert old.shards() == grown == base.shards()
