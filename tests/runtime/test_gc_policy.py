"""The garbage-collector policy of a worker process (``echomq.runtime.gcpolicy``, issue 41):
``Worker.run`` (which owns the process) freezes what start-up made and collects less often
while it serves, and puts both back when it returns; ``Worker.arun`` leaves the caller's
collector alone."""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any

import echomq
from conftest import wait_for
from echomq import App, Worker


def _serve_one_job(url: str, qname: str, *, run: bool) -> dict[str, Any]:
    """Run a worker (``run()`` or ``arun()``) until its one job ran; what the handler saw."""
    app = App(url=url)
    seen: dict[str, Any] = {}
    worker: Worker | None = None

    @app.task(queue=qname, name="look")
    async def look() -> None:
        seen["threshold"] = gc.get_threshold()
        seen["frozen"] = gc.get_freeze_count()
        assert worker is not None
        worker.stop()

    with echomq.Queue(qname, url=url) as q:
        q.enqueue(look.payload((), {}))
    worker = Worker(app, concurrency=2, beat_ms=100)
    if run:
        worker.run()  # in the main thread: it installs its signal handlers
    else:
        asyncio.run(worker.arun())
    return seen


def test_run_freezes_and_collects_less_while_serving_then_restores(url: str, qname: str) -> None:
    assert threading.current_thread() is threading.main_thread()
    before = gc.get_threshold()
    frozen = gc.get_freeze_count()
    seen = _serve_one_job(url, qname, run=True)
    assert seen["threshold"][0] >= 50_000 and seen["threshold"][1:] == before[1:]
    assert seen["frozen"] > frozen
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == frozen


def test_arun_leaves_the_callers_collector_alone(url: str, qname: str) -> None:
    before = gc.get_threshold()
    frozen = gc.get_freeze_count()
    seen = _serve_one_job(url, qname, run=False)
    assert seen["threshold"] == before and seen["frozen"] == frozen
    wait_for(lambda: gc.get_threshold() == before)
