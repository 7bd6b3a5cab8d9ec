"""The project's Django tasks (Django's ``@task``, from ``django.tasks`` or the backport)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task()
def add(a: int, b: int) -> int:
    return a + b


@task(queue_name="reports")
def report(rows: list[int], *, title: str) -> dict[str, Any]:
    return {"title": title, "total": sum(rows)}


@task()
def explode(message: str) -> None:
    raise ValueError(message)


@task()
async def shout(word: str) -> str:
    return word.upper()


@task(takes_context=True)
def whoami(context: Any) -> dict[str, Any]:
    return {"id": context.task_result.id, "attempt": context.attempt}


@task()
def record(path: str, name: str) -> str:
    """Append ``name`` to the file at ``path``: the order of runs, for the priority test."""
    with Path(path).open("a") as f:
        f.write(name + "\n")
    return name


@task()
def wait_for_file(path: str) -> str:
    """Hold the worker's only slot until ``path`` exists (no fixed sleep: the test creates
    it when it is ready), so jobs enqueued meanwhile queue up behind it."""
    deadline = time.monotonic() + 120
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return "released"
