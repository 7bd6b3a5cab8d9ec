"""Helpers shared by test_fleet.py and the files split from it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from worker_support import InProcWorker

from echomq import App, Worker


@pytest.fixture
def inproc(url: str) -> Iterator[Callable[..., Any]]:
    apps: list[App] = []
    handles: list[InProcWorker] = []

    def start(app: App, **kw: Any) -> InProcWorker:
        kw.setdefault("beat_ms", 100)
        handle = InProcWorker(Worker(app, **kw))
        handles.append(handle)
        return handle

    def make_app() -> App:
        app = App(url=url)
        apps.append(app)
        return app

    start.make_app = make_app  # type: ignore[attr-defined]
    yield start
    for handle in handles:
        handle.stop()
    for app in apps:
        app.close()
