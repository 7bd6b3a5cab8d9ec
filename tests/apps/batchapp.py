"""An app for batch tests (issue 42) run by worker processes. ``EMQ_TEST_QUEUE`` names the
queue. Bookkeeping lives in ``emqtest:<queue>:*`` keys, outside the queue's keyspace:
``fired`` (a list: one entry per callback run, ``<kind>:<batch id>``), ``runs`` (a counter
of member runs)."""

from __future__ import annotations

import os

import redis

from echomq import App, current_job

QUEUE = os.environ.get("EMQ_TEST_QUEUE", "unset")
PREFIX = f"emqtest:{QUEUE}:"

app = App()
_r: redis.Redis | None = None


def books() -> redis.Redis:
    global _r
    if _r is None:
        _r = redis.Redis.from_url(app.url.split("?")[0])  # no echomq option
    return _r


@app.task(queue=QUEUE, name="member", max_attempts=2, backoff=10)
def member(n: int, fail: bool = False, spawn: int = 0) -> int:
    """A batch member: fails every attempt when ``fail`` (it dies after 2), and adds
    ``spawn`` siblings to its own batch first."""
    books().incr(PREFIX + "runs")
    if spawn:
        ctx = current_job()
        assert ctx is not None
        batch = ctx.batch
        assert batch is not None
        batch.add_many([member.s(n * 100 + i) for i in range(spawn)])
    if fail:
        raise RuntimeError(f"member {n} fails")
    return n


@app.task(queue=QUEUE, name="fired")
def fired(kind: str) -> None:
    """A batch callback: records ``kind:<batch id>`` (its batch read from the job)."""
    ctx = current_job()
    assert ctx is not None
    batch = ctx.batch
    books().rpush(PREFIX + "fired", f"{kind}:{batch.id if batch else '-'}")
