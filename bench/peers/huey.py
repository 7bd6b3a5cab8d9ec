"""huey: RedisHuey (blocking BRPOP), one consumer process with C worker threads."""

from __future__ import annotations

import sys
from importlib.metadata import version as _version
from pathlib import Path
from typing import Any

from huey import RedisHuey

from peers._common import QUEUE, WARMUP, bench_url, paced, record, timed, wait_warm

LABEL = "huey"
SETTINGS = (
    "`huey_consumer peers.huey.huey -w C -k thread -n -q` (RedisHuey, blocking dequeue, no "
    "periodic tasks); the task returns True so its result lands in huey's result hash, which is "
    "how completion is read (HLEN huey.results.bench; huey has no in-progress set); "
    "single = `noop(i)`; no bulk API"
)
BULK: str | None = None
CONCURRENCY: dict[int, str | None] = {}

huey = RedisHuey(QUEUE, url=bench_url())


@huey.task(name="noop")
def noop(i: int, t: float = 0.0) -> bool:
    if t:
        record(t)
    return True


def version() -> str:
    return _version("huey")


def enqueue_single(url: str, n: int) -> float:
    huey.storage.conn.ping()
    return timed(lambda: [noop(i) for i in range(n)])


def enqueue_bulk(url: str, n: int) -> float:
    raise NotImplementedError


def worker_cmd(url: str, concurrency: int) -> list[str]:
    return [
        str(Path(sys.executable).parent / "huey_consumer"), "peers.huey.huey",
        "-w", str(concurrency), "-k", "thread", "-n", "-q",
    ]  # fmt: skip


def remaining(url: str, r: Any, n: int) -> int:
    return n - int(r.hlen(f"huey.results.{QUEUE}"))


def latency_send(url: str, r: Any, rate: float, seconds: float) -> int:
    noop(0, t=WARMUP)
    wait_warm(r)
    return paced(lambda t: noop(0, t=t), rate, seconds)
