"""Shared pieces of the adapters: the bench URL, the latency recorder, pacing, the contract."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

QUEUE = "bench"  # every system uses a queue of this name on the bench's own server
LAT_KEY = "bench:lat"  # handlers push "<enqueued_at> <started_at>" (unix seconds) here
WARMUP = -1.0  # the t of the warm-up job sent before a latency run


def bench_url() -> str:
    """The bench's own server (set by run.py before any adapter is imported)."""
    return os.environ.get("BENCH_URL", "redis://127.0.0.1:6390/0")


_recorder: Any = None


def record(t: float) -> None:
    """Called first thing by a handler whose job carries an enqueue timestamp ``t``."""
    started = time.time()
    global _recorder
    if _recorder is None:
        import redis

        _recorder = redis.Redis.from_url(bench_url())
    _recorder.rpush(LAT_KEY, f"{t!r} {started!r}")


def wait_warm(r: Any, timeout: float = 120.0) -> None:
    """Block until the warm-up job was started by the worker, then clear the list."""
    deadline = time.monotonic() + timeout
    while r.llen(LAT_KEY) < 1:
        if time.monotonic() > deadline:
            raise TimeoutError("the worker did not start the warm-up job")
        time.sleep(0.01)
    r.delete(LAT_KEY)


def paced(send: Callable[[float], Any], rate: float, seconds: float) -> int:
    """Call ``send(enqueue_time)`` at a steady ``rate`` per second for ``seconds``."""
    n = int(rate * seconds)
    start = time.monotonic()
    for i in range(n):
        due = start + i / rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        send(time.time())
    return n


async def apaced(send: Callable[[float], Awaitable[Any]], rate: float, seconds: float) -> int:
    """``paced`` for asyncio producers."""
    n = int(rate * seconds)
    start = time.monotonic()
    for i in range(n):
        due = start + i / rate
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await send(time.time())
    return n


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class Peer(Protocol):
    """What every adapter module provides (module-level names)."""

    LABEL: str  # the name in the tables
    SETTINGS: str  # the settings used, for RESULTS.md
    BULK: str | None  # the bulk API used, or None when the system has none
    CONCURRENCY: dict[int, str | None]  # per concurrency: None = supported, else why not
    # optional: MAX_CONCURRENCY = (top, why), every concurrency above top unsupported (rq)

    def version(self) -> str: ...
    def enqueue_single(self, url: str, n: int) -> float: ...  # seconds for n enqueues
    def enqueue_bulk(self, url: str, n: int) -> float: ...  # seconds for n via the bulk API
    def worker_cmd(self, url: str, concurrency: int) -> list[str]: ...
    def remaining(self, url: str, r: Any, n: int) -> int: ...  # broker-side: not yet completed
    def latency_send(self, url: str, r: Any, rate: float, seconds: float) -> int: ...
