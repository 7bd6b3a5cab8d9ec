"""An app for the health-probe tests (tests/runtime/test_health_probes.py): one handler that
blocks the worker's event loop, one that holds a slot politely. Its queue and lease come
from the environment (``EMQ_TEST_QUEUE``, ``EMQ_TEST_LEASE_MS``), as apps.basic's do."""

from __future__ import annotations

import asyncio
import os
import time

from echomq import App

QUEUE = os.environ.get("EMQ_TEST_QUEUE", "unset")
LEASE_MS = int(os.environ.get("EMQ_TEST_LEASE_MS", "30000"))

app = App()


@app.task(queue=QUEUE, name="block", lease_ms=LEASE_MS, max_attempts=1)
async def block(seconds: float) -> None:
    """A bug on purpose: ``time.sleep`` in an async handler stalls the whole event loop."""
    time.sleep(seconds)


@app.task(queue=QUEUE, name="nap", lease_ms=LEASE_MS, max_attempts=1)
async def nap(seconds: float) -> None:
    """Holds its slot without blocking anything (keeps a worker draining after SIGTERM)."""
    await asyncio.sleep(seconds)
