"""echomq: ``@app.task`` async no-op, ``python -m echomq worker`` (one process, asyncio)."""

from __future__ import annotations

import sys
import time
from typing import Any

import echomq
from echomq.protocol import calls as _protocol
from peers._common import QUEUE, WARMUP, bench_url, paced, record, timed, wait_warm

LABEL = "echomq"
SETTINGS = (
    "`python -m echomq worker peers.echomq:app -q bench -c C --log-level WARNING` (one process, "
    "asyncio; `async def` handler); single = `noop.enqueue(i)`; bulk = `noop.enqueue_many(...)` "
    "(one call, chunked by echomq into 1000-job scripts, pipelined)"
)
BULK: str | None = "Task.enqueue_many"
CONCURRENCY: dict[int, str | None] = {}

app = echomq.App(bench_url())


@app.task(queue=QUEUE, name="noop")
async def noop(i: int, t: float = 0.0) -> None:
    if t:
        record(t)


# The same no-op as an inline sync handler (``inline=True``: run on the worker's loop, no
# thread, no Task): bench/cpu.py's "inline sync handler" rows run the worker on this app.
inline_app = echomq.App(bench_url())


@inline_app.task(queue=QUEUE, name="noop", inline=True)
def noop_inline(i: int, t: float = 0.0) -> None:
    if t:
        record(t)


def version() -> str:
    return echomq.__version__


# The executor this adapter asks for (the URL's executor=): None leaves URLs as they are (no
# module on the bench's server, or an older echomq under --echomq-rev); run.py sets "lua" when
# the server loads the native module, and peers/echomq_native.py runs this file with "native".
EXECUTOR: str | None = None
WORKER_APP = "app"  # the module-level App the worker runs ("inline_app": the sync handler)


def _with_executor(url: str) -> str:
    return f"{url}?executor={EXECUTOR}" if EXECUTOR else url


def _bound(url: str) -> echomq.App:
    """The module's app, pointed at ``url`` (its connection is opened untimed)."""
    url = _with_executor(url)
    if app.url != url:
        app.close()
        app.url = url
    app.queue(QUEUE).counts()
    return app


def enqueue_single(url: str, n: int) -> float:
    _bound(url)
    return timed(lambda: [noop.enqueue(i) for i in range(n)])


def enqueue_bulk(url: str, n: int) -> float:
    _bound(url)
    calls = [((i,), {}) for i in range(n)]
    return timed(lambda: noop.enqueue_many(calls))


def worker_cmd(url: str, concurrency: int) -> list[str]:
    at = ["--url", _with_executor(url)] if EXECUTOR else []
    return [
        sys.executable, "-m", "echomq", *at, "worker", f"peers.echomq:{WORKER_APP}",
        "-q", QUEUE, "-c", str(concurrency), "--log-level", "WARNING",
    ]  # fmt: skip


_queues: dict[str, echomq.Queue] = {}


def _queue(url: str) -> echomq.Queue:
    url = _with_executor(url)
    q = _queues.get(url)
    if q is None:
        q = _queues[url] = echomq.Queue(QUEUE, url=url)
    return q


def remaining(url: str, r: Any, n: int) -> int:
    return n - _queue(url).counts()["completed"]


def verify(url: str, n: int) -> tuple[bool, str]:
    """After a processed run: the consistency checker and the completed metric."""
    q = _queue(url)
    problems = q.check()
    counts = q.counts()
    ok = problems == [] and counts["completed"] == n and counts["pending"] == 0
    return ok, f"check()={problems!r} completed={counts['completed']} (N={n}) counts={counts}"


def latency_send(url: str, r: Any, rate: float, seconds: float) -> int:
    _bound(url)
    noop.enqueue(0, t=WARMUP)
    wait_warm(r)
    return paced(lambda t: noop.enqueue(0, t=t), rate, seconds)


# ------------------------------------------------------------------ the limit rows


def lifecycle_loop(url: str, n: int, batch: int = 100) -> tuple[float, str]:
    """enqueue -> claim -> complete built from ``protocol.calls`` Calls, pipelined ``batch`` at a
    time (three round trips per batch); returns (lifecycles/s, verification text)."""
    q = echomq.Queue(QUEUE, url=_with_executor(url))
    k = _protocol.Keys(QUEUE)
    payload = noop.payload((0,), {})
    q.counts()
    done = 0
    try:
        t0 = time.perf_counter()
        while done < n:
            m = min(batch, n - done)
            enq = [next(_protocol.enqueue(k, payload)) for _ in range(m)]
            for res in q._x.pipeline(enq):
                if isinstance(res, BaseException):
                    raise res
            jobs = q._x.pipeline([_protocol.claim(k, 30_000) for _ in range(m)])
            settles = [_protocol.complete(k, j.id, j.token) for j in jobs if j is not None]
            for res in q._x.pipeline(settles):
                if isinstance(res, BaseException):
                    raise res
            done += m
        elapsed = time.perf_counter() - t0
        problems, counts = q.check(), q.counts()
        ok = problems == [] and counts["completed"] == n
        text = f"check()={problems!r} completed={counts['completed']} (N={n})"
        return n / elapsed, ("ok: " if ok else "FAILED: ") + text
    finally:
        q.close()
