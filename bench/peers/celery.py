"""celery: Redis broker, one worker process (``--pool solo`` at C=1, ``--pool threads -c C``)."""

from __future__ import annotations

import sys
from importlib.metadata import version as _version
from pathlib import Path
from typing import Any

from celery import Celery

from peers._common import QUEUE, WARMUP, bench_url, paced, record, timed, wait_warm

LABEL = "celery"
SETTINGS = (
    "`celery -A peers.celery worker -Q bench --pool solo` at C=1, `--pool threads -c C` "
    "otherwise, `-l WARNING --without-gossip --without-mingle --without-heartbeat`; Redis "
    "broker, no result backend (`task_ignore_result`), `task_acks_late=True` so a message "
    "leaves kombu's `unacked` hash only after it ran; default prefetch multiplier (4); "
    "single = `noop.delay(i)`; no bulk API; completion = LLEN bench + HLEN unacked"
)
BULK: str | None = None
CONCURRENCY: dict[int, str | None] = {}

app = Celery("bench", broker=bench_url())
app.conf.update(
    task_default_queue=QUEUE,
    task_acks_late=True,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="noop")
def noop(i: int, t: float = 0.0) -> None:
    if t:
        record(t)


def version() -> str:
    return _version("celery")


def enqueue_single(url: str, n: int) -> float:
    noop.delay(-2)  # open the producer connection untimed ...
    with app.connection_for_write() as conn:
        conn.default_channel.client.delete(QUEUE)  # ... and drop that job again
    return timed(lambda: [noop.delay(i) for i in range(n)])


def enqueue_bulk(url: str, n: int) -> float:
    raise NotImplementedError


def worker_cmd(url: str, concurrency: int) -> list[str]:
    pool = ["--pool", "solo"] if concurrency == 1 else ["--pool", "threads", "-c", str(concurrency)]
    return [
        str(Path(sys.executable).parent / "celery"), "-A", "peers.celery", "worker",
        "-Q", QUEUE, *pool, "-l", "WARNING",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip


def remaining(url: str, r: Any, n: int) -> int:
    pipe = r.pipeline(transaction=False)
    pipe.llen(QUEUE)
    pipe.hlen("unacked")
    queued, unacked = pipe.execute()
    return int(queued) + int(unacked)


def latency_send(url: str, r: Any, rate: float, seconds: float) -> int:
    noop.delay(0, t=WARMUP)
    wait_warm(r)
    return paced(lambda t: noop.delay(0, t=t), rate, seconds)
