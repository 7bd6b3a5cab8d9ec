"""Flow chaos (D18): a 3-level tree of 500 jobs over 3 queues, run by 3 worker processes
while the test SIGKILLs a random worker every ~0.5 s (and starts a replacement).

At the end every parent ran only after all its children, and every run of it saw all their
results; each parent completed exactly once; every queue is empty, its outbox delivered, and
``check()`` is clean on all three.
"""

from __future__ import annotations

import random
import signal
import time

import pytest
import redis

import echomq
from procs import Proc, Spawner, wait_log

MIDS = 9
LEAVES_PER_MID = 54  # 1 root + 9 mids + 486 leaves = 496 jobs, + 4 more leaves under mid 0
EXTRA = 4
WORKERS = 3
LEASE_MS = 1500

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def start_worker(spawn: Spawner, queue: str) -> Proc:
    # Runs long enough (486 leaves x 200 ms over 3 x 8 slots: ~4 s before any kill) that the
    # tree is still being worked through after several kills, however fast the machine.
    env = spawn.env(EMQ_TEST_QUEUE=queue, EMQ_TEST_LEASE_MS=str(LEASE_MS), EMQ_TEST_RUN_MS="200")
    args = ["-q", queue, "-q", queue + "-mid", "-q", queue + "-leaf", "-c", "8"]
    args += ["--beat-ms", "100", "--max-stalled", "1000000", "--grace", "20"]
    return spawn.start("worker", "apps.flowchaos:app", *args, env=env)


def _stub(*args: object) -> None:
    raise AssertionError("runs in the worker processes only")


def test_flow_tree_under_sigkill(spawn: Spawner, url: str, qname: str, r: redis.Redis) -> None:
    # The producer side only needs the tasks' names and queues (apps/flowchaos.py runs them).
    app = echomq.App(url=url)
    leaf = app.task(queue=qname + "-leaf", name="flow.leaf")(_stub)
    mid = app.task(queue=qname + "-mid", name="flow.mid")(_stub)
    root = app.task(queue=qname, name="flow.root")(_stub)
    expected: dict[str, tuple[int, int]] = {}  # parent id -> (children, sum)
    n = 0
    mids = []
    for m in range(MIDS):
        size = LEAVES_PER_MID + (EXTRA if m == 0 else 0)
        leaves = [leaf.s(n + i) for i in range(size)]
        mids.append((app.flow_job(mid.s(m), children=leaves), size, sum(range(n, n + size))))
        n += size
    added = app.flow(root.s(), children=[node for node, _, _ in mids])
    total_jobs = 1 + MIDS + n
    assert total_jobs == 500
    for cid, (_, size, s) in zip(added.child_ids, mids, strict=True):
        expected[cid] = (size, s)
    expected[added.parent_id] = (MIDS, sum(s for _, _, s in mids))
    queues = [app.queue(name) for name in (qname, qname + "-mid", qname + "-leaf")]

    rng = random.Random()
    live = [start_worker(spawn, qname) for _ in range(WORKERS)]
    kills = 0
    deadline = time.monotonic() + 170
    while queues[0].job_state(added.parent_id) != "absent":
        assert time.monotonic() < deadline, [q.counts() for q in queues]
        time.sleep(0.5)
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

    runs = [x.decode().split(":") for x in r.lrange(f"emqtest:{qname}:flowruns", 0, -1)]
    seen: set[str] = set()
    for kind, jid, _token, count, total in runs:
        assert jid in expected, (kind, jid)
        # Every run of a parent, re-runs after a kill included, saw all its children.
        assert (int(count), int(total)) == expected[jid], (kind, jid, count, total)
        seen.add(jid)
    assert seen == set(expected)
    counts = [q.counts() for q in queues]
    for c, done in zip(counts, (1, MIDS, n), strict=True):
        assert c == {**c, "pending": 0, "active": 0, "schedule": 0, "dead": 0}, counts
        assert c["completed"] == done, counts  # each job completed exactly once
    for q in queues:
        assert q.check() == []
        assert r.llen(f"emq:{{{q.name}}}:flow:outbox") == 0
        assert list(r.scan_iter(match=f"emq:{{{q.name}}}:job:*")) == []
    assert kills >= 5, f"only {kills} kills"
    print(
        f"\nflow chaos: {total_jobs} jobs over 3 queues, {kills} SIGKILLs, {len(runs)} parent runs"
    )
    app.close()
