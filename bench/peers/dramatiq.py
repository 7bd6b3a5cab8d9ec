"""dramatiq: RedisBroker, one worker process with C threads."""

from __future__ import annotations

import sys
from importlib.metadata import version as _version
from pathlib import Path
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from peers._common import QUEUE, WARMUP, bench_url, paced, record, timed, wait_warm

LABEL = "dramatiq"
SETTINGS = (
    "`dramatiq peers.dramatiq --processes 1 --threads C --queues bench` (RedisBroker, default "
    "middleware); single = `noop.send(i)`; no bulk API (`group` sends one by one); "
    "completion = HLEN dramatiq:bench.msgs (a message is deleted when it is acked, after it ran)"
)
BULK: str | None = None
CONCURRENCY: dict[int, str | None] = {}

broker = RedisBroker(url=bench_url())
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE, actor_name="noop")
def noop(i: int, t: float = 0.0) -> None:
    if t:
        record(t)


def version() -> str:
    return _version("dramatiq")


def enqueue_single(url: str, n: int) -> float:
    broker.client.ping()
    return timed(lambda: [noop.send(i) for i in range(n)])


def enqueue_bulk(url: str, n: int) -> float:
    raise NotImplementedError


def worker_cmd(url: str, concurrency: int) -> list[str]:
    return [
        str(Path(sys.executable).parent / "dramatiq"), "peers.dramatiq",
        "--processes", "1", "--threads", str(concurrency), "--queues", QUEUE,
    ]  # fmt: skip


def remaining(url: str, r: Any, n: int) -> int:
    return int(r.hlen(f"dramatiq:{QUEUE}.msgs"))


def latency_send(url: str, r: Any, rate: float, seconds: float) -> int:
    noop.send(0, t=WARMUP)
    wait_warm(r)
    return paced(lambda t: noop.send(0, t=t), rate, seconds)
