"""The side-by-side benchmark: echomq and its peers on a redis-server this script starts.

    bench/.venv/bin/python bench/run.py [--rounds 3] [--n 20000] [--only echomq,arq,...]
    python bench/run.py --smoke          # ~5 s, echomq only, needs only echomq + redis-server

Rounds are interleaved (round 1 runs every system, then round 2 ...; the order rotates per
round), every measurement starts on an empty server (FLUSHALL of the bench's own server),
and the report gives medians over rounds plus the ratio echomq/peer computed per round.
Every worker runs at -c 1 and -c 10; echomq also at ``--best``, every peer at ``--peer-best``,
and the report compares each system at its best measured setting.
Peer adapters live in ``bench/peers/`` and are imported lazily, so ``--smoke`` runs without
any of them installed. ``bash bench/setup.sh`` installs the peers into ``bench/.venv``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

SYSTEMS = [
    "echomq",
    "echomq_native",
    "rq",
    "arq",
    "saq",
    "dramatiq",
    "huey",
    "celery",
    "taskiq",
    "bullmq_py",
    "bullmq_node",
]
# (key, column title, higher is better)
METRICS = [
    ("single", "single enqueue/s", True),
    ("bulk", "bulk enqueue/s", True),
    ("c1", "processed/s c=1", True),
    ("c10", "processed/s c=10", True),
    ("p50", "latency p50 ms", False),
    ("p99", "latency p99 ms", False),
]
BEST = (50, 200)  # echomq's extra concurrency settings
ECHOMQ = ("echomq", "echomq_native")  # measured at those settings too, and verified
PEER_BEST = (50,)  # every other system's extra concurrency settings (--peer-best)
NODE = ("bullmq_node",)  # the peers that are not Python
PYTHON_PEERS = tuple(s for s in SYSTEMS if s not in ECHOMQ and s not in NODE)
Best = tuple[str, float]  # (processed/s key such as "c50", jobs/s)
SETTING = re.compile(r"c([1-9]\d*)(?:x([1-9]\d*))?")  # a processed/s key: c10, c50, c50x2
LAT_KEY = "bench:lat"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------- processes


class WorkerProc:
    """One worker, in its own session/process group so its children stop with it."""

    def __init__(self, cmd: list[str], env: dict[str, str], logfile: Path) -> None:
        self.cmd = cmd
        self.logfile = logfile
        self._out = logfile.open("wb")
        self._out.write(f"$ {shlex.join(cmd)}\n".encode())
        self._out.flush()
        self.proc = subprocess.Popen(
            cmd,
            cwd=BENCH,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)  # the group this object created (pgid == its pid)

    def stop(self, timeout: float = 20.0) -> None:
        if self.alive():
            self._signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        self._signal_group(signal.SIGKILL)  # leftovers of the group (forked children)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        self._out.close()

    def tail(self, n: int = 1500) -> str:
        with contextlib.suppress(OSError):
            return self.logfile.read_text(errors="replace")[-n:]
        return ""


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="echomq-bench-"))
        self.logs = self.tmp / "logs" if args.smoke else BENCH / ".run" / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.server: Any = None
        self.url = ""
        self.r: Any = None
        self.env: dict[str, str] = {}
        self.mods: dict[str, ModuleType] = {}
        self.unavailable: dict[str, str] = {}
        self.data: dict[str, dict[str, list[float | None]]] = {}
        self.notes: dict[str, list[str]] = {}
        self.verifications: list[str] = []
        self.verify_failures = 0
        self.errors = 0
        self.workers: list[WorkerProc] = []
        self.pinned = ""
        self.echomq_source = "?"

    # ------------------------------------------------------------------ setup

    def pin_echomq(self) -> None:
        """Copy echomq's source as of ``--echomq-rev`` (default HEAD) into the run's temp dir
        and put it first on every path, so all rounds measure the same code even when the
        work tree changes during the run; ``--echomq-rev installed`` uses the install as is."""
        rev = self.args.echomq_rev
        self.echomq_source = "the installed package"
        if rev == "installed":
            return
        dest = self.tmp / "echomq-src"
        dest.mkdir()
        try:
            if rev == "worktree":
                shutil.copytree(ROOT / "src" / "echomq", dest / "echomq")
                sha = git("rev-parse", "--short", "HEAD")
                dirty = git("status", "--porcelain", "--", "src")
                edits = " + uncommitted edits" if dirty else ""
                self.echomq_source = f"work tree at {sha}{edits}"
            else:
                sha = git("rev-parse", "--short", f"{rev}^{{commit}}")
                archive = subprocess.run(
                    ["git", "-C", str(ROOT), "archive", sha, "src/echomq"],
                    capture_output=True,
                    check=True,
                )
                subprocess.run(
                    ["tar", "-x", "-C", str(dest), "--strip-components=1"],
                    input=archive.stdout,
                    check=True,
                )
                self.echomq_source = f"commit {sha} (`git archive`, uncommitted edits excluded)"
        except (OSError, subprocess.CalledProcessError) as exc:
            if self.args.smoke:  # e.g. a source tarball without git: measure what is installed
                self.echomq_source = f"the installed package (no git snapshot: {exc})"
                return
            raise
        self.pinned = str(dest)
        sys.path.insert(0, self.pinned)
        for mod in [m for m in sys.modules if m == "echomq" or m.startswith("echomq.")]:
            del sys.modules[mod]
        log(f"echomq source: {self.echomq_source}")

    def start_server(self, native: bool = False) -> None:
        """The bench's server; with ``native`` (echomq_native is measured) it loads the
        trafikey module, built from the work tree's native/ with make."""
        import redis

        from echomq.server import EmbeddedServer

        args: list[str] = []
        if native:
            subprocess.run(["make", "-s", "-C", str(ROOT / "native")], check=True)
            args = ["--loadmodule", str(ROOT / "native" / "trafikey.so")]
            log(f"bench server loads {args[1]}")
        self.server = EmbeddedServer(self.tmp / "redis", appendonly=False, args=args).start()
        self.url = self.server.url
        self.r = redis.Redis.from_url(self.url)
        self.env = dict(os.environ)
        self.env.update(
            BENCH_URL=self.url,
            ECHOMQ_URL=self.url,
            PYTHONPATH=os.pathsep.join(
                p for p in (str(BENCH), self.pinned, os.environ.get("PYTHONPATH", "")) if p
            ),
            PYTHONDONTWRITEBYTECODE="1",
        )
        os.environ["BENCH_URL"] = self.url  # read by the adapters at import
        log(f"bench server: {self.server.command()[0]} on {self.url} (dir {self.tmp})")

    def load(self, names: list[str]) -> list[str]:
        ok = []
        for name in names:
            try:
                mod = importlib.import_module(f"peers.{name}")
                if hasattr(mod, "available"):
                    mod.available()
                self.mods[name] = mod
                ok.append(name)
            except Exception as exc:
                self.unavailable[name] = f"{type(exc).__name__}: {exc}"
                log(f"{name}: not available ({self.unavailable[name]})")
        return ok

    def close(self) -> None:
        for w in self.workers:
            w.stop(timeout=5)
        if self.r is not None:
            self.r.close()
        if self.server is not None:
            self.server.stop()
        shutil.rmtree(self.tmp / "redis", ignore_errors=True)

    # ------------------------------------------------------------------ helpers

    def put(self, name: str, key: str, rnd: int, value: float | None) -> None:
        series = self.data.setdefault(name, {})
        row = series.setdefault(key, [None] * self.args.rounds)
        row[rnd] = value

    def note(self, name: str, text: str) -> None:
        notes = self.notes.setdefault(name, [])
        if text not in notes:
            notes.append(text)

    def fresh(self) -> None:
        self.r.flushall()

    def spawn(self, name: str, c: int, tag: str) -> WorkerProc:
        cmd = self.mods[name].worker_cmd(self.url, c)
        w = WorkerProc(cmd, self.env, self.logs / f"{name}-{tag}.log")
        self.workers.append(w)
        return w

    def stop(self, w: WorkerProc, name: str) -> None:
        w.stop(timeout=getattr(self.mods[name], "STOP_TIMEOUT", 15.0))
        if w in self.workers:
            self.workers.remove(w)

    # ------------------------------------------------------------------ measurements

    def processed(self, name: str, n: int, c: int | str, tag: str) -> float:
        """N jobs wait in the queue; start one worker (``c`` may be ``"CxP"``: P worker
        processes of concurrency C); jobs/s from the broker's own view of completion: the jobs
        completed between the first observed progress and the last."""
        mod = self.mods[name]
        conc, _, procs = str(c).partition("x")
        ws = [self.spawn(name, int(conc), f"{tag}-p{i}") for i in range(int(procs or 1))]
        w = ws[0]
        spawned = time.monotonic()
        first: tuple[float, int] | None = None
        last_rem, last_change = n, spawned
        try:
            while True:
                rem = mod.remaining(self.url, self.r, n)
                now = time.monotonic()
                if rem < 0:
                    raise RuntimeError(f"remaining={rem}: more completions than jobs")
                if first is None and rem < n:
                    first = (now, rem)
                if rem == 0:
                    # re-read once: a pop not yet recorded as in-flight must not end the run
                    time.sleep(0.02)
                    if mod.remaining(self.url, self.r, n) == 0:
                        done = now
                        break
                if rem != last_rem:
                    last_rem, last_change = rem, now
                for w in ws:
                    if not w.alive():
                        raise RuntimeError(f"worker exited ({w.proc.returncode}): {w.tail()}")
                if now - last_change > self.args.stall_timeout:
                    raise RuntimeError(
                        f"no progress for {self.args.stall_timeout:.0f}s ({rem} of {n} left): "
                        f"{w.tail()}"
                    )
                time.sleep(0.005)
            assert first is not None
            if first[1] > 0 and done > first[0]:
                return first[1] / (done - first[0])
            self.note(name, f"{tag}: all jobs done before the first poll; rate includes start-up")
            return n / (done - spawned)
        finally:
            if name in ECHOMQ:
                self.verify_echomq(n, tag if name == "echomq" else f"{name}-{tag}", name)
            for w in ws:
                self.stop(w, name)

    def verify_echomq(self, n: int, tag: str, name: str = "echomq") -> None:
        ok, text = self.mods[name].verify(self.url, n)
        self.verifications.append(f"{'ok' if ok else 'FAILED'} {tag}: {text}")
        if not ok:
            self.verify_failures += 1
            log(f"echomq verification FAILED ({tag}): {text}")

    def latency(self, name: str, c: int, tag: str) -> tuple[float, float]:
        mod = self.mods[name]
        self.fresh()
        w = self.spawn(name, c, tag)
        try:
            sent = mod.latency_send(self.url, self.r, self.args.rate, self.args.lat_seconds)
            deadline = time.monotonic() + 60
            while self.r.llen(LAT_KEY) < sent:
                if not w.alive():
                    raise RuntimeError(f"worker exited ({w.proc.returncode}): {w.tail()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {self.r.llen(LAT_KEY)} of {sent} latency samples")
                time.sleep(0.02)
            samples = []
            for item in self.r.lrange(LAT_KEY, 0, -1):
                enq, start = (float(x) for x in item.split())
                if enq > 0:
                    samples.append((start - enq) * 1000.0)
            samples.sort()
            if len(samples) < sent:
                raise RuntimeError(f"{len(samples)} samples for {sent} jobs")
            return statistics.median(samples), percentile(samples, 99)
        finally:
            self.stop(w, name)

    def run_system(self, name: str, rnd: int) -> None:
        a = self.args
        mod = self.mods[name]
        n = a.n
        tag = f"r{rnd + 1}"

        def attempt(key: str, fn: Any) -> Any:
            try:
                value = fn()
            except NotImplementedError:
                value = None
            except Exception as exc:
                self.errors += 1
                text = f"{key} ({tag}): {type(exc).__name__}: {str(exc).strip()[-600:]}"
                self.note(name, text)
                log(f"{name}: {text}")
                if a.verbose:
                    traceback.print_exc()
                value = None
            return value

        # 1. single enqueue (timed) -> those N jobs are processed at c=1
        self.fresh()
        secs = attempt("single", lambda: mod.enqueue_single(self.url, n))
        self.put(name, "single", rnd, n / secs if secs else None)
        if secs and unsupported(mod, 1) is None:
            value = attempt("c1", lambda: self.processed(name, n, 1, f"c1-{tag}"))
            self.put(name, "c1", rnd, value)
        # 2. bulk enqueue (timed, when the system has a bulk API) -> processed at c=10
        self.fresh()
        if mod.BULK:
            secs = attempt("bulk", lambda: mod.enqueue_bulk(self.url, n))
            self.put(name, "bulk", rnd, n / secs if secs else None)
        else:
            secs = attempt("fill", lambda: mod.enqueue_single(self.url, n))
        if secs and unsupported(mod, 10) is None:
            self.put(
                name, "c10", rnd, attempt("c10", lambda: self.processed(name, n, 10, f"c10-{tag}"))
            )
        # 3. echomq at its larger settings
        if name in ECHOMQ:
            bn = a.best_n
            for c in a.best:
                self.fresh()
                secs = attempt("fill", lambda: mod.enqueue_bulk(self.url, bn))
                if secs:
                    value = attempt(f"c{c}", lambda c=c: self.processed(name, bn, c, f"c{c}-{tag}"))
                    self.put(name, f"c{c}", rnd, value)
        # 3b. every peer at its larger settings (--peer-best), filled like c=10 above
        else:
            pn = a.peer_best_n
            fill = mod.enqueue_bulk if mod.BULK else mod.enqueue_single
            for c in a.peer_best:
                if unsupported(mod, int(c.partition("x")[0])) is not None:
                    continue  # the report gives the adapter's reason
                self.fresh()
                secs = attempt(f"fill c{c}", lambda: fill(self.url, pn))
                value = (
                    attempt(f"c{c}", lambda c=c: self.processed(name, pn, c, f"c{c}-{tag}"))
                    if secs
                    else None
                )
                self.put(name, f"c{c}", rnd, value)
        # 4. enqueue -> start latency at a steady rate, idle worker
        lat_c = 10 if unsupported(mod, 10) is None else 1
        res = attempt("latency", lambda: self.latency(name, lat_c, f"lat-{tag}"))
        self.put(name, "p50", rnd, res[0] if res else None)
        self.put(name, "p99", rnd, res[1] if res else None)
        # 5. echomq's limit rows (the EVALSHA one is the Lua path's only)
        if name == "echomq":
            self.put(name, "evalsha", rnd, attempt("evalsha", self.evalsha))
        if name in ECHOMQ:
            self.put(name, "lifecycle", rnd, attempt("lifecycle", lambda: self.lifecycle(name)))

    def evalsha(self) -> float | None:
        from echomq.protocol import calls as _protocol
        from echomq.protocol.scripts import SCRIPTS

        tool = shutil.which("redis-benchmark")
        if tool is None:
            self.note("echomq", "redis-benchmark not on PATH: no server claim scripts/s row")
            return None
        self.fresh()
        script = SCRIPTS["claim"]
        sha = self.r.script_load(script.source)
        if sha != script.sha:
            raise RuntimeError(f"SCRIPT LOAD gave {sha}, echomq computes {script.sha}")
        k = _protocol.Keys("bench")
        cmd = [
            tool, "-h", "127.0.0.1", "-p", str(self.server.port), "-n", str(self.args.evalsha_n),
            "-P", "16", "-q", "EVALSHA", sha, str(script.nkeys), k.meta, k.ring, k.active,
            k.base, "30000",
        ]  # fmt: skip
        self.evalsha_cmd = shlex.join([*cmd[:1], "-p", "PORT", *cmd[5:]])
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True)
        found = re.findall(r"([\d.]+) requests per second", out.stdout.replace("\r", "\n"))
        if not found:
            raise RuntimeError(f"unexpected redis-benchmark output: {out.stdout[-500:]}")
        if self.r.zcard(k.active) != 0:
            raise RuntimeError("the claim script claimed something on an empty queue")
        return float(found[-1])

    def lifecycle(self, name: str = "echomq") -> float:
        self.fresh()
        rate, text = self.mods[name].lifecycle_loop(self.url, self.args.lifecycle_n)
        ok = text.startswith("ok")
        self.verifications.append(f"{'ok' if ok else 'FAILED'} lifecycle: {text}")
        if not ok:
            self.verify_failures += 1
        return float(rate)

    # ------------------------------------------------------------------ the run

    def run(self, names: list[str]) -> None:
        if not names:
            return
        for rnd in range(self.args.rounds):
            order = names[rnd % len(names) :] + names[: rnd % len(names)]
            log(f"round {rnd + 1}/{self.args.rounds}: {', '.join(order)}")
            for name in order:
                t0 = time.monotonic()
                self.run_system(name, rnd)
                got = self.data.get(name, {})
                larger = [k for k in settings(self, name) if k not in ("c1", "c10")]
                keys = [k for k, *_ in METRICS] + larger
                vals = [(k, got[k][rnd] if k in got else None) for k in keys]
                shown = ", ".join(f"{k}={fmt(v)}" for k, v in vals)
                log(f"  {name:<12} {time.monotonic() - t0:5.1f}s  {shown}")


