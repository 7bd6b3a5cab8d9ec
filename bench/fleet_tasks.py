"""The tasks of ``bench/fleet.py``, one app per system (chosen by ``FLEET_SYSTEM``, so each
worker process imports only its own system): ``burn(n)``, ``n`` rounds of pure-Python work
(the driver calibrates ``n`` to ~20 ms), and ``noop()``. Each ``burn`` counts itself with one
INCR of ``fleet:done`` on the bench's server, the completion every system is measured by."""

from __future__ import annotations

import os
from typing import Any

import redis

SYSTEM = os.environ.get("FLEET_SYSTEM", "echomq")
URL = os.environ.get("BENCH_URL", "redis://127.0.0.1:6390/0")
QUEUE = "fleet"
DONE = "fleet:done"

_counter: redis.Redis | None = None


def work(n: int) -> int:
    """CPU-bound, pure Python, no I/O: ``n`` rounds of integer arithmetic."""
    x = 0
    for i in range(n):
        x = (x * 31 + i) % 1_000_003
    return x


def _done() -> None:
    global _counter
    if _counter is None:  # one connection per worker process, opened in that process
        _counter = redis.Redis.from_url(URL)
    _counter.incr(DONE)


def burn_fn(n: int) -> None:
    work(n)
    _done()


app: Any = None
if SYSTEM == "echomq":
    from echomq import App

    app = App(url=URL)
    burn = app.task(name="burn", queue=QUEUE, max_attempts=1)(burn_fn)

    @app.task(name="noop", queue=QUEUE, max_attempts=1, inline=True)
    def noop() -> None:
        return None

elif SYSTEM == "celery":
    from celery import Celery

    app = Celery("fleet", broker=URL)
    app.conf.update(
        task_default_queue=QUEUE,
        task_acks_late=True,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    burn = app.task(name="burn")(burn_fn)

elif SYSTEM == "dramatiq":
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(url=URL)
    dramatiq.set_broker(broker)
    burn = dramatiq.actor(queue_name=QUEUE, actor_name="burn", max_retries=0)(burn_fn)
