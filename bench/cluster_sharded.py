"""Issue 43: one logical queue with 1, 3 and 6 shards on a 3-primary cluster, server CPU per job.

    python bench/cluster_sharded.py [--jobs 30000] [--rounds 3] [--concurrency 50]
                                    [--replicas 0] [--shards 1,3,6]

Starts a local cluster of 3 primaries (``echomq.testing.EmbeddedCluster``; ``--replicas``
per primary, none by default: a replica's work is not a primary's) and, per measurement,
one logical queue ``echomq.Queue(name, shards=N)`` (N = 1 is today's queue), the same total
number of no-op jobs whatever N. Each measurement resets ``INFO commandstats`` on every
primary, enqueues the jobs (``enqueue_many``: the sharded queue splits them by shard), starts
one worker process on the queue (``echomq worker -q name``: it serves every shard), and
times from the first completion until the queue's completed count reaches the total. Then,
per primary: the µs of the top-level echomq calls (script calls, ``EMQ.*``:
``bench/servertime.py``) and the process CPU (``INFO cpu``), each divided by the total
jobs, so a primary's figure is its share of the cost of one logical job.

The projected ceiling: a logical job costs the busiest primary ``max_p µs/job``, so with one
core per primary the cluster serves at most ``1e6 / max_p`` jobs/s (= jobs/s per primary
core times primaries when the shards spread evenly); N = 1 puts every job on one primary, the
one-server ceiling. A warm-up per N first (the primaries compile the scripts on first use),
then rounds interleave the Ns; medians are reported. Every measurement ends
with ``check() == []`` on every shard and completed == the jobs enqueued on it.

On a small machine every primary and the worker share the same cores: jobs/s measures
contention; the µs per job (server work per job, wherever it runs) is the figure that
survives a loaded box.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from servertime import top_level_calls, top_level_usec

import echomq
from echomq.client.shards import slot_of
from echomq.testing import EmbeddedCluster

APP = """
import os, echomq
app = echomq.App()
app.task(name="noop", queue=os.environ["SHARD_QUEUE"], inline=True)(lambda i: None)
"""
PAYLOAD = b'{"task": "noop", "args": [0], "kwargs": {}}'


@dataclass
class Sample:
    shards: int
    jobs_s: float
    script_us: dict[int, float] = field(default_factory=dict)  # primary port -> µs/job
    cpu_us: dict[int, float] = field(default_factory=dict)  # primary port -> µs/job
    placement: dict[str, int] = field(default_factory=dict)  # shard -> primary port
    fill_us: float = 0.0  # script µs per job of the enqueues, all primaries
    calls: float = 0.0  # top-level calls per job, all primaries


def _owners(cluster: EmbeddedCluster) -> dict[int, int]:
    """slot -> the port of the primary that serves it (asked of the cluster)."""
    out: dict[int, int] = {}
    with redis.Redis(port=cluster.primaries()[0].port) as c:
        for start, end, primary, *_ in c.execute_command("CLUSTER", "SLOTS"):
            for s in range(start, end + 1):
                out[s] = int(primary[1])
    return out


def _cpu_s(c: redis.Redis) -> float:
    info: dict[str, Any] = c.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _measure(
    cluster: EmbeddedCluster, base: str, n: int, total: int, concurrency: int, appdir: str
) -> Sample:
    url = cluster.url
    owners = _owners(cluster)
    ports = sorted(node.port for node in cluster.primaries())
    admin = {p: redis.Redis(port=p) for p in ports}
    q = echomq.Queue(base, shards=n, url=url)  # n = 1: today's queue
    env = {**os.environ, "ECHOMQ_URL": url, "PYTHONPATH": appdir, "SHARD_QUEUE": base}
    cmd = [sys.executable, "-m", "echomq", "worker", "shardapp:app", "-q", base,
           "-c", str(concurrency), "--log-level", "ERROR"]  # fmt: skip
    proc = None
    try:
        for c in admin.values():
            c.execute_command("CONFIG", "RESETSTAT")
        cpu0 = {p: _cpu_s(c) for p, c in admin.items()}
        for start in range(0, total, 5000):  # split by shard: the jobs' ids route them
            q.enqueue_many([PAYLOAD] * min(5000, total - start))
        fill_us = sum(top_level_usec(c.info("commandstats")) for c in admin.values()) / total
        names = q.shards()
        assert len(names) == n, names
        per = {}
        for name in names:
            with echomq.Queue(name, url=url) as shard:
                per[name] = shard.counts()["pending"]
        assert sum(per.values()) == total, per
        proc = subprocess.Popen(cmd, env=env)
        # Timed from the first completion, so the worker's start-up is not counted.
        while q.counts()["completed"] == 0:
            time.sleep(0.005)
        t0 = time.monotonic()
        while q.counts()["completed"] < total:
            time.sleep(0.05)
        elapsed = time.monotonic() - t0
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        sample = Sample(n, total / elapsed, fill_us=fill_us)
        for p, c in admin.items():
            stats = c.info("commandstats")
            sample.script_us[p] = top_level_usec(stats) / total
            sample.calls += top_level_calls(stats) / total
            sample.cpu_us[p] = (_cpu_s(c) - cpu0[p]) * 1e6 / total
        violations = q.check()  # every shard's
        assert violations == [], violations
        for name in names:
            sample.placement[name] = owners[slot_of(name)]
            with echomq.Queue(name, url=url) as shard:
                got = shard.counts()["completed"]
                assert got == per[name], (name, got, per[name])
        return sample
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(30)
        q.pause()
        q.obliterate(force=True)  # every shard, then the stored list
        q.close()
        for c in admin.values():
            c.close()


def _fmt(values: list[float], digits: int = 1) -> str:
    return f"{statistics.median(values):,.{digits}f}"


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


def report(samples: list[Sample], ports: list[int], args: argparse.Namespace, began: str) -> str:
    by_n: dict[int, list[Sample]] = {}
    for s in samples:
        by_n.setdefault(s.shards, []).append(s)
    cmd = (
        f"python bench/cluster_sharded.py --jobs {args.jobs} --rounds {args.rounds} "
        f"--concurrency {args.concurrency} --replicas {args.replicas} "
        f"--shards {','.join(map(str, args.shards))}"
    )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [
        f"Command: `{cmd}`. {os.cpu_count()} cores, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}, redis-server "
        f"{_server_version(ports[0])}; load average at the end {load}; "
        f"{began} to {time.strftime('%H:%M UTC', time.gmtime())}, commit {_commit()}. "
        f"A cluster of 3 primaries "
        f"({args.replicas} replica(s) each), {args.jobs:,} no-op jobs per measurement "
        f"(`enqueue_many`), one worker process serving every shard at `-c {args.concurrency}`.",
        "",
        "Server µs per logical job on each primary (A, B, C: the primaries in port order), "
        "script calls (`INFO commandstats`, top-level echomq calls: enqueue, claim, settle, "
        "sweeps; calls/job: how many such calls a job took, over all primaries) and the whole "
        "process (`INFO cpu`, user+sys: also the network); medians:",
        "",
        "| shards | shards per primary (A/B/C) | jobs/s | script µs/job A / B / C | "
        "busiest, vs N=1 | sum | calls/job | process CPU µs/job A / B / C | "
        "busiest, vs N=1 | sum | ceiling jobs/s: script, process (vs N=1) |",
        "|---:|---|---:|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    base_script = base_cpu = 0.0
    for n, group in sorted(by_n.items()):
        placement = group[0].placement
        spread = "/".join(str(sum(1 for p in placement.values() if p == port)) for port in ports)
        script = [statistics.median(s.script_us[p] for s in group) for p in ports]
        cpu = [statistics.median(s.cpu_us[p] for s in group) for p in ports]
        busiest_script = statistics.median(max(s.script_us.values()) for s in group)
        busiest_cpu = statistics.median(max(s.cpu_us.values()) for s in group)
        total_script = statistics.median(sum(s.script_us.values()) for s in group)
        total_cpu = statistics.median(sum(s.cpu_us.values()) for s in group)
        if not base_script:  # the smallest N is the baseline (N = 1: one server)
            base_script, base_cpu = busiest_script, busiest_cpu
        ceil_script, ceil_cpu = 1e6 / busiest_script, 1e6 / busiest_cpu
        lines.append(
            f"| {n} | {spread} | {_fmt([s.jobs_s for s in group], 0)} "
            f"({', '.join(f'{s.jobs_s:,.0f}' for s in group)}) | "
            f"{' / '.join(f'{v:.1f}' for v in script)} | "
            f"{busiest_script:.1f}, {busiest_script / base_script:.2f}x | {total_script:.1f} | "
            f"{statistics.median(s.calls for s in group):.3f} | "
            f"{' / '.join(f'{v:.1f}' for v in cpu)} | "
            f"{busiest_cpu:.1f}, {busiest_cpu / base_cpu:.2f}x | {total_cpu:.1f} | "
            f"{ceil_script:,.0f}, {ceil_cpu:,.0f} ({base_script / busiest_script:.2f}x, "
            f"{base_cpu / busiest_cpu:.2f}x) |"
        )
    lines += [
        "",
        "Every measurement ended with `check() == []` on every shard and completed == the "
        "jobs enqueued on it. The ceiling is `1e6 / busiest primary's µs per job`: what the "
        "cluster serves with one core per primary before its busiest primary saturates "
        "(N = 1: the one-server ceiling).",
    ]
    # Paragraphs wrapped as bench/RESULTS.md is (tables are not).
    out = [line if line.startswith("|") else _wrap(line) for line in lines]
    return "\n".join(out)


def _wrap(text: str) -> str:
    return textwrap.fill(text, 96, break_long_words=False, break_on_hyphens=False)


def _server_version(port: int) -> str:
    with redis.Redis(port=port) as c:
        return str(c.info("server")["redis_version"])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=30_000, help="jobs per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--replicas", type=int, default=0, help="replicas per primary")
    parser.add_argument(
        "--shards", type=lambda s: [int(x) for x in s.split(",")], default=[1, 3, 6]
    )
    args = parser.parse_args()
    began = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    tmp = tempfile.mkdtemp(prefix="echomq-shardbench-")
    appdir = os.path.join(tmp, "app")
    os.makedirs(appdir)
    Path(appdir, "shardapp.py").write_text(APP)
    cluster = EmbeddedCluster(Path(tmp, "cluster"), replicas=args.replicas).start()
    try:
        ports = sorted(node.port for node in cluster.primaries())
        samples: list[Sample] = []
        # A warm-up per N, not reported: every primary compiles the scripts on first use.
        for n in args.shards:
            _measure(cluster, f"bench43-n{n}", n, 2_000, args.concurrency, appdir)
        for r in range(args.rounds):
            for n in args.shards:
                s = _measure(cluster, f"bench43-n{n}", n, args.jobs, args.concurrency, appdir)
                samples.append(s)
                script = " / ".join(f"{s.script_us[p]:.1f}" for p in ports)
                print(
                    f"round {r + 1}, N={n}: {s.jobs_s:,.0f} jobs/s, script µs/job {script}"
                    f" (enqueue {s.fill_us:.1f}), {s.calls:.2f} calls/job",
                    file=sys.stderr,
                )
        print(report(samples, ports, args, began))
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
