"""Issue 13 controls under a real in-process worker: results kept through the task's
serializer (D17) and waited for from the app layer, cancel of a running handler (D22), and
dedup options on ``task.options`` (D20)."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from worker_support import InProcWorker, make_app, run_worker  # fixtures, re-exported below

import echomq
from conftest import command_calls, wait_for
from echomq import App, current_job

__all__ = ["make_app", "run_worker"]


def _p(queue: str) -> str:
    return f"emq:{{{queue}}}:"


def test_task_result_round_trips_through_the_serializer(
    make_app: Callable[..., App], run_worker: Callable[..., InProcWorker], qname: str
) -> None:
    app = make_app()

    @app.task(queue=qname, keep_result_ms=30_000)
    def add(a: int, b: int) -> dict[str, int]:
        return {"sum": a + b}

    @app.task(queue=qname)
    def plain(a: int) -> int:
        return a

    h = add.enqueue(2, 3)
    assert h == echomq.Enqueued(h.id, "enqueued")  # still an Enqueued to its callers
    p = plain.enqueue(1)
    run_worker(app, queues=[qname])
    assert h.wait(timeout_s=10) == {"sum": 5}
    # A task that does not keep results writes none.
    q = app.queue(qname)
    wait_for(lambda: q.counts()["completed"] == 2)
    assert q.result(p.id) is None


def test_wait_on_a_task_that_keeps_no_results_fails_at_once(
    make_app: Callable[..., App], qname: str
) -> None:
    """Issue 27 #6: it used to wait out the whole timeout."""
    app = make_app()

    @app.task(queue=qname)
    def plain(a: int) -> int:
        return a

    p = plain.enqueue(1)
    how = "keep them with @app.task(..., keep_result_ms=60_000)"
    r = app.queue(qname).client
    blocked = command_calls(r, "blpop")
    with pytest.raises(echomq.InvalidArgument, match=re.escape(how)):
        p.wait(timeout_s=60)
    with pytest.raises(echomq.InvalidArgument, match="keeps no results"):
        asyncio.run(p.await_result(timeout_s=60))
    # At once: neither waited (no BLPOP), which no elapsed time can say on a busy machine.
    assert command_calls(r, "blpop") == blocked


def test_task_failure_raises_job_failed(
    make_app: Callable[..., App], run_worker: Callable[..., InProcWorker], qname: str
) -> None:
    app = make_app()

    @app.task(queue=qname, keep_result_ms=30_000, max_attempts=1)
    def boom() -> None:
        raise ValueError("nope")

    h = boom.enqueue()
    run_worker(app, queues=[qname])
    with pytest.raises(echomq.JobFailed) as info:
        h.wait(timeout_s=10)
    assert "ValueError: nope" in info.value.error


def test_await_result_async(
    make_app: Callable[..., App], run_worker: Callable[..., InProcWorker], qname: str
) -> None:
    app = make_app()

    @app.task(queue=qname, keep_result_ms=30_000)
    async def double(x: int) -> int:
        return 2 * x

    async def main() -> list[Any]:
        try:
            handles = [await double.aenqueue(i) for i in range(20)]
            return list(await asyncio.gather(*(h.await_result(timeout_s=20) for h in handles)))
        finally:
            await app.aclose()

    run_worker(app, queues=[qname])
    assert asyncio.run(main()) == [2 * i for i in range(20)]


def test_cancel_async_handler_mid_await(
    make_app: Callable[..., App],
    run_worker: Callable[..., InProcWorker],
    qname: str,
    r: redis.Redis,
) -> None:
    app = make_app()
    started = threading.Event()
    after: list[str] = []

    @app.task(queue=qname, lease_ms=300, keep_result_ms=30_000)
    async def slow() -> None:
        started.set()
        await asyncio.sleep(30)
        after.append("ran on")  # must never run

    h = slow.enqueue()
    run_worker(app, queues=[qname])
    assert started.wait(60)
    q = app.queue(qname)
    assert q.cancel(h.id) == "signalled"
    wait_for(lambda: q.job_state(h.id) == "dead", timeout=60)
    row = q.get_job(h.id)
    assert row is not None and row["last_error"] == "cancelled"
    assert row["attempts"] == "1"  # dead-lettered under the token it ran with
    with pytest.raises(echomq.JobFailed, match="cancelled"):
        h.wait(timeout_s=5)
    time.sleep(0.3)
    assert after == []


def test_cancel_sync_handler_that_polls(
    make_app: Callable[..., App],
    run_worker: Callable[..., InProcWorker],
    qname: str,
) -> None:
    app = make_app()
    started = threading.Event()
    steps: list[int] = []

    @app.task(queue=qname, lease_ms=300)
    def polling() -> str:
        started.set()
        for i in range(300):
            job = current_job()
            assert job is not None
            if job.cancelled:
                return "stopped"
            steps.append(i)
            time.sleep(0.05)
        return "finished"

    h = polling.enqueue()
    run_worker(app, queues=[qname])
    assert started.wait(60)
    q = app.queue(qname)
    assert q.cancel(h.id) == "signalled"
    wait_for(lambda: q.job_state(h.id) == "dead", timeout=60)
    assert q.get_job(h.id)["last_error"] == "cancelled"  # type: ignore[index]
    n = len(steps)
    time.sleep(0.3)
    assert len(steps) == n < 300  # the handler ran no further


