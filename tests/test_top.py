"""``echomq top``: the frame shows every queue's sets, rates between two frames, lanes and
lease health, from one snapshot of the real server."""

from __future__ import annotations

import time

from rich.console import Console

import echomq
from echomq import _inspect, top
from echomq._executor import SyncExecutor


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
