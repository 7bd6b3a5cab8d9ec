"""The native executor (trafikey's EMQ.* commands) against the Lua one, and under the same
faults the Lua executor is tested under.

- One queue driven alternately, at random (seeded), by a Lua Queue and a native Queue on
  the module server, against a model checked after every step.
- One representative of the worker chaos, server SIGKILL and cutting-proxy runs, with the
  workers on the native executor.
- Replication to a replica without the module, and an AOF restart, of native writes.
- The 6-node cluster with every node loading the module: queues over the shards, a
  failover, and a CROSSSLOT call refused.

Every server is a real redis-server started here (or the session's module server) and is
stopped by its pid.

The topology legs (proxy, replica, AOF, cluster) are in test_executors_topology.py.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import executors_support
import pytest
import redis
from executors_support import (
    STEPS,
    Driver,
    assert_used,
    emq_calls,
    worker_twins,
)

import echomq
from conftest import wait_for
from echomq.protocol.scripts import SCRIPTS
from echomq.server import EmbeddedServer
from procs import Proc, Spawner, wait_log
from reliability import leftover_keys, payload, raw_violations, read_books, verify

# Shared fixtures (bound here so pytest finds them in this module).
nr = executors_support.nr


pytestmark = pytest.mark.module


def script_calls(client: redis.Redis) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("eval", "evalsha"))


@pytest.mark.parametrize("seed", [1, 2])
def test_one_queue_through_both_executors(
    module_server: EmbeddedServer, nr: redis.Redis, qname: str, seed: int
) -> None:
    lua = echomq.Queue(qname, url=module_server.url, executor="lua")
    native = echomq.Queue(qname, url=module_server.url, executor="native")
    nr.script_flush()
    emq0, eval0 = sum(emq_calls(nr).values()), script_calls(nr)
    d = Driver(lua, native, nr, seed)
    verbs = list(STEPS)
    weights = [STEPS[v] for v in verbs]
    reached: set[str] = set()
    try:
        for _ in range(150):
            getattr(d, d.rng.choices(verbs, weights)[0])()
            d.agree()
            reached |= {j.state for j in d.m.jobs.values()}
        assert lua.executor == "lua" and native.executor == "native"
        # Both executors really ran the twins: EMQ.* calls, and the twins' scripts in the
        # script cache (EVAL caches them; they were flushed above).
        assert sum(emq_calls(nr).values()) - emq0 > 50
        assert script_calls(nr) - eval0 > 50
        twins = sorted({"enqueue", "claim", "complete", "retry"})
        assert nr.script_exists(*(SCRIPTS[t].sha for t in twins)) == [True] * len(twins)
        # The walk's mix reached every state (at some step: where it ends is the seed's luck).
        assert reached >= {"done", "dead", "pending", "active", "scheduled"}, reached
    finally:
        lua.close()
        native.close()


CHAOS_JOBS = 3000


def test_worker_sigkill_chaos_on_native(
    module_server: EmbeddedServer, nr: redis.Redis, tmp_path: Path, qname: str
) -> None:
    """test_chaos.py's run, scaled down: workers on the native executor SIGKILLed every
    0.4 s (and now and then frozen past their lease) while jobs keep arriving."""
    spawn = Spawner(tmp_path, module_server.url)
    env = spawn.env(
        ECHOMQ_EXECUTOR="native",
        EMQ_TEST_QUEUE=qname,
        EMQ_TEST_LEASE_MS="1000",
        EMQ_TEST_FAIL_EVERY="50",
        EMQ_TEST_RUN_MS="10",
    )
    args = ["-c", "32", "--beat-ms", "200", "--max-stalled", "1000000", "--grace", "20"]

    def start() -> Proc:
        return spawn.start("worker", "apps.chaos:app", *args, env=env)

    q = echomq.Queue(qname, url=module_server.url, executor="native")
    emq0 = emq_calls(nr)
    rng = random.Random(7)
    enqueued: dict[str, int] = {}

    def produce(start_n: int, stop_n: int) -> None:
        for n, e in zip(
            range(start_n, stop_n),
            q.enqueue_many([payload(n) for n in range(start_n, stop_n)]),
            strict=True,
        ):
            assert isinstance(e, echomq.Enqueued) and e.status == "enqueued", e
            enqueued[e.id] = n

    try:
        produce(0, 500)
        live = [start() for _ in range(3)]
        killed: set[int] = set()
        frozen: list[tuple[Proc, float]] = []
        actions = kills = 0
        deadline = time.monotonic() + 60
        while q.counts()["completed"] < CHAOS_JOBS:
            assert time.monotonic() < deadline, f"not done in time: {q.counts()}"
            time.sleep(0.4)
            for proc in live:
                assert proc.popen.poll() is None, f"{proc} exited:\n{proc.text()[-3000:]}"
            for proc, until in list(frozen):
                if time.monotonic() >= until:
                    proc.signal(signal.SIGCONT)
                    frozen.remove((proc, until))
            if len(enqueued) < CHAOS_JOBS:
                produce(len(enqueued), min(CHAOS_JOBS, len(enqueued) + 250))
            actions += 1
            if kills >= 12 and len(enqueued) == CHAOS_JOBS:
                continue  # enough chaos: let the run finish
            thawed = [p for p in live if all(p is not f for f, _ in frozen)]
            victim = rng.choice(thawed)
            if actions % 6 == 0:
                victim.signal(signal.SIGSTOP)
                frozen.append((victim, time.monotonic() + 2.0))
                continue
            victim.signal(signal.SIGKILL)
            victim.wait(60)
            killed.add(victim.pid)
            kills += 1
            live[live.index(victim)] = start()
        for proc, _ in frozen:
            proc.signal(signal.SIGCONT)
        for proc in live:
            wait_log(proc, "serving", timeout=30)
            proc.signal(signal.SIGTERM)
        for proc in live:
            assert proc.wait(30) == 0, proc.text()[-3000:]

        counts = q.counts()
        assert counts == {**counts, "pending": 0, "active": 0, "schedule": 0, "dead": 0}
        assert counts["completed"] == CHAOS_JOBS == len(enqueued)
        assert q.check() == []
        assert raw_violations(nr, qname) == []
        assert leftover_keys(nr, qname) == []
        assert kills >= 8, kills
        v = verify(read_books(nr, qname), enqueued, killed)
        assert v.errors == [], "\n".join(v.errors[:20])
        assert_used(
            emq0, emq_calls(nr), worker_twins("enqueue_many", "extend_many", "sweep_stalled")
        )
    finally:
        spawn.stop_all()
        q.close()


class Producer(threading.Thread):
    """Enqueues payload(n) one call at a time through a native Queue, remembering acks."""

    def __init__(self, url: str, queue: str, first: int, count: int) -> None:
        super().__init__(daemon=True)
        self.q = echomq.Queue(queue, url=url, retry_for=30, executor="native")
        self.todo = range(first, first + count)
        self.acked: dict[str, int] = {}
        self.errors: list[BaseException] = []

    def run(self) -> None:
        try:
            for n in self.todo:
                try:
                    e = self.q.enqueue(payload(n))
                except (redis.RedisError, echomq.EchoMQError) as exc:
                    self.errors.append(exc)
                    continue
                assert e.status == "enqueued"
                self.acked[e.id] = n
                time.sleep(0.002)
        finally:
            self.q.close()


def test_module_server_sigkill_mid_run(
    module_so: Path, module_server: EmbeddedServer, nr: redis.Redis, tmp_path: Path, qname: str
) -> None:
    """test_crash.py's run on a module server (appendfsync always): SIGKILL and restart on
    the same dir while native producers and native workers run; nothing acknowledged is
    lost and each job completes once. Bookkeeping stays on the session module server."""
    srv = EmbeddedServer(
        tmp_path / "aof", appendonly=True, fsync="always", args=["--loadmodule", str(module_so)]
    ).start()
    spawn = Spawner(tmp_path, srv.url)
    env = spawn.env(
        ECHOMQ_EXECUTOR="native",
        EMQ_TEST_HISTORY_URL=module_server.url,
        EMQ_TEST_QUEUE=qname,
        EMQ_TEST_LEASE_MS="3000",
        EMQ_TEST_RUN_MS="5",
    )
    args = ["-c", "16", "--beat-ms", "200", "--max-stalled", "1000000"]
    q = echomq.Queue(qname, url=srv.url, retry_for=30, executor="native")
    try:
        workers = [spawn.start("worker", "apps.chaos:app", *args, env=env) for _ in range(2)]
        for w in workers:
            wait_log(w, "serving", timeout=60)
        producers = [Producer(srv.url, qname, i * 600, 600) for i in range(2)]
        for p in producers:
            p.start()
        wait_for(lambda: sum(len(p.acked) for p in producers) >= 500, timeout=60)
        srv.kill()
        time.sleep(0.5)
        srv.start()
        for p in producers:
            p.join(120)
            assert not p.is_alive(), "a producer is stuck"
        acked = {i: n for p in producers for i, n in p.acked.items()}
        assert [e for p in producers for e in p.errors] == []
        assert len(acked) == 1200

        def drained() -> bool:
            c = q.counts()
            return c["pending"] + c["active"] + c["schedule"] == 0

        wait_for(drained, timeout=60)
        books = read_books(nr, qname)
        ran = {job_id for job_id, _, _, _ in books.history}
        assert ran == set(acked)  # no acknowledged enqueue lost, nothing else got in
        counts = q.counts()
        assert counts["dead"] == 0
        assert counts["completed"] == len(ran)  # always: each job completed exactly once
        assert q.check() == []
        with redis.Redis.from_url(srv.url) as c:
            assert leftover_keys(c, qname) == []
            # Counters since the restart: the producers went on natively, and so did the
            # workers' beat (its extends and sweeps come and go with timing: one of them).
            used = emq_calls(c)
            assert_used({}, used, worker_twins("enqueue"))
            assert used.get("emq.extend", 0) + used.get("emq.sweep", 0) > 0, used
        for w in workers:
            assert w.popen.poll() is None, w.text()[-3000:]
            w.signal(signal.SIGTERM)
            assert w.wait(30) == 0, w.text()[-3000:]
            assert "Traceback" not in w.text(), w.text()[-3000:]
    finally:
        spawn.stop_all()
        q.close()
        srv.stop()
