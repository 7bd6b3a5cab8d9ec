"""Worker chaos on a sharded queue (issue 43): 4,000 jobs spread over the shards of one
logical queue, served by 3 worker processes started on the logical name, while the test
SIGKILLs a random worker every ~0.5 s (and starts a replacement) — and, halfway, grows the
queue from 3 shards to 4 with the workers running.

At the end every shard is empty, ``check()`` and the raw-key checker are clean on each, the
completed metrics sum to the number enqueued, and the workers' own records (``apps.chaos``,
the same books as test_chaos.py) show every job ran and completed exactly once per lease
generation, with no stale token settled (``reliability.verify``).
"""

from __future__ import annotations

import random
import signal
import time

import pytest
import redis
from test_chaos import start_worker, stats_of

import echomq
from echomq.client.shards import grow, layout
from procs import Spawner, wait_log
from reliability import leftover_keys, payload, raw_violations, read_books, verify

JOBS = 4_000
WORKERS = 3
KILL_EVERY_S = 0.5
PRODUCE_PER_TURN = 200

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def test_sigkill_chaos_on_a_sharded_queue(
    spawn: Spawner, q: echomq.Queue, qname: str, r: redis.Redis, url: str
) -> None:
    rng = random.Random()
    shards = q.propose_shards(layout(qname, 3))
    queues = {s: echomq.Queue(s, url=url) for s in shards}
    enqueued: dict[str, int] = {}

    def produce(start: int, stop: int) -> None:
        for i, shard in enumerate(queues.values()):  # every shard gets its share
            ns = [n for n in range(start, stop) if n % len(queues) == i]
            for n, e in zip(ns, shard.enqueue_many([payload(n) for n in ns]), strict=True):
                assert isinstance(e, echomq.Enqueued) and e.status == "enqueued", e
                enqueued[e.id] = n

    def done() -> int:
        return sum(x.counts()["completed"] for x in queues.values())

    produce(0, 400)
    live = [start_worker(spawn, qname) for _ in range(WORKERS)]
    killed: set[int] = set()
    grown = False
    t0 = time.monotonic()
    deadline = t0 + 170
    try:
        while done() < JOBS:
            assert time.monotonic() < deadline, f"not done in time: {done()} of {JOBS}"
            time.sleep(KILL_EVERY_S)
            for proc in live:  # a worker must never exit on its own
                assert proc.popen.poll() is None, f"{proc} exited:\n{proc.text()[-3000:]}"
            if not grown and len(enqueued) >= JOBS // 2:
                # Growth while the workers run: they pick the new shard up on their beat.
                shards = q.propose_shards(grow(qname, shards, 4))
                queues.update({s: echomq.Queue(s, url=url) for s in shards[3:]})
                grown = True
            if len(enqueued) < JOBS:
                produce(len(enqueued), min(JOBS, len(enqueued) + PRODUCE_PER_TURN))
            victim = rng.choice(live)
            victim.signal(signal.SIGKILL)
            victim.wait(60)
            killed.add(victim.pid)
            live[live.index(victim)] = start_worker(spawn, qname)
        for proc in live:
            wait_log(proc, "serving", timeout=60)
            proc.signal(signal.SIGTERM)
        for proc in live:
            assert proc.wait(60) == 0, proc.text()[-3000:]
        survivors = [stats_of(p) for p in live]
        assert grown and len(shards) == 4 and q.shards() == shards
        assert len(killed) >= 10, f"only {len(killed)} kills: the chaos did not happen"
        for s, x in queues.items():
            counts = x.counts()
            assert counts == {**counts, "pending": 0, "active": 0, "schedule": 0, "dead": 0}, s
            assert counts["failed"] == 0 and counts["completed"] > 0, (s, counts)
            assert x.check() == [], s
            assert raw_violations(r, s) == [], s
            assert leftover_keys(r, s) == [], s
        assert done() == JOBS == len(enqueued)
        books = read_books(r, qname)  # the chaos app's books: one list for the logical queue
        v = verify(books, enqueued, killed)
        assert v.errors == [], "\n".join(v.errors[:20])
        assert sum(s["completed"] for s in survivors) <= JOBS
    finally:
        for x in queues.values():
            x.close()
