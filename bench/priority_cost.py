"""What priorities cost (issue 24): server time per job of claim + complete when every
waiting job has a priority (1..16, mixed) against priority-0 jobs, at a backlog of 1k and
1M, on the Lua scripts and the trafikey module; and the bytes a waiting priority-0 job holds.

    PYTHONPATH=src python bench/priority_cost.py [--backlogs 1000,1000000] [--jobs 2000]
        [--rounds 5]
    PYTHONPATH=src python bench/priority_cost.py --memory 100000   # bytes per waiting job
    PYTHONPATH=/other/checkout/src python bench/priority_cost.py --memory 100000  # before

Time: one private redis-server with the module loaded (``make -C native``), never 6379, no
persistence. Per backlog, two queues are filled with backlog + rounds x 2 x jobs jobs by
``enqueue_many`` (1,000 a call): ``zero`` with priority 0, ``mixed`` with a priority of 1 to
16 drawn per call (so every claimed row carries the field and the set holds 16 scores). Each
round then runs, for each executor (their order alternates by round) and each queue, ``jobs``
claim + complete pairs (one verb a call) and counts the server's µs of the top-level calls
only (EVALSHA and ``EMQ.*``, bench/servertime.py). Reported: µs per job, and the ratio
mixed/zero per round (the same round, the same backlog) with its median: the machine is
shared, so only ratios within one run mean anything.

Memory (``--memory N``): a fresh server per priority; ``INFO memory`` ``used_memory`` before
and after ``Queue(retry_for=0).enqueue_many`` of N payloads ``{"args":[i]}`` (no replay
marker), bytes per job = the difference / N, as docs/CAPACITY.md measures. Priority 0 runs
on any checkout (the call names no priority); 5 only where priorities exist.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import tempfile
from pathlib import Path

import redis
from servertime import top_level_usec

import echomq
from echomq.server import EmbeddedServer

ROOT = Path(__file__).resolve().parent.parent
CHUNK = 1000


def fill(url: str, name: str, n: int, mixed: bool) -> None:
    """n waiting jobs: priority 0, or one priority of 1..16 per call of CHUNK jobs."""
    rng = random.Random(24)
    with echomq.Queue(name, url=url, executor="lua", retry_for=0) as q:
        done = 0
        while done < n:
            k = min(CHUNK, n - done)
            items = [b'{"args":[%d]}' % (done + i) for i in range(k)]
            if mixed:
                q.enqueue_many(items, priority=rng.randint(1, 16))
            else:
                q.enqueue_many(items)
            done += k


def cycle(url: str, name: str, executor: str, jobs: int, r: redis.Redis) -> float:
    """Server µs per job of ``jobs`` claim + complete pairs on ``name``."""
    with echomq.Queue(name, url=url, executor=executor) as q:
        q.counts()  # connect and fence outside the measurement
        assert q.executor == executor
        before = top_level_usec(r.info("commandstats"))
        for _ in range(jobs):
            job = q.claim()
            assert job is not None
            q.complete(job.id, job.token)
        return (top_level_usec(r.info("commandstats")) - before) / jobs


def timing(a: argparse.Namespace) -> None:
    subprocess.run(["make", "-s", "-C", str(ROOT / "native")], check=True)
    so = ROOT / "native" / "trafikey.so"
    with tempfile.TemporaryDirectory() as tmp:
        srv = EmbeddedServer(tmp, appendonly=False, args=["--loadmodule", str(so)]).start()
        try:
            r = redis.Redis.from_url(srv.url)
            for backlog in a.backlogs:
                r.flushall()
                size = backlog + a.rounds * 2 * a.jobs
                fill(srv.url, "zero", size, mixed=False)
                fill(srv.url, "mixed", size, mixed=True)
                got: dict[tuple[str, str], list[float]] = {}
                for rnd in range(a.rounds):
                    order = ("lua", "native") if rnd % 2 == 0 else ("native", "lua")
                    for ex in order:
                        for kind in ("zero", "mixed") if rnd % 2 == 0 else ("mixed", "zero"):
                            us = cycle(srv.url, kind, ex, a.jobs, r)
                            got.setdefault((ex, kind), []).append(us)
                for ex in ("lua", "native"):
                    zero, mixed = got[(ex, "zero")], got[(ex, "mixed")]
                    ratios = [m / z for m, z in zip(mixed, zero, strict=True)]
                    print(
                        f"backlog {backlog:>9,} {ex:6s}: priority 0 "
                        f"{statistics.median(zero):5.1f} us/job, mixed "
                        f"{statistics.median(mixed):5.1f} us/job, mixed/zero median "
                        f"{statistics.median(ratios):.3f} "
                        f"(rounds {', '.join(f'{x:.3f}' for x in ratios)})"
                    )
        finally:
            srv.stop()


def memory(n: int) -> None:
    for priority in (0, 5):
        with tempfile.TemporaryDirectory() as tmp:
            srv = EmbeddedServer(tmp, appendonly=False).start()
            try:
                r = redis.Redis.from_url(srv.url)
                with echomq.Queue("mem", url=srv.url, retry_for=0) as q:
                    q.counts()
                    before = int(r.info("memory")["used_memory"])
                    for done in range(0, n, CHUNK):
                        items = [b'{"args":[%d]}' % (done + i) for i in range(CHUNK)]
                        try:
                            if priority:
                                q.enqueue_many(items, priority=priority)
                            else:
                                q.enqueue_many(items)
                        except TypeError:  # a checkout without priorities
                            print("priority 5: not supported by this checkout")
                            return
                    q.close()
                    after = int(r.info("memory")["used_memory"])
                print(
                    f"priority {priority}: {(after - before) / n:.1f} bytes per waiting job ({n:,})"
                )
            finally:
                srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backlogs", default="1000,1000000")
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--memory", type=int, default=0, help="measure bytes per job at N instead")
    a = ap.parse_args()
    if a.memory:
        memory(a.memory)
        return
    a.backlogs = [int(x) for x in a.backlogs.split(",")]
    timing(a)


if __name__ == "__main__":
    main()
