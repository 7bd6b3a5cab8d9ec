"""Model legs for the seams of issue 37: the queue-wide limit with a worker's turn, and the
dashboard's actions against jobs that moved since the page was drawn.

A hypothesis ``RuleBasedStateMachine`` on one queue, next to the pure ``QueueModel`` of
tests/model/core.py (its jobs, places, attempts, and the queue-wide limit's room), drives:
enqueue (flat and lanes), claim, the worker's settle (a completion, ``n=0``, as a worker
whose claim came back short sends it), retry into the schedule, a dead-letter, run_now,
reprocess, ``limit(n)``; and the dashboard: a page drawn of a job (its place and attempts,
as the job page shows them), then "remove" or "cancel" posted from that page later,
through ``echomq.web.actions.perform`` exactly as the dashboard runs it.

After every step the server must agree with the model: each job's ``job_state`` and
attempts, ``counts()``, and ``check()`` empty. The seams:

- Limit and turn: a settle that frees room under the limit while jobs wait leaves one wake
  token per freed slot still open (the wake list is emptied before it, as a parked worker
  would have); without a limit, or with nothing waiting, none (the mechanism of the refill,
  not a rate).
- Dashboard: an action acts only when the job is still where the page saw it (same place,
  same attempts); otherwise it reports ``skipped`` and nothing changes.

Two rules take the short walks that reach these seams within the budget: ``turn`` (claim
until a claim comes back short, then settle one run) and ``dash_seam`` (draw a job's page,
let another hand move it, then post the page's action).

Mutations (issue 37): without the settle's wake (settle.lua / cmd_settle.c) ``turn`` fails
(woke 0, room 1); without the script's seen-state check (control.lua ``moved_since``)
``dash_seam`` fails (a reprocessed job removed, a retried one cancelled).

Budget: 12 examples of up to 30 steps per leg; ``ECHOMQ_MODEL_DEEP=1`` runs 20x more.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import echomq
from echomq.errors import JobGone
from echomq.web.actions import perform
from model.core import LANES, LONG, Job, QueueModel

pytestmark = pytest.mark.executors

DEEP = os.environ.get("ECHOMQ_MODEL_DEEP") == "1"
PICK = st.integers(0, 1_000)
GROUPS = st.sampled_from((None, None, *LANES))


class SeamsMachine(RuleBasedStateMachine):
    def __init__(self, q: echomq.Queue, client: redis.Redis) -> None:
        super().__init__()
        self.q = q
        self.r = client
        self.m = QueueModel()
        self.tokens: dict[str, int] = {}
        self.pages: dict[str, tuple[str, int]] = {}  # jid -> (place, attempts) drawn
        self.wake = "emq:{" + q.name + "}:wake"

    # ------------------------------------------------------------------ helpers

    def pick(self, n: int, *states: str) -> str | None:
        found = sorted(i for i, j in self.m.jobs.items() if j.state in states)
        return found[n % len(found)] if found else None

    def waiting_any(self) -> bool:
        return any(j.state == "pending" for j in self.m.jobs.values())

    # ------------------------------------------------------------------ producer, worker

    @rule(group=GROUPS, n=st.integers(1, 3))
    def enqueue(self, group: str | None, n: int) -> None:
        for _ in range(n):
            jid = self.q.enqueue(b"p", group=group).id
            self.m.jobs[jid] = Job(b"p", group)

    @rule(n=st.sampled_from((None, 1, 2, 2, 3)))
    def limit(self, n: int | None) -> None:
        self.q.limit(n)
        self.m.limit = n

    @rule()
    def claim(self) -> None:
        room = self.m.claimable()
        job = self.q.claim(lease_ms=LONG)
        if room == 0:
            assert job is None, f"claimed {job} past the limit's room"
            return
        assert job is not None, "a claimable job was not claimed"
        j = self.m.jobs[job.id]
        assert j.state == "pending", f"claimed {job.id} in {j.state}"
        j.state, j.attempts, j.cancel = "active", j.attempts + 1, None
        assert job.token == j.attempts
        self.tokens[job.id] = job.token

    @rule(n=PICK)
    def turn(self, n: int) -> None:
        """A worker's turns under load: it claims until a claim comes back short (the limit
        holds, or nothing waits), then one of its runs ends and its settle goes out."""
        for _ in range(6):
            if self.m.claimable() == 0:
                break
            self.claim()
        self.claim()  # the short claim: None, the worker would park now
        self.settle(n)

    @rule(n=PICK)
    def settle(self, n: int) -> None:
        """The worker's settle after a short claim: a completion and no claim of its own.
        Under a limit, the room it frees (while jobs wait) wakes a parked claimer."""
        jid = self.pick(n, "active")
        if jid is None:
            return
        self.r.delete(self.wake)
        done = self.q.settle(completed=[(jid, self.tokens[jid])])
        assert done.completed == [None]
        del self.m.jobs[jid]
        woke = int(self.r.llen(self.wake))
        if self.m.limit is not None and self.waiting_any():
            room = self.m.limit - self.m.active_count()
            assert woke == min(1, max(0, room)), (woke, room)
        else:
            assert woke == 0, "a settle woke a claimer with no limit or nothing waiting"

    @rule(n=PICK)
    def retry_later(self, n: int) -> None:
        jid = self.pick(n, "active")
        if jid is None or self.m.jobs[jid].cancel:
            return
        verdict = self.q.retry(jid, self.tokens[jid], delay_ms=LONG, max_attempts=99, error="e")
        assert verdict == "scheduled"
        self.m.jobs[jid].state = "scheduled"

    @rule(n=PICK)
    def die(self, n: int) -> None:
        jid = self.pick(n, "active")
        if jid is None or self.m.jobs[jid].cancel:
            return
        assert self.q.retry(jid, self.tokens[jid], delay_ms=0, max_attempts=1, error="e") == (
            "dead"
        )
        self.m.jobs[jid].state = "dead"

    @rule(n=PICK)
    def run_now(self, n: int) -> None:
        jid = self.pick(n, "scheduled")
        if jid is not None:
            self.q.run_now(jid)
            self.m.jobs[jid].state = "pending"

    @rule(n=PICK)
    def reprocess(self, n: int) -> None:
        jid = self.pick(n, "dead")
        if jid is not None:
            self.q.reprocess(jid)
            self.m.jobs[jid].state = "pending"

    # ------------------------------------------------------------------ the dashboard

    @rule(n=PICK)
    def draw_page(self, n: int) -> None:
        """An operator opens a job's page: its place and attempts as the page shows them."""
        jid = self.pick(n, "pending", "active", "scheduled", "dead")
        if jid is None:
            return
        place = self.q.job_state(jid)
        row = self.q.get_job(jid)
        assert row is not None
        self.pages[jid] = (place, int(row.get("attempts") or 0))

    def post(self, jid: str, action: str) -> Any:
        place, attempts = self.pages.pop(jid)
        fields = {"seen_state": place, "seen_attempts": str(attempts), "confirm": "yes"}
        return perform(self.r, None, self.q.name, jid, action, fields, [])

    @precondition(lambda self: bool(self.pages))
    @rule(n=PICK)
    def dash_remove(self, n: int) -> None:
        jid = sorted(self.pages)[n % len(self.pages)]
        seen = self.pages[jid]
        j = self.m.jobs.get(jid)
        if j is None:
            with pytest.raises(JobGone):
                self.post(jid, "remove")
            return
        result = self.post(jid, "remove")
        if (j.state, j.attempts) == seen:
            assert result == {"done": 1, "skipped": 0}
            del self.m.jobs[jid]
        else:
            assert result == {"done": 0, "skipped": 1}, (jid, j.state, seen)

    @precondition(lambda self: any(p == "active" for p, _ in self.pages.values()))
    @rule(n=PICK)
    def dash_cancel(self, n: int) -> None:
        jids = sorted(i for i, (p, _) in self.pages.items() if p == "active")
        jid = jids[n % len(jids)]
        seen = self.pages[jid]
        j = self.m.jobs.get(jid)
        if j is None:
            with pytest.raises(JobGone):
                self.post(jid, "cancel")
            return
        result = self.post(jid, "cancel")
        if (j.state, j.attempts) == seen:
            assert result == {"done": 1, "skipped": 0, "outcome": "signalled"}
            j.cancel = "1"
        else:
            assert result == {"done": 0, "skipped": 1}, (jid, j.state, seen)

    def subject(self, want: str) -> str | None:
        """A job of its own for a seam walk: enqueued, claimed (the claims may take others
        first, as a worker's would), and dead-lettered when ``want`` is dead. None when the
        limit leaves no room to claim it."""
        self.enqueue(None, 1)
        jid = max(self.m.jobs)  # minted ids sort by time: the newest
        while self.m.jobs[jid].state == "pending":
            if self.m.claimable() == 0:
                return None
            self.claim()
        if want == "dead":
            self.die(sorted(i for i, j in self.m.jobs.items() if j.state == "active").index(jid))
        return jid

    @rule(n=PICK, kind=st.sampled_from(("reprocessed", "retried", "unmoved")))
    def dash_seam(self, n: int, kind: str) -> None:
        """A page drawn, the job moved by someone else, then the page's action posted: a
        dead job reprocessed before "remove", an active one retried into the schedule before
        "cancel" (or, the control, nothing moved)."""
        want = "active" if kind == "retried" else "dead"
        jid = self.pick(n, want)
        if jid is None or self.m.jobs[jid].cancel:
            jid = self.subject(want)
            if jid is None:
                return
        self.pages.pop(jid, None)
        order = sorted(
            i
            for i, j in self.m.jobs.items()
            if j.state in ("pending", "active", "scheduled", "dead")
        )
        self.draw_page(order.index(jid))
        assert self.pages[jid][0] == self.m.jobs[jid].state
        states = ("active",) if kind == "retried" else ("dead",)
        if kind == "reprocessed":
            self.reprocess(
                sorted(i for i, j in self.m.jobs.items() if j.state in states).index(jid)
            )
        elif kind == "retried":
            self.retry_later(
                sorted(i for i, j in self.m.jobs.items() if j.state in states).index(jid)
            )
        others = sorted(self.pages)
        if kind == "retried":
            self.dash_cancel(
                sorted(i for i, (p, _) in self.pages.items() if p == "active").index(jid)
            )
        else:
            self.dash_remove(others.index(jid))

    # ------------------------------------------------------------------ agreement

    @invariant()
    def agrees(self) -> None:
        for jid, j in self.m.jobs.items():
            assert self.q.job_state(jid) == j.state, jid
            row = self.q.get_job(jid)
            assert row is not None and int(row.get("attempts") or 0) == j.attempts, jid
        counts = self.q.counts()
        for place, key in (("pending", "pending"), ("active", "active"), ("dead", "dead")):
            assert counts[key] == sum(1 for j in self.m.jobs.values() if j.state == place)
        assert self.q.check() == []


def test_model_seams(url: str, qname: str, r: redis.Redis) -> None:
    runs = [0]

    def make() -> SeamsMachine:
        runs[0] += 1
        q = echomq.Queue(f"{qname}-{runs[0]}", url=url)
        return SeamsMachine(q, r)

    run_state_machine_as_test(
        make,
        settings=settings(
            max_examples=240 if DEEP else 12,
            stateful_step_count=60 if DEEP else 30,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            # ECHOMQ_MODEL_NOSHRINK=1 (mutations.py --no-shrink): the first failure unshrunk,
            # as the other model files; shrinking and explaining a failure of this machine
            # under a loaded machine's tracing outran the 300 s test timeout.
            phases=[Phase.explicit, Phase.generate]
            if os.environ.get("ECHOMQ_MODEL_NOSHRINK")
            else list(Phase),
        ),
    )
