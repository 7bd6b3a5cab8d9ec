"""rq: ``SimpleWorker`` (no fork per job), one process; no in-process concurrency."""

from __future__ import annotations

import sys
from importlib.metadata import version as _version
from pathlib import Path
from typing import Any

import redis
from rq import Queue

from peers._common import QUEUE, WARMUP, paced, record, timed, wait_warm

LABEL = "rq"
SETTINGS = (
    "`rq worker -w rq.worker.SimpleWorker --logging_level WARNING --disable-job-desc-logging "
    "bench` (executes in the worker process, no fork per job); default result_ttl (500 s); "
    "single = `Queue.enqueue(noop, i)`; bulk = `Queue.enqueue_many([Queue.prepare_data(...)])` "
    "(one pipeline); completion = the FinishedJobRegistry (ZCARD)"
)
BULK: str | None = "Queue.enqueue_many"
_ONE_AT_A_TIME = (
    "n/a: one SimpleWorker process runs one job at a time (rq has no in-process concurrency)"
)
CONCURRENCY: dict[int, str | None] = {10: _ONE_AT_A_TIME}
MAX_CONCURRENCY = (1, _ONE_AT_A_TIME)  # bench/run.py: every -c above 1 (--peer-best too)


def noop(i: int, t: float = 0.0) -> None:
    if t:
        record(t)


def version() -> str:
    return _version("rq")


def _queue(url: str) -> Queue:
    return Queue(QUEUE, connection=redis.Redis.from_url(url))


def enqueue_single(url: str, n: int) -> float:
    q = _queue(url)
    q.connection.ping()
    return timed(lambda: [q.enqueue(noop, i) for i in range(n)])


def enqueue_bulk(url: str, n: int) -> float:
    q = _queue(url)
    q.connection.ping()
    return timed(lambda: q.enqueue_many([Queue.prepare_data(noop, (i,)) for i in range(n)]))


def worker_cmd(url: str, concurrency: int) -> list[str]:
    rq_bin = str(Path(sys.executable).parent / "rq")
    return [
        rq_bin, "worker", "-w", "rq.worker.SimpleWorker", "-u", url,
        "--logging_level", "WARNING", "--disable-job-desc-logging", QUEUE,
    ]  # fmt: skip


_finished: dict[str, str] = {}


def remaining(url: str, r: Any, n: int) -> int:
    key = _finished.get(url)
    if key is None:
        key = _finished[url] = _queue(url).finished_job_registry.key
    return n - int(r.zcard(key))


def latency_send(url: str, r: Any, rate: float, seconds: float) -> int:
    q = _queue(url)
    q.enqueue(noop, 0, t=WARMUP)
    wait_warm(r)
    return paced(lambda t: q.enqueue(noop, 0, t=t), rate, seconds)
