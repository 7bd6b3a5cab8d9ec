"""bullmq-py: the Python port of BullMQ (same Lua scripts), one asyncio worker process."""

from __future__ import annotations

import asyncio
import signal
import sys
from importlib.metadata import version as _version
from typing import Any

from peers._common import QUEUE, WARMUP, apaced, bench_url, record, wait_warm

LABEL = "bullmq-py"
SETTINGS = (
    "`bullmq.Worker('bench', process, {'connection': url, 'concurrency': C})` in one process "
    "(defaults otherwise: completed jobs kept); single = `await queue.add('noop', {...})`; "
    "bulk = `await queue.addBulk([...])` (one MULTI pipeline); completion = ZCARD "
    "bull:bench:completed"
)
BULK: str | None = "Queue.addBulk"
CONCURRENCY: dict[int, str | None] = {}


async def process(job: Any, token: str) -> None:
    t = job.data.get("t")
    if t:
        record(t)


def version() -> str:
    return _version("bullmq")


def _queue(url: str) -> Any:
    from bullmq import Queue

    return Queue(QUEUE, {"connection": url})


def enqueue_single(url: str, n: int) -> float:
    async def main() -> float:
        q = _queue(url)
        await q.getJobCounts("wait")
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for i in range(n):
            await q.add("noop", {"i": i})
        elapsed = loop.time() - t0
        await q.close()
        return elapsed

    return asyncio.run(main())


def enqueue_bulk(url: str, n: int) -> float:
    async def main() -> float:
        q = _queue(url)
        await q.getJobCounts("wait")
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await q.addBulk([{"name": "noop", "data": {"i": i}} for i in range(n)])
        elapsed = loop.time() - t0
        await q.close()
        return elapsed

    return asyncio.run(main())


def run_worker(concurrency: int) -> None:
    from bullmq import Worker

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        worker = Worker(QUEUE, process, {"connection": bench_url(), "concurrency": concurrency})
        await stop.wait()
        await worker.close()

    asyncio.run(main())


def worker_cmd(url: str, concurrency: int) -> list[str]:
    return [sys.executable, "-m", "peers._worker", "bullmq_py", str(concurrency)]


def remaining(url: str, r: Any, n: int) -> int:
    return n - int(r.zcard(f"bull:{QUEUE}:completed"))


def latency_send(url: str, r: Any, rate: float, seconds: float) -> int:
    async def main() -> int:
        q = _queue(url)
        await q.add("noop", {"i": 0, "t": WARMUP})
        await asyncio.to_thread(wait_warm, r)
        sent = await apaced(lambda t: q.add("noop", {"i": 0, "t": t}), rate, seconds)
        await q.close()
        return sent

    return asyncio.run(main())