def git(*args: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


# --------------------------------------------------------------------------- statistics


def percentile(sorted_values: list[float], p: float) -> float:
    """Linear-interpolated percentile of an already sorted list."""
    if not sorted_values:
        raise ValueError("no samples")
    pos = (len(sorted_values) - 1) * p / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def med(values: list[float | None] | None) -> float | None:
    vals = [v for v in values or [] if v is not None]
    return statistics.median(vals) if vals else None


def ratios(ours: list[float | None], theirs: list[float | None]) -> list[float | None]:
    return [
        (a / b) if (a is not None and b is not None and b > 0) else None
        for a, b in zip(ours, theirs, strict=False)
    ]


def unsupported(mod: ModuleType, c: int) -> str | None:
    """Why the adapter cannot run its worker at concurrency ``c`` (None: it can). An adapter
    lists reasons per concurrency in ``CONCURRENCY``; ``MAX_CONCURRENCY = (top, why)`` covers
    every concurrency above ``top`` (rq: one job at a time, whatever -c is asked for)."""
    why: str | None = mod.CONCURRENCY.get(c)
    top = getattr(mod, "MAX_CONCURRENCY", None)
    if why is None and top is not None and c > top[0]:
        why = top[1]
    return why


def setting_order(key: str) -> tuple[int, int]:
    m = SETTING.fullmatch(key)
    assert m is not None, key
    return int(m[1]) * int(m[2] or 1), int(m[2] or 1)


def settings(b: Bench, name: str) -> list[str]:
    """The processed/s keys measured for ``name`` (c1, c10, c50, c50x2 ...), in -c order."""
    keys = [k for k in b.data.get(name, {}) if SETTING.fullmatch(k)]
    return sorted(keys, key=setting_order)


def top_of(pairs: list[tuple[str, float | None]]) -> Best | None:
    """The (setting, value) pair with the highest value, values None or 0 left out."""
    good: list[Best] = [(k, v) for k, v in pairs if v]
    return max(good, key=lambda kv: kv[1]) if good else None


def best_setting(b: Bench, name: str) -> Best | None:
    """The setting with the highest median processed/s over rounds, and that median."""
    return top_of([(k, med(b.data[name][k])) for k in settings(b, name)])


def best_per_round(b: Bench, name: str) -> list[Best | None]:
    """Per round: the setting with the highest processed/s in that round, and its value."""
    keys = settings(b, name)
    return [top_of([(k, b.data[name][k][rnd]) for k in keys]) for rnd in range(b.args.rounds)]


def setting_label(key: str) -> str:
    return f"`-c {key[1:]}`"


def _fastest(systems: dict[str, list[Best | None]], rnd: int) -> tuple[str, Best] | None:
    top: tuple[str, Best] | None = None
    for name, per_round in systems.items():
        got = per_round[rnd]
        if got is not None and (top is None or got[1] > top[1][1]):
            top = (name, got)
    return top


def best_ratios(b: Bench, names: list[str], ours: str) -> list[dict[str, Any]]:
    """Per round: ``ours``'s best processed/s over the fastest Python peer's best and over
    BullMQ Node's best in the same round (each at the setting that was best in that round)."""
    mine = best_per_round(b, ours)
    pys = {p: best_per_round(b, p) for p in names if p in PYTHON_PEERS}
    nodes = {p: best_per_round(b, p) for p in names if p in NODE}
    rows = []
    for rnd in range(b.args.rounds):
        own = mine[rnd]
        row: dict[str, Any] = {"round": rnd + 1, "ours": own}
        for key, systems in (("python", pys), ("node", nodes)):
            other = _fastest(systems, rnd)
            row[key] = other
            ratio = None
            if own is not None and other is not None and other[1][1] > 0:
                ratio = own[1] / other[1][1]
            row[f"vs_{key}"] = ratio
        rows.append(row)
    return rows


def fmt(v: float | None, digits: int = 0) -> str:
    if v is None:
        return "—"
    if digits == 0:
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.1f}"
    return f"{v:,.{digits}f}"


