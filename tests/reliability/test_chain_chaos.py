"""Chain chaos (issue 42): 8 chains of 5 steps alternating over 2 queues, run by 2 worker
processes while the test SIGKILLs a random worker every ~1.5 s (and starts a replacement),
on both executors.

The hand-off from step to step is the flow release inside the completing script (through
the outbox between the two queues), so a kill between steps loses nothing: at the end every
chain's value is right, every step completed exactly once (the queues' completed counts),
every run of a step was handed the right previous value (none skipped, none run before its
predecessor completed), and a step ran again only after a kill took its first run (a later
token: at-least-once delivery of a run that died, never a second hand-off).
"""

from __future__ import annotations

import random
import signal
import time

import pytest
import redis

import echomq
from procs import Proc, Spawner, wait_log

CHAINS = 8
STEPS = 5
WORKERS = 2
LEASE_MS = 1500

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.executors]


def start_worker(spawn: Spawner, queue: str) -> Proc:
    env = spawn.env(EMQ_TEST_QUEUE=queue, EMQ_TEST_LEASE_MS=str(LEASE_MS), EMQ_TEST_RUN_MS="400")
    args = ["-q", queue, "-q", queue + "-b", "-c", "4"]
    args += ["--beat-ms", "100", "--max-stalled", "1000000", "--grace", "20"]
    return spawn.start("worker", "apps.chainchaos:app", *args, env=env)


def _stub(*args: object) -> None:
    raise AssertionError("runs in the worker processes only")


def _expected(chain: int) -> list[int]:
    """The value each step returns: step 0 returns the chain's number."""
    values = [chain]
    for i in range(1, STEPS):
        values.append(values[-1] * 2 + i)
    return values


def test_chains_under_sigkill(spawn: Spawner, url: str, qname: str, r: redis.Redis) -> None:
    app = echomq.App(url=url)
    first = app.task(queue=qname, name="chain.first")(_stub)
    step_a = app.task(queue=qname, name="chain.step.a")(lambda prev, chain, i: 0)
    step_b = app.task(queue=qname + "-b", name="chain.step.b")(lambda prev, chain, i: 0)
    receipts = []
    for c in range(CHAINS):
        steps = [first.s(c)]
        steps += [(step_b if i % 2 else step_a).s(chain=c, i=i) for i in range(1, STEPS)]
        receipts.append(app.chain(*steps).enqueue())
    queues = [app.queue(qname), app.queue(qname + "-b")]

    rng = random.Random()
    live = [start_worker(spawn, qname) for _ in range(WORKERS)]
    kills = 0
    deadline = time.monotonic() + 170
    while any(q.job_state(rc.id) != "absent" for rc in receipts for q in queues[:1]):
        assert time.monotonic() < deadline, [q.counts() for q in queues]
        for q in queues:
            assert q.counts()["dead"] == 0, q.errors()
        time.sleep(1.5)  # a replacement needs time to start and take jobs before the next kill
        for proc in live:
            assert proc.popen.poll() is None, f"{proc} exited:\n{proc.text()[-3000:]}"
        victim = rng.choice(live)
        victim.signal(signal.SIGKILL)
        victim.wait(60)
        kills += 1
        live[live.index(victim)] = start_worker(spawn, qname)
    for proc in live:
        wait_log(proc, "serving", timeout=60)
        proc.signal(signal.SIGTERM)
    for proc in live:
        assert proc.wait(60) == 0, proc.text()[-3000:]

    for c, rc in enumerate(receipts):
        assert rc.wait(timeout_s=10) == _expected(c)[-1], (c, rc.status())
        assert rc.status() == ["completed"] * STEPS
    runs: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for raw in r.lrange(f"emqtest:{qname}:chainruns", 0, -1):
        chain, step, token, prev = map(int, raw.decode().split(":"))
        runs.setdefault((chain, step), []).append((token, prev))
    reruns = 0
    for c in range(CHAINS):
        values = _expected(c)
        for i in range(STEPS):
            seen = runs.get((c, i), [])
            assert seen, f"chain {c} step {i} never ran"
            want = values[i - 1] if i else -1
            assert all(prev == want for _, prev in seen), (c, i, seen)
            tokens = [t for t, _ in seen]
            assert len(set(tokens)) == len(tokens), (c, i, seen)  # one run per attempt
            reruns += len(seen) - 1
    odd = sum(1 for i in range(STEPS) if i % 2)
    counts = [q.counts() for q in queues]
    for cnt, done in zip(counts, (CHAINS * (STEPS - odd), CHAINS * odd), strict=True):
        assert cnt == {**cnt, "pending": 0, "active": 0, "schedule": 0, "dead": 0}, counts
        assert cnt["completed"] == done, counts  # each step completed exactly once
    for q in queues:
        assert q.check() == []
        assert r.llen(f"emq:{{{q.name}}}:flow:outbox") == 0
    assert kills >= 3, f"only {kills} kills"
    started = int(r.get(f"emqtest:{qname}:chainstarts") or 0)
    print(
        f"\nchain chaos: {CHAINS} chains x {STEPS} steps, {kills} SIGKILLs, {started} runs "
        f"begun ({started - CHAINS * STEPS} cut short by a kill), {reruns} re-runs finished"
    )
    app.close()
