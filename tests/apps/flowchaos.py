"""The app of the flow chaos test (tests/reliability/test_flow_chaos.py): a 3-level tree
over 3 queues.

``leaf(n)`` returns n; ``mid(k)`` returns the sum of its children's values; ``root()``
checks its children. Every run of a parent appends ``kind:id:token:count:sum`` to the list
``emqtest:<queue>:flowruns`` (what the run saw), so the test can check that each parent ran
only after all its children, with all their results.

Configured from the environment: ``EMQ_TEST_QUEUE`` (the root queue; the others are
``<queue>-mid`` and ``<queue>-leaf``), ``EMQ_TEST_LEASE_MS``, ``EMQ_TEST_RUN_MS``.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import redis.asyncio

from echomq import App, current_job

QUEUE = os.environ.get("EMQ_TEST_QUEUE", "unset")
LEASE_MS = int(os.environ.get("EMQ_TEST_LEASE_MS", "30000"))
RUN_MS = int(os.environ.get("EMQ_TEST_RUN_MS", "0"))
KEEP_MS = 3_600_000

app = App()
_books: redis.asyncio.Redis | None = None


def books() -> redis.asyncio.Redis:
    global _books
    if _books is None:
        _books = redis.asyncio.Redis.from_url(app.url, socket_timeout=10)
    return _books


async def _record(kind: str, values: dict[str, Any]) -> int:
    job = current_job()
    assert job is not None
    total = sum(v for v in values.values() if isinstance(v, int))
    entry = f"{kind}:{job.id}:{job.token}:{len(values)}:{total}"
    await books().rpush(f"emqtest:{QUEUE}:flowruns", entry)
    return total


@app.task(queue=QUEUE + "-leaf", name="flow.leaf", lease_ms=LEASE_MS, keep_result_ms=KEEP_MS)
async def leaf(n: int) -> int:
    if RUN_MS:
        await asyncio.sleep(RUN_MS / 1000)
    return n


@app.task(queue=QUEUE + "-mid", name="flow.mid", lease_ms=LEASE_MS, keep_result_ms=KEEP_MS)
async def mid(k: int) -> int:
    job = current_job()
    assert job is not None
    total = await _record("mid", await job.achildren_values())
    if RUN_MS:
        await asyncio.sleep(RUN_MS / 1000)
    return total


@app.task(queue=QUEUE, name="flow.root", lease_ms=LEASE_MS)
async def root() -> None:
    job = current_job()
    assert job is not None
    await _record("root", await job.achildren_values())
