"""The CI smoke of the side-by-side benchmark: ``python bench/run.py --smoke`` (echomq only,
tiny N, one round, its own redis-server) must finish and exit 0 in the project's own
environment, without the peers installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_smoke() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("ECHOMQ_URL", "BENCH_URL")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--smoke"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "all " in proc.stdout and "checks passed" in proc.stdout
    assert "| echomq |" in proc.stdout
