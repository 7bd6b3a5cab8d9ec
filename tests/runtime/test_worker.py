"""The worker runtime in-process: handlers (sync and async), the signals they raise, backoff
timing, dead-lettering, undecodable and unknown jobs, per-task timeouts, job options and
``current_job()``. Each test runs a real :class:`echomq.Worker` on its own event loop in a
thread against the session server, on the test's own queue.

The input tests (unknown tasks, bad payloads, options, argument checks) are in
test_worker_inputs.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import worker_support
from worker_support import (
    dead_with,
    row,
)

import echomq
from conftest import wait_for
from echomq import Discard, Retry, current_job, exponential, fixed

# Shared fixtures (bound here so pytest finds them in this module).
make_app = worker_support.make_app
run_worker = worker_support.run_worker


def test_sync_and_async_handlers_run_with_current_job(make_app, run_worker, qname) -> None:
    app = make_app()
    seen: list[tuple[str, Any, Any]] = []

    @app.task(queue=qname, name="s")
    def s(a: int, *, b: int) -> int:
        job = current_job()
        seen.append(("sync", (a, b), job))
        return a + b

    @app.task(queue=qname, name="a")
    async def a(x: str) -> str:
        await asyncio.sleep(0)
        seen.append(("async", x, current_job()))
        return x

    assert current_job() is None
    assert s(1, b=2) == 3  # calling the task runs it in-process, outside any job
    assert seen.pop() == ("sync", (1, 2), None)
    e1 = s.enqueue(1, b=2)
    e2 = a.enqueue("hey")
    assert e1.status == e2.status == "enqueued"
    w = run_worker(app)
    q = app.queue(qname)
    wait_for(lambda: q.counts()["completed"] == 2)
    stats = w.stop()
    by_kind = {kind: (args, job) for kind, args, job in seen}
    assert by_kind["sync"][0] == (1, 2) and by_kind["async"][0] == "hey"
    for kind, e, name in (("sync", e1, "s"), ("async", e2, "a")):
        job = by_kind[kind][1]
        assert isinstance(job, echomq.JobContext)
        assert (job.queue, job.id, job.token, job.attempt, job.group, job.task, job.lost) == (
            qname, e.id, 1, 1, None, name, False,
        )  # fmt: skip
    assert current_job() is None
    assert (stats.claimed, stats.completed, stats.retried, stats.dead, stats.lost) == (
        2,
        2,
        0,
        0,
        0,
    )
    assert q.check() == []
    assert q.counts()["active"] == q.counts()["pending"] == 0


def test_concurrency_caps_jobs_in_flight(make_app, run_worker, qname) -> None:
    app = make_app()
    lock = threading.Lock()
    now = [0]
    peak = [0]
    # Every run holds until 3 ran at once (then the gate stays open): that 3 overlap does
    # not hang on how fast a busy machine claims, as 0.15 s runs did (issue 36).
    full = threading.Event()

    def start() -> None:
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
            if now[0] == 3:
                full.set()

    @app.task(queue=qname, name="sync_slow")
    def sync_slow() -> None:
        start()
        full.wait(60)
        with lock:
            now[0] -= 1

    @app.task(queue=qname, name="async_slow")
    async def async_slow() -> None:
        start()
        for _ in range(6000):
            if full.is_set():
                break
            await asyncio.sleep(0.01)
        with lock:
            now[0] -= 1

    for _ in range(6):
        sync_slow.enqueue()
        async_slow.enqueue()
    run_worker(app, concurrency=3)
    q = app.queue(qname)
    wait_for(lambda: q.counts()["completed"] == 12)
    assert peak[0] == 3


def test_worker_serves_only_its_queues(make_app, run_worker, qname) -> None:
    app = make_app()
    other = qname[:100] + "-other"

    @app.task(queue=qname, name="mine")
    def mine() -> None:
        pass

    @app.task(queue=other, name="theirs")
    def theirs() -> None:
        pass

    assert app.queues() == sorted([qname, other])
    mine.enqueue()
    e = theirs.enqueue()
    run_worker(app, queues=[qname])
    wait_for(lambda: app.queue(qname).counts()["completed"] == 1)
    time.sleep(0.2)
    assert app.queue(other).job_state(e.id) == "pending"
    app.queue(other).remove(e.id)


def test_fixed_backoff_spaces_attempts(make_app, run_worker, qname) -> None:
    app = make_app()
    marks: list[tuple[str, int, float]] = []

    @app.task(queue=qname, name="flaky", max_attempts=3, backoff=fixed(200))
    def flaky() -> None:
        job = current_job()
        assert job is not None
        marks.append(("start", job.attempt, time.time()))
        if job.attempt < 3:
            marks.append(("fail", job.attempt, time.time()))
            raise RuntimeError(f"transient {job.attempt}")

    e = flaky.enqueue()
    # The default beat (1 s) is far above the 200 ms delay: the worker's own promote of a
    # short retry must run it on time, not at the next beat.
    w = run_worker(app, beat_ms=1000)
    q = app.queue(qname)
    wait_for(lambda: q.counts()["completed"] == 1)
    stats = w.stop()
    starts = {n: t for kind, n, t in marks if kind == "start"}
    fails = {n: t for kind, n, t in marks if kind == "fail"}
    assert sorted(starts) == [1, 2, 3]
    for n in (1, 2):
        gap = starts[n + 1] - fails[n]
        assert 0.199 <= gap < 0.9, f"attempt {n + 1} started {gap * 1000:.0f} ms after failure {n}"
    assert (stats.retried, stats.completed, stats.dead) == (2, 1, 0)
    assert q.job_state(e.id) == "absent"


def test_exponential_backoff_spaces_attempts(make_app, run_worker, qname) -> None:
    app = make_app()
    marks: list[tuple[str, int, float]] = []

    @app.task(queue=qname, name="flaky", max_attempts=4, backoff=exponential(100, 250))
    def flaky() -> None:
        job = current_job()
        assert job is not None
        marks.append(("start", job.attempt, time.time()))
        if job.attempt < 4:
            marks.append(("fail", job.attempt, time.time()))
            raise RuntimeError("again")

    flaky.enqueue()
    run_worker(app, beat_ms=50)
    q = app.queue(qname)
    wait_for(lambda: q.counts()["completed"] == 1)
    starts = {n: t for kind, n, t in marks if kind == "start"}
    fails = {n: t for kind, n, t in marks if kind == "fail"}
    for n, expected in ((1, 0.1), (2, 0.2), (3, 0.25)):  # 100, 200, then capped at 250
        gap = starts[n + 1] - fails[n]
        assert expected - 0.001 <= gap < expected + 0.5, (n, gap)


def test_dead_letter_at_max_attempts_keeps_the_error(make_app, run_worker, qname) -> None:
    app = make_app()
    runs: list[int] = []

    @app.task(queue=qname, name="broken", max_attempts=3, backoff=0)
    def broken(n: int) -> None:
        runs.append(n)
        raise ValueError(f"cannot handle {n} widgets")

    e = broken.enqueue(42)
    w = run_worker(app, beat_ms=50)
    err = dead_with(app, qname, e.id)
    stats = w.stop()
    assert runs == [42, 42, 42]
    assert err.startswith("ValueError: cannot handle 42 widgets")
    assert "Traceback" in err  # the traceback follows the one-line head
    job = row(app, qname, e.id)
    assert job["attempts"] == "3" and job["state"] == "dead"
    q = app.queue(qname)
    assert q.browse("dead") == [e.id]
    assert q.counts()["dead"] == 1 and q.counts()["failed"] == 1
    assert (stats.retried, stats.dead, stats.completed) == (2, 1, 0)
    assert q.check() == []


def test_error_text_is_capped(make_app, run_worker, qname) -> None:
    app = make_app()

    @app.task(queue=qname, name="loud", max_attempts=1)
    def loud() -> None:
        raise RuntimeError("x" * 20_000)

    e = loud.enqueue()
    run_worker(app)
    err = dead_with(app, qname, e.id)
    assert len(err) <= 8192
    assert err.startswith("RuntimeError: xxx")


def test_user_timeout_error_keeps_its_message(make_app, run_worker, qname) -> None:
    """A handler's own TimeoutError (a socket, a client) is an ordinary failure: its text is
    kept, not replaced by the per-task timeout message (the task has no timeout)."""
    app = make_app()

    @app.task(queue=qname, name="db", max_attempts=1)
    def db() -> None:
        raise TimeoutError("the database did not answer")

    e = db.enqueue()
    run_worker(app)
    err = dead_with(app, qname, e.id)
    assert "the database did not answer" in err, err


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_task_timeout_fails_the_run_and_retries(make_app, run_worker, qname, kind) -> None:
    app = make_app()
    runs: list[int] = []

    if kind == "sync":

        @app.task(queue=qname, name="slow", max_attempts=2, timeout=0.2, backoff=fixed(100))
        def slow() -> None:
            job = current_job()
            assert job is not None
            runs.append(job.attempt)
            time.sleep(0.6 if job.attempt == 1 else 0)

    else:

        @app.task(queue=qname, name="slow", max_attempts=2, timeout=0.2, backoff=fixed(100))
        async def slow() -> None:
            job = current_job()
            assert job is not None
            runs.append(job.attempt)
            await asyncio.sleep(5 if job.attempt == 1 else 0)

    e = slow.enqueue()
    q = app.queue(qname)
    run_worker(app)
    wait_for(lambda: q.job_state(e.id) in ("scheduled", "absent"))
    wait_for(lambda: q.counts()["completed"] == 1)
    assert runs == [1, 2]


def test_sync_timeout_does_not_charge_jobs_that_never_ran(make_app, run_worker, qname) -> None:
    """A sync handler past its timeout keeps its thread (threads cannot be stopped). The next
    job must not be claimed into a pool with no free thread, where its own timeout would run
    out before it starts: it would be retried, then dead, without ever running."""
    app = make_app()
    runs: list[tuple[int, int]] = []

    @app.task(queue=qname, name="stuck", max_attempts=3, timeout=0.3, backoff=0)
    def stuck(n: int) -> None:
        job = current_job()
        assert job is not None
        runs.append((n, job.attempt))
        time.sleep(1.2 if (n, job.attempt) == (0, 1) else 0)

    first = stuck.enqueue(0)
    second = stuck.enqueue(1)
    w = run_worker(app, concurrency=1)
    q = app.queue(qname)
    wait_for(lambda: q.counts()["completed"] == 2)
    assert sorted(runs) == [(0, 1), (0, 2), (1, 1)]  # every attempt charged was a real run
    assert q.job_state(first.id) == q.job_state(second.id) == "absent"
    stats = w.stop()
    assert (stats.claimed, stats.retried, stats.completed, stats.dead) == (3, 1, 2, 0)


def test_task_timeout_at_the_ceiling_is_dead_with_timeout_error(
    make_app, run_worker, qname
) -> None:
    app = make_app()

    @app.task(queue=qname, name="hang", max_attempts=2, timeout=0.1, backoff=fixed(50))
    async def hang() -> None:
        await asyncio.sleep(10)

    e = hang.enqueue()
    w = run_worker(app)
    err = dead_with(app, qname, e.id)
    assert err.startswith("TimeoutError"), err
    assert "0.1" in err
    assert row(app, qname, e.id)["attempts"] == "2"
    stats = w.stop()
    assert (stats.retried, stats.dead) == (1, 1)


def test_broken_backoff_policy_does_not_strand_the_job(make_app, run_worker, qname) -> None:
    """A custom policy that answers nonsense must not leave the job unsettled in active (to
    come back only through lapsed leases, past max_attempts): the worker falls back to the
    default curve and the handler's error is kept."""
    app = make_app()
    runs: list[int] = []

    @app.task(queue=qname, name="bad", max_attempts=2, backoff=lambda attempt: -5)
    def bad() -> None:
        runs.append(1)
        raise RuntimeError("the real problem")

    e = bad.enqueue()
    w = run_worker(app)
    err = dead_with(app, qname, e.id, timeout=10)
    assert err.startswith("RuntimeError: the real problem"), err
    assert runs == [1, 1]
    assert row(app, qname, e.id)["attempts"] == "2"
    stats = w.stop()
    assert (stats.retried, stats.dead, stats.recovered) == (1, 1, 0)


