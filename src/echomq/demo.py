"""``echomq demo``: the whole product in one run.

Producers enqueue ~20k jobs for several tenants (each tenant a fair lane, one with double
weight) while worker processes run them. Some jobs are flaky (fail once, then succeed on
retry), a few are poison (dead-lettered at the attempt ceiling). Mid-run one worker is
killed with SIGKILL: its leases lapse, the stall sweep of the surviving workers returns its
jobs to their lanes, and they run again elsewhere. The summary shows throughput,
enqueue→start latency, counts per state, the dead jobs, a fix "deployed" and one dead job
reprocessed to completion, and the consistency checker's verdict.

The handlers keep their bookkeeping in keys outside the queue's keyspace (``echomq-demo:*``).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis
import redis.asyncio

from echomq import ids
from echomq.app import App, current_job
from echomq.backoff import fixed
from echomq.queue import Queue
from echomq.server import state_dir

__all__ = ["app", "run_demo"]

QUEUE = "demo"
TENANTS = {"acme": 2, "globex": 1, "initech": 1, "umbrella": 1, "hooli": 1}  # lane -> weight
PREFIX = "echomq-demo:"

app = App()
_r: redis.asyncio.Redis | None = None


def _redis() -> redis.asyncio.Redis:
    global _r
    if _r is None:
        _r = redis.asyncio.Redis.from_url(app.url)
    return _r


@app.task(queue=QUEUE, max_attempts=3, backoff=fixed(200), lease_ms=3_000, name="demo.process")
async def process(tenant: str, n: int, kind: str) -> None:
    """A tenant's job: a little I/O-shaped work; flaky jobs fail their first attempt."""
    job = current_job()
    assert job is not None
    started = time.time() * 1000
    await asyncio.sleep(random.uniform(0.001, 0.004))
    if kind == "flaky" and job.attempt == 1:
        raise RuntimeError(f"flaky job {n} of {tenant}: a transient error")
    r = _redis()
    if kind == "poison" and not await r.get(PREFIX + "fixed"):
        raise ValueError(f"poison job {n} of {tenant}: cannot be processed")
    # The demo's own bookkeeping, one round trip per job: the enqueue -> start latency of
    # first attempts, progress per tenant, and the runs that are not first attempts.
    pipe = r.pipeline(transaction=False)
    if job.attempt == 1:
        pipe.rpush(PREFIX + "latency", started - ids.decode_time_ms(job.id))
    else:
        pipe.sadd(PREFIX + "again", f"{kind}:{job.id}")
    pipe.hincrby(PREFIX + "done", tenant, 1)
    await pipe.execute()


def _int_map(raw: Any) -> dict[str, int]:
    return {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in raw.items()}


def _plan(jobs: int) -> list[tuple[str, int, str]]:
    """(tenant, n, kind) for every job: tenants get uneven shares; ~4 % flaky, 8 poison."""
    rng = random.Random(7)
    shares = {"acme": 0.4, "globex": 0.25, "initech": 0.15, "umbrella": 0.12, "hooli": 0.08}
    plan = []
    for tenant, share in shares.items():
        for n in range(int(jobs * share)):
            kind = "flaky" if rng.random() < 0.04 else "ok"
            plan.append((tenant, n, kind))
    poison = rng.sample(range(len(plan)), min(8, len(plan)))
    for i in poison:
        plan[i] = (plan[i][0], plan[i][1], "poison")
    rng.shuffle(plan)
    return plan


