"""An app for the worker's log lines (tests/runtime/test_worker_logs.py): one task per line the
worker writes at a job's end. Its queue comes from ``EMQ_TEST_QUEUE``. Retries wait a minute,
so each job runs once while the test reads the lines."""

from __future__ import annotations

import asyncio
import os

from echomq import App, Retry

QUEUE = os.environ.get("EMQ_TEST_QUEUE", "unset")
LEASE = 1500  # heartbeats every 0.5 s: a cancel reaches the "wait" job quickly

app = App()


@app.task(queue=QUEUE, name="ok", lease_ms=LEASE, inline=True)
def ok() -> int:
    return 1


@app.task(queue=QUEUE, name="fail", lease_ms=LEASE, max_attempts=3, backoff=60_000)
def fail(why: str) -> None:
    raise ValueError(f"boom: {why}")


@app.task(queue=QUEUE, name="die", lease_ms=LEASE, max_attempts=1)
async def die() -> None:
    raise KeyError("last straw")


@app.task(queue=QUEUE, name="slow", lease_ms=LEASE, max_attempts=2, backoff=60_000, timeout=0.2)
async def slow() -> None:
    await asyncio.sleep(30)


@app.task(queue=QUEUE, name="again", lease_ms=LEASE, max_attempts=4)
def again() -> None:
    raise Retry(delay_ms=45_000, reason="not yet")


@app.task(queue=QUEUE, name="wait", lease_ms=LEASE)
async def wait() -> None:
    await asyncio.sleep(30)
