"""Fair lanes: the ring serves flooded lanes in turn (weighted), the flat set takes part in
the rotation, lanes at their limit or paused are skipped, and claim and claim_batch follow
the same schedule. After each run the ring (``emq:{q}:ring``) and the lane registry
(``emq:{q}:lanes``) are asserted directly and ``check()`` must be empty.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from itertools import pairwise

import pytest
import redis

import echomq
from conftest import wait_for
from echomq import keyspace

# Every test that reaches a server runs on both executors (tests/conftest.py).
pytestmark = pytest.mark.executors

LONG = 60_000  # no lease lapses during a test
Claimer = Callable[[echomq.Queue, int], list[echomq.Job]]


@pytest.fixture(autouse=True)
def _obliterate(q: echomq.Queue) -> Iterator[None]:
    """Leave nothing behind: these tests enqueue thousands of jobs."""
    yield
    q.pause()
    q.obliterate(force=True)


def by_claim(q: echomq.Queue, n: int) -> list[echomq.Job]:
    """Up to n jobs by single claims (stops at the first empty answer)."""
    out = []
    for _ in range(n):
        job = q.claim(lease_ms=LONG)
        if job is None:
            break
        out.append(job)
    return out


def by_batch(size: int) -> Claimer:
    """Up to n jobs by claim_batch(size) calls."""

    def claim(q: echomq.Queue, n: int) -> list[echomq.Job]:
        out: list[echomq.Job] = []
        while len(out) < n:
            got = q.claim_batch(min(size, n - len(out)), lease_ms=LONG)
            if not got:
                break
            out += got
        return out

    return claim


CLAIMERS = {
    "claim": by_claim,
    "batch1": by_batch(1),
    "batch7": by_batch(7),
    "batch32": by_batch(32),
    "batch100": by_batch(100),
}
claimers = pytest.mark.parametrize("claimer", list(CLAIMERS.values()), ids=list(CLAIMERS))


def fill(q: echomq.Queue, n: int, group: str | None) -> list[str]:
    out = q.enqueue_many([f"{group}-{i}".encode() for i in range(n)], group=group)
    assert all(isinstance(e, echomq.Enqueued) and e.status == "enqueued" for e in out)
    return [e.id for e in out if isinstance(e, echomq.Enqueued)]


def ring(r: redis.Redis, q: echomq.Queue) -> list[str]:
    return [x.decode() for x in r.lrange(keyspace.queue_key(q.name, "ring"), 0, -1)]


def registry(r: redis.Redis, q: echomq.Queue) -> set[str]:
    return {x.decode() for x in r.smembers(keyspace.queue_key(q.name, "lanes"))}


def groups(jobs: list[echomq.Job]) -> list[str | None]:
    return [j.group for j in jobs]


# ------------------------------------------------------------------ (a) round robin


@claimers
def test_two_flooded_lanes_alternate(q: echomq.Queue, r: redis.Redis, claimer: Claimer) -> None:
    a = fill(q, 200, "A")
    b = fill(q, 20, "B")
    jobs = claimer(q, 1000)
    seq = groups(jobs)
    assert len(seq) == 220
    # While both lanes have work they are served strictly in turn, A (ringed first) first.
    assert seq[:40] == ["A", "B"] * 20
    assert seq[40:] == ["A"] * 180
    # Within a lane, oldest first; every token is a first attempt.
    assert [j.id for j in jobs if j.group == "A"] == a
    assert [j.id for j in jobs if j.group == "B"] == b
    assert {j.token for j in jobs} == {1}
    assert ring(r, q) == [] and registry(r, q) == set()
    assert q.claim() is None and q.claim_batch(10) == []
    assert q.counts()["active"] == 220
    assert q.check() == []


@claimers
def test_alternation_survives_a_lane_joining_late(
    q: echomq.Queue, r: redis.Redis, claimer: Claimer
) -> None:
    fill(q, 100, "A")
    first = claimer(q, 10)
    assert groups(first) == ["A"] * 10
    fill(q, 10, "B")
    assert ring(r, q) == ["A", "B"] and registry(r, q) == {"A", "B"}
    seq = groups(claimer(q, 20))
    assert Counter(seq) == {"A": 10, "B": 10}
    assert all(x != y for x, y in pairwise(seq)), seq
    assert ring(r, q) == ["A"] and registry(r, q) == {"A"}
    assert q.check() == []


# ------------------------------------------------------------------ (b) weights


@claimers
def test_weights_hold_while_flooded(q: echomq.Queue, r: redis.Redis, claimer: Claimer) -> None:
    q.weight_lane("A", 3)
    fill(q, 500, "A")
    fill(q, 500, "B")
    jobs = claimer(q, 400)
    assert len(jobs) == 400
    counts = Counter(groups(jobs))
    # Both lanes stay flooded for all 400 claims: each within 10 % of its 3:1 share.
    assert 270 <= counts["A"] <= 330, counts
    assert 90 <= counts["B"] <= 110, counts
    # And the share holds locally, not only on the total: every window of 40 is ~3:1.
    for start in range(0, 400, 40):
        window = Counter(groups(jobs[start : start + 40]))
        assert 26 <= window["A"] <= 34, (start, window)
    assert sorted(ring(r, q)) == ["A", "B"] and registry(r, q) == {"A", "B"}
    assert q.lane_depth("A") == 500 - counts["A"]
    assert q.lane_depth("B") == 500 - counts["B"]
    assert q.check() == []


def test_weights_hold_when_claim_and_claim_batch_interleave(
    q: echomq.Queue, r: redis.Redis
) -> None:
    q.weight_lane("A", 3)
    fill(q, 500, "A")
    fill(q, 500, "B")
    jobs: list[echomq.Job] = []
    sizes = [1, 2, 5, 1, 13, 3, 1, 8]
    i = 0
    while len(jobs) < 400:
        size = min(sizes[i % len(sizes)], 400 - len(jobs))
        i += 1
        if size == 1 and i % 2:
            job = q.claim(lease_ms=LONG)
            assert job is not None
            jobs.append(job)
        else:
            jobs += q.claim_batch(size, lease_ms=LONG)
    counts = Counter(groups(jobs))
    assert 270 <= counts["A"] <= 330, counts
    assert 90 <= counts["B"] <= 110, counts
    assert q.check() == []


def test_three_weighted_lanes_share_in_proportion(q: echomq.Queue) -> None:
    q.weight_lane("A", 3)
    q.weight_lane("B", 2)
    for g in ("A", "B", "C"):
        fill(q, 400, g)
    counts = Counter(groups(by_batch(16)(q, 600)))
    assert 270 <= counts["A"] <= 330, counts  # 3/6 of 600
    assert 180 <= counts["B"] <= 220, counts  # 2/6
    assert 90 <= counts["C"] <= 110, counts  # 1/6
    assert q.check() == []


# ------------------------------------------------------------------ (c) flat and lanes


@claimers
def test_flat_set_and_lane_share_the_rotation(
    q: echomq.Queue, r: redis.Redis, claimer: Claimer
) -> None:
    flat = fill(q, 1000, None)
    lane = fill(q, 10, "L")
    assert ring(r, q) == ["*", "L"] and registry(r, q) == {"L"}
    first = claimer(q, 20)
    # Neither starves: the lane's 10 jobs all come out within the first 20 claims, and the
    # flooded flat set is served in between.
    assert [j.id for j in first if j.group == "L"] == lane
    assert [j.id for j in first if j.group is None] == flat[:10]
    assert ring(r, q) == ["*"] and registry(r, q) == set()
    rest = claimer(q, 2000)
    assert [j.id for j in rest] == flat[10:]
    assert ring(r, q) == [] and registry(r, q) == set()
    assert q.counts()["active"] == 1010
    assert q.check() == []


def test_flat_set_is_not_starved_by_many_lanes(q: echomq.Queue, r: redis.Redis) -> None:
    fill(q, 50, None)
    for g in ("L1", "L2", "L3", "L4"):
        fill(q, 50, g)
    jobs = by_claim(q, 50)
    counts = Counter(groups(jobs))
    # Five ring entries, one job each per turn.
    assert counts == {None: 10, "L1": 10, "L2": 10, "L3": 10, "L4": 10}
    assert sorted(ring(r, q)) == ["*", "L1", "L2", "L3", "L4"]
    assert q.check() == []


# ------------------------------------------------------------------ (d) limits


@claimers
def test_lane_at_its_limit_is_skipped_until_a_slot_frees(
    q: echomq.Queue, r: redis.Redis, claimer: Claimer
) -> None:
    q.limit_lane("A", 2)
    fill(q, 10, "A")
    fill(q, 10, "B")
    jobs = claimer(q, 6)
    held = [j for j in jobs if j.group == "A"]
    assert len(held) == 2 and Counter(groups(jobs))["B"] == 4
    # A is at its limit: out of the ring, still in the registry (it holds waiting jobs).
    assert ring(r, q) == ["B"]
    assert registry(r, q) == {"A", "B"}
    assert q.check() == []
    assert groups(claimer(q, 3)) == ["B"] * 3
    # Completing an A job frees a slot: A is back in the ring and served again, once.
    q.complete(held[0].id, held[0].token)
    assert "A" in ring(r, q)
    nxt = claimer(q, 4)
    assert Counter(groups(nxt)) == {"A": 1, "B": 3}
    assert ring(r, q) == []  # B is drained, A at its limit again
    assert registry(r, q) == {"A"}
    assert q.claim() is None and q.claim_batch(5) == []
    # Retry frees a slot too; so does raising the limit.
    q.retry(held[1].id, held[1].token, delay_ms=LONG, max_attempts=5, error="x")
    assert ring(r, q) == ["A"]
    assert groups(claimer(q, 5)) == ["A"]
    q.limit_lane("A", 4)
    assert groups(claimer(q, 5)) == ["A", "A"]
    q.limit_lane("A", None)
    assert groups(claimer(q, 50)) == ["A"] * 4
    assert ring(r, q) == [] and registry(r, q) == set()
    assert q.check() == []


def test_reap_frees_a_limited_lane(q: echomq.Queue, r: redis.Redis) -> None:
    q.limit_lane("A", 1)
    fill(q, 3, "A")
    job = q.claim(lease_ms=30)
    assert job is not None and job.group == "A"
    assert q.claim() is None and ring(r, q) == []
    wait_for(lambda: q.reap() == 1)
    # The reaped job is back at the head of its lane and the lane is back in the ring.
    assert ring(r, q) == ["A"] and registry(r, q) == {"A"}
    again = q.claim(lease_ms=LONG)
    assert again is not None and again.id == job.id and again.token == 2
    assert q.claim() is None
    assert q.check() == []


# ------------------------------------------------------------------ (e) pause


@claimers
def test_paused_lane_is_skipped(q: echomq.Queue, r: redis.Redis, claimer: Claimer) -> None:
    fill(q, 5, "A")
    fill(q, 5, "B")
    fill(q, 5, None)
    q.pause_lane("A")
    assert sorted(ring(r, q)) == ["*", "B"]
    assert registry(r, q) == {"A", "B"}
    jobs = claimer(q, 100)
    assert Counter(groups(jobs)) == {"B": 5, None: 5}
    assert ring(r, q) == [] and registry(r, q) == {"A"}
    assert q.lane_depth("A") == 5 and q.lanes() == ["A"]
    assert q.check() == []
    q.resume_lane("A")
    assert ring(r, q) == ["A"]
    assert groups(claimer(q, 100)) == ["A"] * 5
    assert ring(r, q) == [] and registry(r, q) == set()
    assert q.check() == []


def test_paused_queue_claims_nothing(q: echomq.Queue, r: redis.Redis) -> None:
    fill(q, 5, "A")
    fill(q, 5, None)
    q.pause()
    before = q.counts()
    assert q.claim() is None
    assert q.claim_batch(100) == []
    assert q.counts() == before
    # The backlog and the ring are untouched; resume serves everything.
    assert sorted(ring(r, q)) == ["*", "A"] and registry(r, q) == {"A"}
    q.resume()
    jobs = q.claim_batch(100, lease_ms=LONG)
    assert Counter(groups(jobs)) == {"A": 5, None: 5}
    assert ring(r, q) == [] and registry(r, q) == set()
    assert q.check() == []


def test_paused_lane_and_queue_then_resume_queue(q: echomq.Queue, r: redis.Redis) -> None:
    fill(q, 3, "A")
    fill(q, 3, "B")
    q.pause_lane("A")
    q.pause()
    assert q.claim_batch(10) == []
    q.resume()
    # The queue resumed, lane A is still paused.
    assert groups(q.claim_batch(10, lease_ms=LONG)) == ["B"] * 3
    assert ring(r, q) == [] and registry(r, q) == {"A"}
    assert q.check() == []