def _start_worker(url: str, i: int, concurrency: int, logdir: Path) -> subprocess.Popen[bytes]:
    log = open(logdir / f"worker-{i}.log", "wb")  # noqa: SIM115 - handed to the child
    env = {**os.environ, "ECHOMQ_URL": url}
    cmd = [
        sys.executable,
        "-m",
        "echomq",
        "worker",
        "echomq.demo:app",
        "-c",
        str(concurrency),
        "--beat-ms",
        "500",
        "--grace",
        "5",
    ]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def run_demo(
    url: str, *, jobs: int = 20_000, workers: int = 3, concurrency: int = 32, kill: bool = True
) -> int:
    """Run the demo against ``url``; returns the process exit code (0 when all is well)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    console = Console()
    app.url = url
    r = redis.Redis.from_url(url)
    q = Queue(QUEUE, url=url)
    if q.counts()["active"]:
        console.print(f"[red]queue {QUEUE!r} has active jobs; is another demo running?[/red]")
        return 1
    # A clean slate for this demo's own queue and bookkeeping (never the whole server).
    q.pause()
    q.obliterate(force=True)
    r.delete(*(PREFIX + k for k in ("latency", "again", "done", "fixed")))
    for tenant, weight in TENANTS.items():
        q.weight_lane(tenant, weight)

    plan = _plan(jobs)
    total = {t: sum(1 for p in plan if p[0] == t) for t in TENANTS}
    poison_total = sum(1 for p in plan if p[2] == "poison")
    logdir = state_dir() / "demo-logs"
    logdir.mkdir(parents=True, exist_ok=True)
    console.rule("[bold]echomq demo")
    console.print(
        f"{len(plan):,} jobs for {len(TENANTS)} tenants (fair lanes; acme has weight 2), "
        f"~4% flaky, {poison_total} poison; {workers} workers x {concurrency}; server {url}"
    )
    # Decided at the queue's first call (MODULE LIST): native when the server loads trafikey.
    how = (
        "the trafikey module runs the transitions it has, Lua the rest"
        if q.executor == "native"
        else "every transition runs as a Lua script"
    )
    console.print(f"executor: {q.executor} ({how})")
    procs = [_start_worker(url, i, concurrency, logdir) for i in range(workers)]
    killed: dict[str, Any] = {}
    t0 = time.monotonic()
    columns = (
        TextColumn("{task.description:>9}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
    )
    try:
        with Progress(*columns, console=console, refresh_per_second=8) as progress:
            bars = {t: progress.add_task(t, total=total[t], note="") for t in TENANTS}
            overall = progress.add_task("all", total=len(plan) - poison_total, note="")
            sent = 0
            chunk = 500
            while True:
                # Produce at a steady pace while the workers run, per tenant lane.
                if sent < len(plan):
                    batch = plan[sent : sent + chunk]
                    for tenant in TENANTS:
                        mine: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
                            ((t, n, k), {}) for t, n, k in batch if t == tenant
                        ]
                        if mine:
                            process.enqueue_many(mine, group=tenant)
                    sent += len(batch)
                # Tenant bars count handler returns (a re-run of a killed worker's job counts
                # twice, so they are capped); the overall bar and the stop condition use the
                # queue's own metrics, which count each settled job exactly once.
                done = _int_map(r.hgetall(PREFIX + "done"))
                for t in TENANTS:
                    progress.update(bars[t], completed=min(done.get(t, 0), total[t]))
                counts = q.counts()
                finished = counts["completed"]
                progress.update(overall, completed=finished, note=f"dead {counts['dead']}")
                if kill and not killed and finished >= 0.35 * len(plan):
                    victim = procs[0]
                    held = counts["active"]
                    victim.send_signal(signal.SIGKILL)
                    victim.wait()
                    killed = {
                        "pid": victim.pid,
                        "at": finished,
                        "active": held,
                        "t": time.monotonic(),
                    }
                    progress.console.print(
                        f"[yellow]SIGKILL worker pid {victim.pid} ({held} jobs active across all "
                        "workers); its leases lapse in 3 s and the stall sweep returns its jobs"
                        "[/yellow]"
                    )
                    procs[0] = _start_worker(url, workers, concurrency, logdir)
                    progress.console.print(
                        f"[yellow]started a replacement worker pid {procs[0].pid}[/yellow]"
                    )
                waiting = counts["pending"] + counts["active"] + counts["schedule"]
                if sent >= len(plan) and waiting == 0 and finished + counts["dead"] >= len(plan):
                    break
                if time.monotonic() - t0 > max(120, jobs / 50):
                    console.print("[red]the demo did not finish in time[/red]")
                    return 1
                time.sleep(0.1 if sent < len(plan) else 0.05)
        elapsed = time.monotonic() - t0
        return _summary(console, q, r, plan, elapsed, killed, Table)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        q.close()
        r.close()


def _summary(
    console: Any,
    q: Queue,
    r: redis.Redis,
    plan: list[tuple[str, int, str]],
    elapsed: float,
    killed: dict[str, Any],
    table_cls: Any,
) -> int:
    lat = sorted(float(x) for x in r.lrange(PREFIX + "latency", 0, -1))

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))] if lat else float("nan")

    counts = q.counts()
    again = [m.decode() if isinstance(m, bytes) else str(m) for m in r.smembers(PREFIX + "again")]
    # An "ok" job completes on its first attempt unless its worker died holding it: a later
    # attempt means it came back (stall sweep) and ran elsewhere.
    redelivered = sum(1 for m in again if m.startswith("ok:"))
    retried = sum(1 for m in again if m.startswith("flaky:"))
    console.rule("[bold]summary")
    t = table_cls(show_header=False)
    t.add_row("jobs", f"{len(plan):,}")
    t.add_row("elapsed", f"{elapsed:.1f} s")
    t.add_row("throughput", f"{counts['completed'] / elapsed:,.0f} jobs/s completed")
    t.add_row(
        "enqueue→start",
        f"p50 {pct(0.5):.1f} ms, p99 {pct(0.99):.1f} ms ({len(lat):,} first attempts; "
        "includes queueing: producers outpace the workers on purpose)",
    )
    t.add_row("counts", ", ".join(f"{k} {v:,}" for k, v in counts.items()))
    t.add_row("flaky, retried", f"{retried:,} jobs failed once and completed on their retry")
    if killed:
        t.add_row(
            "killed worker",
            f"pid {killed['pid']} (SIGKILL at {killed['at']:,} done): {redelivered:,} of its jobs "
            "came back via the stall sweep and completed on another worker",
        )
    console.print(t)
    dead = q.browse("dead", 20)
    console.print(f"[bold]dead jobs ({counts['dead']})[/bold]")
    for job_id in dead:
        row = q.get_job(job_id) or {}
        err = str(row.get("last_error", "")).splitlines()[0] if row.get("last_error") else ""
        console.print(f"  {job_id}  attempts {row.get('attempts')!s}  {err}")
    ok = True
    if dead:
        r.set(PREFIX + "fixed", "1")
        console.print(f"[bold]a fix is deployed; reprocessing {dead[0]}[/bold]")
        q.reprocess(dead[0])
        deadline = time.monotonic() + 15
        while q.job_state(dead[0]) != "absent" and time.monotonic() < deadline:
            time.sleep(0.05)
        state = q.job_state(dead[0])
        console.print(f"  {dead[0]} -> {'completed' if state == 'absent' else state}")
        ok = state == "absent"
    violations = q.check()
    console.print(f"consistency check: {violations or 'clean'}")
    counts = q.counts()
    expected_done = len(plan) - counts["dead"]
    ok = ok and not violations and counts["completed"] == expected_done and counts["pending"] == 0
    console.print("[bold green]demo ok[/bold green]" if ok else "[bold red]demo failed[/bold red]")
    return 0 if ok else 1
