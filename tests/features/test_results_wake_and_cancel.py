"""Issue 13 follow-ups on a real server: a kept result writes its wake token only when a waiter
asked for one (D17), and cancel / push back are visible on the events stream (D15, D22)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis
from worker_support import InProcWorker, make_app, run_worker  # fixtures, re-exported below

import echomq
from conftest import blocked_clients, wait_for
from echomq import App
from echomq.protocol import control as _ctl

__all__ = ["make_app", "run_worker"]


def _p(queue: str) -> str:
    return f"emq:{{{queue}}}:"


def _events(q: Any) -> list[tuple[str, str | None, dict[str, str]]]:
    return [(e.event, e.id, e.fields) for e in q.events(count=100_000)]


# --------------------------------------------------------------------------- results (D17)


def _waiting(q: echomq.Queue, job_id: str) -> tuple[threading.Thread, list[BaseException]]:
    """A thread blocked in ``q.wait(job_id)``, and the list that gets what it raised."""
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            q.wait(job_id, timeout_s=60)
        except BaseException as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    # Blocked on the job's notify list, its marker set: what the settle must wake.
    wait_for(lambda: blocked_clients(q.client) == 1, timeout=60)
    return waiter, errors


def _woken(q: echomq.Queue, job_id: str) -> bool:
    """The blocked waiters of job_id were woken by its settle's token, not by their block
    ending (MAX_BLOCK_S, after which they read the outcome anyway): each woken waiter puts
    the token back for the others (rearm), so one stays; a block that ran out takes and puts
    back none. Asserted on the keys rather than on how long the wait took (issue 36)."""
    return bool(q.client.llen(_p(q.name) + "notify:" + job_id) == 1)


def test_kept_result_without_a_waiter_writes_no_wake_token(anyq: Any, r: redis.Redis) -> None:
    e = anyq.enqueue(b"x")
    job = anyq.claim()
    anyq.complete(job.id, job.token, result=b"v", keep_result_ms=60_000)
    p = _p(anyq.name)
    assert r.hget(p + "result:" + e.id, "result") == b"v"
    assert not r.exists(p + "notify:" + e.id, p + "want:" + e.id)


def test_waiter_marker_makes_the_completion_push(q: echomq.Queue, r: redis.Redis, url: str) -> None:
    e = q.enqueue(b"x")
    job = q.claim()
    assert job is not None
    p = _p(q.name)
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(q.wait(e.id, timeout_s=60)))
    waiter.start()
    wait_for(lambda: blocked_clients(r) == 1, timeout=60)  # marker set, then blocked
    # The marker outlives the longest block the waiter makes.
    assert _ctl.MAX_BLOCK_S * 1000 < r.pttl(p + "want:" + e.id) <= _ctl.WANT_MS
    with echomq.Queue(q.name, url=url) as other:
        other.complete(job.id, job.token, result=b"done", keep_result_ms=60_000)
    waiter.join(60)
    assert got and got[0].value == b"done"
    # The token went back for any other waiter (rearm), with the result's TTL.
    assert 0 < r.pttl(p + "notify:" + e.id) <= 60_000


def test_dead_letter_with_a_waiter_wakes_it(q: echomq.Queue, url: str) -> None:
    e = q.enqueue(b"x")
    job = q.claim()
    assert job is not None
    waiter, errors = _waiting(q, e.id)
    with echomq.Queue(q.name, url=url) as other:
        other.retry(
            job.id, job.token, delay_ms=0, max_attempts=1, error="bad", keep_result_ms=60_000
        )
    waiter.join(60)
    assert errors and isinstance(errors[0], echomq.JobFailed)
    assert _woken(q, e.id)


def test_a_stall_death_wakes_its_waiter_with_stalled(q: echomq.Queue, url: str) -> None:
    """A job that dies of stalls (its holder vanished) wakes a waiter already waiting with
    JobFailed("stalled"): the sweep keeps that outcome for 60 s, as cancel does."""
    e = q.enqueue(b"x")
    job = q.claim(lease_ms=50)
    assert job is not None
    waiter, errors = _waiting(q, e.id)
    time.sleep(0.06)  # the 50 ms lease lapses (a slower machine only makes it later)
    with echomq.Queue(q.name, url=url) as other:
        assert other.sweep_stalled(max_stalled=1) == ([], [e.id])
    waiter.join(60)
    assert _woken(q, e.id)
    assert errors and isinstance(errors[0], echomq.JobFailed)
    assert "stalled" in str(errors[0])


def test_a_stall_death_without_a_waiter_keeps_nothing(q: echomq.Queue, r: redis.Redis) -> None:
    e = q.enqueue(b"x")
    assert q.claim(lease_ms=1) is not None
    time.sleep(0.05)
    assert q.sweep_stalled(max_stalled=1) == ([], [e.id])
    assert not r.exists(_p(q.name) + "result:" + e.id)


async def test_async_waiter_sets_its_marker_and_refreshes_it(
    aq: echomq.AsyncQueue, r: redis.Redis
) -> None:
    e = await aq.enqueue(b"x")
    wk = _p(aq.name) + "want:" + e.id
    task = asyncio.create_task(aq.wait(e.id, timeout_s=30))
    for _ in range(200):
        if r.exists(wk):
            break
        await asyncio.sleep(0.01)
    assert r.exists(wk)
    # A marker too old to outlive the next block is set again before it: simulate its age
    # and expiry, then wake the reader (a poke) so it blocks again.
    r.delete(wk)
    waiters = aq._waiters
    assert waiters is not None
    waiters._marked[e.id] = 0.0
    await waiters._x.run(waiters._poke_plan())
    for _ in range(200):
        if r.exists(wk):
            break
        await asyncio.sleep(0.01)
    assert r.exists(wk)
    job = await aq.claim()
    assert job is not None
    await aq.complete(job.id, job.token, result=b"ok", keep_result_ms=10_000)
    assert (await asyncio.wait_for(task, 60)).value == b"ok"


# --------------------------------------------------------------------------- events (D15)


def test_cancel_emits_cancelled(anyq: Any) -> None:
    anyq.enable_events(1000)
    waiting = anyq.enqueue(b"w")
    assert anyq.cancel(waiting.id) == "removed"
    active = anyq.enqueue(b"a")
    job = anyq.claim()
    assert job.id == active.id
    assert anyq.cancel(active.id) == "signalled"
    assert anyq.cancel(active.id) == "signalled"  # the flag again: one event per call
    cancelled = [(i, f) for ev, i, f in _events(anyq) if ev == "cancelled"]
    assert cancelled[0] == (waiting.id, {})
    assert cancelled[1:] == [(active.id, {"signalled": "1"})] * 2
    assert anyq.cancel(waiting.id) == "absent"
    assert len([ev for ev, _, _ in _events(anyq) if ev == "cancelled"]) == 3


def test_cancel_of_a_grouped_job_names_its_lane(q: echomq.Queue) -> None:
    q.enable_events(1000)
    e = q.enqueue(b"g", group="tenant-a")
    assert q.cancel(e.id) == "removed"
    assert [(i, f) for ev, i, f in _events(q) if ev == "cancelled"] == [
        (e.id, {"group": "tenant-a"})
    ]


def test_push_back_emits_delayed_with_pushed(q: echomq.Queue, r: redis.Redis) -> None:
    q.enable_events(1000)
    e = q.enqueue(b"x")
    job = q.claim()
    assert job is not None
    q._x.call(_ctl.push_back(q._k, job.id, job.token, 5000))
    pushed = [f for ev, i, f in _events(q) if ev == "delayed" and i == e.id]
    assert pushed == [{"attempts": "1", "delay_ms": "5000", "pushed": "1"}]
    assert r.zscore(_p(q.name) + "schedule", e.id) is not None


# --------------------------------------------------------------------------- cancel (D22)


def test_cancel_remove_has_the_holders_settle_remove_the_job(anyq: Any, r: redis.Redis) -> None:
    anyq.enable_events(1000)
    e = anyq.enqueue(b"x")
    job = anyq.claim()
    assert anyq.cancel(e.id, remove=True) == "signalled"
    p = _p(anyq.name)
    assert r.hget(p + "job:" + e.id, "cancel") == b"remove"
    assert anyq.extend_leases([(job.id, job.token)], lease_ms=30_000) == ([], [e.id])
    # The holder settles its cancelled run as it always does: dead, error "cancelled".
    verdict = anyq.retry(
        job.id, job.token, delay_ms=0, max_attempts=1, error="cancelled", keep_result_ms=5000
    )
    assert verdict == "removed"
    assert not r.exists(p + "job:" + e.id)
    assert r.zscore(p + "dead", e.id) is None and r.zscore(p + "active", e.id) is None
    assert anyq.counts()["dead"] == 0
    # Its waiters still learn why.
    assert r.hget(p + "result:" + e.id, "error") == b"cancelled"
    removed = [f for ev, i, f in _events(anyq) if ev == "removed" and i == e.id]
    assert removed == [{"state": "active", "cancelled": "1"}]


def test_cancel_without_remove_still_dead_letters(q: echomq.Queue, r: redis.Redis) -> None:
    e = q.enqueue(b"x")
    job = q.claim()
    assert job is not None
    assert q.cancel(e.id) == "signalled"
    assert r.hget(_p(q.name) + "job:" + e.id, "cancel") == b"1"
    assert q.retry(job.id, job.token, delay_ms=0, max_attempts=1, error="cancelled") == "dead"
    assert r.zscore(_p(q.name) + "dead", e.id) is not None


def test_cancel_remove_bad_flag_writes_nothing(q: echomq.Queue, r: redis.Redis) -> None:
    e = q.enqueue(b"x")
    job = q.claim()
    assert job is not None
    before = r.hgetall(_p(q.name) + "job:" + e.id)
    for bad in (1, "yes", None):
        try:
            q.cancel(e.id, remove=bad)  # type: ignore[arg-type]
        except echomq.InvalidArgument:
            pass
        else:
            raise AssertionError(f"remove={bad!r} accepted")
    assert r.hgetall(_p(q.name) + "job:" + e.id) == before


def test_worker_removes_a_job_cancelled_with_remove(
    make_app: Any, run_worker: Any, qname: str, r: redis.Redis
) -> None:
    app: App = make_app()
    started = threading.Event()

    @app.task(queue=qname, lease_ms=300, keep_result_ms=30_000)
    async def slow() -> None:
        started.set()
        await asyncio.sleep(30)

    h = slow.enqueue()
    w: InProcWorker = run_worker(app, queues=[qname])
    assert started.wait(60)
    q = app.queue(qname)
    assert q.cancel(h.id, remove=True) == "signalled"
    wait_for(lambda: q.job_state(h.id) == "absent", timeout=60)
    assert q.counts()["dead"] == 0
    assert r.zscore(_p(qname) + "dead", h.id) is None
    with pytest.raises(echomq.JobFailed, match="cancelled"):
        h.wait(timeout_s=5)
    assert w.stop().dead == 1  # counted with the jobs that ended unsuccessfully


def test_cancel_of_a_waiting_job_wakes_its_waiters(q: echomq.Queue, url: str) -> None:
    e = q.enqueue(b"x", delay_ms=60_000)  # scheduled
    errors: list[BaseException] = []

    def wait() -> None:
        with echomq.Queue(q.name, url=url) as mine:
            try:
                mine.wait(e.id, timeout_s=60)
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=wait) for _ in range(3)]
    for t in threads:
        t.start()
    wait_for(lambda: blocked_clients(q.client) == 3, timeout=60)
    assert q.cancel(e.id) == "removed"
    for t in threads:
        t.join(60)
    assert _woken(q, e.id)  # woken by the cancel's one token, passed on by each
    assert len(errors) == 3
    assert all(isinstance(x, echomq.JobFailed) and "cancelled" in str(x) for x in errors)


def test_cancel_without_a_waiter_keeps_no_outcome(q: echomq.Queue, r: redis.Redis) -> None:
    e = q.enqueue(b"x")
    assert q.cancel(e.id) == "removed"
    p = _p(q.name)
    assert not r.exists(p + "result:" + e.id, p + "notify:" + e.id)
