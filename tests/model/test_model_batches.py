"""Model leg for batches (issue 42): a hypothesis ``RuleBasedStateMachine`` on one queue
drives one batch, next to a small pure model of it, through adds (some resent as after a
lost reply), close, claims settled as completions or deaths, reprocess of dead members,
removal of waiting members, and the callbacks' own runs (the anchor is on_complete).

After every step the server must agree with the model: ``status()`` (total, pending,
succeeded, dead, closed, complete, success) or its absence once on_complete ran; which
callbacks were admitted (each at most once, and exactly when the model says: on_death at
the first counted death while the batch runs, on_success at the release when no member's
counted outcome is a death, on_complete at the release); and ``check()`` empty.

Budget: 12 examples of up to 30 steps per leg; ``ECHOMQ_MODEL_DEEP=1`` runs 20x more.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest
import redis
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

import echomq
from echomq.tasks import batches as _batches

pytestmark = pytest.mark.executors

DEEP = os.environ.get("ECHOMQ_MODEL_DEEP") == "1"
PICK = st.integers(0, 1_000)


@dataclass
class Member:
    place: str = "waiting"  # waiting | active | dead | gone
    record: str | None = None  # the counted outcome: ok | dead | None (not counted yet)
    dropped: bool = False  # removed before it was counted: the batch stopped waiting


@dataclass
class BatchModel:
    members: dict[str, Member] = field(default_factory=dict)
    closed: bool = False
    released: bool = False
    gone: bool = False  # the anchor (on_complete) ran: the batch's keys went with it
    fire_success: bool = False
    fire_death: bool = False

    def live(self) -> list[Member]:
        return [m for m in self.members.values() if not m.dropped]

    def maybe_release(self) -> None:
        if self.closed and not self.released and all(m.record for m in self.live()):
            self.released = True
            self.fire_success = not any(m.record == "dead" for m in self.live())

    def counted(self, m: Member, outcome: str) -> None:
        before, m.record = m.record, outcome
        if self.gone:
            return
        if outcome == "dead" and before != "dead" and not self.released:
            self.fire_death = True  # the first death only: admitted once (HSETNX died)
        if before is None:
            self.maybe_release()


class BatchMachine(RuleBasedStateMachine):
    def __init__(self, app: echomq.App, qname: str, client: redis.Redis) -> None:
        super().__init__()
        self.app, self.r = app, client
        self.q = app.queue(qname)
        self.member_task = app.tasks["member"]
        cb = app.tasks["cb"]
        self.b = app.batch(
            on_complete=cb.s("complete"), on_success=cb.s("success"), on_death=cb.s("death")
        )
        self.m = BatchModel()
        anchor = self.r.hgetall(f"emq:{{{qname}}}:job:{self.b.id}")
        self.cb_ids = {
            kind: anchor[b"on_" + kind.encode()].split(b"\0")[0].decode()
            for kind in ("success", "death")
        }
        self.ran: dict[str, int] = {"success": 0, "death": 0, "complete": 0}
        self.tokens: dict[str, int] = {}

    def pick(self, n: int, place: str) -> str | None:
        found = sorted(i for i, m in self.m.members.items() if m.place == place)
        return found[n % len(found)] if found else None

    def refusal(self) -> str | None:
        if self.m.gone:
            return "nobatch"
        if self.m.released:
            return "finished"
        if self.m.closed:
            return "closed"
        return None

    @rule(n=st.integers(1, 3), lost=st.booleans())
    def add(self, n: int, lost: bool) -> None:
        sigs = [self.member_task.s(i) for i in range(n)]
        why = self.refusal()
        if why is not None:
            with pytest.raises(echomq.StateError, match=why):
                self.b.add_many(sigs)
            return
        if not lost:
            ids = self.b.add_many(sigs)
        else:  # the reply of the first copy was lost: the same call is sent again
            plan = _batches.add(self.q._k, None, self.b.id, sigs, "")
            call = next(plan)
            self.q._x.run(call)
            again = self.q._x.run(call)
            assert [str(v) for v in again] == ["replayed"] * n
            ids = [str(a) for a in call.args[6::4]]
        for jid in ids:
            self.m.members[jid] = Member()

    @rule()
    def close(self) -> None:
        if self.m.gone:
            with pytest.raises(echomq.StateError, match="nobatch"):
                self.b.close()
            return
        assert self.b.close() == (not self.m.closed)
        self.m.closed = True
        self.m.maybe_release()

    @rule(die=st.booleans())
    def claim_and_settle(self, die: bool) -> None:
        job = self.q.claim(lease_ms=600_000)
        if job is None:
            return
        kinds = {v: k for k, v in self.cb_ids.items()}
        if job.id == self.b.id or job.id in kinds:
            self.ran[kinds.get(job.id, "complete")] += 1
            self.q.complete(job.id, job.token)
            if job.id == self.b.id:
                self.m.gone = True
            return
        m = self.m.members[job.id]
        assert m.place == "waiting", (job.id, m)
        if die:
            self.q.retry(job.id, job.token, delay_ms=0, max_attempts=1, error="boom")
            m.place = "dead"
            self.m.counted(m, "dead")
        else:
            self.q.complete(job.id, job.token)
            m.place = "gone"
            self.m.counted(m, "ok")

    @rule(n=PICK)
    def reprocess(self, n: int) -> None:
        jid = self.pick(n, "dead")
        if jid is None:
            return
        self.q.reprocess(jid)
        self.m.members[jid].place = "waiting"

    @rule(n=PICK)
    def remove(self, n: int) -> None:
        jid = self.pick(n, "waiting")
        if jid is None:
            return
        self.q.remove(jid)
        m = self.m.members[jid]
        m.place = "gone"
        if m.record is None and not self.m.gone:
            m.dropped = True
            self.m.maybe_release()

    @invariant()
    def agrees(self) -> None:
        live = self.m.live()
        if self.m.gone:
            with pytest.raises(echomq.StateError, match="nobatch"):
                self.b.status()
        else:
            st_ = self.b.status()
            pending = 0 if self.m.released else sum(1 for m in live if m.record is None)
            ok = sum(1 for m in live if m.record == "ok")
            dead = sum(1 for m in live if m.record == "dead")
            got = (st_.total, st_.pending, st_.succeeded, st_.dead)
            assert got == (ok + dead + pending, pending, ok, dead)
            assert (st_.closed, st_.complete, st_.success) == (
                self.m.closed,
                self.m.released,
                self.m.released and self.m.fire_success,
            )
        for kind in ("success", "death"):
            jid = self.cb_ids[kind]
            admitted = self.ran[kind] + self.q.job_state(jid).count("pending")
            want = self.m.fire_success if kind == "success" else self.m.fire_death
            assert admitted == int(want), (kind, admitted, want)
        assert self.ran["complete"] <= 1 and (self.ran["complete"] == 0 or self.m.released)
        assert self.q.check() == []


def _app(url: str, qname: str) -> echomq.App:
    app = echomq.App(url=url)

    @app.task(queue=qname, name="member")
    def member(n: int) -> int:
        return n

    @app.task(queue=qname, name="cb")
    def cb(kind: str) -> None:
        return None

    return app


def test_batches_agree_with_the_model(url: str, qname: str, r: redis.Redis) -> None:
    apps: list[echomq.App] = []

    def machine() -> BatchMachine:
        # Every example on a fresh queue: no job of an earlier example is claimed.
        name = f"{qname}-{len(apps)}"
        apps.append(_app(url, name))
        return BatchMachine(apps[-1], name, r)

    conf = settings(
        max_examples=240 if DEEP else 12,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=(Phase.explicit, Phase.reuse, Phase.generate),
    )
    try:
        run_state_machine_as_test(machine, settings=conf)
    finally:
        for app in apps:
            app.close()
