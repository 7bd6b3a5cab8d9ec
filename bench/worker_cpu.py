"""The worker process's CPU per no-op job (issue 41), measured the way users run a worker.

    python bench/worker_cpu.py [--n 20000] [--rounds 3] [--modes async:200,async:50,inline:200]
                               [--log-level WARNING] [--src LABEL=PATH ...]

Each run starts a fresh server (``EmbeddedServer``, AOF off), enqueues ``n`` no-op jobs in
bulk (``enqueue_many``), then starts one ``echomq worker MODULE:app -c C`` process. The
handler reads the process's own CPU (``getrusage``: user + system, children included) at
its first call and at its n-th, and the worker is stopped with SIGTERM; the figure is that
CPU divided by the n - 1 jobs in between (start-up and shutdown are left out). The "whole
process" figure is the worker's CPU from exec to exit (``wait4``) divided by n. Modes:
``async:C`` (an ``async def`` handler, concurrency C) and ``inline:C`` (a sync handler with
``inline=True``). Rounds are interleaved over modes and sources; the median of each is
printed, with the spread and jobs/s.

``--src LABEL=PATH`` runs the worker (and the enqueue) on another ``src`` tree, e.g. one of
``git archive v0.1.0 src | tar -x -C /tmp/v010``; the default is this checkout's.
``--profile DIR`` runs each worker under py-spy (``pip install py-spy``; sampling, so the
CPU figures barely move) and writes its raw stacks there, one file per run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from echomq.server import EmbeddedServer

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"

_HANDLERS = """
import gc, json, os, resource, signal, time
import echomq

N = int(os.environ["CPU_N"])
app = echomq.App(os.environ["CPU_URL"])
_seen = 0
_first = None
_gc = [0.0, 0.0, 0]  # CPU seconds in the cyclic collector, when the current one began, runs


def _gc_timer(phase, info):
    if phase == "start":
        _gc[1] = time.thread_time()
    else:
        _gc[0] += time.thread_time() - _gc[1]
        _gc[2] += 1


gc.callbacks.append(_gc_timer)


def _cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def _tick():
    global _seen, _first
    _seen += 1
    if _seen == 1:
        _first = (_cpu(), time.perf_counter(), _gc[0], _gc[2])
    elif _seen == N:
        cpu, wall = _cpu(), time.perf_counter()
        with open(os.environ["CPU_OUT"], "w") as f:
            gc_s, runs = _gc[0] - _first[2], _gc[2] - _first[3]
            got = {"cpu": cpu - _first[0], "wall": wall - _first[1], "gc": gc_s, "runs": runs}
            json.dump(got, f)
        os.kill(os.getpid(), signal.SIGTERM)


if os.environ["CPU_KIND"] == "inline":

    @app.task(queue="cpu", name="noop", inline=True)
    def noop():
        _tick()

else:

    @app.task(queue="cpu", name="noop")
    async def noop():
        _tick()


def fill():
    with echomq.Queue("cpu", url=os.environ["CPU_URL"]) as q:
        for i in range(0, N, 5000):
            q.enqueue_many([b'["noop",[]]'] * min(5000, N - i))
"""


def one_run(
    src: Path, kind: str, c: int, n: int, log_level: str, profile: Path | None
) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        srv = EmbeddedServer(Path(tmp) / "data", appendonly=False)
        srv.start()
        try:
            Path(tmp, "cpujobs.py").write_text(_HANDLERS)
            out = Path(tmp) / "out.json"
            env = dict(
                os.environ,
                PYTHONPATH=f"{src}{os.pathsep}{tmp}",
                CPU_N=str(n),
                CPU_URL=srv.url,
                CPU_KIND=kind,
                CPU_OUT=str(out),
            )
            subprocess.run(
                [sys.executable, "-c", "import cpujobs; cpujobs.fill()"], env=env, check=True
            )
            cmd = [sys.executable]
            if profile is not None:  # py-spy (sampling, CPU time only, --idle off)
                prof = profile / f"{src.parent.name}-{kind}-{c}-{time.time_ns()}.txt"
                spy = Path(sys.executable).with_name("py-spy")
                cmd = [str(spy), "record", "-r", "1000", "--nonblocking", "--format", "raw"]
                cmd += ["-o", str(prof), "--", sys.executable]
            cmd += ["-m", "echomq", "worker", "cpujobs:app", "-c", str(c)]
            cmd += ["--log-level", log_level]
            with open(Path(tmp) / "worker.log", "w") as logf:
                proc = subprocess.Popen(cmd, env=env, cwd=tmp, stdout=logf, stderr=logf)
                deadline = time.monotonic() + 600
                while (done := os.wait4(proc.pid, os.WNOHANG))[0] == 0:
                    if time.monotonic() > deadline:
                        proc.send_signal(signal.SIGKILL)
                    time.sleep(0.05)
                proc.returncode = 0  # reaped by wait4
                whole = done[2].ru_utime + done[2].ru_stime
            if not out.exists():
                raise SystemExit(Path(tmp, "worker.log").read_text()[-3000:])
            got = json.loads(out.read_text())
        finally:
            srv.stop()
    return {
        "us": got["cpu"] / (n - 1) * 1e6,
        "whole": whole / n * 1e6,
        "gc": got["gc"] / (n - 1) * 1e6,
        "gc_runs": got["runs"],
        "rate": (n - 1) / got["wall"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="async:200,async:50,inline:200")
    ap.add_argument("--log-level", default="WARNING")  # the CPU bench's (bench/peers/echomq.py)
    ap.add_argument("--src", action="append", default=[], help="LABEL=PATH of a src tree")
    ap.add_argument("--profile", type=Path, default=None)
    a = ap.parse_args()
    srcs = [tuple(s.split("=", 1)) for s in a.src] or [("this", str(SRC))]
    modes = [(k, int(c)) for k, c in (m.split(":") for m in a.modes.split(","))]
    if a.profile is not None:
        a.profile.mkdir(parents=True, exist_ok=True)
    got: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    for rnd in range(a.rounds):
        for kind, c in modes:
            for label, path in srcs:
                r = one_run(Path(path), kind, c, a.n, a.log_level, a.profile)
                got.setdefault((label, kind, c), []).append(r)
                print(
                    f"round {rnd + 1} {label:>8} {kind}:{c:<4} {r['us']:6.1f} us/job "
                    f"(whole process {r['whole']:5.1f}; gc {r['gc']:4.1f} in {r['gc_runs']} runs) "
                    f"{r['rate']:8.0f} jobs/s",
                    flush=True,
                )
    print(f"\nmedians of {a.rounds} (n={a.n}, --log-level {a.log_level})")
    for (label, kind, c), rs in got.items():
        us = [r["us"] for r in rs]
        rate = statistics.median(r["rate"] for r in rs)
        whole = statistics.median(r["whole"] for r in rs)
        print(
            f"{label:>8} {kind}:{c:<4} {statistics.median(us):6.1f} us/job "
            f"(min {min(us):.1f}, max {max(us):.1f}; whole process {whole:.1f}) "
            f"{rate:8.0f} jobs/s"
        )


if __name__ == "__main__":
    main()
