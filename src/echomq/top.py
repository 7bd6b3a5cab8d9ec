"""``echomq top``: a live terminal view of every queue (rich).

Per queue: the four sets, throughput (completions and dead-letters per second, measured
between two refreshes from the server-side totals, so it works whichever process settles),
lanes (how many, how many paused or at their limit), lease health (seconds until the
earliest lease lapses; red when one already lapsed and awaits reap), the oldest waiting
job's age. One pipelined snapshot per refresh; nothing runs in the workers.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from echomq.client.executor import SyncExecutor, sync_client
from echomq.ops import console as _console
from echomq.ops import sharded as _sharded
from echomq.ops import snapshots as _inspect

__all__ = ["render", "run_top"]


def _fmt_age(seconds: float | None) -> str:
    return "-" if seconds is None else _console.human(seconds * 1000)


# Below this many columns the frame drops the lanes and lease columns and shortens the
# headers, so every row stays one line at 80 columns (a name longer than its share folds).
NARROW = 120


def render(
    url: str,
    views: Sequence[_inspect.QueueView],
    previous: dict[str, tuple[float, int, int]],
    now: float,
    width: int | None = None,
) -> Group:
    """The frame for ``views``; ``previous`` holds each queue's last (time, completed,
    failed) and is updated, so rates are per second between two frames. ``width``: the
    terminal's columns (narrower than :data:`NARROW`: the compact frame)."""
    narrow = width is not None and width < NARROW
    table = Table(title=f"echomq top @ {url}", title_justify="left", expand=True)
    heads: tuple[str, ...]
    if narrow:
        heads = ("queue", "pend", "act", "sched", "dead", "ok/s", "fail/s", "oldest", "state")
    else:
        heads = ("queue", "pending", "active", "sched", "dead", "done/s", "dead/s")
    for col in heads:
        table.add_column(
            col,
            justify="left" if col == "queue" else "right",
            overflow="fold" if col == "queue" else "ellipsis",
            no_wrap=col != "queue",
            ratio=1 if col == "queue" else None,
        )
    if not narrow:
        for col in ("lanes", "lease health", "oldest wait", "state"):
            table.add_column(col, justify="right", no_wrap=True)
    for v in views:
        c = v.counts
        before = previous.get(v.name)
        previous[v.name] = (now, c.get("completed", 0), c.get("failed", 0))
        if before is not None and now > before[0]:
            dt = now - before[0]
            rate = f"{(c.get('completed', 0) - before[1]) / dt:,.1f}"
            dead_rate = f"{(c.get('failed', 0) - before[2]) / dt:,.1f}"
        else:
            rate = dead_rate = "…"
        paused_lanes = sum(1 for lane in v.lanes if lane.paused)
        full = sum(1 for lane in v.lanes if lane.limit is not None and lane.active >= lane.limit)
        lanes = f"{len(v.lanes)}" + (f" ({paused_lanes} paused)" if paused_lanes else "")
        lanes += f" ({full} at limit)" if full else ""
        headroom = v.lease_headroom_s
        if headroom is None:
            lease = Text("idle", style="dim")
        elif headroom < 0:
            lease = Text(f"lapsed {-headroom:.1f}s", style="bold red")
        else:
            lease = Text(f"{headroom:.1f}s", style="green")
        cells: list[Any] = [
            Text(v.name),
            f"{c.get('pending', 0):,}",
            f"{c.get('active', 0):,}",
            f"{c.get('schedule', 0):,}",
            Text(f"{c.get('dead', 0):,}", style="red" if c.get("dead") else ""),
            rate,
            dead_rate,
        ]
        if not narrow:
            cells += [lanes, lease]
        cells.append(_fmt_age(v.oldest_waiting_age_s))
        cells.append(Text("paused", style="yellow") if v.paused else Text("running", style="dim"))
        table.add_row(*cells)
    footer = Text(f"{len(views)} queue(s) · Ctrl-C quits", style="dim")
    return Group(table, footer)


def run_top(
    url: str, queues: Sequence[str] = (), interval: float = 1.0, console: Console | None = None
) -> None:
    """Refresh every ``interval`` seconds until Ctrl-C; without a terminal (a pipe, a cron
    job, CI) print one frame and return, since a live view needs a screen to redraw."""
    console = console or Console()
    client: Any = sync_client(url)
    x = SyncExecutor(client, retry_for=0)
    previous: dict[str, tuple[float, int, int]] = {}
    names = list(queues)
    found_at = -1e18

    def frame() -> Group:
        nonlocal names, found_at
        now = time.monotonic()
        if not queues and now - found_at > 10:
            names = _inspect.discover(client)
            found_at = now
        views = _sharded.snapshot(x, names, minutes=0)  # a sharded queue: its sums
        return render(url, views, previous, now, console.width)

    try:
        if not console.is_terminal:
            console.print(frame())
            return
        with (
            Live(frame(), console=console, refresh_per_second=4) as live,
            contextlib.suppress(KeyboardInterrupt),
        ):
            while True:
                time.sleep(interval)
                live.update(frame())
    finally:
        client.close()