def test_retry_signal_overrides_the_backoff(make_app, run_worker, qname) -> None:
    app = make_app()
    marks: list[tuple[int, float]] = []
    errors: list[str] = []

    @app.task(queue=qname, name="later", max_attempts=5, backoff=exponential(60_000, 60_000))
    def later() -> None:
        job = current_job()
        assert job is not None
        marks.append((job.attempt, time.time()))
        if job.attempt == 1:
            raise Retry(delay_ms=300, reason="not yet")

    e = later.enqueue()
    run_worker(app, beat_ms=1000)
    q = app.queue(qname)

    def scheduled_error() -> bool:
        r = q.get_job(e.id)
        if r is not None and r.get("state") == "scheduled":
            errors.append(str(r["last_error"]))
            return True
        return q.job_state(e.id) == "absent"

    wait_for(scheduled_error)
    wait_for(lambda: q.counts()["completed"] == 1)
    (a1, t1), (a2, t2) = marks
    assert (a1, a2) == (1, 2)
    assert 0.299 <= t2 - t1 < 1.5, t2 - t1
    if errors:
        assert errors[0] == "Retry: not yet"


def test_retry_signal_still_dead_letters_at_the_ceiling(make_app, run_worker, qname) -> None:
    app = make_app()

    @app.task(queue=qname, name="forever", max_attempts=2)
    def forever() -> None:
        raise Retry(delay_ms=0)

    e = forever.enqueue()
    run_worker(app)
    assert dead_with(app, qname, e.id) == "Retry: retry requested"
    assert row(app, qname, e.id)["attempts"] == "2"


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_discard_dead_letters_at_once(make_app, run_worker, qname, kind) -> None:
    app = make_app()
    runs: list[int] = []

    if kind == "sync":

        @app.task(queue=qname, name="nope", max_attempts=5)
        def nope() -> None:
            runs.append(1)
            raise Discard("order was cancelled")

    else:

        @app.task(queue=qname, name="nope", max_attempts=5)
        async def nope() -> None:
            runs.append(1)
            raise Discard("order was cancelled")

    e = nope.enqueue()
    w = run_worker(app)
    assert dead_with(app, qname, e.id) == "Discard: order was cancelled"
    assert runs == [1]
    assert row(app, qname, e.id)["attempts"] == "1"
    stats = w.stop()
    assert (stats.dead, stats.retried) == (1, 0)


def test_signals_are_exceptions() -> None:
    assert issubclass(Retry, Exception) and issubclass(Discard, Exception)
    r = Retry(delay_ms=5, reason="why")
    assert (r.delay_ms, r.reason, str(r)) == (5, "why", "why")
    assert Retry().delay_ms is None
    assert Discard("gone").reason == "gone" and str(Discard("gone")) == "gone"
