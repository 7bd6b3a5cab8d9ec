"""Issue 36, item 3: one "should I stop?" flag for sync handlers. A sync handler runs in a
thread the worker cannot stop, so it polls ``current_job().should_stop``: true once the job
was cancelled, or its lease was lost (a shutdown's hand-back, a run past its timeout), with
``cancelled`` / ``lost`` saying which. Each test runs a real in-process Worker with a sync
(thread) handler that loops until the flag turns true and records what it saw."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from conftest import running, wait_for
from echomq import App, Worker, current_job


def _polling_task(app: App, qname: str, **opts: Any) -> tuple[threading.Event, list[Any]]:
    """A sync task ``poll`` that loops until ``should_stop`` (60 s at most: the test fails
    then) and records (lost, cancelled, should_stop) as it ends."""
    started = threading.Event()
    seen: list[Any] = []

    @app.task(queue=qname, name="poll", **opts)
    def poll() -> str:
        job = current_job()
        assert job is not None
        assert job.should_stop is False
        started.set()
        deadline = time.monotonic() + 60
        while not job.should_stop and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.append((job.lost, job.cancelled, job.should_stop))
        return "stopped"

    return started, seen


def test_should_stop_turns_true_when_the_job_is_cancelled(url: str, qname: str) -> None:
    app = App(url=url)
    started, seen = _polling_task(app, qname, lease_ms=3_000)
    q = app.queue(qname)
    try:
        e = app.tasks["poll"].enqueue()
        with running(Worker(app, beat_ms=100)):
            assert started.wait(30)
            assert q.cancel(e.id) == "signalled"
            wait_for(lambda: seen, 30)
            wait_for(lambda: q.job_state(e.id) == "dead", 30)
        assert seen == [(False, True, True)]
        row = q.get_job(e.id)
        assert row is not None and row["last_error"] == "cancelled"
    finally:
        app.close()


def test_should_stop_turns_true_when_a_shutdown_hands_the_job_back(url: str, qname: str) -> None:
    app = App(url=url)
    started, seen = _polling_task(app, qname)
    q = app.queue(qname)
    try:
        e = app.tasks["poll"].enqueue()
        w = Worker(app, beat_ms=100, grace_s=0.05)
        with running(w):
            assert started.wait(30)
        wait_for(lambda: seen, 30)
        assert seen == [(True, False, True)]
        assert w.stats.handed_back == 1 and q.job_state(e.id) == "pending"
    finally:
        app.close()


def test_should_stop_turns_true_when_the_run_passes_its_timeout(url: str, qname: str) -> None:
    """The run is settled as failed at its timeout while the thread runs on: the thread's
    result is never settled, so it should stop (the README's advice for long handlers)."""
    app = App(url=url)
    started, seen = _polling_task(app, qname, timeout=0.2, max_attempts=1)
    q = app.queue(qname)
    try:
        e = app.tasks["poll"].enqueue()
        with running(Worker(app, beat_ms=100)):
            assert started.wait(30)
            wait_for(lambda: seen, 30)
        assert seen == [(True, False, True)]
        row = q.get_job(e.id)
        assert row is not None and str(row["last_error"]).startswith("TimeoutError")
    finally:
        app.close()


def test_should_stop_is_read_only_and_false_outside_trouble() -> None:
    from echomq import JobContext

    ctx = JobContext("q", "id", 1, None, "t")
    assert ctx.should_stop is False
    ctx.lost = True
    assert ctx.should_stop is True
    ctx.lost, ctx.cancelled = False, True
    assert ctx.should_stop is True
    with pytest.raises(AttributeError):
        ctx.should_stop = False  # type: ignore[misc]
