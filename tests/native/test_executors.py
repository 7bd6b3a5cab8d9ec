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
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from test_cluster_failover import _losses, _run_failover
from test_proxy import Proxy

import echomq
from conftest import server_ms, wait_for
from echomq import keyspace
from echomq.client import native as _native
from echomq.errors import StaleToken
from echomq.protocol.scripts import SCRIPTS
from echomq.server import EmbeddedServer
from echomq.testing import EmbeddedCluster
from procs import TESTS_DIR, Proc, Spawner, wait_log
from reliability import leftover_keys, payload, raw_violations, read_books, verify

pytestmark = pytest.mark.module


def emq_calls(client: redis.Redis) -> dict[str, int]:
    """Calls per EMQ.* command since the server started (INFO commandstats)."""
    stats: dict[str, Any] = client.info("commandstats")
    return {
        name[len("cmdstat_") :]: int(v["calls"])
        for name, v in stats.items()
        if name.startswith("cmdstat_emq.")
    }


def script_calls(client: redis.Redis) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("eval", "evalsha"))


def worker_twins(*scripts: str) -> set[str]:
    """The EMQ.* commands (INFO's lowercase names) of the scripts a worker run uses that
    have a native twin: a worker claims and settles through `settle`, which joins TWINS
    when EMQ.SETTLE lands, and is then required here with no change."""
    return {_native.TWINS[s].lower() for s in (*scripts, "settle") if s in _native.TWINS}


def assert_used(before: dict[str, int], after: dict[str, int], commands: set[str]) -> None:
    grew = {c for c in commands if after.get(c, 0) > before.get(c, 0)}
    assert grew == commands, f"EMQ.* calls before {before}, after {after}"


@pytest.fixture
def nr(module_server: EmbeddedServer) -> Iterator[redis.Redis]:
    """A raw client of the session's module server."""
    client = redis.Redis.from_url(module_server.url)
    yield client
    client.close()


# --------------------------------------------------------------------------- cross-executor


@dataclass
class MJob:
    state: str  # pending | active | scheduled | dead | done
    group: str | None
    attempts: int = 0  # claims of this incarnation (reprocess starts a fresh budget)
    token: int = 0
    due: int = 0  # scheduled: the latest server ms it can be due at
    lease_end: int = 0  # active: the latest server ms its lease can end at


@dataclass
class Model:
    jobs: dict[str, MJob] = field(default_factory=dict)
    completed: int = 0
    failed: int = 0

    def ids(self, state: str) -> list[str]:
        return sorted(i for i, j in self.jobs.items() if j.state == state)


SHORT_MS = 30  # leases and delays that lapse within a step or two
LONG_MS = 600_000  # never lapse during the test
LANES = (None, None, "la", "lb")


