"""The worker fleet benchmark (issue 25), on a private redis-server (a free port, never 6379):

1. CPU-bound jobs (``burn``: ~20 ms of pure Python each, calibrated here on one core): jobs/s
   with ``echomq worker -p 1`` and ``-p 2`` (both ``-c 2``), beside Celery prefork ``-c 2``
   and Dramatiq ``--processes 2 --threads 2`` on the same function. Every worker is started
   and warmed up first; the clock runs from the enqueue of the batch to its last completion
   (each run INCRs one counter).
2. No-op jobs (an ``inline`` handler): processed/s with ``-p 2 -c 50`` against
   ``-p 1 -c 100`` (a backlog enqueued first, then timed to the last completion).
3. The registry's cost: server time per ``worker_beat`` call (``INFO commandstats``, an entry
   with 50 held jobs), and the beats counted during the no-op runs (``worker_beat`` is the
   only caller of PEXPIRE there: two a beat), against the jobs run: none per job.

    bench/.venv/bin/python bench/fleet.py                  # all rows (peers: bash bench/setup.sh)
    .venv/bin/python bench/fleet.py --only echomq          # echomq rows only
    bench/.venv/bin/python bench/fleet.py --jobs 400 --noop-jobs 50000 --rounds 3

Prints a Markdown table (the median of ``--rounds``) for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
PY = sys.executable


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(url: str, system: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ECHOMQ_")}
    env.update(BENCH_URL=url, FLEET_SYSTEM=system, ECHOMQ_URL=url)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p)
    return env


def calibrate(ms: float) -> int:
    """Rounds of ``fleet_tasks.work`` that take ``ms`` on this core (best of five)."""
    sys.path.insert(0, str(HERE))
    from fleet_tasks import work

    n = 20_000
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        work(n)
        best = min(best, time.perf_counter() - t)
    return max(1, int(n * (ms / 1000) / best))


class Workers:
    """One system's worker command, started and stopped by pid (never by name)."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self._out = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            argv, cwd=HERE, env=env, stdout=self._out, stderr=subprocess.STDOUT,
            start_new_session=True,  # its children (prefork) stop with it: one group
        )  # fmt: skip

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._out.close()


def _wait(pred: Callable[[], bool], timeout: float, what: str, w: Workers) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if w.proc.poll() is not None:
            raise RuntimeError(f"{what}: the workers exited:\n{w.log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout}s:\n{w.log.read_text()[-3000:]}")
        time.sleep(0.005)


def cpu_run(system: str, argv: list[str], url: str, jobs: int, n: int, log: Path) -> float:
    """Jobs/s of ``jobs`` burn(n) runs on an already-warm fleet of ``system``."""
    r = redis.Redis.from_url(url)
    r.flushdb()
    env = _env(url, system)
    w = Workers(argv, env, log)
    try:
        send = _sender(system, url)
        send(n, 4)  # the warm-up: every process imports and connects first
        _wait(lambda: int(r.get("fleet:done") or 0) >= 4, 120, f"{system} warm-up", w)
        time.sleep(1.0)
        r.set("fleet:done", 0)
        t0 = time.perf_counter()
        send(n, jobs)
        _wait(lambda: int(r.get("fleet:done") or 0) >= jobs, 600, f"{system} run", w)
        return jobs / (time.perf_counter() - t0)
    finally:
        w.stop()
        r.close()


def _sender(system: str, url: str) -> Callable[[int, int], None]:
    """How ``system`` enqueues ``count`` burn(n) jobs, in bulk where it has a bulk API."""
    os.environ.update(BENCH_URL=url, FLEET_SYSTEM=system)
    sys.path.insert(0, str(HERE))
    import importlib

    import fleet_tasks

    tasks: Any = importlib.reload(fleet_tasks)
    if system == "echomq":
        return lambda n, count: tasks.burn.enqueue_many([((n,), {}) for _ in range(count)])
    if system == "celery":
        return lambda n, count: [tasks.burn.delay(n) for _ in range(count)] and None
    return lambda n, count: [tasks.burn.send(n) for _ in range(count)] and None


def noop_run(url: str, processes: int, concurrency: int, jobs: int, log: Path) -> tuple[float, int]:
    """(jobs/s, registry beats during the run) of ``jobs`` no-op jobs, backlog first."""
    import echomq

    r = redis.Redis.from_url(url)
    r.flushdb()
    q = echomq.Queue("fleet", url=url)
    payload = b'{"task":"noop","args":[],"kwargs":{}}'
    for start in range(0, jobs, 5000):
        q.enqueue_many([payload] * min(5000, jobs - start))
    r.config_resetstat()
    argv = [PY, "-m", "echomq", "worker", "fleet_tasks:app", "-q", "fleet"]
    argv += ["-p", str(processes), "-c", str(concurrency), "--log-level", "WARNING"]
    w = Workers(argv, _env(url, "echomq"), log)
    try:
        _wait(lambda: q.counts()["active"] > 0 or q.counts()["completed"] > 0, 60, "start", w)
        t0 = time.perf_counter()
        _wait(lambda: q.counts()["completed"] >= jobs, 600, "no-op run", w)
        rate = jobs / (time.perf_counter() - t0)
        beats = int(r.info("commandstats").get("cmdstat_pexpire", {}).get("calls", 0)) // 2
        return rate, beats
    finally:
        w.stop()
        q.close()
        r.close()