def test_task_options_dedup(make_app: Callable[..., App], qname: str) -> None:
    app = make_app()

    @app.task(queue=qname)
    def sync_account(account: int) -> None: ...

    first = sync_account.options(dedup="acct-1").enqueue(1)
    again = sync_account.options(dedup="acct-1").enqueue(1)
    assert first.status == "enqueued"
    assert again == echomq.Enqueued(first.id, "deduplicated")
    with pytest.raises(echomq.InvalidArgument):
        sync_account.options(dedup="x", dedup_mode="throttle")
    with pytest.raises(echomq.InvalidId):
        sync_account.options(dedup="a b")


def test_bad_keep_result_ms_on_task(make_app: Callable[..., App], qname: str) -> None:
    app = make_app()
    for bad in (-1, "5", 1.5, True):
        with pytest.raises(echomq.InvalidArgument):
            app.task(queue=qname, keep_result_ms=bad)(lambda: None)  # type: ignore[arg-type]


def test_rate_limit_exception_pushes_back_without_spending_an_attempt(
    make_app: Callable[..., App],
    run_worker: Callable[..., InProcWorker],
    qname: str,
    r: redis.Redis,
) -> None:
    app = make_app()
    runs: list[int] = []

    @app.task(queue=qname, max_attempts=1, keep_result_ms=30_000)
    def call_api() -> str:
        runs.append(1)
        if len(runs) < 3:
            raise echomq.RateLimit(50)
        return "ok"

    h = call_api.enqueue()
    run_worker(app, queues=[qname])
    # max_attempts=1, yet two rate-limited runs did not dead-letter it.
    assert h.wait(timeout_s=15) == "ok"
    assert len(runs) == 3


def test_task_rate_limit_applies_to_its_queue(
    make_app: Callable[..., App],
    run_worker: Callable[..., InProcWorker],
    qname: str,
    r: redis.Redis,
) -> None:
    app = make_app()

    @app.task(queue=qname, rate_limit=(5, 60_000))
    def limited(i: int) -> None: ...

    limited.enqueue_many([((i,), {}) for i in range(12)])
    run_worker(app, queues=[qname])
    q = app.queue(qname)
    wait_for(lambda: q.counts()["completed"] == 5, timeout=60)
    assert r.hmget(_p(qname) + "meta", "rate_max", "rate_window_ms") == [b"5", b"60000"]
    time.sleep(0.5)
    assert q.counts()["completed"] == 5 and q.counts()["pending"] == 7
    assert 0 < q.rate_limit_ttl() <= 60_000
    with pytest.raises(echomq.InvalidArgument):
        app.task(queue=qname, rate_limit=(0, 1000))(lambda: None)
    with pytest.raises(echomq.InvalidArgument):
        echomq.RateLimit(-1)


def test_limited_lane_beside_unlimited_lanes(
    make_app: Callable[..., App],
    run_worker: Callable[..., InProcWorker],
    qname: str,
) -> None:
    app = make_app()
    done: dict[str, int] = {}

    @app.task(queue=qname, inline=True)
    def work(lane: str) -> None:
        done[lane] = done.get(lane, 0) + 1

    q = app.queue(qname)
    q.rate_limit_lane("slow", 1, 1000)
    for lane in ("slow", "a", "b", "c"):
        for _ in range(40):
            work.options(group=lane).enqueue(lane)
    t0 = time.monotonic()
    run_worker(app, queues=[qname])
    wait_for(lambda: all(done.get(x) == 40 for x in "abc"), timeout=60)
    # The unlimited lanes finished their 120 jobs while the slow lane ran about 1 a second.
    assert done.get("slow", 0) <= 2 + (time.monotonic() - t0)
    assert q.check() == []


# A lease whose heartbeat (every lease/3) comes long after any deadline of the test below.
LONG_LEASE_MS = 600_000


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_cancel_reaches_a_running_job_before_its_next_heartbeat(
    make_app: Callable[..., App],
    run_worker: Callable[..., InProcWorker],
    qname: str,
    kind: str,
) -> None:
    """Issue 27 #7: the holder learned of a cancel at its next heartbeat, lease/3 later (10 s
    on the default 30 s lease); now cancel nudges the queue's count, which a worker holding
    jobs polls. The lease here is 10 minutes, so its next heartbeat is 200 s away, past the
    test's deadlines: the cancel can only arrive by the poll. (It asserted "within 2 s" on
    the default lease: a clock, issue 36.)"""
    app = make_app()
    started = threading.Event()
    stopped: list[float] = []

    if kind == "async":

        @app.task(queue=qname, name="long", lease_ms=LONG_LEASE_MS)
        async def long_async() -> None:
            started.set()
            try:
                await asyncio.sleep(120)  # past the deadlines below: only a cancel ends it
            except asyncio.CancelledError:
                stopped.append(time.monotonic())
                raise

    else:

        @app.task(queue=qname, name="long", lease_ms=LONG_LEASE_MS)
        def long_sync() -> None:
            started.set()
            for _ in range(2400):  # 120 s: past the deadlines below
                job = current_job()
                assert job is not None
                if job.cancelled:
                    stopped.append(time.monotonic())
                    return
                time.sleep(0.05)

    h = app.tasks["long"].enqueue()
    run_worker(app, queues=[qname])
    assert started.wait(60)
    q = app.queue(qname)
    assert q.cancel(h.id) == "signalled"
    wait_for(lambda: q.job_state(h.id) == "dead", timeout=60)
    wait_for(lambda: stopped, timeout=60)  # the handler saw it and stopped
    assert q.get_job(h.id)["last_error"] == "cancelled"  # type: ignore[index]
