"""Worker chaos: 20,000 jobs through 4 worker processes while the test SIGKILLs a random
worker every ~0.5 s (and starts a replacement), and now and then freezes one (SIGSTOP) past
its lease so that it wakes up holding leases that others took over.

At the end the server's completed metric equals the number enqueued, no job is left in any
set, ``check()`` and the independent raw-key checker (``reliability.raw_violations``) are
clean, and the workers' own records (``apps.chaos``) show every job ran, no lease generation
ran or settled twice, and no stale token settled (``reliability.verify``).
"""

from __future__ import annotations

import random
import re
import signal
import time

import pytest
import redis

import echomq
from procs import Proc, Spawner, wait_log
from reliability import leftover_keys, payload, raw_violations, read_books, verify

JOBS = 20_000
WORKERS = 4
LEASE_MS = 1500
KILL_EVERY_S = 0.5
PRODUCE_PER_TURN = 400
FREEZE_EVERY = 8  # every 8th action freezes a worker instead of killing one

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def start_worker(spawn: Spawner, queue: str) -> Proc:
    env = spawn.env(
        EMQ_TEST_QUEUE=queue,
        EMQ_TEST_LEASE_MS=str(LEASE_MS),
        EMQ_TEST_FAIL_EVERY="50",
        EMQ_TEST_RUN_MS="20",
    )
    # A high --max-stalled: a job whose workers keep dying is never dead-lettered here.
    args = ["-c", "32", "--beat-ms", "200", "--max-stalled", "1000000", "--grace", "20"]
    return spawn.start("worker", "apps.chaos:app", *args, env=env)


def stats_of(proc: Proc) -> dict[str, int]:
    m = re.search(r"stopped: .* \(counters: (.*?)\)$", proc.text(), re.MULTILINE)
    assert m, f"no stats in the output of {proc}:\n{proc.text()[-3000:]}"
    return {k: int(v) for k, v in (kv.split("=") for kv in m.group(1).split(", "))}


def test_sigkill_chaos(spawn: Spawner, q: echomq.Queue, qname: str, r: redis.Redis) -> None:
    rng = random.Random()
    enqueued: dict[str, int] = {}

    def produce(start: int, stop: int) -> None:
        receipts = q.enqueue_many([payload(n) for n in range(start, stop)])
        for n, e in zip(range(start, stop), receipts, strict=True):
            assert isinstance(e, echomq.Enqueued) and e.status == "enqueued", e
            enqueued[e.id] = n

    produce(0, 2_000)  # the rest arrives while the workers are being killed
    live = [start_worker(spawn, qname) for _ in range(WORKERS)]
    killed: set[int] = set()
    frozen: list[tuple[Proc, float]] = []
    kills = freezes = actions = 0
    t0 = time.monotonic()
    deadline = t0 + 170
    while q.counts()["completed"] < JOBS:
        assert time.monotonic() < deadline, f"not done in time: {q.counts()}"
        time.sleep(KILL_EVERY_S)
        for proc in live:  # a worker must never exit on its own
            assert proc.popen.poll() is None, f"{proc} exited:\n{proc.text()[-3000:]}"
        for proc, until in list(frozen):
            if time.monotonic() >= until:
                proc.signal(signal.SIGCONT)
                frozen.remove((proc, until))
        if len(enqueued) < JOBS:
            produce(len(enqueued), min(JOBS, len(enqueued) + PRODUCE_PER_TURN))
        actions += 1
        thawed = [p for p in live if all(p is not f for f, _ in frozen)]
        victim = rng.choice(thawed)
        if actions % FREEZE_EVERY == 0:
            # Frozen past its lease: its jobs are swept and run elsewhere; when it wakes, its
            # heartbeat and settles must be refused (or accepted only for a generation that
            # nobody reclaimed meanwhile, D5).
            victim.signal(signal.SIGSTOP)
            frozen.append((victim, time.monotonic() + LEASE_MS / 1000 + 1.0))
            freezes += 1
            continue
        victim.signal(signal.SIGKILL)
        victim.wait(60)
        killed.add(victim.pid)
        kills += 1
        live[live.index(victim)] = start_worker(spawn, qname)
    took = time.monotonic() - t0
    for proc, _ in frozen:
        proc.signal(signal.SIGCONT)

    # The survivors stop gracefully (their records are complete once they exit).
    for proc in live:
        wait_log(proc, "serving", timeout=60)  # a replacement may still be starting
        proc.signal(signal.SIGTERM)
    for proc in live:
        assert proc.wait(60) == 0, proc.text()[-3000:]
    survivors = [stats_of(p) for p in live]

    counts = q.counts()
    assert counts == {**counts, "pending": 0, "active": 0, "schedule": 0, "dead": 0}
    assert counts["completed"] == JOBS == len(enqueued)
    assert counts["failed"] == 0
    assert q.check() == []
    assert raw_violations(r, qname) == []  # the raw keys, read independently of check()
    assert leftover_keys(r, qname) == []
    assert kills >= 20, f"only {kills} kills: the chaos did not happen"

    books = read_books(r, qname)
    v = verify(books, enqueued, killed)
    assert v.errors == [], "\n".join(v.errors[:20])
    # The first run of every job with n % 50 == 0 fails: those retries settle too (fewer
    # when the first run died with its worker), and no other retry is ever accepted.
    retried = [(i, t, k) for i, t, k, _ in books.settled if k != "completed"]
    assert all(enqueued[i] % 50 == 0 and (t, k) == (1, "retried") for i, t, k in retried)
    assert len(retried) > JOBS // 100
    lost_leases = sum(s["lost"] for s in survivors)
    print(
        f"\nchaos: {JOBS} jobs, {WORKERS} workers, {kills} SIGKILLs, {freezes} freezes "
        f"in {took:.1f}s; runs {v.runs}: {v.retries_accepted} planted-failure retries and "
        f"{v.runs - v.jobs - v.retries_accepted} redeliveries of leases lost to kills and "
        f"freezes ({v.redelivered_jobs} jobs ran more than once); settles accepted "
        f"{v.settles_accepted}, refused {v.settles_refused} (stale "
        f"{sum(1 for x in books.refused if x[4] == 'stale')}); completions the killed worker "
        f"never recorded {v.unrecorded_completions}; survivors' leases lost {lost_leases}"
    )
