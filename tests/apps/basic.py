"""An app for worker subprocesses. Its queue and lease come from the environment, so every
test runs it on its own queue:

- ``EMQ_TEST_QUEUE``: the queue of every task (required).
- ``EMQ_TEST_LEASE_MS``: the tasks' lease (default 30000).
- ``EMQ_TEST_DURABLE``: replicas that must acknowledge the worker's writes (default 0).
- ``EMQ_TEST_BOOKS_URL``: where the bookkeeping goes (default: the app's server), so a test
  can make the app's server refuse commands without failing the handlers.

The handlers keep their bookkeeping in keys named ``emqtest:<queue>:*``, outside the queue's
keyspace: ``tokens`` (a list of ``id:token`` per run start), ``done`` (HINCRBY per job id when
a run returns) and ``started`` (a counter).
"""

from __future__ import annotations

import asyncio
import os
import time

import redis
import redis.asyncio

from echomq import App, current_job

QUEUE = os.environ.get("EMQ_TEST_QUEUE", "unset")
LEASE_MS = int(os.environ.get("EMQ_TEST_LEASE_MS", "30000"))
PREFIX = f"emqtest:{QUEUE}:"

app = App(durable=int(os.environ.get("EMQ_TEST_DURABLE", "0")))

_sync: redis.Redis | None = None
_async: redis.asyncio.Redis | None = None


def sync_redis() -> redis.Redis:
    global _sync
    if _sync is None:
        _sync = redis.Redis.from_url(os.environ.get("EMQ_TEST_BOOKS_URL") or app.url)
    return _sync


def async_redis() -> redis.asyncio.Redis:
    global _async
    if _async is None:
        _async = redis.asyncio.Redis.from_url(os.environ.get("EMQ_TEST_BOOKS_URL") or app.url)
    return _async


def _me() -> tuple[str, int]:
    job = current_job()
    assert job is not None
    return job.id, job.token


@app.task(queue=QUEUE, name="count", lease_ms=LEASE_MS, max_attempts=5, backoff=50)
async def count(n: int) -> int:
    """Count one run of the job: the e2e bookkeeping."""
    job_id, token = _me()
    r = async_redis()
    pipe = r.pipeline(transaction=False)
    pipe.rpush(PREFIX + "tokens", f"{job_id}:{token}")
    pipe.hincrby(PREFIX + "done", job_id, 1)
    await pipe.execute()
    return n


@app.task(queue=QUEUE, name="hold", lease_ms=LEASE_MS, max_attempts=5, backoff=50)
def hold(first_s: float, later_s: float) -> None:
    """Record the run, sleep ``first_s`` on the first attempt and ``later_s`` after, then
    count the run as done."""
    job_id, token = _me()
    r = sync_redis()
    r.rpush(PREFIX + "tokens", f"{job_id}:{token}")
    time.sleep(first_s if token == 1 else later_s)
    r.hincrby(PREFIX + "done", job_id, 1)


@app.task(queue=QUEUE, name="ahold", lease_ms=LEASE_MS, max_attempts=5, backoff=50)
async def ahold(seconds: float) -> None:
    """The async twin of ``hold``: record, sleep, count."""
    job_id, token = _me()
    r = async_redis()
    await r.rpush(PREFIX + "tokens", f"{job_id}:{token}")
    await asyncio.sleep(seconds)
    await r.hincrby(PREFIX + "done", job_id, 1)
