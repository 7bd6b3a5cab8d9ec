"""The CI smokes of the benchmarks: ``python bench/run.py --smoke`` (the side by side) and
``python bench/cpu.py --smoke`` (CPU per job): echomq only, tiny N, one round, their own
redis-server; each must finish and exit 0 in the project's own environment, without the peers
installed, and report sane figures (no speed asserts: the box is shared)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _smoke(script: str, timeout: float) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("ECHOMQ_URL", "BENCH_URL")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--smoke"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout


def test_bench_smoke() -> None:
    out = _smoke("run.py", 60)
    assert "all " in out and "checks passed" in out
    assert "| echomq |" in out


# A row of bench/cpu.py's table: label | jobs/s | server | worker | **total** | producer |
CPU_ROW = re.compile(
    r"^\| (echomq lua, [^|]+) \| ([\d,]+) \| ([\d.]+) \| ([\d.]+) "
    r"\| \*\*([\d.]+)\*\* \| ([\d.]+) \|",
    re.M,
)


def test_bench_cpu_smoke() -> None:
    out = _smoke("cpu.py", 120)
    rows = {
        m[1]: [float(x.replace(",", "")) for x in m.groups()[1:]] for m in CPU_ROW.finditer(out)
    }
    assert set(rows) == {"echomq lua, async no-op, c=50", "echomq lua, inline sync, c=50"}, out
    for label, (jobs_s, server, worker, total, producer) in rows.items():
        assert jobs_s > 0, label
        # Each share is a real measurement from the scheduler's counters: more than nothing,
        # less than 10 ms a job.
        for share in (server, worker, producer):
            assert 0.5 < share < 10_000, (label, share)
        assert abs(total - (server + worker)) < 0.2, (label, total, server, worker)
    assert "2 of 2 passed" in out  # check() after every drain
    assert re.search(r"ratio per round \*\*\d+\.\d\d\*\*", out), out  # the limit(3) row
    m = re.search(r"Bytes per waiting job at N=2,000: echomq (\d+)", out)
    assert m is not None and 100 < int(m[1]) < 5_000, out
