"""Server CPU per job lifecycle, Lua scripts vs the trafikey module (issue 15's target: native
at most a third of the Lua path), from ``INFO commandstats`` (the usec of every command).

    PYTHONPATH=src python bench/native_cost.py [--jobs 5000] [--rounds 3]

One private redis-server with the module loaded (built with ``make -C native``), never 6379.
Per round and executor, on a fresh queue: ``jobs`` single enqueues, then the worker's shape
(``settle``: claim 50, complete them while claiming the next 50) and the one-verb-a-call shape
(claim, complete), each job once; reported as server µs per job for each shape, and the
ratio native/Lua. The rounds alternate the executors.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
from pathlib import Path

import redis

import echomq
from echomq.server import EmbeddedServer

ROOT = Path(__file__).resolve().parent.parent


def usec(r: redis.Redis) -> float:
    return float(sum(v["usec"] for v in r.info("commandstats").values()))


def lifecycle(url: str, executor: str, jobs: int, shape: str, r: redis.Redis, rnd: int) -> float:
    """Server µs per job: enqueue + claim + complete, ``shape`` 'settle' or 'verbs'."""
    name = f"cost-{executor}-{shape}-{rnd}"
    with echomq.Queue(name, url=url, executor=executor) as q:
        q.counts()  # connect and fence outside the measurement
        assert q.executor == executor
        r.config_resetstat()
        before = usec(r)
        for i in range(jobs):
            q.enqueue(str(i).encode())
        if shape == "settle":
            held = q.settle(n=50).jobs
            while held:
                held = q.settle(completed=[(j.id, j.token) for j in held], n=50).jobs
        else:
            while (job := q.claim()) is not None:
                q.complete(job.id, job.token)
        spent = usec(r) - before
        assert q.counts()["completed"] == jobs and q.check() == []
    return spent / jobs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    subprocess.run(["make", "-s", "-C", str(ROOT / "native")], check=True)
    so = ROOT / "native" / "trafikey.so"
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        srv = EmbeddedServer(tmp, appendonly=False, args=["--loadmodule", str(so)]).start()
        try:
            r = redis.Redis.from_url(srv.url)
            got: dict[tuple[str, str], list[float]] = {}
            for rnd in range(a.rounds):
                order = ("lua", "native") if rnd % 2 == 0 else ("native", "lua")
                for shape in ("settle", "verbs"):
                    for ex in order:
                        got.setdefault((shape, ex), []).append(
                            lifecycle(srv.url, ex, a.jobs, shape, r, rnd)
                        )
            for shape in ("settle", "verbs"):
                lua, nat = got[(shape, "lua")], got[(shape, "native")]
                ratios = [n / lu for n, lu in zip(nat, lua, strict=True)]
                print(
                    f"{shape:6s}: lua {statistics.median(lua):6.1f} us/job "
                    f"({', '.join(f'{x:.1f}' for x in lua)}), native "
                    f"{statistics.median(nat):6.1f} us/job ({', '.join(f'{x:.1f}' for x in nat)}),"
                    f" native/lua median {statistics.median(ratios):.2f}"
                )
        finally:
            srv.stop()


if __name__ == "__main__":
    main()
