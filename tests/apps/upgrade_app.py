"""The app of the rolling-upgrade contract test (tests/upgrade/test_rolling_upgrade.py). The
same module runs under every release the test pairs (PYTHONPATH picks the release), so it
uses only API that 0.4.0 already had.

Every run appends ``id:token:floor:pid:task`` to ``emqtest:<queue>:runs`` on the bookkeeping
server (``EMQ_TEST_BOOKS_URL``: the server itself, never the test's lossy proxy) when it
starts. The test reads a job admitted twice from it: a lease generation (id, token) that ran
twice, or a run whose ``floor`` is above 0 (a re-admitted id carries its retired count over;
nothing here hands a job back or pushes it back, so only a second admission raises it).

Queues: ``EMQ_TEST_QUEUE`` (the flat set, lanes, delayed jobs, dedup, results, retries to
dead, the repeat, flow parents) and ``<queue>-kids`` (flow children, kept history).
"""

from __future__ import annotations

import os
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from echomq import App, current_job

QUEUE = os.environ.get("EMQ_TEST_QUEUE", "unset")
KIDS = QUEUE + "-kids"
RUNS = f"emqtest:{QUEUE}:runs"
TICKS = 6  # occurrences the repeat fires in all (its limit survives worker restarts)
# A SIGKILLed worker's jobs come back within seconds; every task of a queue has it (a
# worker claims with the longest lease of the queue's tasks, before it knows the task).
LEASE_MS = 3000
PID = os.getpid()

app = App(name="upgrade")
_books: redis.Redis | None = None


def books() -> redis.Redis:
    """The bookkeeping client. No automatic retries: a blindly resent RPUSH would record one
    run twice, which the test would read as a double admission."""
    global _books
    if _books is None:
        _books = redis.Redis.from_url(
            os.environ["EMQ_TEST_BOOKS_URL"],
            retry=Retry(NoBackoff(), 0),
            socket_timeout=10,
            socket_connect_timeout=5,
        )
    return _books


def _record(task: str) -> None:
    job = current_job()
    assert job is not None
    books().rpush(RUNS, f"{job.id}:{job.token}:{job.floor}:{PID}:{task}")


_OPTS: dict[str, Any] = {"lease_ms": LEASE_MS}


@app.task(queue=QUEUE, name="up.ok", **_OPTS)
def ok(n: int) -> int:
    _record("ok")
    return n


@app.task(queue=QUEUE, name="up.kept", keep_result_ms=600_000, **_OPTS)
def kept(n: int) -> int:
    _record("kept")
    return n * 2


@app.task(queue=QUEUE, name="up.fail", max_attempts=2, backoff=20, **_OPTS)
def fail(n: int) -> None:
    _record("fail")
    raise RuntimeError(f"planned failure of {n}")


@app.task(queue=KIDS, name="up.child", keep_result_ms=600_000, **_OPTS)
def child(n: int) -> int:
    _record("child")
    return n


@app.task(queue=QUEUE, name="up.parent", **_OPTS)
def parent(n: int) -> int:
    _record("parent")
    return n


@app.periodic(every_ms=250, limit=TICKS, queue=QUEUE, name="up-tick", **_OPTS)
def tick() -> None:
    _record("tick")


@app.task(queue=QUEUE, name="up.noop", inline=True, **_OPTS)
def noop(n: int) -> None:
    """The rotation's filler (the test's churn enqueues and completes these itself; a worker
    that claims one first just runs it)."""
