"""A queue-wide rate limit under real worker processes (issue 13, D21).

Four ``echomq worker`` processes serve one queue limited to 50 claims per 1,000 ms for 10 s.
Every claim appends its ``active`` event (D15) in the claiming script, and a stream id is the
server's clock in ms, so the events are the claims as the limiter saw them. The limiter opens
a window at the first claim after the last one expired, so the check walks the claims the
same way: a window starts at a claim and holds every claim before its end; none may hold
more than 50.
"""

from __future__ import annotations

import time

import redis

import echomq
from procs import Spawner, wait_log

MAX, WINDOW_MS, SECONDS = 50, 1000, 10.0


def _windows(stamps: list[int]) -> list[int]:
    """Claims per limiter window. The next window opens at the first claim at or after the
    current one's end (1 ms of slack for the stream id vs the script's frozen clock; claims
    come right after a window opens, never in its last millisecond, once it is spent)."""
    counts: list[int] = []
    start = None
    for t in sorted(stamps):
        if start is None or t >= start + WINDOW_MS - 1:
            start = t
            counts.append(0)
        counts[-1] += 1
    return counts


def test_rate_limit_holds_under_four_worker_processes(
    spawn: Spawner, qname: str, url: str, r: redis.Redis
) -> None:
    q = echomq.Queue(qname, url=url)
    q.enable_events(100_000)
    q.rate_limit(MAX, WINDOW_MS)
    app = echomq.App(url=url)

    @app.task(queue=qname, name="count")
    def count(n: int) -> int:  # the same task name as tests/apps/basic.py's
        return n

    count.enqueue_many([((n,), {}) for n in range(2_000)])
    q.pause()  # every worker starts before the clock does
    workers = [spawn.worker(qname, "-c", "8") for _ in range(4)]
    for w in workers:
        wait_log(w, "serving")
    started = r.time()
    q.resume()
    time.sleep(SECONDS)
    q.pause()
    spawn.stop_all()

    t0 = int(started[0]) * 1000 + int(started[1]) // 1000
    stamps = [
        int(e.stream_id.split("-")[0])
        for e in _all_events(q)
        if e.event == "active" and int(e.stream_id.split("-")[0]) >= t0
    ]
    windows = _windows(stamps)
    print(f"\n{len(stamps)} claims in {len(windows)} windows: {windows}")
    assert max(windows) <= MAX, windows
    # Throttled, not starved: every window but the last (cut by the pause) is filled.
    assert all(n == MAX for n in windows[:-1]), windows
    assert SECONDS - 1 <= len(windows) <= SECONDS + 2
    q.close()
    app.close()


def _all_events(q: echomq.Queue) -> list[echomq.Event]:
    out: list[echomq.Event] = []
    after = "0"
    while batch := q.events(after=after, count=1000):
        out += batch
        after = batch[-1].stream_id
    return out
