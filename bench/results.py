"""What keeping results costs the worker (D17): processed/s of no-op jobs with results kept
versus not, in-process worker, interleaved rounds, median ratio.

    PYTHONPATH=src python bench/results.py [--jobs 20000] [--rounds 3]

Starts its own redis-server on a free port (never 6379) and stops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import tempfile
import threading
import time

import redis

from echomq import App, Worker


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _round(url: str, queue: str, keep: bool, jobs: int) -> float:
    app = App(url=url)
    try:

        @app.task(queue=queue, keep_result_ms=60_000 if keep else 0)
        def noop(i: int) -> int:
            return i

        for start in range(0, jobs, 1000):
            noop.enqueue_many([((i,), {}) for i in range(start, min(jobs, start + 1000))])
        q = app.queue(queue)
        worker = Worker(app, queues=[queue])
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=lambda: loop.run_until_complete(worker.arun()))
        t0 = time.perf_counter()
        thread.start()
        while q.counts()["completed"] < jobs:
            time.sleep(0.01)
        elapsed = time.perf_counter() - t0
        loop.call_soon_threadsafe(worker.stop)
        thread.join(30)
        loop.close()
        return jobs / elapsed
    finally:
        app.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ns = ap.parse_args()
    port = _free_port()
    with tempfile.TemporaryDirectory() as d:
        server = subprocess.Popen(
            ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", d],
            stdout=subprocess.DEVNULL,
        )
        try:
            url = f"redis://127.0.0.1:{port}/0"
            r = redis.Redis.from_url(url)
            for _ in range(100):
                try:
                    r.ping()
                    break
                except redis.ConnectionError:
                    time.sleep(0.05)
            ratios = []
            for n in range(ns.rounds):
                plain = _round(url, f"plain{n}", False, ns.jobs)
                kept = _round(url, f"kept{n}", True, ns.jobs)
                ratios.append(kept / plain)
                print(
                    f"round {n}: without {plain:.0f}/s, kept {kept:.0f}/s, ratio {kept / plain:.3f}"
                )
            print(f"median ratio {statistics.median(ratios):.3f}")
        finally:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    main()
