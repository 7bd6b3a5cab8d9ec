"""The queue rate limit: every claim path capped, the window reopening, spent lanes
leaving and rejoining the ring, bad limits, four claimers, and the wait it answers.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis
from results_dedup_cancel_support import (
    _p,
)

import echomq
from conftest import snapshot, wait_for


def test_queue_rate_limit_caps_every_claim_path(anyq: Any, r: redis.Redis) -> None:
    p = _p(anyq.name)
    for i in range(10):
        anyq.enqueue(str(i), group="g" if i % 2 else None)
    anyq.rate_limit(4, 60_000)
    assert r.hmget(p + "meta", "rate_max", "rate_window_ms") == [b"4", b"60000"]
    assert anyq.rate_limit_ttl() == 0
    assert anyq.claim() is not None
    batch = anyq.claim_batch(10)
    assert len(batch) == 3
    assert {j.group for j in batch} == {None, "g"}  # lanes and the flat set share the window
    assert anyq.settle(n=10).jobs == []
    assert anyq.claim() is None and anyq.claim_batch(5) == []
    assert r.get(p + "limiter") == b"4" and 55_000 < r.pttl(p + "limiter") <= 60_000
    assert 55_000 < anyq.rate_limit_ttl() <= 60_000
    anyq.clear_rate_limit()
    assert not r.exists(p + "limiter") and anyq.rate_limit_ttl() == 0
    assert len(anyq.claim_batch(10)) == 6


def test_queue_window_reopens(q: echomq.Queue, r: redis.Redis) -> None:
    for i in range(6):
        q.enqueue(str(i))
    q.rate_limit(3, 300)
    assert len(q.claim_batch(10)) == 3
    assert q.claim() is None
    wait_for(lambda: q.rate_limit_ttl() == 0, timeout=60)
    assert len(q.claim_batch(10)) == 3


def test_spent_lane_leaves_the_ring_and_comes_back(anyq: Any, r: redis.Redis) -> None:
    p = _p(anyq.name)
    for i in range(5):
        anyq.enqueue(f"a{i}", group="a")
        anyq.enqueue(f"b{i}", group="b")
    anyq.rate_limit_lane("a", 2, 4000)  # generous: the asserts below run inside the window
    assert r.hget(p + "grate", "a") == b"2:4000"
    jobs = anyq.claim_batch(20)
    assert sum(1 for j in jobs if j.group == "a") == 2
    assert sum(1 for j in jobs if j.group == "b") == 5
    assert r.get(p + "limiter:a") == b"2" and 0 < r.pttl(p + "limiter:a") <= 4000
    assert not r.sismember(p + "inring", "a")  # out of the ring while its window is spent
    assert r.zscore(p + "ratewait", "a") is not None
    assert 0 < anyq.rate_limit_ttl("a") <= 4000
    assert anyq.check() == []
    anyq.enqueue(b"b-more", group="b")
    assert anyq.claim().group == "b"  # the other lanes keep being served
    wait_for(lambda: anyq.rate_limit_ttl("a") == 0, timeout=60)
    jobs = anyq.claim_batch(20)
    assert [j.group for j in jobs] == ["a", "a"]  # readmitted by the claim, window renewed
    assert anyq.check() == []
    anyq.clear_rate_limit("a")
    assert not r.exists(p + "limiter:a") and not r.hexists(p + "grate", "a")
    assert r.zscore(p + "ratewait", "a") is None
    assert len(anyq.claim_batch(20)) == 1
    assert anyq.check() == []


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((0, 1000), echomq.InvalidArgument),
        ((-1, 1000), echomq.InvalidArgument),
        ((5, 0), echomq.InvalidArgument),
        ((5, "1000"), echomq.InvalidArgument),
        ((True, 1000), echomq.InvalidArgument),
        ((5, 2**42), echomq.InvalidArgument),
    ],
)
def test_bad_rate_limits_write_nothing(
    anyq: Any, r: redis.Redis, args: tuple[Any, Any], error: type[Exception]
) -> None:
    anyq.enqueue(b"x", group="g")
    before = snapshot(r, anyq.name)
    with pytest.raises(error):
        anyq.rate_limit(*args)
    with pytest.raises(error):
        anyq.rate_limit_lane("g", *args)
    with pytest.raises(echomq.InvalidId):
        anyq.rate_limit_lane("bad lane", 5, 1000)
    with pytest.raises(echomq.InvalidId):
        anyq.rate_limit_ttl("bad:lane")
    assert snapshot(r, anyq.name) == before


def test_rate_limit_under_four_claimers_never_exceeds_its_window(
    q: echomq.Queue, url: str, r: redis.Redis
) -> None:
    """50/s with 4 concurrent claimers for 4 s: every fixed window (as the limiter counts it,
    on the server clock) admits at most 50, and the total stays within the windows' bound."""
    q.enqueue_many([b"x"] * 1000)
    q.rate_limit(50, 1000)
    stop = time.monotonic() + 4
    stamps: list[int] = []
    lock = threading.Lock()

    def claimer() -> None:
        with echomq.Queue(q.name, url=url) as mine:
            while time.monotonic() < stop:
                jobs = mine.claim_batch(10)
                if jobs:
                    sec, usec = mine.client.time()
                    with lock:
                        stamps.extend([int(sec) * 1000 + int(usec) // 1000] * len(jobs))
                    mine.complete_many([(j.id, j.token) for j in jobs])
                else:
                    time.sleep(max(mine.rate_limit_ttl(), 1) / 1000)

    threads = [threading.Thread(target=claimer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    stamps.sort()
    # Any 1 s span holds at most two fixed windows' worth; the total at most 5 windows.
    assert 150 <= len(stamps) <= 250
    for i, t0 in enumerate(stamps):
        inside = sum(1 for t in stamps[i:] if t < t0 + 1000)
        assert inside <= 100
    # The limiter's own count never passed its max.
    assert int(r.get(_p(q.name) + "limiter") or 0) <= 50


def test_a_limited_claim_answers_the_ms_until_its_window_reopens(
    q: echomq.Queue, r: redis.Redis
) -> None:
    """D21: a claim held back by a rate limit answers empty plus the wait: on the wire
    ``{ms}`` from claim and claim_batch, and ``Settled.rate_limited_ms`` from settle."""
    from echomq.protocol.scripts import SCRIPTS

    for i in range(3):
        q.enqueue(f"j{i}")
    q.rate_limit(1, 5_000)
    assert q.claim() is not None
    assert q.claim() is None and q.claim_batch(5) == []
    base = _p(q.name)
    keys = [base + "meta", base + "ring", base + "active"]
    reply = r.eval(SCRIPTS["claim"].source, 3, *keys, base, 30_000)
    assert len(reply) == 1 and 0 < reply[0] <= 5_000
    reply = r.eval(SCRIPTS["claim_batch"].source, 3, *keys, base, 30_000, 5)
    assert len(reply) == 1 and 0 < reply[0] <= 5_000
    s = q.settle(n=5)
    assert s.jobs == [] and 0 < s.rate_limited_ms <= 5_000
    q.clear_rate_limit()
    s = q.settle(n=1)
    assert len(s.jobs) == 1 and s.rate_limited_ms == 0
    # A lane held by its own limit: the wait is until that lane is readmitted.
    q.enqueue("g", group="slow")
    q.enqueue("g2", group="slow")
    q.rate_limit_lane("slow", 1, 4_000)
    got = q.claim_batch(10)
    assert [j.group for j in got] == [None, "slow"]
    s = q.settle(n=5)
    assert s.jobs == [] and 0 < s.rate_limited_ms <= 4_000
    assert q.settle(n=0).rate_limited_ms == 0  # no claim asked: nothing to report


def test_rate_limit_ttl_zero_means_a_claim_is_served(q: echomq.Queue) -> None:
    """rate_limit_ttl answers 0 only once the window has reopened: PTTL reads 0 in the last
    millisecond of a spent counter, and a claim in that millisecond still found the lane
    rate-held (it answered [] right after a 0). Many short windows, each claimed at once."""
    for i in range(60):
        q.enqueue(f"a{i}", group="a")
    q.rate_limit_lane("a", 2, 40)
    for _ in range(25):
        assert [j.group for j in q.claim_batch(20)] == ["a", "a"]
        wait_for(lambda: q.rate_limit_ttl("a") == 0, timeout=5, interval=0.0005)