def fmt_ratio(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}x"


# --------------------------------------------------------------------------- report


def machine_note() -> list[str]:
    cpu = platform.processor() or ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return [
        f"{os.cpu_count()} cores ({cpu}), shared and noisy; load average at start {load}",
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}",
    ]


def versions(b: Bench, names: list[str]) -> dict[str, str]:
    out = {}
    for name in names:
        try:
            out[name] = b.mods[name].version()
        except Exception as exc:
            out[name] = f"? ({exc})"
    return out


def tool_version(cmd: list[str]) -> str:
    with contextlib.suppress(Exception):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
        return out.stdout.strip()
    return "?"


def label(b: Bench, name: str) -> str:
    mod = b.mods.get(name)
    return getattr(mod, "LABEL", name) if mod else name


def cell(b: Bench, name: str, key: str) -> str:
    mod = b.mods[name]
    if key == "bulk" and not mod.BULK:
        return "n/a (no bulk API)"
    if key in ("c1", "c10") and unsupported(mod, int(key[1:])):
        return "n/a¹"
    return fmt(med(b.data.get(name, {}).get(key)))


def chart(b: Bench, names: list[str], path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return f"no chart: {exc}"
    labels = [label(b, n) for n in names]
    c1 = [med(b.data.get(n, {}).get("c1")) or 0.0 for n in names]
    c10 = [med(b.data.get(n, {}).get("c10")) or 0.0 for n in names]
    # each system's best larger setting (echomq: --best, the peers: --peer-best)
    larger: list[tuple[str, float]] = []
    for n in names:
        keys = [k for k in settings(b, n) if k not in ("c1", "c10")]
        larger.append(top_of([(k, med(b.data[n][k])) for k in keys]) or ("", 0.0))
    x = list(range(len(labels)))
    fig, ax = plt.subplots(figsize=(12, 5.5), dpi=110)
    w = 0.27
    bars = [
        ax.bar([i - w for i in x], c1, w, label="concurrency 1", color="#8fb3d9"),
        ax.bar(x, c10, w, label="concurrency 10", color="#1f5fa8"),
        ax.bar(
            [i + w for i in x],
            [v for _, v in larger],
            w,
            label="best larger setting (echomq: --best, peers: --peer-best)",
            color="#c0392b",
        ),
    ]
    for g, group in enumerate(bars):
        for i, rect in enumerate(group):
            h = rect.get_height()
            if h:
                ax.annotate(
                    f"{h:,.0f}" + (f" {larger[i][0]}" if g == 2 else ""),
                    (rect.get_x() + rect.get_width() / 2, h),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    rotation=90,
                    xytext=(0, 2),
                    textcoords="offset points",
                )
    top = max([*c1, *c10, *(v for _, v in larger), 1.0])
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=20, ha="right")
    ax.set_ylabel("no-op jobs processed per second (one worker process)")
    ax.set_title(
        f"Processed/s, median of {b.args.rounds} interleaved rounds, N={b.args.n} "
        f"(larger settings: echomq N={b.args.best_n}, peers N={b.args.peer_best_n}; "
        f"{dt.date.today().isoformat()})"
    )
    ax.legend(loc="upper right")
    ax.grid(axis="y", alpha=0.3)
    ax.set_ylim(0, top * 1.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return None


def tried(b: Bench, name: str) -> list[str]:
    """The processed/s settings the run asks of ``name``, as keys (c1, c10, c50, c50x2 ...)."""
    extra = b.args.best if name in ECHOMQ else b.args.peer_best
    return sorted(dict.fromkeys(f"c{c}" for c in ("1", "10", *extra)), key=setting_order)


def fmt_best(got: Best | None) -> str:
    return "—" if got is None else f"{fmt(got[1])} ({setting_label(got[0])})"


def best_section(b: Bench, names: list[str]) -> list[str]:
    """Processed/s at each system's best measured setting, and echomq's best over the fastest
    Python peer's best and over BullMQ Node's best, per round then the median."""
    a = b.args
    peers = [n for n in names if n not in ECHOMQ]
    larger = "/".join(a.peer_best)
    lines = [
        "## Processed/s at each system's best setting",
        "",
        "Every system's worker ran at `-c 1` and `-c 10` (N jobs each) and at larger settings: "
        + (
            f"echomq at `--best` `-c {'/'.join(a.best)}` with N={a.best_n}, "
            if a.best and any(n in ECHOMQ for n in names)
            else ""
        )
        + (
            f"every peer at `--peer-best` `-c {larger}` with N={a.peer_best_n} (the queue "
            "filled as for `-c 10`: the peer's bulk API when it has one, else its single "
            "enqueue), where the adapter supports that setting. "
            if larger
            else "the peers at no larger setting (`--peer-best ''`). "
        )
        + "A system's figure is the highest of its per-setting medians over rounds. The ratios "
        "are computed per round, each system at whichever of its settings was fastest in that "
        "round, the fastest Python peer picked per round among the Python peers measured ("
        + (", ".join(label(b, n) for n in peers if n in PYTHON_PEERS) or "none")
        + "), then the median over rounds.",
        "",
        "| system | processed/s per setting (median) | best setting | processed/s at best "
        "| per round: best (setting) |",
        "|---|---|---|---:|---|",
    ]
    why_not: list[str] = []
    for name in names:
        mod = b.mods[name]
        cells = []
        for key in tried(b, name):
            why = unsupported(mod, int(key[1:].partition("x")[0]))
            if why:
                cells.append(f"{setting_label(key)} n/a")
                why_not.append(f"{label(b, name)} {setting_label(key)}: {why}")
            else:
                cells.append(f"{setting_label(key)} {fmt(med(b.data.get(name, {}).get(key)))}")
        best = best_setting(b, name) if name in b.data else None
        per_round = best_per_round(b, name) if name in b.data else []
        lines.append(
            f"| {label(b, name)} | {' · '.join(cells)} | "
            f"{setting_label(best[0]) if best else '—'} | {fmt(best[1] if best else None)} | "
            f"{', '.join(fmt_best(x) for x in per_round)} |"
        )
    lines.append("")
    if why_not:
        lines += ["Settings not run (the adapter's reason):", ""]
        lines += [f"- {w}" for w in why_not]
        lines.append("")
    if any("x" in c for c in (*a.best, *a.peer_best)):
        lines += ["`CxP` is P worker processes of `-c C` each; the other settings use one.", ""]
    for ours in (n for n in names if n in ECHOMQ):
        rows = best_ratios(b, names, ours)
        me = label(b, ours)
        node = label(b, NODE[0]) if NODE[0] in b.mods else "BullMQ (Node)"
        lines += [
            f"### {me}'s best ÷ the peers' best, per round",
            "",
            f"| round | {me} best | fastest Python peer's best | ÷ fastest Python peer | "
            f"{node} best | ÷ {node} |",
            "|---:|---:|---|---:|---:|---:|",
        ]
        for row in rows:
            py = row["python"]
            lines.append(
                f"| {row['round']} | {fmt_best(row['ours'])} | "
                f"{f'{label(b, py[0])} {fmt_best(py[1])}' if py else '—'} | "
                f"{fmt_ratio(row['vs_python'])} | "
                f"{fmt_best(row['node'][1]) if row['node'] else '—'} | "
                f"{fmt_ratio(row['vs_node'])} |"
            )
        vs_py = med([r["vs_python"] for r in rows])
        vs_node = med([r["vs_node"] for r in rows])
        lines.append(f"| median | | | **{fmt_ratio(vs_py)}** | | **{fmt_ratio(vs_node)}** |")
        fastest = [label(b, r["python"][0]) for r in rows if r["python"]]
        named = ", ".join(
            f"{p} in {fastest.count(p)} of {len(rows)} round{'s' * (len(rows) > 1)}"
            for p in dict.fromkeys(fastest)
        )
        lines += [
            "",
            f"Median over rounds: {me}'s best processed/s is **{fmt_ratio(vs_py)}** the fastest "
            f"Python peer's best ({named or 'no Python peer measured'}) and "
            f"**{fmt_ratio(vs_node)}** {node}'s best"
            + ("" if any(n in NODE for n in names) else f" ({node} not measured in this run)")
            + ". The issue's targets: ≥ 15x and ≥ 5x.",
            "",
        ]
    return lines


def report(b: Bench, names: list[str], command: str, started: float, out: Path) -> str:
    a = b.args
    vers = versions(b, names)
    lines = [
        "# echomq side-by-side benchmark",
        "",
        f"- date: {dt.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}, "
        f"wall time {(time.monotonic() - started) / 60:.1f} min",
        *[f"- machine: {m}" for m in machine_note()],
        f"- server: {tool_version([b.server.command()[0], '--version'])}, started by the bench "
        "(no persistence, loopback TCP), FLUSHALL before every measurement",
        f"- command: `{command}`",
        f"- echomq measured: {b.echomq_source}, copied at the start so every round ran the "
        "same code",
        f"- N = {a.n} no-op jobs per measurement, {a.rounds} interleaved rounds (the order "
        "rotates each round), medians over rounds; latency at a steady "
        f"{a.rate:g} jobs/s for {a.lat_seconds:g} s with an idle worker",
        "",
        "## Results (medians)",
        "",
        "| system | version | " + " | ".join(t for _, t, _ in METRICS) + " |",
        "|---|---|" + "---:|" * len(METRICS),
    ]
    for name in names:
        row = [label(b, name), vers.get(name, "?")] + [cell(b, name, k) for k, *_ in METRICS]
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "Throughput is jobs per second (higher is better); latency is enqueue → handler start in "
        "milliseconds (lower is better), measured with the worker at concurrency 10 (rq: 1).",
        "¹ rq's SimpleWorker runs one job at a time in one process; rq has no in-process "
        "concurrency, so it has no c=10 figure.",
        "",
    ]
    if "echomq" in names:
        e = b.data.get("echomq", {})
        shown = [n for n in ECHOMQ if n in names]
        lines += [
            "### echomq at larger concurrency",
            "",
            f"The `-c {'/'.join(map(str, a.best))}` runs use N={a.best_n} so that they last long "
            "enough to time (c=1 and c=10 use N as above); `CxP` is P worker processes of "
            "`-c C` each.",
            "",
            "| setting | "
            + " | ".join(f"{label(b, n)} (median) | per round" for n in shown)
            + " |",
            "|---|" + "---:|---|" * len(shown),
        ]
        for c in (1, 10, *a.best):
            cells = []
            for n in shown:
                rounds = b.data.get(n, {}).get(f"c{c}", [])
                cells.append(f"{fmt(med(rounds))} | {', '.join(fmt(x) for x in rounds)}")
            lines.append(f"| `-c {c}` | " + " | ".join(cells) + " |")
        for n in shown:
            good = {c: med(b.data.get(n, {}).get(f"c{c}")) for c in a.best}
            good = {c: v for c, v in good.items() if v}
            if good:
                c = max(good, key=lambda k: good[k])
                lines += ["", f"Best setting of {label(b, n)}: `-c {c}` at {fmt(good[c])} jobs/s."]
        lines += [
            "",
            "## Limit rows (echomq)",
            "",
            "| limit | median | per round |",
            "|---|---:|---|",
            f"| server claim scripts/s (redis-benchmark EVALSHA of `claim`, empty queue, "
            f"-n {a.evalsha_n} -P 16) | {fmt(med(e.get('evalsha')))} | "
            f"{', '.join(fmt(x) for x in e.get('evalsha', []))} |",
            f"| one-process lifecycle limit, lifecycles/s (enqueue → claim → complete from "
            f"`protocol.calls` Calls, pipelined 100 at a time, N={a.lifecycle_n}) | "
            f"{fmt(med(e.get('lifecycle')))} | "
            f"{', '.join(fmt(x) for x in e.get('lifecycle', []))} |",
            *(
                f"| the same, {label(b, n)} | {fmt(med(b.data.get(n, {}).get('lifecycle')))} | "
                f"{', '.join(fmt(x) for x in b.data.get(n, {}).get('lifecycle', []))} |"
                for n in shown[1:]
            ),
            "",
            f"redis-benchmark command: `{getattr(b, 'evalsha_cmd', 'n/a')}` (after SCRIPT LOAD "
            "of `echomq.protocol.scripts.SCRIPTS['claim'].source`).",
            "",
            "### echomq verification",
            "",
            "After every echomq processed run the bench ran `Queue('bench').check()` and read "
            "`counts()`: "
            + (
                f"**all {len(b.verifications)} checks passed** (`check() == []`, "
                f"`completed == N`, nothing pending)."
                if b.verify_failures == 0 and b.verifications
                else f"**{b.verify_failures} of {len(b.verifications)} checks FAILED**."
            ),
            "",
            "<details><summary>each check</summary>",
            "",
            *[f"- {v}" for v in b.verifications],
            "",
            "</details>",
            "",
        ]
        peers = [n for n in names if n != "echomq"]
        if peers:
            lines += [
                "## Ratios echomq / peer (computed per round, then the median)",
                "",
                "Above 1x echomq is faster for throughput; for latency below 1x means echomq's "
                "latency is lower.",
                "",
                "| peer | " + " | ".join(t for _, t, _ in METRICS) + " |",
                "|---|" + "---:|" * len(METRICS),
            ]
            for p in peers:
                row = [label(b, p)]
                for k, *_ in METRICS:
                    rs = ratios(e.get(k, []), b.data.get(p, {}).get(k, []))
                    row.append(fmt_ratio(med(rs)))
                lines.append("| " + " | ".join(row) + " |")
            lines += ["", "<details><summary>per-round ratios</summary>", ""]
            for p in peers:
                for k, title, _ in METRICS:
                    rs = ratios(e.get(k, []), b.data.get(p, {}).get(k, []))
                    if any(x is not None for x in rs):
                        lines.append(
                            f"- {label(b, p)}, {title}: " + ", ".join(fmt_ratio(x) for x in rs)
                        )
            lines += ["", "</details>", ""]
    lines += best_section(b, names)
    if out.suffix == ".md" and not a.smoke:
        lines += ["## Processed/s", "", "![processed/s per system](processed.png)", ""]
    lines += ["## Settings per system", ""]
    for name in names:
        lines.append(f"- **{label(b, name)}** — {b.mods[name].SETTINGS}")
    lines += [
        "",
        "Common to all: one worker process (plus the launcher process some CLIs keep: "
        "dramatiq's and taskiq's supervisors), no-op handler, logging at WARNING, started after "
        "the N jobs are queued; processed/s = jobs completed between the first and the last "
        "observation of the broker's own completion state (polled every 5 ms), so worker "
        "start-up is not counted. The latency handler records `time.time()` at entry and "
        "RPUSHes it with the job's enqueue timestamp to `bench:lat` on the bench server.",
        "",
        "## Problems and omissions",
        "",
    ]
    problems = [f"- {label(b, n)}: not run — {why}" for n, why in b.unavailable.items()]
    for name in names:
        problems += [f"- {label(b, name)}: {t}" for t in b.notes.get(name, [])]
    lines += problems or ["- none: every system ran every measurement in every round."]
    lines += [
        "",
        "## How to reproduce",
        "",
        "```sh",
        "bash bench/setup.sh  # peers into bench/.venv (+ .venv-arq), BullMQ into bench/node",
        "# the full run: writes bench/RESULTS.md, bench/results.json and bench/processed.png",
        f"bench/.venv/bin/python bench/run.py --rounds {a.rounds} --n {a.n}",
        "# a subset, quicker",
        "bench/.venv/bin/python bench/run.py --only echomq,bullmq_node --rounds 1 --n 5000",
        "# the CI smoke: ~5 s, echomq only, the project's own environment",
        "python bench/run.py --smoke",
        "```",
        "",
        "Raw per-round numbers: `bench/results.json`. Worker logs: `bench/.run/logs/`. The "
        "bench never touches a server it did not start.",
        "",
    ]  # fmt: skip
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--n", type=int, default=20_000, help="jobs per measurement")
    p.add_argument("--only", default="", help="comma-separated systems: " + ",".join(SYSTEMS))
    p.add_argument("--smoke", action="store_true", help="~5 s echomq-only run (CI)")
    p.add_argument("--rate", type=float, default=100.0, help="latency run: jobs/s")
    p.add_argument("--lat-seconds", type=float, default=5.0, help="latency run: seconds")
    p.add_argument(
        "--best",
        default=",".join(map(str, BEST)),
        help="echomq's extra settings: -c values, or CxP for P worker processes of -c C",
    )
    p.add_argument(
        "--best-n", type=int, default=None, help="jobs for echomq's larger -c runs (max(N, 50000))"
    )
    p.add_argument(
        "--peer-best",
        default=",".join(map(str, PEER_BEST)),
        help="every peer's extra settings (not echomq's: see --best), same form as --best;\n"
        "'' runs the peers at -c 1 and -c 10 only",
    )
    p.add_argument(
        "--peer-best-n", type=int, default=None, help="jobs for the peers' --peer-best runs (N)"
    )
    p.add_argument("--evalsha-n", type=int, default=200_000)
    p.add_argument("--lifecycle-n", type=int, default=50_000)
    p.add_argument("--stall-timeout", type=float, default=90.0)
    p.add_argument("--out", default=None, help="report path (default bench/RESULTS.md)")
    p.add_argument(
        "--echomq-rev",
        default="HEAD",
        help="echomq source to measure: a git revision (default HEAD), 'worktree', or 'installed'",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    if a.smoke:
        a.only, a.rounds, a.n = a.only or "echomq", 1, min(a.n, 300)
        a.lat_seconds, a.evalsha_n, a.lifecycle_n = 0.5, 5_000, 1_000
        a.best = "50"
        a.stall_timeout = 20.0
    # An entry is a concurrency, or CxP: P worker processes of concurrency C each.
    for opt in ("best", "peer_best"):
        vals = list(dict.fromkeys(x.strip() for x in str(getattr(a, opt)).split(",")))
        vals = [x for x in vals if x]
        bad = [x for x in vals if not SETTING.fullmatch(f"c{x}")]
        if bad:
            p.error(
                f"--{opt.replace('_', '-')} takes concurrencies or CxP (P processes), got {bad}"
            )
        setattr(a, opt, vals)
    # -c 1 and -c 10 are measured for every system anyway
    a.peer_best = [x for x in a.peer_best if x not in ("1", "10")]
    if a.best_n is None:
        a.best_n = a.n if a.smoke else max(a.n, 50_000)
    if a.peer_best_n is None:
        a.peer_best_n = a.n
    return a


# Sections other benchmarks own in RESULTS.md (bench/verbs.py, bench/cluster.py): a rerun of
# this bench rewrites its own part and keeps theirs.
KEPT_SECTIONS = ("## Targets and where the time goes", "## Protocol verbs", "## Cluster")


# RESULTS.md opens with the current figures (bench/cpu.py's CPU per job, issue 38); this
# bench's side by side goes under the "# History" heading, after what stands above it.
HISTORY = "# History\n"


def _current_head(path: Path) -> str:
    if not path.exists():
        return ""
    old = path.read_text()
    at = old.find("\n" + HISTORY)
    return old[: at + 1 + len(HISTORY)] + "\n" if at >= 0 else ""


def _kept_sections(path: Path) -> str:
    if not path.exists():
        return ""
    old = path.read_text()
    starts = [old.find(h) for h in KEPT_SECTIONS if old.find(h) >= 0]
    return "\n" + old[min(starts) :] if starts else ""


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    started = time.monotonic()
    names = [s.strip() for s in a.only.split(",") if s.strip()] if a.only else list(SYSTEMS)
    unknown = [s for s in names if s not in SYSTEMS]
    if unknown:
        print(f"unknown systems: {', '.join(unknown)} (known: {', '.join(SYSTEMS)})")
        return 2
    if "echomq" in names:
        names = ["echomq"] + [s for s in names if s != "echomq"]
    exe = Path(sys.executable)
    with contextlib.suppress(ValueError):
        exe = exe.relative_to(ROOT) if exe.is_absolute() else exe
    if exe.name.startswith("python") and not str(exe).startswith("bench/"):
        exe = Path("python")
    command = shlex.join([str(exe), "bench/run.py", *(argv if argv is not None else sys.argv[1:])])
    b = Bench(a)
    ok: list[str] = []
    try:
        b.pin_echomq()
        b.start_server(native="echomq_native" in names)
        ok = b.load(names)
        if "echomq_native" in names and "echomq" in b.mods:
            b.mods["echomq"].EXECUTOR = "lua"  # type: ignore[attr-defined]  # asked for: the module is loaded
        if "echomq" in b.mods:
            where = Path(b.mods["echomq"].echomq.__file__).resolve()
            log(f"echomq imported from {where}")
        log(f"systems: {', '.join(ok)}; N={a.n}, rounds={a.rounds}")
        b.run(ok)
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        b.close()
    text = report(b, ok, command, started, Path(a.out or "RESULTS.md"))
    if a.smoke:
        print(text)
        shutil.rmtree(b.tmp, ignore_errors=True)
    else:
        out = Path(a.out) if a.out else BENCH / "RESULTS.md"
        out.write_text(_current_head(out) + text + _kept_sections(out))
        (BENCH / "results.json").write_text(
            json.dumps(
                {
                    "command": command,
                    "echomq": b.echomq_source,
                    "n": a.n,
                    "rounds": a.rounds,
                    "best": a.best,
                    "best_n": a.best_n,
                    "peer_best": a.peer_best,
                    "peer_best_n": a.peer_best_n,
                    "data": b.data,
                    "best_setting": {
                        n: {
                            "setting": (best := best_setting(b, n)) and best[0],
                            "median": best and best[1],
                            "per_round": best_per_round(b, n),
                        }
                        for n in ok
                        if n in b.data
                    },
                    "best_ratios": {n: best_ratios(b, ok, n) for n in ok if n in ECHOMQ},
                    "notes": b.notes,
                    "unavailable": b.unavailable,
                    "verifications": b.verifications,
                },
                indent=1,
            )
            + "\n"
        )
        problem = chart(b, ok, BENCH / "processed.png")
        if problem:
            log(problem)
        log(f"wrote {out} and bench/processed.png in {(time.monotonic() - started) / 60:.1f} min")
    if b.verify_failures:
        log(f"{b.verify_failures} echomq verification(s) failed")
        return 1
    if a.smoke and b.errors:
        log(f"{b.errors} measurement(s) failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
