"""Concurrent asyncio enqueue (issue 28): jobs/s of ``await task.aenqueue(i)`` from 100
coroutines in flight on one App (auto-pipelined, src/echomq/client/autopipe.py), against the same
coroutines with auto-pipelining off (each enqueue its own round trip, as before), one
coroutine awaiting one enqueue at a time, the sync ``task.enqueue``, and BullMQ Node's
``queue.add`` from 100 concurrent promises and one at a time (when ``bench/node`` has its
packages: ``bash bench/setup.sh``).

    PYTHONPATH=src .venv/bin/python bench/concurrent_enqueue.py [--n 20000] [--rounds 3] [-c 100]
        [--executor lua|native]

One private server (``EmbeddedServer``, AOF off, never 6379; with ``--executor native`` it
loads the module, built into a temp dir), FLUSHALL before each measurement (it is ours);
the rows interleave within each round, and each row's figure is its median over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

import echomq
from echomq.client import native as _native
from echomq.server import EmbeddedServer

Row = Callable[[str, int, int], float]  # (url, n, concurrency) -> jobs/s


def _app(url: str, executor: str) -> tuple[echomq.App, Any]:
    app = echomq.App(f"{url}?executor={executor}")
    task = app.task(queue="cbench", name="noop")(lambda i: None)
    return app, task


def sync_single(executor: str) -> Row:
    def row(url: str, n: int, c: int) -> float:
        app, task = _app(url, executor)
        try:
            task.enqueue(-1)
            t0 = time.perf_counter()
            for i in range(n):
                task.enqueue(i)
            return n / (time.perf_counter() - t0)
        finally:
            app.close()

    return row


def async_row(executor: str, concurrent: bool, autopipe: bool = True) -> Row:
    def row(url: str, n: int, c: int) -> float:
        async def main() -> float:
            app, task = _app(url, executor)
            try:
                await task.aenqueue(-1)  # connect, fence, choose the executor
                aq = app.aqueue("cbench")
                if not autopipe:  # the path before issue 28: every enqueue its own call
                    aq._pipe = aq._x  # type: ignore[assignment]
                left = iter(range(n))

                async def producer() -> None:
                    for i in left:
                        await task.aenqueue(i)

                t0 = time.perf_counter()
                await asyncio.gather(*(producer() for _ in range(c if concurrent else 1)))
                return n / (time.perf_counter() - t0)
            finally:
                await app.aclose()

        return asyncio.run(main())

    return row


def bullmq_row(concurrent: bool) -> Row | None:
    try:
        from peers import bullmq_node
    except ImportError:
        return None
    try:
        bullmq_node.available()
    except RuntimeError:
        return None

    def row(url: str, n: int, c: int) -> float:
        if concurrent:
            return n / float(bullmq_node._produce("concurrent", url, n, c)["elapsed"])
        return n / bullmq_node.enqueue_single(url, n)

    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-c", type=int, default=100)
    ap.add_argument("--executor", choices=("lua", "native"), default="lua")
    a = ap.parse_args()
    ex = a.executor
    rows: list[tuple[str, Row]] = [
        (f"echomq `await task.aenqueue(i)`, {a.c} coroutines, auto-pipelined", async_row(ex, True)),
        (
            f"echomq `await task.aenqueue(i)`, {a.c} coroutines, auto-pipelining off",
            async_row(ex, True, autopipe=False),
        ),
        ("echomq `await task.aenqueue(i)`, one at a time", async_row(ex, False)),
        ("echomq `task.enqueue(i)` (sync), one at a time", sync_single(ex)),
    ]
    for label, concurrent in (
        (f"BullMQ Node `add`, {a.c} promises", True),
        ("BullMQ Node `add`, one at a time", False),
    ):
        peer = bullmq_row(concurrent)
        if peer is not None:
            rows.append((label, peer))
    tmp = Path(tempfile.mkdtemp(prefix="echomq-cbench-"))
    args: list[str] = []
    if ex == "native":
        args = ["--loadmodule", str(_native.build(tmp / "module"))]
    srv = EmbeddedServer(tmp / "server", appendonly=False, args=args).start()
    try:
        r = redis.Redis.from_url(srv.url)
        got: dict[str, list[float]] = {label: [] for label, _ in rows}
        for rnd in range(a.rounds):
            order = rows[rnd % len(rows) :] + rows[: rnd % len(rows)]
            for label, fn in order:
                r.flushall()
                got[label].append(fn(srv.url, a.n, a.c))
        cmd = (
            f"PYTHONPATH=src .venv/bin/python bench/concurrent_enqueue.py --n {a.n} "
            f"--rounds {a.rounds} -c {a.c} --executor {ex}"
        )
        print(f"command: `{cmd}`\n")
        print("| producer | jobs/s (median) | per round |")
        print("|---|---:|---|")
        for label, _ in rows:
            per = " · ".join(f"{x:,.0f}" for x in got[label])
            print(f"| {label} | {statistics.median(got[label]):,.0f} | {per} |")
        first = rows[0][0]
        for label, _ in rows[1:]:
            ratios = [x / y for x, y in zip(got[first], got[label], strict=True)]
            print(f"\nauto-pipelined / {label}: per round {', '.join(f'{x:.2f}' for x in ratios)}")
        r.close()
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
