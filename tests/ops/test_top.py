"""``echomq top``: the frame shows every queue's sets, rates between two frames, lanes and
lease health, from one snapshot of the real server."""

from __future__ import annotations

import time

from rich.console import Console

import echomq
from echomq import top
from echomq.client.executor import SyncExecutor
from echomq.ops import snapshots as _inspect


def _text(frame: object) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(frame)
    return console.export_text()


def test_frame_shows_sets_rates_lanes_and_leases(q: echomq.Queue) -> None:
    for _ in range(3):
        q.enqueue(b"x")
    q.enqueue(b"y", group="g1")
    q.pause_lane("g1")
    x = SyncExecutor(q.client, retry_for=0)
    previous: dict[str, tuple[float, int, int]] = {}
    first = _text(top.render("u", _inspect.snapshot(x, [q.name]), previous, 100.0))
    assert q.name in first and "…" in first  # no rate before a second frame
    for job in q.claim_batch(2):
        q.complete(job.id, job.token)
    held = q.claim(lease_ms=1)
    assert held is not None
    time.sleep(0.02)
    second = _text(top.render("u", _inspect.snapshot(x, [q.name]), previous, 102.0))
    row = next(line for line in second.splitlines() if q.name in line)
    cells = [c.strip() for c in row.split("│") if c.strip()]
    # queue, pending, active, sched, dead, done/s, dead/s, lanes, lease, oldest, state
    assert cells[1:7] == ["1", "1", "0", "0", "1.0", "0.0"]
    assert cells[7] == "1 (1 paused)"
    assert cells[8].startswith("lapsed")
    assert cells[10] == "running"


def test_frame_fits_80_columns(q: echomq.Queue) -> None:
    long = echomq.Queue(q.name + "-with-a-long-tail-" + "x" * 40, client=q.client)
    for _ in range(1234):
        q.enqueue(b"x")
    long.enqueue(b"y", group="g")
    x = SyncExecutor(q.client, retry_for=0)
    frame = top.render("u", _inspect.snapshot(x, [q.name, long.name]), {}, 1.0, 80)
    console = Console(width=80, record=True, color_system=None)
    console.print(frame)
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    row = next(line for line in lines if line.startswith("│ " + q.name[:10]))
    assert "1,234" in row and "running" in row  # the numbers are not cut
    header = next(line for line in lines if "queue" in line)
    assert "pend" in header and "oldest" in header and "state" in header


def test_top_without_a_terminal_prints_one_frame_and_exits(url: str, q: echomq.Queue) -> None:
    import subprocess
    import sys

    q.enqueue(b"x")
    done = subprocess.run(
        [sys.executable, "-m", "echomq", "--url", url, "top", q.name],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={"COLUMNS": "80", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert q.name[:10] in done.stdout and "pend" in done.stdout
    assert max(len(line) for line in done.stdout.splitlines()) <= 80
