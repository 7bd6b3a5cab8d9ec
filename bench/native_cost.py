"""Server CPU per job lifecycle, Lua scripts vs the trafikey module (issue 15's target: native
at most a third of the Lua path), from ``INFO commandstats``: the usec of the top-level calls
only (EVAL/EVALSHA and ``EMQ.*``, bench/servertime.py), since a script's inner commands have
rows of their own whose time is also inside the EVALSHA's.

    PYTHONPATH=src python bench/native_cost.py [--jobs 5000] [--rounds 3] [--retry-for S]

One private redis-server with the module loaded (built with ``make -C native``), never 6379.
Per round and executor, on a fresh queue: ``jobs`` single enqueues, then the worker's shape
(``settle``: claim 50, complete them while claiming the next 50) and the one-verb-a-call shape
(claim, complete), each job once; reported as server µs per job for each shape, and the
ratio native/Lua, and the enqueues' share alone (µs per single enqueue). The rounds alternate
the executors. ``--retry-for 0`` runs the queues without resends (no replay marker).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
from pathlib import Path

import redis
from servertime import top_level_usec

import echomq
from echomq.client.connect import DEFAULT_RETRY_FOR
from echomq.server import EmbeddedServer

ROOT = Path(__file__).resolve().parent.parent


def usec(r: redis.Redis) -> float:
    return top_level_usec(r.info("commandstats"))


def lifecycle(
    url: str, executor: str, jobs: int, shape: str, r: redis.Redis, rnd: int, retry_for: float
) -> tuple[float, float]:
    """Server µs per job: (enqueue + claim + complete, the enqueue alone), ``shape`` 'settle'
    or 'verbs'."""
    name = f"cost-{executor}-{shape}-{rnd}"
    with echomq.Queue(name, url=url, executor=executor, retry_for=retry_for) as q:
        q.counts()  # connect and fence outside the measurement
        assert q.executor == executor
        r.config_resetstat()
        before = usec(r)
        for i in range(jobs):
            q.enqueue(str(i).encode())
        enqueued = usec(r) - before
        if shape == "settle":
            held = q.settle(n=50).jobs
            while held:
                held = q.settle(completed=[(j.id, j.token) for j in held], n=50).jobs
        else:
            while (job := q.claim()) is not None:
                q.complete(job.id, job.token)
        spent = usec(r) - before
        assert q.counts()["completed"] == jobs and q.check() == []
    return spent / jobs, enqueued / jobs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--retry-for", type=float, default=DEFAULT_RETRY_FOR)
    a = ap.parse_args()
    subprocess.run(["make", "-s", "-C", str(ROOT / "native")], check=True)
    so = ROOT / "native" / "trafikey.so"
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        srv = EmbeddedServer(tmp, appendonly=False, args=["--loadmodule", str(so)]).start()
        try:
            r = redis.Redis.from_url(srv.url)
            got: dict[tuple[str, str], list[float]] = {}
            enq: dict[str, list[float]] = {}
            for rnd in range(a.rounds):
                order = ("lua", "native") if rnd % 2 == 0 else ("native", "lua")
                for shape in ("settle", "verbs"):
                    for ex in order:
                        total, alone = lifecycle(srv.url, ex, a.jobs, shape, r, rnd, a.retry_for)
                        got.setdefault((shape, ex), []).append(total)
                        enq.setdefault(ex, []).append(alone)
            print(f"retry_for={a.retry_for:g}, {a.jobs} jobs a round, {a.rounds} rounds")
            for shape in ("settle", "verbs"):
                lua, nat = got[(shape, "lua")], got[(shape, "native")]
                ratios = [n / lu for n, lu in zip(nat, lua, strict=True)]
                print(
                    f"{shape:6s}: lua {statistics.median(lua):6.1f} us/job "
                    f"({', '.join(f'{x:.1f}' for x in lua)}), native "
                    f"{statistics.median(nat):6.1f} us/job ({', '.join(f'{x:.1f}' for x in nat)}),"
                    f" native/lua median {statistics.median(ratios):.2f}"
                )
            lua, nat = enq["lua"], enq["native"]
            print(
                f"single enqueue alone: lua {statistics.median(lua):5.1f} us "
                f"({', '.join(f'{x:.1f}' for x in lua)}), native {statistics.median(nat):5.1f} us "
                f"({', '.join(f'{x:.1f}' for x in nat)})"
            )
        finally:
            srv.stop()


if __name__ == "__main__":
    main()
