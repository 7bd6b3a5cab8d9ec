"""The seams of issue 37 (items 4 and 6): a debounce fold takes the newest call's settings,
and a settle that frees room under a queue-wide limit wakes a parked claimer. Each test
failed on the code before its fix; each runs on both executors."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import echomq
from conftest import server_ms, snapshot, wait_for
from echomq import App, Worker
from echomq.errors import StateError

pytestmark = pytest.mark.executors


def K(q: str, suffix: str) -> str:
    return "emq:{" + q + "}:" + suffix


DEBOUNCE: dict[str, Any] = {"dedup": "k", "dedup_mode": "debounce", "dedup_ttl_ms": 600_000}


# --------------------------------------------------------------------------- item 4: the fold


def test_a_debounce_fold_takes_the_new_calls_ttl(q: echomq.Queue, r: redis.Redis) -> None:
    holder = q.enqueue(b"v1", ttl_ms=50, **DEBOUNCE).id
    expires = int(r.hget(K(q.name, "job:" + holder), "expires") or 0)
    # Past the holder's own deadline (server clock): a claim now would dead-letter v1.
    wait_for(lambda: server_ms(r) > expires, timeout=30)
    folded = q.enqueue(b"v2", ttl_ms=600_000, **DEBOUNCE)
    assert folded.status == "deduplicated" and folded.id == holder
    job = q.claim()
    assert job is not None and job.id == holder and job.payload == b"v2"
    assert q.check() == []


def test_a_debounce_fold_without_ttl_drops_the_holders(q: echomq.Queue, r: redis.Redis) -> None:
    holder = q.enqueue(b"v1", ttl_ms=50, **DEBOUNCE).id
    assert q.enqueue(b"v2", **DEBOUNCE).id == holder
    assert not r.hexists(K(q.name, "job:" + holder), "expires")
    # And a fold with a ttl into a holder without one gives it that deadline.
    q.enqueue(b"v3", ttl_ms=600_000, **DEBOUNCE)
    assert int(r.hget(K(q.name, "job:" + holder), "expires") or 0) > server_ms(r) + 500_000


@pytest.mark.parametrize("delayed", [False, True])
def test_a_debounce_fold_takes_the_new_calls_priority(
    q: echomq.Queue, r: redis.Redis, delayed: bool
) -> None:
    other = q.enqueue(b"other", priority=5).id
    holder = q.enqueue(b"v1", priority=10, **DEBOUNCE).id
    if delayed:  # a scheduled holder takes it at its promotion (the row field)
        assert q.enqueue(b"v2", priority=1, delay_ms=600_000, **DEBOUNCE).id == holder
        assert q.job_state(holder) == "scheduled"
        q.enqueue(b"v2", priority=1, **DEBOUNCE)  # due now again
        assert q.promote() == 1
    else:
        assert q.enqueue(b"v2", priority=1, **DEBOUNCE).id == holder
    assert r.hget(K(q.name, "job:" + holder), "priority") == b"1"
    first = q.claim()
    assert first is not None and first.id == holder and first.payload == b"v2"
    second = q.claim()
    assert second is not None and second.id == other
    # Back to the default priority: the field goes (a default job holds no byte for it).
    third = q.enqueue(b"w1", priority=7, dedup="k2", dedup_mode="debounce", dedup_ttl_ms=60_000)
    q.enqueue(b"w2", dedup="k2", dedup_mode="debounce", dedup_ttl_ms=60_000)
    assert not r.hexists(K(q.name, "job:" + third.id), "priority")
    assert q.check() == []


@pytest.mark.parametrize(("held", "asked"), [("a", "b"), ("a", None), (None, "b")])
def test_a_debounce_fold_refuses_another_lane(
    q: echomq.Queue, r: redis.Redis, held: str | None, asked: str | None
) -> None:
    holder = q.enqueue(b"v1", group=held, **DEBOUNCE).id
    before = snapshot(r, q.name)
    with pytest.raises(StateError, match="lane") as raised:
        q.enqueue(b"v2", group=asked, **DEBOUNCE)
    assert holder in str(raised.value)
    assert snapshot(r, q.name) == before  # refused: nothing written, the holder keeps v1
    job = q.claim()
    assert job is not None and job.payload == b"v1"


def test_a_dedup_into_a_running_holder_of_another_lane_is_deduplicated(
    q: echomq.Queue,
) -> None:
    # Only a fold is refused: a holder already running takes nothing, so the lane is moot.
    holder = q.enqueue(b"v1", group="a", **DEBOUNCE).id
    assert q.claim() is not None
    refused = q.enqueue(b"v2", group="b", **DEBOUNCE)
    assert refused.status == "deduplicated" and refused.id == holder


# --------------------------------------------------------------------------- item 6: the refill


def test_a_settle_that_frees_room_under_the_limit_wakes_a_claimer(
    q: echomq.Queue, r: redis.Redis
) -> None:
    q.limit(1)
    a = q.enqueue(b"a").id
    q.enqueue(b"b")
    job = q.claim()
    assert job is not None and job.id == a
    assert q.claim() is None  # the limit holds b back
    r.delete(K(q.name, "wake"))
    q.settle(completed=[(job.id, job.token)])
    assert r.llen(K(q.name, "wake")) == 1  # b may run: a parked claimer is woken


def test_a_settle_wakes_no_one_without_a_limit_or_work(q: echomq.Queue, r: redis.Redis) -> None:
    q.enqueue(b"a")
    job = q.claim()
    assert job is not None
    r.delete(K(q.name, "wake"))
    q.settle(completed=[(job.id, job.token)])
    assert r.llen(K(q.name, "wake")) == 0  # no limit: the settle costs what it did
    q.limit(1)
    q.enqueue(b"b")
    job = q.claim()
    assert job is not None
    r.delete(K(q.name, "wake"))
    q.settle(completed=[(job.id, job.token)])
    assert r.llen(K(q.name, "wake")) == 0  # nothing waits: nobody to wake


class _InProc:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_until_complete, args=(worker.arun(),), daemon=True
        )
        self.thread.start()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.worker.stop)
        self.thread.join(60)
        assert not self.thread.is_alive(), "the worker did not stop"
        self.loop.close()


@pytest.fixture
def app(url: str) -> Iterator[App]:
    a = App(url=url)
    yield a
    a.close()


def test_a_worker_under_the_limit_refills_without_waiting_for_its_beat(
    app: App, qname: str, r: redis.Redis
) -> None:
    done: list[int] = []

    @app.task(queue=qname, name="t")
    def t(i: int) -> None:
        done.append(i)

    q = app.queue(qname)
    q.limit(3)
    for i in range(12):
        t.enqueue(i)
    # No wake token left over from the enqueues: the worker's first claims come from its
    # start, and every later one must come from a settle's wake, not from a beat (one beat
    # here is ten minutes: the old code took at least one beat per refill).
    r.delete(K(qname, "wake"))
    handle = _InProc(Worker(app, queues=[qname], concurrency=4, beat_ms=600_000))
    try:
        wait_for(lambda: len(done) == 12, timeout=60)
    finally:
        handle.stop()
    assert sorted(done) == list(range(12))
