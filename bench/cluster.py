"""Scale on a real Redis Cluster: throughput per shard and in total, next to one node.

    python bench/cluster.py [--n 30000] [--rounds 3] [--concurrency 50]

Starts, in one run, (a) one redis-server with one queue and one worker process, and (b) a
6-process cluster (3 primaries, 3 replicas) with three queues whose slots live on the three
different primaries, one worker process per queue. Each measurement pre-enqueues N no-op
jobs per queue, starts the workers, and times until every queue's completed metric reaches
N; rounds alternate single/cluster and the medians are reported. Writes docs/SCALING.md's
figures block to stdout (markdown) for pasting, and verifies ``check() == []`` after each.

The machine this runs on matters more than anything here: every primary, replica and
worker shares the same cores, so the cluster figure measures contention as much as scale.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import echomq
from echomq import keyspace
from echomq.server import EmbeddedServer
from echomq.testing import EmbeddedCluster

HERE = Path(__file__).resolve().parent
APP = """
import os, echomq
app = echomq.App()
for name in os.environ["SCALE_QUEUES"].split(","):
    app.task(name=f"noop.{name}", queue=name)(lambda i: None)
"""


def _queues_on_distinct_primaries(cluster: EmbeddedCluster, count: int) -> list[str]:
    """Queue names whose slots are owned by ``count`` different primaries."""
    import redis

    owner_of_slot: dict[int, int] = {}
    for node in cluster.primaries():
        with redis.Redis(port=node.port) as c:
            for start, end, primary, *_ in c.execute_command("CLUSTER", "SLOTS"):
                for s in range(start, end + 1):
                    owner_of_slot[s] = int(primary[1])
    chosen: dict[int, str] = {}
    i = 0
    while len(chosen) < count:
        name = f"scale-{i}"
        port = owner_of_slot[keyspace.slot(keyspace.queue_key(name, "pending"))]
        chosen.setdefault(port, name)
        i += 1
    return list(chosen.values())


def _fill(url: str, names: list[str], n: int) -> None:
    for name in names:
        with echomq.Queue(name, url=url) as q:
            payload = f'{{"task": "noop.{name}", "args": [0], "kwargs": {{}}}}'.encode()
            for start in range(0, n, 5000):
                q.enqueue_many([payload] * min(5000, n - start))


def _worker_cmd(name: str, concurrency: int) -> list[str]:
    return [
        sys.executable, "-m", "echomq", "worker", "scaleapp:app",
        "-q", name, "-c", str(concurrency), "--log-level", "WARNING",
    ]  # fmt: skip


def _measure(url: str, names: list[str], n: int, concurrency: int, appdir: str) -> dict[str, float]:
    """Start one worker per queue; return each queue's jobs/s and the total."""
    _fill(url, names, n)
    env = {**os.environ, "ECHOMQ_URL": url, "PYTHONPATH": appdir, "SCALE_QUEUES": ",".join(names)}
    queues = [echomq.Queue(name, url=url) for name in names]
    procs = [subprocess.Popen(_worker_cmd(name, concurrency), env=env) for name in names]
    try:
        # Time from the first completion, so process start-up is not counted.
        while sum(q.counts()["completed"] for q in queues) == 0:
            time.sleep(0.002)
        t0 = time.monotonic()
        done_at: dict[str, float] = {}
        while len(done_at) < len(names):
            for name, q in zip(names, queues, strict=True):
                if name not in done_at and q.counts()["completed"] >= n:
                    done_at[name] = time.monotonic()
            time.sleep(0.01)
        elapsed = max(done_at.values()) - t0
        out = {name: n / (done_at[name] - t0) for name in names}
        out["total"] = n * len(names) / elapsed
        for q in queues:
            violations = q.check()
            assert violations == [], violations
            assert q.counts()["completed"] == n
            q.pause()
            q.obliterate(force=True)
        return out
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(30)
        for q in queues:
            q.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=30_000, help="jobs per queue")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=50)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="echomq-scale-")
    appdir = os.path.join(tmp, "app")
    os.makedirs(appdir)
    Path(appdir, "scaleapp.py").write_text(APP)
    single = EmbeddedServer(Path(tmp, "single"), appendonly=False).start()
    cluster = EmbeddedCluster(Path(tmp, "cluster")).start()
    try:
        names = _queues_on_distinct_primaries(cluster, 3)
        results: dict[str, list[float]] = {}
        for r in range(args.rounds):
            one = _measure(single.url, ["scale-single"], args.n, args.concurrency, appdir)
            results.setdefault("single node, 1 queue", []).append(one["total"])
            three = _measure(single.url, names, args.n, args.concurrency, appdir)
            results.setdefault("single node, 3 queues", []).append(three["total"])
            many = _measure(cluster.url, names, args.n, args.concurrency, appdir)
            for i, name in enumerate(names):
                results.setdefault(f"cluster shard {i + 1} ({name})", []).append(many[name])
            results.setdefault("cluster, 3 queues on 3 primaries (total)", []).append(many["total"])
            line = f"round {r + 1}: single {one['total']:,.0f}/s, "
            line += f"single x3 {three['total']:,.0f}/s, cluster total {many['total']:,.0f}/s"
            print(line, file=sys.stderr)
        print(f"command: `python bench/cluster.py --n {args.n} --rounds {args.rounds} "
              f"--concurrency {args.concurrency}`; {os.cpu_count()} cores, "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")  # fmt: skip
        print("| setup | jobs/s (median) | per round |")
        print("|---|---:|---|")
        for label, values in results.items():
            rounds = ", ".join(f"{v:,.0f}" for v in values)
            print(f"| {label} | {statistics.median(values):,.0f} | {rounds} |")
        print("\nEvery run ended with `check() == []` and completed == N on every queue.")
    finally:
        cluster.stop()
        single.stop()


if __name__ == "__main__":
    main()
