"""The app of the chain chaos test (tests/reliability/test_chain_chaos.py): chains of 5
steps over 2 queues.

``first(k)`` returns ``k``; ``step(prev, i)`` returns ``prev * 2 + i``. Every run that
reaches its end appends ``chain:step:token:prev`` to the list ``emqtest:<queue>:chainruns``
(the value it was handed), so the test can check that no step was skipped, that each got
the right value, and that a step ran again only after its worker was killed (a new token).

Configured from the environment: ``EMQ_TEST_QUEUE`` (odd steps; even steps go to
``<queue>-b``), ``EMQ_TEST_LEASE_MS``, ``EMQ_TEST_RUN_MS``.
"""

from __future__ import annotations

import asyncio
import os

import redis.asyncio

from echomq import App, current_job

QUEUE = os.environ.get("EMQ_TEST_QUEUE", "unset")
LEASE_MS = int(os.environ.get("EMQ_TEST_LEASE_MS", "30000"))
RUN_MS = int(os.environ.get("EMQ_TEST_RUN_MS", "0"))

app = App()
_books: redis.asyncio.Redis | None = None


def books() -> redis.asyncio.Redis:
    global _books
    if _books is None:
        # The URL without echomq's options (executor=native is not redis-py's).
        _books = redis.asyncio.Redis.from_url(app.url.split("?")[0], socket_timeout=10)
    return _books


async def _record(chain: int, step: int, prev: int) -> None:
    job = current_job()
    assert job is not None
    await books().incr(f"emqtest:{QUEUE}:chainstarts")  # runs begun, killed ones included
    if RUN_MS:
        await asyncio.sleep(RUN_MS / 1000)
    await books().rpush(f"emqtest:{QUEUE}:chainruns", f"{chain}:{step}:{job.token}:{prev}")


@app.task(queue=QUEUE, name="chain.first", lease_ms=LEASE_MS, max_attempts=1000, backoff=50)
async def first(chain: int) -> int:
    await _record(chain, 0, -1)
    return chain


@app.task(queue=QUEUE + "-b", name="chain.step.b", lease_ms=LEASE_MS, max_attempts=1000, backoff=50)
async def step_b(prev: int, chain: int, i: int) -> int:
    await _record(chain, i, prev)
    return prev * 2 + i


@app.task(queue=QUEUE, name="chain.step.a", lease_ms=LEASE_MS, max_attempts=1000, backoff=50)
async def step_a(prev: int, chain: int, i: int) -> int:
    await _record(chain, i, prev)
    return prev * 2 + i
