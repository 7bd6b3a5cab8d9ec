"""taskiq: taskiq-redis ``RedisStreamBroker`` (XREADGROUP + XACK), one worker process."""

from __future__ import annotations

import asyncio
import sys
from importlib.metadata import version as _version
from pathlib import Path
from typing import Any

from taskiq_redis import RedisStreamBroker

from peers._common import QUEUE, WARMUP, apaced, bench_url, record, wait_warm

LABEL = "taskiq"
GROUP = "taskiq"
SETTINGS = (
    "`taskiq worker peers.taskiq:broker --workers 1 --max-async-tasks C --log-level WARNING` "
    "(taskiq-redis RedisStreamBroker, stream `bench`, consumer group `taskiq`, default "
    "xread_count 100, default ack when_saved, no result backend); single = "
    "`await noop.kiq(i)`; no bulk API; completion = XINFO GROUPS entries-read minus pending"
)
BULK: str | None = None
CONCURRENCY: dict[int, str | None] = {}
# taskiq's supervisor takes tens of seconds to stop on SIGTERM; the jobs are done by then
STOP_TIMEOUT = 3.0

broker = RedisStreamBroker(url=bench_url(), queue_name=QUEUE, consumer_group_name=GROUP)


@broker.task(task_name="noop")
async def noop(i: int, t: float = 0.0) -> None:
    if t:
        record(t)


def version() -> str:
    return f"{_version('taskiq')} + taskiq-redis {_version('taskiq-redis')}"


def enqueue_single(url: str, n: int) -> float:
    async def main() -> float:
        await broker.startup()  # creates the consumer group before the first message
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for i in range(n):
            await noop.kiq(i)
        elapsed = loop.time() - t0
        await broker.shutdown()
        return elapsed

    return asyncio.run(main())


def enqueue_bulk(url: str, n: int) -> float:
    raise NotImplementedError


def worker_cmd(url: str, concurrency: int) -> list[str]:
    return [
        str(Path(sys.executable).parent / "taskiq"), "worker", "peers.taskiq:broker",
        "--workers", "1", "--max-async-tasks", str(concurrency), "--log-level", "WARNING",
    ]  # fmt: skip


def remaining(url: str, r: Any, n: int) -> int:
    try:
        groups = r.xinfo_groups(QUEUE)
    except Exception:  # the stream does not exist yet
        return n
    for g in groups:
        name = g["name"].decode() if isinstance(g["name"], bytes) else g["name"]
        if name == GROUP:
            read = g.get("entries-read") or 0
            return n - (int(read) - int(g["pending"]))
    return n


def latency_send(url: str, r: Any, rate: float, seconds: float) -> int:
    async def main() -> int:
        await broker.startup()
        await noop.kiq(0, t=WARMUP)
        await asyncio.to_thread(wait_warm, r)
        sent = await apaced(lambda t: noop.kiq(0, t=t), rate, seconds)
        await broker.shutdown()
        return sent

    return asyncio.run(main())
