"""The app of the reliability tests (chaos, server crash, dropped connections, TLS, ACL).

Its one task, ``chaos.run(n)``, appends ``id:token:pid:n`` to a history list when a run
starts; and this module wraps ``WorkerStats.count_call`` so every settle verdict the server
sent is recorded too: ``settled`` (accepted: completed, scheduled or dead), each entry
``id:token:kind:pid``, and ``refused`` (``StaleToken``/``JobGone``), each
``id:token:kind:pid:stale|gone``. The product code is not changed: the wrapper only
observes what the worker already receives.

Configured from the environment:

- ``EMQ_TEST_QUEUE``: the queue (required).
- ``EMQ_TEST_LEASE_MS``: the task's lease (default 30000).
- ``EMQ_TEST_HISTORY_URL``: where the bookkeeping goes (default: the app's server). The
  dropped-connection test points it past its proxy, so bookkeeping is never cut.
- ``EMQ_TEST_FAIL_EVERY``: runs of jobs with ``n % FAIL_EVERY == 0`` fail on their first
  attempt (0, the default: never), so retries settle too.
- ``EMQ_TEST_RUN_MS``: how long a run takes (an asyncio sleep; default 0), so a worker holds
  many jobs when it is killed.

Keys (outside the queue's keyspace): ``emqtest:<queue>:history``, ``:settled``, ``:refused``.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from echomq import App, JobGone, StaleToken, current_job
from echomq.worker import WorkerStats

QUEUE = os.environ.get("EMQ_TEST_QUEUE", "unset")
LEASE_MS = int(os.environ.get("EMQ_TEST_LEASE_MS", "30000"))
FAIL_EVERY = int(os.environ.get("EMQ_TEST_FAIL_EVERY", "0"))
RUN_MS = int(os.environ.get("EMQ_TEST_RUN_MS", "0"))
PREFIX = f"emqtest:{QUEUE}:"
PID = os.getpid()

app = App()
_books: redis.Redis | None = None
_abooks: redis.asyncio.Redis | None = None
# No automatic retries: a blindly resent RPUSH would record one event twice, which the
# tests would read as a double delivery.
_OPTIONS: dict[str, Any] = {"socket_timeout": 10, "socket_connect_timeout": 5}


def _books_url() -> str:
    return os.environ.get("EMQ_TEST_HISTORY_URL") or app.url


def books() -> redis.Redis:
    """The bookkeeping client (sync: the settle recorder runs inside the worker's loop)."""
    global _books
    if _books is None:
        _books = redis.Redis.from_url(_books_url(), retry=Retry(NoBackoff(), 0), **_OPTIONS)
    return _books


def abooks() -> redis.asyncio.Redis:
    global _abooks
    if _abooks is None:
        _abooks = redis.asyncio.Redis.from_url(
            _books_url(), retry=Retry(NoBackoff(), 0), **_OPTIONS
        )
    return _abooks


@app.task(queue=QUEUE, name="chaos.run", lease_ms=LEASE_MS, max_attempts=100_000, backoff=20)
async def run(n: int) -> None:
    """Record the run, take RUN_MS, and fail the first attempt of every FAIL_EVERY-th job."""
    job = current_job()
    assert job is not None
    await abooks().rpush(PREFIX + "history", f"{job.id}:{job.token}:{PID}:{n}")
    if RUN_MS:
        await asyncio.sleep(RUN_MS / 1000)
    if FAIL_EVERY and n % FAIL_EVERY == 0 and job.token == 1:
        raise RuntimeError(f"job {n} fails its first attempt")


_count_call = WorkerStats.count_call


def _record(s: Any, result: Any) -> None:
    entry = f"{s.job_id}:{s.token}:{s.kind}:{PID}"
    try:
        if result is None or result in ("scheduled", "dead"):
            books().rpush(PREFIX + "settled", entry)
        elif isinstance(result, (StaleToken, JobGone)):
            why = "gone" if isinstance(result, JobGone) else "stale"
            books().rpush(PREFIX + "refused", f"{entry}:{why}")
    except redis.RedisError as exc:  # the server is down (the crash test): say so, go on
        print(f"BOOKKEEPING LOST {entry}: {exc!r}", flush=True)


def _recording_count_call(self: WorkerStats, settles: Any, result: Any, queue: str) -> Any:
    # The verdicts in the order settle_call sent them: completions, then retries.
    done, again = iter(result.completed), iter(result.retried)
    for s in settles:
        _record(s, next(done) if s.kind == "completed" else next(again))
    return _count_call(self, settles, result, queue)


WorkerStats.count_call = _recording_count_call  # type: ignore[method-assign]