class Driver:
    """Runs random verbs through two queues (Lua, native) on one queue name and checks the
    server against the model after every step."""

    def __init__(self, lua: echomq.Queue, native: echomq.Queue, raw: redis.Redis, seed: int):
        self.qs = {"lua": lua, "native": native}
        self.raw = raw
        self.rng = random.Random(seed)
        self.m = Model()
        self.log: list[str] = []

    def q(self) -> tuple[str, echomq.Queue]:
        name = self.rng.choice(("lua", "native"))
        return name, self.qs[name]

    def now(self) -> int:
        return server_ms(self.raw)

    # ----------------------------------------------------------------- verbs

    def enqueue(self) -> None:
        name, q = self.q()
        group = self.rng.choice(LANES)
        delay = self.rng.choice((None, None, 0, SHORT_MS, LONG_MS))
        if self.rng.random() < 0.5:
            got: list[echomq.Enqueued | echomq.EchoMQError] = [
                q.enqueue(b"p", group=group, delay_ms=delay)
            ]
        else:
            got = q.enqueue_many([b"a", b"b", b"c"][: self.rng.randint(1, 3)], group=group,
                                 delay_ms=delay)  # fmt: skip
        t1 = self.now()
        state = "pending" if not delay else "scheduled"
        for e in got:
            assert isinstance(e, echomq.Enqueued), e
            assert e.status == ("enqueued" if state == "pending" else "scheduled"), e
            self.m.jobs[e.id] = MJob(state, group, due=t1 + (delay or 0))
        self.log.append(f"{name} enqueue x{len(got)} group={group} delay={delay}")

    def claim(self) -> None:
        name, q = self.q()
        lease = self.rng.choice((SHORT_MS, LONG_MS, LONG_MS))
        pending = self.m.ids("pending")
        if self.rng.random() < 0.5:
            job = q.claim(lease_ms=lease)
            jobs = [job] if job else []
            assert len(jobs) == min(1, len(pending)), (jobs, pending)
        else:
            n = self.rng.randint(1, 4)
            jobs = q.claim_batch(n, lease_ms=lease)
            assert len(jobs) == min(n, len(pending)), (jobs, pending)
        t1 = self.now()
        for job in jobs:
            mj = self.m.jobs[job.id]
            assert mj.state == "pending", (job.id, mj)
            assert job.group == mj.group
            mj.attempts += 1
            assert job.attempt == mj.attempts, (job, mj)
            assert job.token > mj.token, (job, mj)
            mj.state, mj.token, mj.lease_end = "active", job.token, t1 + lease
        self.log.append(f"{name} claim lease={lease} -> {len(jobs)}")

    def _active(self) -> tuple[str, MJob] | None:
        active = self.m.ids("active")
        if not active:
            return None
        jid = self.rng.choice(active)
        return jid, self.m.jobs[jid]

    def extend(self) -> None:
        pick = self._active()
        if pick is None:
            return
        jid, mj = pick
        name, q = self.q()
        if self.now() >= mj.lease_end - 5:
            return  # its lease may have lapsed: the verdict would depend on the clock
        q.extend(jid, mj.token, lease_ms=LONG_MS)
        mj.lease_end = self.now() + LONG_MS
        self.log.append(f"{name} extend {jid}")

    def complete(self) -> None:
        pick = self._active()
        if pick is None:
            return
        jid, mj = pick
        name, q = self.q()
        if self.rng.random() < 0.2:
            with pytest.raises(StaleToken):
                q.complete(jid, mj.token + 1)
            self.log.append(f"{name} complete {jid} stale")
            return
        q.complete(jid, mj.token)
        mj.state = "done"
        self.m.completed += 1
        self.log.append(f"{name} complete {jid}")

    def retry(self) -> None:
        pick = self._active()
        if pick is None:
            return
        jid, mj = pick
        name, q = self.q()
        ceiling = self.rng.choice((mj.attempts, mj.attempts + 1, mj.attempts + 5))
        delay = self.rng.choice((0, SHORT_MS, LONG_MS))
        verdict = q.retry(jid, mj.token, delay_ms=delay, max_attempts=ceiling, error="e")
        if mj.attempts >= ceiling:
            assert verdict == "dead", (verdict, mj, ceiling)
            mj.state = "dead"
            self.m.failed += 1
        else:
            assert verdict == "scheduled", (verdict, mj, ceiling)
            mj.state, mj.due = "scheduled", self.now() + delay
        self.log.append(f"{name} retry {jid} ceiling={ceiling} delay={delay} -> {verdict}")

    def reprocess(self) -> None:
        dead = self.m.ids("dead")
        if not dead:
            return
        jid = self.rng.choice(dead)
        name, q = self.q()
        q.reprocess(jid)
        mj = self.m.jobs[jid]
        mj.state, mj.attempts = "pending", 0
        self.log.append(f"{name} reprocess {jid}")

    def promote(self) -> None:
        """Wait until every short delay is due, then promote: exactly those move."""
        name, q = self.q()
        now = self.now()
        scheduled = [j for j in self.m.jobs.values() if j.state == "scheduled"]
        short = [j for j in scheduled if j.due - now < LONG_MS // 2]
        if short:
            latest = max(j.due for j in short)
            wait_for(lambda: self.now() > latest, timeout=5, interval=0.005)
        moved = q.promote(limit=1000)
        assert moved == len(short), (moved, len(short))
        for j in short:
            j.state = "pending"
        self.log.append(f"{name} promote -> {moved}")

    def sweep(self) -> None:
        """Wait until every short lease has lapsed, then sweep: to pending (a high
        max_stalled) or to dead (max_stalled=1)."""
        name, q = self.q()
        lapsing = {
            i: j
            for i, j in self.m.jobs.items()
            if j.state == "active" and j.lease_end - self.now() < LONG_MS // 2
        }
        if lapsing:
            latest = max(j.lease_end for j in lapsing.values())
            wait_for(lambda: self.now() > latest, timeout=5, interval=0.005)
        kill = self.rng.random() < 0.4
        back, dead = q.sweep_stalled(max_stalled=1 if kill else 1000, limit=1000)
        assert sorted(dead if kill else back) == sorted(lapsing), (back, dead, lapsing)
        assert (back if kill else dead) == []
        for j in lapsing.values():
            j.state = "dead" if kill else "pending"
        if kill:
            self.m.failed += len(lapsing)
        self.log.append(f"{name} sweep kill={kill} -> {len(lapsing)}")

    # ----------------------------------------------------------------- the check

    def agree(self) -> None:
        q = self.qs[self.rng.choice(("lua", "native"))]
        assert q.check() == [], self.log[-5:]
        m = self.m
        want = {
            "pending": len(m.ids("pending")),
            "active": len(m.ids("active")),
            "schedule": len(m.ids("scheduled")),
            "dead": len(m.ids("dead")),
            "completed": m.completed,
            "failed": m.failed,
            "kept": 0,  # this walk never keeps history (tests/model/test_model.py does)
        }
        assert q.counts() == want, self.log[-5:]
        for jid, mj in m.jobs.items():
            expect = "absent" if mj.state == "done" else mj.state
            assert q.job_state(jid) == expect, (jid, mj, self.log[-5:])


STEPS = {
    "enqueue": 4,
    "claim": 4,
    "extend": 1,
    "complete": 2,
    "retry": 2,
    "reprocess": 1,
    "promote": 1,
    "sweep": 1,
}


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


# --------------------------------------------------------------------------- worker chaos


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


# --------------------------------------------------------------------------- server SIGKILL


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


# --------------------------------------------------------------------------- cutting proxy


class NativeProxy(Proxy):
    """test_proxy's Proxy, whose dropped replies are those of EMQ.* calls as well as
    EVAL/EVALSHA (its own check looks for EVAL only, so on the native executor it would
    never drop a transition's reply)."""

    async def _pump(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        other: asyncio.StreamWriter,
        script: list[bool],
        *,
        replies: bool,
    ) -> None:
        try:
            while data := await src.read(65536):
                if not replies:
                    head = data[:24].upper()
                    script[0] = b"\r\nEVAL" in head or b"\r\nEMQ." in head
                elif script[0] and self.drop_reply and self.rng.random() < self.drop_reply:
                    self.dropped += 1
                    self._cut(dst, other)  # the command ran; its reply never arrives
                    return
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            return


def test_run_through_a_cutting_proxy_on_native(
    module_server: EmbeddedServer, nr: redis.Redis, tmp_path: Path, qname: str
) -> None:
    """test_proxy.py's run, scaled down, on the native executor: producer processes and
    workers reach the module server through a proxy that resets every connection after
    50..500 ms and drops the reply of 1 in 200 EMQ.*/EVAL calls (the call ran)."""
    proxy = NativeProxy(module_server.port, life_ms=(50, 500), drop_reply=0.005, seed=3).start()
    spawn = Spawner(tmp_path, proxy.url)
    children: list[subprocess.Popen[bytes]] = []
    per, producers, total = 1000, 2, 2000
    env = spawn.env(
        ECHOMQ_EXECUTOR="native",
        EMQ_TEST_HISTORY_URL=module_server.url,  # the bookkeeping is never cut
        EMQ_TEST_QUEUE=qname,
        EMQ_TEST_LEASE_MS="2000",
        EMQ_TEST_FAIL_EVERY="50",
        EMQ_TEST_RUN_MS="2",
        EMQ_TEST_PRODUCE_PAUSE_MS="3",
    )
    emq0 = emq_calls(nr)
    q = echomq.Queue(qname, url=module_server.url, executor="native")
    try:
        args = ["-c", "16", "--beat-ms", "200", "--max-stalled", "1000000"]
        workers = [spawn.start("worker", "apps.chaos:app", *args, env=env) for _ in range(2)]
        outs = [tmp_path / f"producer-{i}.jsonl" for i in range(producers)]
        for i, out in enumerate(outs):
            cmd = [sys.executable, "-m", "apps.producer", qname, str(i * per), str(per), str(out)]
            with open(tmp_path / f"producer-{i}.log", "wb") as log:
                children.append(
                    subprocess.Popen(cmd, cwd=TESTS_DIR, env=env, stdout=log, stderr=log)
                )
        for p in children:
            assert p.wait(60) == 0, (tmp_path / "producer-0.log").read_text()
        calls = [json.loads(line) for out in outs for line in out.read_text().splitlines()]
        assert [c for c in calls if "error" in c] == []
        enqueued: dict[str, int] = {}
        for c in calls:
            assert c["statuses"] == ["enqueued"] * len(c["ns"]), c
            enqueued.update(zip(c["ids"], c["ns"], strict=True))
        assert sorted(enqueued.values()) == list(range(total))  # one id per job asked for

        def drained() -> bool:
            c = q.counts()
            return c["pending"] + c["active"] + c["schedule"] == 0 and c["completed"] >= total

        wait_for(drained, timeout=60)
        for w in workers:
            assert w.popen.poll() is None, w.text()[-3000:]
            wait_log(w, "serving")
            w.signal(signal.SIGTERM)
        for w in workers:
            assert w.wait(60) == 0, w.text()[-3000:]
        counts = q.counts()
        assert counts == {**counts, "pending": 0, "active": 0, "schedule": 0, "dead": 0}
        assert counts["completed"] == total  # no enqueue made two jobs, none was lost
        assert q.check() == []
        assert leftover_keys(nr, qname) == []
        v = verify(read_books(nr, qname), enqueued, killed=set())
        assert v.errors == [], "\n".join(v.errors[:20])
        assert proxy.cuts > 20 and proxy.dropped > 0, (proxy.cuts, proxy.dropped)
        assert_used(
            emq0, emq_calls(nr), worker_twins("enqueue_many", "extend_many", "sweep_stalled")
        )
    finally:
        for p in children:
            if p.poll() is None:
                p.kill()
            p.wait(60)
        spawn.stop_all()
        proxy.stop()
        q.close()


# --------------------------------------------------------------------------- replica and AOF


def keyspace_of(client: redis.Redis) -> dict[bytes, Any]:
    """Every key with its type, content (sets and hashes by content) and whether it has a
    TTL (the remaining time differs between two reads)."""
    out: dict[bytes, Any] = {}
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        value: Any
        if kind == b"hash":
            value = client.hgetall(key)
        elif kind == b"zset":
            value = client.zrange(key, 0, -1, withscores=True)
        elif kind == b"list":
            value = client.lrange(key, 0, -1)
        elif kind == b"set":
            value = client.smembers(key)
        elif kind == b"string":
            value = client.get(key)
        elif kind == b"stream":
            value = client.xrange(key)
        else:
            value = client.dump(key)
        out[key] = (kind, value, client.pttl(key) >= 0)
    return out


def native_mix(url: str, queue: str, seed: int, steps: int = 120) -> int:
    """A seeded random mix of every twin through a native Queue (the cross-executor driver
    with the native queue on both sides); returns the EMQ.* calls it made."""
    q = echomq.Queue(queue, url=url, executor="native")
    raw = redis.Redis.from_url(url)
    try:
        before = sum(emq_calls(raw).values())
        d = Driver(q, q, raw, seed)
        verbs = list(STEPS)
        for _ in range(steps):
            getattr(d, d.rng.choices(verbs, [STEPS[v] for v in verbs])[0])()
        assert q.check() == []
        assert q.executor == "native"
        return sum(emq_calls(raw).values()) - before
    finally:
        q.close()
        raw.close()


def test_replica_without_the_module_ends_identical(
    module_so: Path, tmp_path: Path, qname: str
) -> None:
    primary = EmbeddedServer(
        tmp_path / "primary",
        appendonly=False,
        # The full sync starts at once (the default waits 5 s for more replicas).
        args=["--loadmodule", str(module_so), "--repl-diskless-sync-delay", "0"],
    ).start()
    replica = EmbeddedServer(
        tmp_path / "replica",
        appendonly=False,
        args=["--replicaof", "127.0.0.1", str(primary.port)],
    ).start()
    try:
        with redis.Redis.from_url(replica.url) as rr, redis.Redis.from_url(primary.url) as pr:
            wait_for(lambda: rr.info("replication").get("master_link_status") == "up")
            assert b"trafikey" not in repr(rr.execute_command("MODULE", "LIST")).encode()
            assert native_mix(primary.url, qname, seed=11) > 50
            assert native_mix(primary.url, qname + "-b", seed=12) > 50
            assert pr.execute_command("WAIT", 1, 5000) == 1
            mine = keyspace_of(pr)
            assert len(mine) > 10
            assert keyspace_of(rr) == mine
    finally:
        replica.stop()
        primary.stop()


def test_aof_restart_of_a_module_server_keeps_the_keyspace(
    module_so: Path, tmp_path: Path, qname: str
) -> None:
    srv = EmbeddedServer(
        tmp_path / "aof", appendonly=True, fsync="always", args=["--loadmodule", str(module_so)]
    ).start()
    try:
        assert native_mix(srv.url, qname, seed=21) > 50
        with redis.Redis.from_url(srv.url) as c:
            before = keyspace_of(c)
        assert len(before) > 10
        srv.kill()  # no shutdown, no rewrite: what the AOF holds is what comes back
        srv.start()
        with redis.Redis.from_url(srv.url) as c:
            assert keyspace_of(c) == before
        aof = b"".join(p.read_bytes() for p in (srv.dir).rglob("*.aof*") if p.is_file())
        assert aof and b"EMQ." not in aof.upper()  # the plain commands, never EMQ.*
    finally:
        srv.stop()


# --------------------------------------------------------------------------- cluster


@pytest.fixture(scope="module")
def native_cluster(
    module_so: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EmbeddedCluster]:
    c = EmbeddedCluster(
        tmp_path_factory.mktemp("native-cluster"),
        node_timeout_ms=1000,
        args=["--loadmodule", str(module_so)],
    ).start()
    yield c
    c.stop()


def _slot_owner(cluster: EmbeddedCluster, queue: str) -> int:
    slot = keyspace.slot(keyspace.queue_key(queue, "pending"))
    for node in cluster.primaries():
        with redis.Redis(port=node.port) as c:
            for start, end, primary, *_ in c.execute_command("CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    return int(primary[1])
    raise AssertionError(f"slot {slot} not covered")


def _cluster_emq(cluster: EmbeddedCluster) -> dict[int, int]:
    out = {}
    for node in cluster.primaries():
        with redis.Redis(port=node.port) as c:
            out[node.port] = sum(emq_calls(c).values())
    return out


def _eval_and_emq(port: int, keys: list[str], args: list[Any]) -> tuple[str, str]:
    """The error of the same complete call sent to one node as EVAL of complete.lua and
    as EMQ.COMPLETE ("ok" when it was not refused)."""
    out = []
    with redis.Redis(port=port) as c:
        for head in (("EVAL", SCRIPTS["complete"].source), ("EMQ.COMPLETE",)):
            try:
                c.execute_command(*head, len(keys), *keys, *args)
                out.append("ok")
            except redis.ResponseError as exc:  # MovedError is one; its prefix is its type
                out.append(f"{type(exc).__name__}: {exc}")
    return out[0], out[1]


@pytest.mark.cluster
def test_cluster_refuses_emq_calls_as_it_refuses_eval(
    native_cluster: EmbeddedCluster, qname: str
) -> None:
    """A node must refuse an EMQ.* call the way it refuses the script's EVAL: keys of two
    queues (two slots) -> CROSSSLOT; keys of a slot it does not serve -> MOVED (so a client
    with an old slot map, e.g. after a failover, is redirected and refreshes it). Nothing
    is written either way."""
    cluster = native_cluster
    node = cluster.primaries()[0]
    a = next(
        f"{qname}-a{i}" for i in range(100) if _slot_owner(cluster, f"{qname}-a{i}") == node.port
    )
    b = next(
        f"{qname}-b{i}" for i in range(100) if _slot_owner(cluster, f"{qname}-b{i}") != node.port
    )
    jid = echomq.ids.mint()
    cross = _eval_and_emq(
        node.port,
        [keyspace.queue_key(a, "active"), keyspace.queue_key(b, "job:" + jid)],
        [keyspace.queue_key(a, ""), jid, 1, 0],
    )
    foreign = _eval_and_emq(
        node.port,
        [keyspace.queue_key(b, "active"), keyspace.queue_key(b, "job:" + jid)],
        [keyspace.queue_key(b, ""), jid, 1, 0],
    )
    with redis.Redis(port=node.port) as c:
        assert c.execute_command("DBSIZE") == 0  # neither call wrote anything here
    assert "hash to the same slot" in cross[0] and foreign[0].startswith("MovedError"), (
        cross,
        foreign,
    )
    # (EMQ.COMPLETE answers, EVAL answers) for keys of two slots, and of a foreign slot.
    assert (cross[1], foreign[1]) == (cross[0], foreign[0])


@pytest.mark.cluster
def test_native_on_the_cluster_with_a_failover(native_cluster: EmbeddedCluster, qname: str) -> None:
    cluster = native_cluster
    url = cluster.url + "?executor=native"
    names = [f"{qname}-{i}" for i in range(9)]
    owners = {_slot_owner(cluster, n) for n in names}
    assert owners == {n.port for n in cluster.primaries()}, owners  # every shard serves
    before = _cluster_emq(cluster)
    for name in names:
        with echomq.Queue(name, url=url) as q:
            q.enqueue(b"a")
            q.enqueue_many([b"b", b"c"], group="lane")
            q.enqueue(b"d", delay_ms=10)
            jobs = q.claim_batch(3, lease_ms=60_000)
            assert len(jobs) == 3
            q.extend(jobs[0].id, jobs[0].token, lease_ms=60_000)
            q.complete(jobs[0].id, jobs[0].token)
            assert q.retry(jobs[1].id, jobs[1].token, delay_ms=0, max_attempts=1, error="e") == (
                "dead"
            )
            q.reprocess(jobs[1].id)
            short = q.claim(lease_ms=20)
            assert short is not None

            def swept(queue: echomq.Queue = q) -> bool:  # q bound now: the loop moves on
                return queue.sweep_stalled(max_stalled=5) != ([], [])

            wait_for(swept, timeout=60)
            assert q.executor == "native"
            assert q.check() == []
    after = _cluster_emq(cluster)
    assert all(after[p] > before[p] for p in before), (before, after)  # on every primary

    # The failover of test_cluster_failover.py, on the native executor.
    run, q = _run_failover(cluster, url, qname + "-fo")
    try:
        lost, undone = _losses(run)
        assert q.check() == []
        assert len(run.enqueued) > 100
        assert q.counts()["dead"] == 0
        assert q.executor == "native"
        owner = _slot_owner(cluster, q.name)
        with redis.Redis(port=owner) as c:
            n0 = sum(emq_calls(c).values())
        job = q.enqueue(b"after")
        got = q.claim(lease_ms=60_000)
        assert got is not None and got.id == job.id
        q.complete(got.id, got.token)
        with redis.Redis(port=owner) as c:
            assert sum(emq_calls(c).values()) >= n0 + 3  # the new primary runs EMQ.*
        assert q.check() == []
        print(f"native failover: lost {len(lost)} enqueues, undid {len(undone)} completions")
    finally:
        q.close()