def beat_cost(url: str, calls: int = 2000) -> float:
    """Server µs per worker_beat call, an entry holding 50 jobs (the registry's bound: 100)."""
    import echomq
    from echomq.protocol import registry as _registry
    from echomq.protocol.kernel import Keys
    from echomq.runtime import worker_registry as _worker_registry

    r = redis.Redis.from_url(url)
    r.flushdb()
    q = echomq.Queue("fleet", url=url)
    reg = _worker_registry.Registry(["fleet"], 50, 1000)
    entry = reg.entry([], "lua")
    entry = entry.replace(
        '"jobs":[]',
        '"jobs":[' + ",".join(f'["{echomq.ids.mint()}","burn",1]' for _ in range(50)) + "]",
    )
    workers = [echomq.ids.mint("WRK") for _ in range(8)]
    q._x.run(_registry.beat(Keys("fleet"), workers[0], entry, 5000))  # loads the script
    r.config_resetstat()
    for i in range(calls):
        q._x.run(_registry.beat(Keys("fleet"), workers[i % 8], entry, 5000))
    s = r.info("commandstats")["cmdstat_evalsha"]
    q.close()
    r.close()
    return float(s["usec"]) / float(s["calls"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=200, help="CPU-bound jobs per run")
    ap.add_argument("--cpu-ms", type=float, default=20.0, help="each CPU-bound job's work")
    ap.add_argument("--noop-jobs", type=int, default=20_000, help="no-op jobs per run")
    ap.add_argument("--rounds", type=int, default=1, help="runs per row (the median)")
    ap.add_argument("--only", choices=["echomq"], help="skip the peers")
    args = ap.parse_args()

    port = _free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    logs = Path(tempfile.mkdtemp(prefix="echomq-fleet-"))  # the workers' output, kept
    print(f"(worker logs in {logs})")
    try:
        time.sleep(0.3)
        n = calibrate(args.cpu_ms)
        echomq_cmd = [PY, "-m", "echomq", "worker", "fleet_tasks:app", "-q", "fleet"]
        echomq_cmd += ["--log-level", "WARNING"]
        cpu_rows: list[tuple[str, list[str], str]] = [
            ("echomq `-p 1 -c 2`", [*echomq_cmd, "-p", "1", "-c", "2"], "echomq"),
            ("echomq `-p 2 -c 2`", [*echomq_cmd, "-p", "2", "-c", "2"], "echomq"),
        ]
        if args.only is None:
            bindir = Path(PY).parent
            cpu_rows.append((
                "celery prefork `-c 2`",
                [str(bindir / "celery"), "-A", "fleet_tasks", "worker", "-Q", "fleet",
                 "--pool", "prefork", "-c", "2", "-l", "WARNING", "--without-gossip",
                 "--without-mingle", "--without-heartbeat"],
                "celery",
            ))  # fmt: skip
            cpu_rows.append((
                "dramatiq `--processes 2 --threads 2`",
                [str(bindir / "dramatiq"), "fleet_tasks", "--processes", "2", "--threads", "2",
                 "--queues", "fleet"],
                "dramatiq",
            ))  # fmt: skip
        print(f"CPU-bound: {args.jobs} jobs of burn({n}) (~{args.cpu_ms:g} ms each), "
              f"median of {args.rounds}")  # fmt: skip
        print("\n| system | jobs/s | vs echomq -p 1 |\n|---|---:|---:|")
        base = None
        for label, argv, system in cpu_rows:
            rates = [
                cpu_run(system, argv, url, args.jobs, n, logs / f"{system}.log")
                for _ in range(args.rounds)
            ]
            rate = statistics.median(rates)
            base = base or rate
            print(f"| {label} | {rate:,.1f} | {rate / base:.2f}x |", flush=True)

        print(f"\nNo-op jobs: {args.noop_jobs:,} (a backlog), median of {args.rounds}")
        print("\n| echomq | jobs/s | registry beats during the run | beats per job |")
        print("|---|---:|---:|---:|")
        for p, c in ((1, 100), (2, 50)):
            runs = [
                noop_run(url, p, c, args.noop_jobs, logs / "noop.log") for _ in range(args.rounds)
            ]
            rate = statistics.median(x[0] for x in runs)
            beats = runs[len(runs) // 2][1]
            print(
                f"| `-p {p} -c {c}` | {rate:,.0f} | {beats} | {beats / args.noop_jobs:.5f} |",
                flush=True,
            )
        us = beat_cost(url)
        print(f"\nRegistry: {us:.1f} µs of server time per worker_beat call (an entry with 50 "
              "held jobs, 8 workers on the queue); one call per worker process per queue per "
              "beat (1 s by default), none per job.")  # fmt: skip
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
