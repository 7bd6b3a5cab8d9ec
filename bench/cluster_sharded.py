"""Issue 43: one logical queue with 1, 3 and 6 shards on a 3-primary cluster, server CPU per job.

    python bench/cluster_sharded.py [--jobs 30000] [--rounds 3] [--concurrency 50]
                                    [--replicas 0] [--shards 1,3,6] [--handler-ms 0]
                                    [--server-config NAME=VALUE ...] [--callgrind]

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
survives a loaded box. Two more ways to take the box out of the figure:

- ``--handler-ms 10 --concurrency 1000``: each job sleeps 10 ms in an async handler, so the
  total rate is set by the worker's slots (about the same for every N) and a shard holds
  hundreds of jobs in flight, as a hot queue with real jobs does ("at the same total rate").
- ``--callgrind``: every primary runs under ``valgrind --tool=callgrind`` and the figure is
  the instructions each executes per logical job, which neither preemption nor cache
  contention moves (the servers run 30-50 times slower: use fewer jobs, and read jobs/s as
  nothing). ``INFO commandstats`` counts wall time inside a call, so on a box with more busy
  processes than cores (N = 3: three servers and a worker on 2 cores) a preempted script is
  charged for the wait; ``INFO cpu`` (process CPU) is not.

``--server-config NAME=VALUE`` sets a server setting on every node
(``--server-config zset-max-listpack-entries=16``).
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import shlex
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
import asyncio, os, echomq
app = echomq.App()
MS = float(os.environ.get("SHARD_HANDLER_MS", "0"))
if MS:
    @app.task(name="noop", queue=os.environ["SHARD_QUEUE"])
    async def noop(i):
        await asyncio.sleep(MS / 1000)
else:
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
    instr: dict[int, float] = field(default_factory=dict)  # primary port -> instructions/job


class Instructions:
    """The instructions each primary executes, its server running under callgrind: zeroed
    before a measurement, dumped after it (``callgrind_control``)."""

    def __init__(self, outdir: Path) -> None:
        self.outdir = outdir
        self.pids: dict[int, int] = {}  # primary port -> the pid of its valgrind

    def wrapper(self) -> str:
        """A server binary (for ``ECHOMQ_SERVER_BIN``) that runs the real one under callgrind."""
        from echomq.server import find_binary

        path = self.outdir / "server-under-callgrind"
        out = shlex.quote(f"{self.outdir}/out.%p")
        path.write_text(
            "#!/bin/sh\n"
            f"exec valgrind --tool=callgrind --callgrind-out-file={out} "
            f'--dump-instr=no --collect-jumps=no {shlex.quote(find_binary())} "$@"\n'
        )
        path.chmod(0o755)
        return str(path)

    def _control(self, flag: str) -> None:
        for pid in self.pids.values():
            subprocess.run(["callgrind_control", flag, str(pid)], check=True, capture_output=True)

    def zero(self, cluster: EmbeddedCluster) -> None:
        self.pids = {n.port: n.proc.pid for n in cluster.primaries() if n.proc is not None}
        self._control("-z")

    def read(self) -> dict[int, int]:
        """Each primary's instructions since :meth:`zero`."""
        self._control("-d")
        out = {}
        for port, pid in self.pids.items():
            newest = max(self.outdir.glob(f"out.{pid}.*"), key=lambda f: f.stat().st_mtime)
            with newest.open() as f:
                out[port] = next(int(x.split()[1]) for x in f if x.startswith("summary:"))
        return out


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
    cluster: EmbeddedCluster,
    base: str,
    n: int,
    total: int,
    concurrency: int,
    appdir: str,
    handler_ms: float = 0.0,
    instructions: Instructions | None = None,
) -> Sample:
    url = cluster.url
    owners = _owners(cluster)
    ports = sorted(node.port for node in cluster.primaries())
    admin = {p: redis.Redis(port=p) for p in ports}
    q = echomq.Queue(base, shards=n, url=url)  # n = 1: today's queue
    env = {**os.environ, "ECHOMQ_URL": url, "PYTHONPATH": appdir, "SHARD_QUEUE": base,
           "SHARD_HANDLER_MS": str(handler_ms)}  # fmt: skip
    cmd = [sys.executable, "-m", "echomq", "worker", "shardapp:app", "-q", base,
           "-c", str(concurrency), "--log-level", "ERROR"]  # fmt: skip
    proc = None
    try:
        for c in admin.values():
            c.execute_command("CONFIG", "RESETSTAT")
        if instructions is not None:
            instructions.zero(cluster)
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
        if instructions is not None:
            sample.instr = {p: v / total for p, v in instructions.read().items()}
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
        + (f" --handler-ms {args.handler_ms:g}" if args.handler_ms else "")
        + "".join(f" --server-config {kv}" for kv in args.server_config)
        + (" --callgrind" if args.callgrind else "")
    )
    jobs = f"jobs sleeping {args.handler_ms:g} ms" if args.handler_ms else "no-op jobs"
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [
        f"Command: `{cmd}`. {os.cpu_count()} cores, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}, redis-server "
        f"{_server_version(ports[0])}; load average at the end {load}; "
        f"{began} to {time.strftime('%H:%M UTC', time.gmtime())}, commit {_commit()}. "
        f"A cluster of 3 primaries "
        f"({args.replicas} replica(s) each), {args.jobs:,} {jobs} per measurement "
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
    if samples and samples[0].instr:
        lines += [
            "",
            "Instructions per logical job on each primary (callgrind `Ir`: everything the "
            "server process executed during the measurement, divided by the jobs), medians:",
            "",
            "| shards | instructions/job A / B / C | busiest, vs N=1 | sum, vs N=1 | calls/job |",
            "|---:|---|---:|---:|---:|",
        ]
        base_busy = base_sum = 0.0
        for n, group in sorted(by_n.items()):
            per = [statistics.median(s.instr[p] for s in group) for p in ports]
            busy = statistics.median(max(s.instr.values()) for s in group)
            whole = statistics.median(sum(s.instr.values()) for s in group)
            if not base_busy:
                base_busy, base_sum = busy, whole
            lines.append(
                f"| {n} | {' / '.join(f'{v:,.0f}' for v in per)} | {busy:,.0f}, "
                f"{busy / base_busy:.2f}x | {whole:,.0f}, {whole / base_sum:.2f}x | "
                f"{statistics.median(s.calls for s in group):.3f} |"
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
        "--handler-ms",
        type=float,
        default=0.0,
        help="each job sleeps this long in an async handler (0: an inline no-op)",
    )
    parser.add_argument(
        "--shards", type=lambda s: [int(x) for x in s.split(",")], default=[1, 3, 6]
    )
    parser.add_argument(
        "--server-config",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a server setting for every node (repeatable)",
    )
    parser.add_argument(
        "--callgrind",
        action="store_true",
        help="run the primaries under valgrind's callgrind and count instructions per job",
    )
    args = parser.parse_args()
    server_args: list[str] = []
    for kv in args.server_config:
        name, sep, value = kv.partition("=")
        if not sep or not name:
            parser.error(f"--server-config takes NAME=VALUE, not {kv!r}")
        server_args += [f"--{name}", value]
    began = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    tmp = tempfile.mkdtemp(prefix="echomq-shardbench-")
    appdir = os.path.join(tmp, "app")
    os.makedirs(appdir)
    Path(appdir, "shardapp.py").write_text(APP)
    instructions = None
    if args.callgrind:
        instructions = Instructions(Path(tmp))
        os.environ["ECHOMQ_SERVER_BIN"] = instructions.wrapper()
    cluster = EmbeddedCluster(Path(tmp, "cluster"), replicas=args.replicas, args=server_args)
    cluster.start(timeout=120 if args.callgrind else 30)
    try:
        ports = sorted(node.port for node in cluster.primaries())
        samples: list[Sample] = []
        measure = functools.partial(
            _measure, concurrency=args.concurrency, appdir=appdir, handler_ms=args.handler_ms
        )
        # A warm-up per N, not reported: every primary compiles the scripts on first use.
        for n in args.shards:
            measure(cluster, f"bench43-n{n}", n, 2_000)
        for r in range(args.rounds):
            for n in args.shards:
                s = measure(cluster, f"bench43-n{n}", n, args.jobs, instructions=instructions)
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
