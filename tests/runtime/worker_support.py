"""Helpers shared by test_worker.py and the files split from it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from conftest import wait_for
from echomq import App, Worker
from echomq.worker import WorkerStats


class InProcWorker:
    """A Worker running ``arun()`` on a private loop in a daemon thread."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.loop = asyncio.new_event_loop()
        self.stats: WorkerStats | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="test-worker", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        try:
            self.stats = self.loop.run_until_complete(self.worker.arun())
        except BaseException as exc:
            self.error = exc

    def stop(self, timeout: float = 60.0) -> WorkerStats:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.worker.stop)
            self.thread.join(timeout)
        assert not self.thread.is_alive(), "the worker did not stop"
        if not self.loop.is_closed():
            self.loop.close()
        if self.error is not None:
            raise self.error
        assert self.stats is not None
        return self.stats


@pytest.fixture
def make_app(url: str) -> Iterator[Callable[..., App]]:
    apps: list[App] = []

    def make(**kw: Any) -> App:
        app = App(url=url, **kw)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close()


@pytest.fixture
def run_worker() -> Iterator[Callable[..., InProcWorker]]:
    running: list[InProcWorker] = []

    def start(app: App, **kw: Any) -> InProcWorker:
        kw.setdefault("beat_ms", 100)
        handle = InProcWorker(Worker(app, **kw))
        running.append(handle)
        return handle

    yield start
    for handle in running:
        handle.stop()


def row(app: App, queue: str, job_id: str) -> dict[str, Any]:
    found = app.queue(queue).get_job(job_id)
    assert found is not None, f"{job_id} has no row"
    return found


def dead_with(app: App, queue: str, job_id: str, timeout: float = 60.0) -> str:
    """Wait until the job is dead; return its last_error."""
    q = app.queue(queue)
    wait_for(lambda: q.job_state(job_id) == "dead", timeout)
    return str(row(app, queue, job_id)["last_error"])
