"""Helpers shared by test_executors.py and the files split from it."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

import echomq
from conftest import server_ms, wait_for
from echomq.client import native as _native
from echomq.errors import StaleToken
from echomq.server import EmbeddedServer


def emq_calls(client: redis.Redis) -> dict[str, int]:
    """Calls per EMQ.* command since the server started (INFO commandstats)."""
    stats: dict[str, Any] = client.info("commandstats")
    return {
        name[len("cmdstat_") :]: int(v["calls"])
        for name, v in stats.items()
        if name.startswith("cmdstat_emq.")
    }


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
