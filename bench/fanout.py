"""Flows: a 10,000-child fan-out against the flat processed/s figure, and the idle beat's cost.

In one run, on a private server (``EmbeddedServer``, AOF off, never 6379), interleaved over
``--rounds`` rounds:

- flat: N no-op jobs added with ``enqueue_many`` and processed by an in-process ``Worker``
  (concurrency ``-c``); processed/s from the first enqueue to the last completion;
- fan-out: one parent with N no-op children added in ONE ``app.flow`` call and processed by
  the same kind of worker until the parent has run; (children + parent)/s over the same span.

Then the idle beat: a worker with nothing to do runs for ``--idle-s`` seconds; the script
counts the server's calls (INFO commandstats after CONFIG RESETSTAT) and the client's round
trips (each write of a command or a pipeline to the socket), per beat.

    python bench/fanout.py [--rounds 3] [--n 10000] [-c 50] [--idle-s 5]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio.connection as aconn

import echomq
from echomq.protocol.scripts import SCRIPTS
from echomq.server import EmbeddedServer


class Bench:
    def __init__(self, url: str, n: int, concurrency: int) -> None:
        self.url = url
        self.n = n
        self.concurrency = concurrency
        self.app = echomq.App(url=url)
        self.done = threading.Event()
        self.ran = 0
        self.target = 0

        @self.app.task(queue="flat")
        async def flat_noop() -> None:
            self.ran += 1  # one event loop runs every handler: no lock needed
            if self.ran == self.target:
                self.done.set()

        @self.app.task(queue="fan")
        async def child_noop() -> None:
            return None

        @self.app.task(queue="fan")
        async def parent() -> None:
            self.done.set()

        self.flat_noop, self.child_noop, self.parent = flat_noop, child_noop, parent

    def _run_worker(self, queue: str, body: Callable[[], object]) -> float:
        """Start a worker on its own loop in a thread, run ``body`` (which adds the jobs),
        wait until the last job has run and the queue holds nothing pending or active."""
        self.done.clear()
        self.ran = 0
        worker = echomq.Worker(self.app, queues=[queue], concurrency=self.concurrency)
        loop = asyncio.new_event_loop()
        runner = threading.Thread(target=loop.run_until_complete, args=(worker.arun(),))
        q = self.app.queue(queue)
        runner.start()
        time.sleep(0.5)  # the worker is up and blocked on an empty queue before the clock starts
        try:
            t0 = time.perf_counter()
            body()
            if not self.done.wait(120):
                raise RuntimeError(f"{queue}: not done in 120 s: {q.counts()}")
            # The handler ran; the settle (and the parent's decrement) follows on the wire.
            while True:
                c = q.counts()
                if c["pending"] == 0 and c["active"] == 0 and c["schedule"] == 0:
                    break
                time.sleep(0.002)
            elapsed = time.perf_counter() - t0
            problems = q.check()
            if problems or c["dead"]:
                raise RuntimeError(f"{queue}: {c} {problems[:5]}")
        finally:
            loop.call_soon_threadsafe(worker.stop)
            runner.join(30)
            loop.close()
        q.pause()
        q.obliterate(force=True)
        return elapsed

    def flat(self) -> float:
        self.target = self.n
        calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [((), {})] * self.n
        elapsed = self._run_worker("flat", lambda: self.flat_noop.enqueue_many(calls))
        return self.n / elapsed

    def fanout(self) -> float:
        children = [self.child_noop.s() for _ in range(self.n)]
        elapsed = self._run_worker("fan", lambda: self.app.flow(self.parent.s(), children))
        return (self.n + 1) / elapsed

    def idle(self, seconds: float) -> dict[str, float]:
        """Server calls and client round trips of one idle worker over ``seconds``."""
        worker = echomq.Worker(self.app, queues=["idle"], concurrency=self.concurrency)
        loop = asyncio.new_event_loop()
        trips = {"n": 0}
        by_sha = {sc.sha: f"EVALSHA {name}" for name, sc in SCRIPTS.items()}
        shapes: dict[str, int] = {}
        orig = aconn.AbstractConnection.send_packed_command

        async def counting(self: Any, command: Any, check_health: bool = True) -> None:
            trips["n"] += 1  # one write = one command or one whole pipeline = one round trip
            raw = b"".join(command) if isinstance(command, list) else bytes(command)
            names = [
                by_sha.get(sha.decode(), sha.decode()[:8]) if sha else cmd.decode().upper()
                for cmd, sha in re.findall(
                    rb"\*\d+\r\n\$\d+\r\n([A-Za-z]+)\r\n(?:\$40\r\n([0-9a-f]{40})\r\n)?", raw
                )
            ]
            shape = "+".join(names)  # EVALSHA calls by script name
            shapes[shape] = shapes.get(shape, 0) + 1
            await orig(self, command, check_health)

        runner = threading.Thread(target=loop.run_until_complete, args=(worker.arun(),))
        runner.start()
        r = redis.Redis.from_url(self.url)
        try:
            time.sleep(2.0)  # past start-up (script loads, registration, first sweep)
            aconn.AbstractConnection.send_packed_command = counting  # type: ignore[method-assign]
            r.config_resetstat()
            time.sleep(seconds)
            stats = r.info("commandstats")
            aconn.AbstractConnection.send_packed_command = orig  # type: ignore[method-assign]
            client_trips = trips["n"]
        finally:
            aconn.AbstractConnection.send_packed_command = orig  # type: ignore[method-assign]
            loop.call_soon_threadsafe(worker.stop)
            runner.join(30)
            loop.close()
        calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
        calls.pop("info", None)  # this script's own reads
        calls.pop("config|resetstat", None)
        r.close()
        beats = seconds  # beat_ms defaults to 1000
        return {
            "beats": beats,
            "evalsha": calls.get("evalsha", 0),
            "blpop": calls.get("blpop", 0),
            "other": sum(v for k, v in calls.items() if k not in ("evalsha", "blpop")),
            "trips": client_trips,
            "shapes": shapes,  # type: ignore[dict-item]
            "detail": calls,  # type: ignore[dict-item]
        }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("-c", "--concurrency", type=int, default=50)
    ap.add_argument("--idle-s", type=float, default=5.0)
    opts = ap.parse_args()
    print(f"echomq from {echomq.__file__}; python {sys.version.split()[0]}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        srv = EmbeddedServer(tmp, appendonly=False).start()
        b = Bench(srv.url, opts.n, opts.concurrency)
        flat: list[float] = []
        fan: list[float] = []
        try:
            for rnd in range(opts.rounds):
                order = [("flat", b.flat, flat), ("fan-out", b.fanout, fan)]
                if rnd % 2:
                    order.reverse()  # interleaved: the order alternates per round
                for name, fn, out in order:
                    out.append(fn())
                    print(f"round {rnd + 1} {name}: {out[-1]:,.0f} jobs/s", flush=True)
            mf, mo = statistics.median(flat), statistics.median(fan)
            ratios = [o / f for f, o in zip(flat, fan, strict=True)]
            print(f"flat     median {mf:,.0f}/s  rounds {[round(x) for x in flat]}")
            print(f"fan-out  median {mo:,.0f}/s  rounds {[round(x) for x in fan]}")
            print(
                f"ratio fan-out/flat: {mo / mf:.0%} (of medians); per round "
                f"{[f'{x:.0%}' for x in ratios]}"
            )
            idle = b.idle(opts.idle_s)
            print(
                f"idle worker over {opts.idle_s:.0f} s (~{idle['beats']:.0f} beats): "
                f"server EVALSHA {idle['evalsha']}, BLPOP {idle['blpop']}, other "
                f"{idle['other']}; client round trips {idle['trips']} "
                f"({idle['trips'] / idle['beats']:.1f} per beat), by shape {idle['shapes']}; "
                f"server calls (inside scripts included) {idle['detail']}"
            )
        finally:
            b.app.close()
            srv.stop()


if __name__ == "__main__":
    main()
