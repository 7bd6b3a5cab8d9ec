"""What the per-job completion log line costs the worker: no-op jobs through an in-process
worker, with the completion line filtered (level WARNING) and enabled (level INFO, the default,
into a ``NullHandler``, so the line is built but written nowhere).

    python bench/logcost.py [--n 20000] [--rounds 3] [--concurrency 50] [--kind inline]

``--kind`` picks the handler: ``inline`` (a trivial sync handler run in the pump's turn, the
cheapest run there is, so logging is the largest share of it), ``async`` or ``sync`` (a pool
thread). Each round enqueues ``n`` jobs, then times the worker from its start until the n-th
handler call. Rounds alternate the two levels; the best round of each is printed (the
machine is noisy; the best round is the least disturbed). It starts its own server
(``EmbeddedServer``, AOF off) in a temp dir. Last, the runner's end-of-run log step alone
(``Runner._log_end`` on a completed settle), in ns per job at each level: the figure the
end-to-end rates are too noisy to show on a busy machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import tempfile
import time
import timeit
from typing import Any

import echomq
from echomq.context import JobContext
from echomq.hooks import Hooks
from echomq.protocol.kernel import Job
from echomq.runtime.runner import Runner, Running, Settle
from echomq.server import EmbeddedServer


def one_round(url: str, queue: str, n: int, concurrency: int, kind: str) -> float:
    """Jobs per second for ``n`` no-op jobs already waiting in ``queue``."""
    app = echomq.App(url)
    seen = 0
    worker: echomq.Worker | None = None

    def tick() -> None:
        nonlocal seen
        seen += 1
        if seen == n and worker is not None:
            loop.call_soon_threadsafe(worker.stop)

    fn: Any
    if kind == "async":

        async def fn() -> None:
            tick()
    else:

        def fn() -> None:
            tick()

    app.task(queue=queue, name="noop", inline=kind == "inline")(fn)
    with echomq.Queue(queue, url=url) as q:
        payload = json.dumps({"task": "noop", "args": [], "kwargs": {}}).encode()
        for start in range(0, n, 1000):
            q.enqueue_many([payload] * min(1000, n - start))
    worker = echomq.Worker(app, concurrency=concurrency, beat_ms=1000)
    loop = asyncio.new_event_loop()
    t0 = time.perf_counter()
    loop.run_until_complete(worker.arun())
    elapsed = time.perf_counter() - t0
    loop.close()
    app.close()
    assert seen == n, (seen, n)
    return n / elapsed


def log_step_ns(level: str, n: int = 200_000) -> float:
    """ns per completed job that the end-of-run log step adds (best of 5, minus building the
    settle itself)."""
    app = echomq.App("redis://127.0.0.1:1/0")  # never connected
    task = app.task(queue="q", name="t")(lambda: None)
    runner = Runner(app, Hooks(), 1000)
    job = Job("JOB0cHNlv7SQnB", b"", 1, None)
    r = Running(job, JobContext("q", job.id, 1, None, "t", app=app, floor=0, payload=b""))
    r.begun = time.monotonic()
    logging.getLogger("echomq.worker.jobs").setLevel(level)
    with_log = min(
        timeit.repeat(
            lambda: runner._log_end(r, task, Settle(job.id, 1, "completed"), None),
            number=n,
            repeat=5,
        )
    )
    bare = min(timeit.repeat(lambda: Settle(job.id, 1, "completed"), number=n, repeat=5))
    return max(0.0, with_log - bare) / n * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--kind", choices=["inline", "async", "sync"], default="inline")
    a = parser.parse_args()
    jobs = logging.getLogger("echomq.worker.jobs")
    jobs.propagate = False  # INFO lines go to the NullHandler only, never to stderr
    jobs.addHandler(logging.NullHandler())
    logging.getLogger("echomq").setLevel(logging.WARNING)  # no startup lines in the output
    srv = EmbeddedServer(tempfile.mkdtemp(prefix="echomq-logcost-"), appendonly=False).start()
    best = {"WARNING": 0.0, "INFO": 0.0}
    try:
        for i in range(a.rounds):
            for level in ("WARNING", "INFO"):
                jobs.setLevel(level)
                rate = one_round(srv.url, f"logcost-{level}-{i}", a.n, a.concurrency, a.kind)
                best[level] = max(best[level], rate)
                print(f"round {i + 1} {level:5}: {rate:9.0f} jobs/s", flush=True)
    finally:
        srv.stop()
    print(
        f"{a.kind} handler, n={a.n}, concurrency={a.concurrency}, best of {a.rounds}:\n"
        f"  completion line filtered (WARNING): {best['WARNING']:9.0f} jobs/s\n"
        f"  completion line enabled (INFO -> NullHandler): {best['INFO']:9.0f} jobs/s\n"
        f"  cost of the enabled line: {100 * (1 - best['INFO'] / best['WARNING']):.1f}%"
    )
    print(
        "the log step alone, per completed job: "
        f"filtered {log_step_ns('WARNING'):.0f} ns, enabled {log_step_ns('INFO'):.0f} ns"
    )


if __name__ == "__main__":
    main()
