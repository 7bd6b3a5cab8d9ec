"""What kept history costs (issue 24, D25): bytes per kept completed job, and the completing
script's server time per job with ``keep_completed(count=10_000)`` against keeping off, on
the Lua scripts and on the native module.

    PYTHONPATH=src python bench/kept_history.py [--jobs 5000] [--rounds 5]

Starts its own redis-server (the trafikey module loaded, built by ``make -C native``) on a
free port, never 6379, and stops it at the end.

Memory: a fresh queue per executor; ``INFO memory`` ``used_memory`` before N enqueues and
after all N were claimed and completed with the rows kept (the count bound above N, so
nothing is trimmed): (after - before) / N is what a kept job costs at rest, row (payload
``[i]``, state, attempts, ``claimed_ms``, ``finished_ms``) and ``completed`` entry included.
The same with keeping off gives what a completed job leaves when deleted (its retired
record, about 64 B).

Server time: per round, two queues (off, and on with 10,000 rows already kept, so every
completion trims one: the steady state), each round's jobs enqueued, then claimed and
completed through the worker's path (``settle``: one call completes the last batch of 50 and
claims the next) and through ``claim`` + ``complete`` one at a time. Server time is the sum
of the top-level rows of ``INFO commandstats`` (EVALSHA/EVAL/EMQ.*: each call counted once,
bench/servertime.py) after ``CONFIG RESETSTAT``, per job. Ratios are taken within a round,
then the median over rounds (the machine is noisy).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from servertime import top_level_usec

import echomq

ROOT = Path(__file__).resolve().parent.parent
BATCH = 50


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fill(q: echomq.Queue, n: int) -> None:
    for start in range(0, n, 1000):
        q.enqueue_many([b"[%d]" % i for i in range(start, min(n, start + 1000))])


def _drain_settle(q: echomq.Queue, n: int) -> None:
    """The worker's round trip: complete the last batch, claim the next, one call."""
    done: list[tuple[str, int]] = []
    left = n
    while left > 0 or done:
        got = q.settle(completed=done, n=min(BATCH, left), lease_ms=60_000)
        done = [(j.id, j.token) for j in got.jobs]
        left -= len(got.jobs)


def _drain_single(q: echomq.Queue, n: int) -> None:
    for _ in range(n):
        job = q.claim(lease_ms=60_000)
        assert job is not None
        q.complete(job.id, job.token)


def _server_us(r: redis.Redis, fn: Any) -> float:
    r.config_resetstat()
    fn()
    return top_level_usec(r.info("commandstats"))


def memory(url: str, r: redis.Redis, executor: str, n: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for keep in (False, True):
        q = echomq.Queue(f"mem-{executor}-{int(keep)}", url=url, executor=executor)
        if keep:
            q.keep_completed(count=n + 1)
        q.enqueue(b"warm")  # the queue's fixed keys exist before the first reading
        _drain_settle(q, 1)
        before = int(r.info("memory")["used_memory"])
        _fill(q, n)
        _drain_settle(q, n)
        after = int(r.info("memory")["used_memory"])
        assert q.counts()["kept"] == (n + 1 if keep else 0)
        out["kept" if keep else "off"] = (after - before) / n
        q.close()
    return out


def servertime(url: str, r: redis.Redis, executor: str, n: int, rounds: int) -> None:
    off = echomq.Queue(f"st-{executor}-off", url=url, executor=executor)
    on = echomq.Queue(f"st-{executor}-on", url=url, executor=executor)
    on.keep_completed(count=10_000)
    _fill(on, 10_000)
    _drain_settle(on, 10_000)  # 10,000 kept: every completion from here on trims one
    ratios: dict[str, list[float]] = {"settle": [], "complete": []}
    per: dict[str, list[tuple[float, float]]] = {"settle": [], "complete": []}
    for rnd in range(rounds):
        for path, drain in (("settle", _drain_settle), ("complete", _drain_single)):
            us = {}
            for name, q in (("off", off), ("on", on)):
                _fill(q, n)
                us[name] = _server_us(r, lambda q=q, drain=drain: drain(q, n)) / n
            ratios[path].append(us["on"] / us["off"])
            per[path].append((us["off"], us["on"]))
            print(
                f"  {executor} round {rnd} {path:8s}: off {us['off']:.2f} us/job, "
                f"kept {us['on']:.2f} us/job, ratio {us['on'] / us['off']:.3f}"
            )
    assert on.counts()["kept"] == 10_000
    for path in ("settle", "complete"):
        off_m = statistics.median(a for a, _ in per[path])
        on_m = statistics.median(b for _, b in per[path])
        print(
            f"{executor} {path}: median off {off_m:.2f} us/job, kept {on_m:.2f} us/job, "
            f"extra {on_m - off_m:+.2f} us/job, median ratio {statistics.median(ratios[path]):.3f}"
        )
    off.close()
    on.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--memory-jobs", type=int, default=10_000)
    ns = ap.parse_args()
    subprocess.run(["make", "-s", "-C", str(ROOT / "native")], check=True)
    port = _free_port()
    with tempfile.TemporaryDirectory() as d:
        args = ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"]
        args += ["--dir", d, "--loadmodule", str(ROOT / "native" / "trafikey.so")]
        server = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        try:
            url = f"redis://127.0.0.1:{port}/0"
            r = redis.Redis.from_url(url)
            for _ in range(100):
                try:
                    r.ping()
                    break
                except redis.ConnectionError:
                    time.sleep(0.05)
            print(f"server {r.info('server')['redis_version']}, pid {os.getpid()}")
            for executor in ("lua", "native"):
                mem = memory(url, r, executor, ns.memory_jobs)
                print(
                    f"{executor} memory, {ns.memory_jobs} jobs: kept {mem['kept']:.0f} B/job, "
                    f"off {mem['off']:.0f} B/job (the retired record)"
                )
            for executor in ("lua", "native"):
                servertime(url, r, executor, ns.jobs, ns.rounds)
        finally:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    main()
