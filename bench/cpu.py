"""CPU per job: the scheduler's CPU time of the server, the workers and the producer (issue 41).

    bench/.venv/bin/python bench/cpu.py [--rounds 3] [--n 20000] [--peer-n 5000] [--only ...]
    python bench/cpu.py --smoke      # echomq only, small N, one round (the CI smoke)

Throughput on a shared 2-core box swings with the load; the CPU a job costs does not (much):
it is what the bill is made of and what decides how far one server and one worker go. Per
row, on the bench's own redis-server (``run.Bench``: FLUSHALL before every row, the worker
commands of ``bench/peers/``):

1. the producer enqueues N no-op jobs (the system's bulk API, else one call a job); its CPU
   is this process's and its waited children's (``getrusage``: Node and arq produce in a
   subprocess), the server's is read around it;
2. then the worker starts (one process, its children in its process group); from the first
   completion the broker reports to the last, the CPU of the server and of every process of
   the worker's group is read (``/proc/<pid>/task/*/schedstat``, ns, every thread, plus
   ``cutime + cstime`` of reaped children: rq forks one per job), divided by the jobs done in
   that window. Start-up (imports, connecting) is outside the window.

server µs/job = enqueue share + drain share (one lifecycle: enqueue, claim, complete); total =
server + worker (the producer is its own column: a producer is usually another machine's
bill). Rounds are interleaved (the order rotates), the table gives medians and min-max, and
the ratios echomq/peer are computed per round, then the median. Also: ``limit(3)`` against
``-c 3`` without a limit (``bench/limit_refill.py``'s run, more jobs) and bytes per waiting
job (``bench/memory.py``'s measurement: ``INFO memory`` ``used_memory`` delta / N).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import resource
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import run  # noqa: E402  (bench/ on the path first)
from servertime import top_level_usec  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
PYTHON_PEERS = ("dramatiq", "taskiq", "huey", "arq", "saq", "rq", "celery", "bullmq_py")


@dataclass(frozen=True)
class Row:
    key: str  # the row's id in the JSON and the ratios
    system: str  # a bench/peers adapter (echomq rows: see _echomq_adapter)
    c: int
    label: str
    executor: str | None = None  # echomq rows: "lua" or "native"
    inline: bool = False  # echomq rows: the inline sync handler


def echomq_rows(best: list[int], executors: list[str]) -> list[Row]:
    rows = []
    for ex in executors:
        for c in best:
            rows.append(Row(f"{ex}-c{c}", "echomq", c, f"echomq {ex}, async no-op, c={c}", ex))
        c = best[0]
        rows.append(
            Row(f"{ex}-inline-c{c}", "echomq", c, f"echomq {ex}, inline sync, c={c}", ex, True)
        )
    return rows


# ------------------------------------------------------------------ the scheduler's counters


def _stat_fields(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": state is field 3


def proc_ns(pid: int) -> int:
    """CPU ns of one process: every live thread's ``schedstat`` run time, plus the
    ``cutime + cstime`` of the children it has reaped (ticks: exited forks such as rq's)."""
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # the thread ended meanwhile
        f = _stat_fields(pid)
        total += (int(f[13]) + int(f[14])) * 1_000_000_000 // CLK_TCK  # cutime, cstime
    except OSError:
        return 0
    return total


def group_ns(pgid: int) -> int:
    """CPU ns of every process in process group ``pgid`` (a worker and the children it forks:
    run.WorkerProc starts each worker in its own session)."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if int(_stat_fields(int(entry.name))[2]) != pgid:  # field 5: pgrp
                continue
        except (OSError, ValueError, IndexError):
            continue
        total += proc_ns(int(entry.name))
    return total


def own_cpu_s() -> float:
    """This process's CPU and its waited children's (a subprocess producer), seconds."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


# ------------------------------------------------------------------ the measurement


class CpuBench(run.Bench):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.rows: dict[str, dict[str, list[float | None]]] = {}
        self.extra: dict[str, Any] = {}

    def server_ns(self) -> int:
        return proc_ns(int(self.server.pid))

    def adapter(self, row: Row) -> ModuleType:
        if row.system != "echomq":
            return self.mods[row.system]
        key = f"echomq-{row.executor}-{'inline' if row.inline else 'async'}"
        if key not in self.mods:  # its own instance of the adapter: EXECUTOR is per module
            spec = importlib.util.spec_from_file_location(
                f"peers._cpu_{key.replace('-', '_')}", BENCH / "peers" / "echomq.py"
            )
            assert spec is not None and spec.loader is not None
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            mod.EXECUTOR = row.executor  # type: ignore[attr-defined]
            mod.WORKER_APP = "inline_app" if row.inline else "app"  # type: ignore[attr-defined]
            self.mods[key] = mod
        return self.mods[key]

    def put(self, name: str, key: str, rnd: int, value: float | None) -> None:
        row = self.rows.setdefault(name, {})
        row.setdefault(key, [None] * self.args.rounds)[rnd] = value

    def measure(self, row: Row, n: int, rnd: int) -> dict[str, float]:
        mod = self.adapter(row)
        self.fresh()
        fill = mod.enqueue_bulk if mod.BULK else mod.enqueue_single
        self.r.config_resetstat()
        s0, p0 = self.server_ns(), own_cpu_s()
        fill(self.url, n)
        s1, p1 = self.server_ns(), own_cpu_s()
        fill_script_us = top_level_usec(self.r.info("commandstats"))
        self.r.config_resetstat()
        log = self.logs / f"cpu-{row.key}-r{rnd + 1}.log"
        w = run.WorkerProc(mod.worker_cmd(self.url, row.c), self.env, log)
        self.workers.append(w)
        try:
            window = self.drain(mod, w, n)
        finally:
            drain_script_us = top_level_usec(self.r.info("commandstats"))
            if row.system == "echomq":
                ok, text = mod.verify(self.url, n)
                self.verifications.append(f"{'ok' if ok else 'FAILED'} {row.key} r{rnd + 1}")
                if not ok:
                    self.verify_failures += 1
                    run.log(f"verification FAILED ({row.key}): {text}")
            w.stop(timeout=getattr(mod, "STOP_TIMEOUT", 15.0))
            self.workers.remove(w)
        jobs, secs, server_drain, worker = window
        out = {
            "producer": (p1 - p0) * 1e6 / n,
            "server_enqueue": (s1 - s0) / 1e3 / n,
            "server_drain": server_drain / 1e3 / jobs,
            "worker": worker / 1e3 / jobs,
            "jobs_s": jobs / secs,
        }
        if row.system == "echomq":  # the script calls' own time (INFO commandstats)
            out["script_enqueue"] = fill_script_us / n
            out["script_drain"] = drain_script_us / n
        out["server"] = out["server_enqueue"] + out["server_drain"]
        out["total"] = out["server"] + out["worker"]
        return out

    def drain(self, mod: ModuleType, w: run.WorkerProc, n: int) -> tuple[float, float, int, int]:
        """Poll the broker's view until all ``n`` are done; CPU snapshots at the first
        completion and at the last. Returns (jobs in the window, seconds, server ns, worker ns)."""
        pgid = w.proc.pid
        start: tuple[float, float, int, int] | None = None
        last, last_change = n, time.monotonic()
        while True:
            rem = mod.remaining(self.url, self.r, n)
            now = time.monotonic()
            if start is None and rem < n:
                sv, wk = self.server_ns(), group_ns(pgid)
                after = mod.remaining(self.url, self.r, n)
                start = ((rem + after) / 2, time.monotonic(), sv, wk)  # rem moved meanwhile
            if rem == 0:
                sv, wk = self.server_ns(), group_ns(pgid)
                t1 = time.monotonic()
                break
            if rem != last:
                last, last_change = rem, now
            if not w.alive():
                raise RuntimeError(f"worker exited ({w.proc.returncode}): {w.tail()}")
            if now - last_change > self.args.stall_timeout:
                raise RuntimeError(f"no progress for {self.args.stall_timeout:.0f}s: {w.tail()}")
            time.sleep(0.01)
        assert start is not None
        jobs, t0, sv0, wk0 = start
        if jobs < n / 10:
            raise RuntimeError(f"only {jobs:.0f} of {n} jobs after the first poll: raise N")
        return jobs, t1 - t0, sv - sv0, wk - wk0

    def run_rows(self, rows: list[Row]) -> None:
        a = self.args
        for rnd in range(a.rounds):
            k = rnd % len(rows)
            order = rows[k:] + rows[:k]
            run.log(f"round {rnd + 1}/{a.rounds}")
            for row in order:
                n = a.n if row.system in ("echomq", "bullmq_node") else a.peer_n
                try:
                    got = self.measure(row, n, rnd)
                except Exception as exc:
                    self.errors += 1
                    self.note(row.key, f"r{rnd + 1}: {type(exc).__name__}: {str(exc)[-400:]}")
                    run.log(f"  {row.key}: FAILED {type(exc).__name__}: {str(exc)[-300:]}")
                    continue
                for key, v in got.items():
                    self.put(row.key, key, rnd, v)
                run.log(
                    f"  {row.key:<22} server {got['server']:6.1f}  worker {got['worker']:6.1f}  "
                    f"total {got['total']:6.1f} µs/job  producer {got['producer']:6.1f}  "
                    f"{got['jobs_s']:8,.0f} jobs/s"
                )
            if a.limit_jobs:
                self.limit_round(rnd)

    def limit_round(self, rnd: int) -> None:
        """``limit(3)`` at ``-c 4`` against no limit at ``-c 3``: bench/limit_refill.py's run
        (an in-process worker, sync no-op, the backlog's wake tokens deleted)."""
        import limit_refill

        for ex in self.args.executors:
            url = f"{self.url}?executor={ex}"
            rates = []
            for name, limit, c in (("limited", 3, 4), ("unlimited", None, 3)):
                self.fresh()
                done, secs = limit_refill.run(url, name, self.args.limit_jobs, limit, c, 120.0)
                if done < self.args.limit_jobs:
                    self.note(f"limit-{ex}", f"r{rnd + 1}: {name} did {done} jobs in {secs:.0f} s")
                rates.append(done / secs)
                self.put(f"limit-{ex}", name, rnd, done / secs)
            self.put(f"limit-{ex}", "ratio", rnd, rates[0] / rates[1])
            run.log(f"  limit {ex}: {rates[0]:,.0f} vs {rates[1]:,.0f} jobs/s")


def bytes_per_job(n: int, with_bullmq: bool) -> dict[str, Any]:
    """bench/memory.py's measurement (each on its own fresh server) at ``n`` waiting jobs."""
    import memory

    def breakdown(s: Any, n: int) -> dict[str, Any]:
        # Without "markers": measure() would then wait out the replay markers' retention
        # (70 s) for an at-rest figure; the marker's bytes per job are in the breakdown.
        return {k: v for k, v in memory.echomq_breakdown(s, n).items() if k != "markers"}

    out = {"echomq": memory.measure(memory.echomq_task, n, breakdown)}
    if with_bullmq:
        out["bullmq_node"] = memory.measure(memory.bullmq, n, memory.nothing)
    return out


# ------------------------------------------------------------------ the report


def med(vals: list[float | None] | None) -> float | None:
    got = [v for v in vals or [] if v is not None]
    return statistics.median(got) if got else None


def spread(vals: list[float | None] | None, fmt: str = "{:.1f}") -> str:
    got = [v for v in vals or [] if v is not None]
    if not got:
        return "n/a"
    m = fmt.format(statistics.median(got))
    return m if len(got) < 2 else f"{m} ({fmt.format(min(got))}-{fmt.format(max(got))})"


def per_round_ratio(b: CpuBench, ours: str, theirs: str, key: str = "total") -> float | None:
    a, t = b.rows.get(ours, {}).get(key), b.rows.get(theirs, {}).get(key)
    if not a or not t:
        return None
    return med([x / y if x and y else None for x, y in zip(a, t, strict=True)])


def report(b: CpuBench, rows: list[Row], command: str, head: dict[str, str]) -> str:
    def best_python() -> str | None:
        got = [(med(b.rows[r.key].get("total")), r.key) for r in rows if r.key in b.rows]
        py = [(v, k) for v, k in got if v is not None and k.split("-")[0] in PYTHON_PEERS]
        return min(py)[1] if py else None

    bull = next((r.key for r in rows if r.system == "bullmq_node" and r.key in b.rows), None)
    bull = min(
        (r.key for r in rows if r.system == "bullmq_node" and r.key in b.rows),
        key=lambda k: med(b.rows[k].get("total")) or float("inf"),
        default=bull,
    )
    py = best_python()

    def label(key: str) -> str:
        return next(r.label for r in rows if r.key == key)

    lines = [f"- {k}: {v}" for k, v in head.items()]
    lines += [
        "",
        "µs of CPU per job, median over rounds (min-max); server = enqueue + drain share; "
        "total = server + worker.",
        "",
        "| system | jobs/s | server µs/job | worker µs/job | **total µs/job** | producer µs/job "
        f"| total / {label(bull) if bull else '-'} | total / {label(py) if py else '-'} |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        d = b.rows.get(r.key)
        if not d:
            lines.append(f"| {r.label} | not run: {'; '.join(b.notes.get(r.key, []))[:200]} |")
            continue
        rb = per_round_ratio(b, r.key, bull) if bull and r.key != bull else None
        rp = per_round_ratio(b, r.key, py) if py and r.key != py else None
        lines.append(
            f"| {r.label} | {spread(d.get('jobs_s'), '{:,.0f}')} | {spread(d.get('server'))} "
            f"| {spread(d.get('worker'))} | **{spread(d.get('total'))}** "
            f"| {spread(d.get('producer'))} | {f'{rb:.2f}' if rb else '-'} "
            f"| {f'{rp:.3f}' if rp else '-'} |"
        )
    echo = [r for r in rows if r.system == "echomq" and r.key in b.rows]
    if echo:
        lines += [
            "",
            "echomq's server share split (µs/job, medians): scheduler CPU while enqueuing and "
            "while draining; the script calls' own time (`INFO commandstats`, top-level rows).",
            "",
            "| row | server: enqueue | server: drain | scripts: enqueue | scripts: drain |",
            "|---|---:|---:|---:|---:|",
        ]
        for r in echo:
            d = b.rows[r.key]
            cells = [spread(d.get(k)) for k in ("server_enqueue", "server_drain")]
            cells += [spread(d.get(k)) for k in ("script_enqueue", "script_drain")]
            lines.append(f"| {r.label} | " + " | ".join(cells) + " |")
    for ex in ("lua", "native"):
        d = b.rows.get(f"limit-{ex}")
        if d:
            lines.append(
                f"\n`limit(3)`, `-c 4` vs no limit `-c 3` ({ex}, {b.args.limit_jobs} sync no-op "
                f"jobs, in-process worker): {spread(d.get('limited'), '{:,.0f}')} vs "
                f"{spread(d.get('unlimited'), '{:,.0f}')} jobs/s, ratio per round "
                f"**{spread(d.get('ratio'), '{:.2f}')}**"
            )
    mem = b.extra.get("bytes")
    if mem:
        e = mem["echomq"]
        text = f"\nBytes per waiting job at N={e['n']:,}: echomq {e['bytes_per_job']:.0f}"
        if "bullmq_node" in mem:
            bm = mem["bullmq_node"]["bytes_per_job"]
            text += f", BullMQ (Node) {bm:.0f}: **{e['bytes_per_job'] / bm:.2f}x**"
        text += (
            f" (echomq row {e['row_bytes']} B, {e['row_encoding']}, fields "
            f"{','.join(e['row_fields'])}; pending ZSET {e['pending_zset_per_job']} B/job; "
            f"replay marker {e['markers_per_job']} B/job)"
        )
        lines.append(text)
    if b.verifications:
        bad = [v for v in b.verifications if not v.startswith("ok")]
        lines.append(
            f"\nechomq verification after every echomq drain (`check() == []`, completed == N): "
            f"{len(b.verifications) - len(bad)} of {len(b.verifications)} passed"
        )
    for key, notes in b.notes.items():
        lines.append(f"- {key}: {'; '.join(notes)[:600]}")
    for key, why in b.unavailable.items():
        lines.append(f"- {key}: not available ({why})")
    lines.append(f"\nCommand: `{command}`")
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--n", type=int, default=20_000, help="jobs per echomq and BullMQ row")
    p.add_argument("--peer-n", type=int, default=5_000, help="jobs per Python-peer row")
    p.add_argument("--best", default="200,50", help="echomq's and BullMQ's concurrencies")
    p.add_argument("--peer-c", type=int, default=10, help="the Python peers' concurrency")
    p.add_argument("--only", default="", help="echomq,bullmq_node," + ",".join(PYTHON_PEERS))
    p.add_argument("--executors", default="lua,native", help="echomq's rows: lua,native")
    p.add_argument("--limit-jobs", type=int, default=3000, help="0: no limit(3) row")
    p.add_argument("--bytes-n", type=int, default=100_000, help="0: no bytes row")
    p.add_argument("--json", default=str(BENCH / "cpu.json"))
    p.add_argument("--stall-timeout", type=float, default=90.0)
    p.add_argument("--echomq-rev", default="HEAD", help="as bench/run.py: a rev, worktree")
    p.add_argument("--smoke", action="store_true", help="echomq only, small N, one round")
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    a.executors = ["lua"] if a.smoke else [x for x in a.executors.split(",") if x]
    if a.smoke:
        a.only, a.rounds, a.n, a.best = "echomq", 1, min(a.n, 2000), "50"
        a.limit_jobs, a.bytes_n, a.stall_timeout, a.json = 200, 2000, 20.0, ""
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    best = [int(x) for x in a.best.split(",") if x]
    systems = [s for s in a.only.split(",") if s] or ["echomq", "bullmq_node", *PYTHON_PEERS]
    rows = echomq_rows(best, a.executors)
    rows += [Row(f"bullmq_node-c{c}", "bullmq_node", c, f"BullMQ (Node), c={c}") for c in best]
    rows = [r for r in rows if r.system in systems]
    b = CpuBench(a)
    try:
        b.pin_echomq()
        b.start_server(native="native" in a.executors)  # the smoke: Lua only, no C build
        loaded = b.load([s for s in systems if s != "echomq"] + ["echomq"])
        for s in PYTHON_PEERS:
            if s in loaded:
                c = 1 if run.unsupported(b.mods[s], a.peer_c) else a.peer_c
                rows.append(Row(f"{s}-c{c}", s, c, f"{b.mods[s].LABEL}, c={c}"))
        rows = [r for r in rows if r.system in loaded]
        run.log(f"rows: {', '.join(r.key for r in rows)}")
        b.run_rows(rows)
        if a.bytes_n:
            b.extra["bytes"] = bytes_per_job(a.bytes_n, "bullmq_node" in loaded)
    finally:
        b.close()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    head = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{os.cpu_count()} cores, {platform.platform()}, Python "
        f"{platform.python_version()}; load average at the end {load}",
        "echomq": b.echomq_source,
        "versions": ", ".join(
            f"{b.mods[s].LABEL} {b.mods[s].version()}" for s in systems if s in b.mods
        ),
        "rows": f"N={a.n} (echomq, BullMQ), {a.peer_n} (Python peers), {a.rounds} rounds",
    }
    command = shlex.join(["bench/.venv/bin/python", "bench/cpu.py", *(argv or sys.argv[1:])])
    print(report(b, rows, command, head))
    if a.json:
        Path(a.json).write_text(
            json.dumps({"head": head, "rows": b.rows, "extra": b.extra, "notes": b.notes}) + "\n"
        )
    if b.verify_failures or (a.smoke and b.errors):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
