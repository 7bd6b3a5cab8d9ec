"""saq: asyncio worker, ``concurrency=C``, one process."""

from __future__ import annotations

import asyncio
import sys
from importlib.metadata import version as _version
from typing import Any

from peers._common import QUEUE, WARMUP, apaced, bench_url, record, wait_warm

LABEL = "saq"
SETTINGS = (
    "`saq.Worker(Queue.from_url(url, name='bench'), functions=[noop], concurrency=C)` in one "
    "process (`await worker.start()`, logging at WARNING); dequeue by BLMOVE; "
    "single = `await queue.enqueue('noop', i=i)`; no bulk enqueue API (`Queue.map` enqueues "
    "one by one and waits for results); completion = ZCARD saq:bench:incomplete"
)
BULK: str | None = None
CONCURRENCY: dict[int, str | None] = {}


async def noop(ctx: dict[str, Any], *, i: int, t: float = 0.0) -> None:
    if t:
        record(t)


def version() -> str:
    return _version("saq")


def _queue(url: str) -> Any:
    from saq import Queue

    return Queue.from_url(url, name=QUEUE)


def enqueue_single(url: str, n: int) -> float:
    async def main() -> float:
        q = _queue(url)
        await q.connect()
        await q.count("incomplete")
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for i in range(n):
            await q.enqueue("noop", i=i)
        elapsed = loop.time() - t0
        await q.disconnect()
        return elapsed

    return asyncio.run(main())


def enqueue_bulk(url: str, n: int) -> float:
    raise NotImplementedError


def run_worker(concurrency: int) -> None:
    from saq import Worker

    async def main() -> None:
        q = _queue(bench_url())
        await q.connect()
        try:
            await Worker(q, functions=[("noop", noop)], concurrency=concurrency).start()
        finally:
            await q.disconnect()

    asyncio.run(main())


def worker_cmd(url: str, concurrency: int) -> list[str]:
    return [sys.executable, "-m", "peers._worker", "saq", str(concurrency)]


def remaining(url: str, r: Any, n: int) -> int:
    return int(r.zcard(f"saq:{QUEUE}:incomplete"))


def latency_send(url: str, r: Any, rate: float, seconds: float) -> int:
    async def main() -> int:
        q = _queue(url)
        await q.connect()
        await q.enqueue("noop", i=0, t=WARMUP)
        await asyncio.to_thread(wait_warm, r)
        sent = await apaced(lambda t: q.enqueue("noop", i=0, t=t), rate, seconds)
        await q.disconnect()
        return sent

    return asyncio.run(main())
