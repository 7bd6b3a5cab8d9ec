"""What priorities cost (issue 24): server time per job of claim + complete when every
waiting job has a priority (1..16, mixed) against priority-0 jobs, at a backlog of 1k and
1M, on the Lua scripts and the trafikey module; and the bytes a waiting priority-0 job holds.

    PYTHONPATH=src python bench/priority_cost.py [--backlogs 1000,1000000] [--jobs 200]
        [--blocks 10] [--rounds 5]
    PYTHONPATH=src python bench/priority_cost.py --memory 100000   # bytes per waiting job
    PYTHONPATH=/other/checkout/src python bench/priority_cost.py --memory 100000  # before

Time: one private redis-server with the module loaded (``make -C native``), never 6379, no
persistence. Per backlog, two queues are filled with ``backlog`` jobs by ``enqueue_many``
(1,000 a call, ``retry_for=0``): ``zero`` with priority 0, ``mixed`` with a priority of 1 to
16 drawn per call (so every claimed row carries the field and the set holds 16 scores). A
round is ``blocks`` blocks; a block runs, for each executor and each queue (the order flips
every block), ``jobs`` claim + complete pairs (one verb a call), counting the server's µs of
the top-level calls only (EVALSHA and ``EMQ.*``, bench/servertime.py), then tops that queue
up by as many jobs, so the backlog stays what it is. Reported: µs per job, and the ratio
mixed/zero per round with its median: the machine is shared, so only ratios within one run
mean anything.

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


def fill(q: echomq.Queue, n: int, mixed: bool, rng: random.Random) -> None:
    """n more waiting jobs: priority 0, or one priority of 1..16 per call of CHUNK jobs."""
    done = 0
    while done < n:
        k = min(CHUNK, n - done)
        items = [b'{"args":[%d]}' % (done + i) for i in range(k)]
        if mixed:
            q.enqueue_many(items, priority=rng.randint(1, 16))
        else:
            q.enqueue_many(items)
        done += k


def cycle(q: echomq.Queue, jobs: int, r: redis.Redis) -> float:
    """Server µs of ``jobs`` claim + complete pairs on ``q``."""
    before = top_level_usec(r.info("commandstats"))
    for _ in range(jobs):
        job = q.claim()
        assert job is not None
        q.complete(job.id, job.token)
    return top_level_usec(r.info("commandstats")) - before


def timing(a: argparse.Namespace) -> None:
    subprocess.run(["make", "-s", "-C", str(ROOT / "native")], check=True)
    so = ROOT / "native" / "trafikey.so"
    rng = random.Random(24)
    with tempfile.TemporaryDirectory() as tmp:
        srv = EmbeddedServer(tmp, appendonly=False, args=["--loadmodule", str(so)]).start()
        try:
            r = redis.Redis.from_url(srv.url)
            for backlog in a.backlogs:
                r.flushall()
                qs = {
                    (ex, kind): echomq.Queue(kind, url=srv.url, executor=ex, retry_for=0)
                    for ex in ("lua", "native")
                    for kind in ("zero", "mixed")
                }
                for kind in ("zero", "mixed"):
                    fill(qs[("lua", kind)], backlog, kind == "mixed", rng)
                for q in qs.values():
                    q.counts()  # connect and fence outside the measurement
                got: dict[tuple[str, str], list[float]] = {}
                for rnd in range(a.rounds):
                    spent = dict.fromkeys(qs, 0.0)
                    for block in range(a.blocks):
                        # The order alternates block by block, so a noisy stretch of the
                        # machine falls on both kinds alike.
                        flip = (rnd + block) % 2
                        for ex in ("lua", "native")[:: 1 - 2 * flip]:
                            for kind in ("zero", "mixed")[:: 1 - 2 * flip]:
                                spent[(ex, kind)] += cycle(qs[(ex, kind)], a.jobs, r)
                                # Top the set up again: the backlog stays what it is.
                                fill(qs[("lua", kind)], a.jobs, kind == "mixed", rng)
                    for key, us in spent.items():
                        got.setdefault(key, []).append(us / (a.blocks * a.jobs))
                for q in qs.values():
                    assert q.executor in ("lua", "native")
                    q.close()
                for ex in ("lua", "native"):
                    zero, mixed = got[(ex, "zero")], got[(ex, "mixed")]
                    ratios = [m / z for m, z in zip(mixed, zero, strict=True)]
                    print(
                        f"backlog {backlog:>9,} {ex:6s}: priority 0 "
                        f"{statistics.median(zero):5.1f} us/job, mixed "
                        f"{statistics.median(mixed):5.1f} us/job, mixed/zero median "
                        f"{statistics.median(ratios):.3f} "
                        f"(rounds {', '.join(f'{x:.3f}' for x in ratios)})",
                        flush=True,
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
    ap.add_argument("--jobs", type=int, default=200, help="claim + complete pairs a block")
    ap.add_argument("--blocks", type=int, default=10, help="blocks a round, order alternating")
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
