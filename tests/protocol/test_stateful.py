"""Model-based test of the protocol core.

A hypothesis state machine drives random sequences of verbs against a real server through
``echomq.Queue``, next to a small pure-Python model of the protocol: jobs (state, attempts,
group, stalled, last_error, the open lease generation ``lease_epoch``), the four places and
the lanes, the queue and lane pause flags and the lane limits. The verbs: enqueue (flat, a
lane, delayed; duplicate ids, retired ids, non-JOB ids), enqueue_many, claim, claim_batch,
complete / retry / delay / extend with current and stale tokens, settle and complete_many
(the worker's batched round trip), extend_many, promote, reap, sweep_stalled, reprocess,
remove, reassign, drain, pause/resume, pause_lane/resume_lane, limit_lane, weight_lane.
After every step the server must agree with the model: ``check()`` is empty, ``counts()``,
``lanes()`` and ``is_paused()`` match, and every row, its set membership and score, and its
``job_state`` are what the model says.

The model predicts every verdict, token, error and count. Two things it cannot know in
advance are read from the server and then checked, not copied:

- which lane a claim serves when several compete: any legal choice is accepted (the oldest
  job of a serviceable waiting set while the queue runs) and the model follows it; how many
  jobs a claim or a batch returns is predicted exactly;
- the exact server clock: every lease deadline and run-at time is read back and must lie in
  ``[t0 + ms, t1 + ms]`` (``t0``/``t1`` = server TIME just before/after the call), and a sweep
  (reap, promote, sweep_stalled) must move exactly the ``k`` earliest due members, with ``k``
  between the number due at ``t0`` and at ``t1``. Leases are short (30-80 ms, plus a long
  one), a rule sleeps 60-100 ms and the sweeps may first wait for the earliest lease or
  run-at to pass, so lapsed leases and due schedules really occur.

Below the machine, fixed scenarios replay the chains that matter most (a reaped lease settled
by its holder, a released lease refused after promote/delay(0)/reprocess, duplicate pairs in
one batch, a dead lane job reprocessed into its lane, reassign, the stall ceiling) through
the same machine, so they are checked on every run whatever hypothesis draws.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

import echomq
from echomq import Enqueued, JobGone, KindError, StaleToken, StateError, _protocol, keyspace
from echomq.server import EmbeddedServer
from reliability import raw_violations

# Every test that reaches a server runs on both executors (tests/conftest.py).
pytestmark = pytest.mark.executors


# Each step runs check(), whose "rows" section SCANs the server's whole keyspace. The session
# servers hold every earlier test's keys (~48k on the Lua one by here in a full run), which
# made one check ~50 SCAN pages and this module ten minutes; its own servers keep it at the
# machine's speed. They override conftest's session_url and module_server for this module.
@pytest.fixture(scope="module")
def session_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if os.environ.get("ECHOMQ_TEST_URL"):
        yield os.environ["ECHOMQ_TEST_URL"]
        return
    with EmbeddedServer(tmp_path_factory.mktemp("stateful"), appendonly=False) as srv:
        yield srv.url


@pytest.fixture(scope="module")
def module_server(
    tmp_path_factory: pytest.TempPathFactory, module_so: Path
) -> Iterator[EmbeddedServer]:
    with EmbeddedServer(
        tmp_path_factory.mktemp("stateful-native"),
        appendonly=False,
        args=["--loadmodule", str(module_so)],
    ) as srv:
        yield srv


LANES = ("la", "lb", "lc")
GROUPS = st.sampled_from((None, *LANES))
LANE = st.sampled_from(LANES)
LEASES = st.sampled_from((30, 50, 80, 60_000))
PAYLOADS = st.binary(max_size=6)
LIMITS = st.sampled_from((1, 100))
PICK = st.integers(0, 255)  # which handed-out ticket, counted from the most recent

_names = itertools.count()


def note(text: str) -> None:
    """A coverage event for ``--hypothesis-show-statistics`` (the scenarios below run the
    machine outside hypothesis, where there is nothing to record to)."""
    if currently_in_test_context():
        event(text)


@dataclass
class MJob:
    """The model of one job's row; ``score`` is the lease deadline (active) or run-at time
    (scheduled) on the server clock; ``epoch`` is the open lease generation (the token of
    the last claim, until its holder releases the job)."""

    payload: bytes
    group: str | None
    state: str = "pending"
    attempts: int = 0
    stalled: int = 0
    last_error: str | None = None
    score: int = 0
    epoch: int | None = None
    floor: int = 0  # the attempts a re-admitted id came back with (its retired last token)


class Model:
    """What the protocol says the queue holds."""

    def __init__(self) -> None:
        self.jobs: dict[str, MJob] = {}
        self.paused = False
        self.paused_lanes: set[str] = set()
        self.limits: dict[str, int] = {}
        self.completed = 0
        self.failed = 0
        # Retired ids' last tokens: a re-admitted id continues from its count, so no (id,
        # token) pair is handed out twice across incarnations (no ABA on the token).
        self.retired: dict[str, int] = {}

    def waiting(self, g: str | None) -> list[str]:
        """The waiting set of lane ``g`` (the flat set when None), oldest first."""
        return sorted(i for i, j in self.jobs.items() if j.state == "pending" and j.group == g)

    def active_in(self, g: str) -> int:
        return sum(1 for j in self.jobs.values() if j.state == "active" and j.group == g)

    def capacity(self, g: str | None) -> int:
        """How many jobs claims could take from waiting set ``g`` right now."""
        depth = len(self.waiting(g))
        if g is None:
            return depth
        if g in self.paused_lanes:
            return 0
        limit = self.limits.get(g)
        if limit is None:
            return depth
        return max(0, min(depth, limit - self.active_in(g)))

    def claimable(self) -> int:
        if self.paused:
            return 0
        return sum(self.capacity(g) for g in (None, *LANES))

    def lanes(self) -> list[str]:
        return [g for g in LANES if self.waiting(g)]

    def counts(self) -> dict[str, int]:
        def n(state: str) -> int:
            return sum(1 for j in self.jobs.values() if j.state == state)

        return {
            "pending": n("pending"),
            "active": n("active"),
            "schedule": n("scheduled"),
            "dead": n("dead"),
            "completed": self.completed,
            "failed": self.failed,
            "kept": 0,  # this machine never turns kept history on (tests/model/test_model.py does)
        }

    def fence(self, jid: str, token: int) -> type[Exception] | None:
        """D5: the error a settle verb must raise, or None when it goes through. The lease
        generation must still be open: the job is active, or pending because its lease
        lapsed and was reaped and nobody claimed it since; once the holder released it
        (complete, retry, delay) or it died stalled, the token settles nothing more, even
        after promote, delay(0) or reprocess bring the job back to pending (D13)."""
        j = self.jobs.get(jid)
        if j is None:
            return JobGone
        if token != j.attempts or token != j.epoch or j.state not in ("active", "pending"):
            return StaleToken
        return None


class QueueMachine(RuleBasedStateMachine):
    ids = Bundle("ids")

    def __init__(self, client: redis.Redis) -> None:
        super().__init__()
        self.r = client
        self.name = f"sm{next(_names)}-{os.getpid()}"
        self.q = echomq.Queue(self.name, client=client)
        self.m = Model()
        self.gone: set[str] = set()
        # (id, token) pairs that claims handed out. A list picked by index rather than a
        # Bundle: how many a claim returns depends on the clock (lapsed leases, due jobs),
        # and hypothesis needs the shape of its draws not to.
        self.tickets: list[tuple[str, int]] = []

    # ------------------------------------------------------------------ helpers

    def key(self, suffix: str) -> str:
        return keyspace.queue_key(self.name, suffix)

    def place_key(self, j: MJob) -> str:
        if j.state == "pending":
            return keyspace.lane_key(self.name, j.group) if j.group else self.key("pending")
        return self.key({"active": "active", "scheduled": "schedule", "dead": "dead"}[j.state])

    def now(self) -> int:
        sec, usec = self.r.time()
        return int(sec) * 1000 + int(usec) // 1000

    def score(self, place: str, jid: str, lo: int, hi: int) -> int:
        """The server-clock score the call gave ``jid``, checked against the call's window."""
        s = self.r.zscore(self.key(place), jid)
        assert s is not None, f"{jid} is not in {place}"
        assert lo <= s <= hi, f"{jid} has {place} score {s}, outside [{lo}, {hi}]"
        return int(s)

    @staticmethod
    def expect(err: type[Exception] | None, fn: Callable[..., Any], *a: Any, **kw: Any) -> Any:
        if err is None:
            return fn(*a, **kw)
        with pytest.raises(err):
            fn(*a, **kw)
        return None

    def ticket(self, pick: int) -> tuple[str, int] | None:
        """A handed-out ticket (the most recent for pick 0), or None before any claim."""
        if not self.tickets:
            return None
        return self.tickets[-1 - pick % len(self.tickets)]

    def ticket_list(self, picks: list[int]) -> list[tuple[str, int]]:
        return [self.tickets[-1 - p % len(self.tickets)] for p in picks] if self.tickets else []

    def add(self, jid: str, j: MJob) -> None:
        assert jid not in self.m.jobs
        j.attempts = j.floor = self.m.retired.pop(jid, 0)
        self.m.jobs[jid] = j
        self.gone.discard(jid)

    def drop(self, jid: str) -> None:
        j = self.m.jobs.pop(jid)
        self.m.retired[jid] = j.attempts  # 0 too: a resend of its enqueue looks here (issue 28)
        self.gone.add(jid)

    def fence(self, verb: str, jid: str, token: int) -> type[Exception] | None:
        """The model's D5 verdict for a settle verb, recorded as a coverage event."""
        err = self.m.fence(jid, token)
        j = self.m.jobs.get(jid)
        if err is None:
            assert j is not None
            note(f"{verb}: accepted ({j.state})")
        elif err is StaleToken and j is not None and token == j.attempts:
            note(f"{verb}: refused, lease settled ({j.state})")
        else:
            note(f"{verb}: refused, {err.__name__}")
        return err

    def take(self, job: echomq.Job) -> None:
        """Accept a claimed job if it is a legal choice, and move the model along."""
        m = self.m
        assert not m.paused, "a paused queue served a claim"
        j = m.jobs.get(job.id)
        assert j is not None and j.state == "pending", f"claimed {job.id}, which is {j}"
        assert m.capacity(j.group) > 0, f"claimed from unserviceable {j.group or 'flat set'}"
        assert job.id == m.waiting(j.group)[0], "a claim must serve the oldest of its set"
        assert job.token == j.attempts + 1
        assert job.group == j.group
        assert job.payload == j.payload
        j.attempts += 1
        j.state = "active"
        j.epoch = j.attempts
        self.tickets.append((job.id, job.token))
        note(f"claim: token {min(j.attempts, 3)}{'+' if j.attempts >= 3 else ''}")

    def wait_for_due(self, state: str, wait: bool) -> None:
        """With ``wait``, sleep until the earliest lease (or run-at) of ``state`` is due, when
        that is at most 100 ms away, so a sweep right after it has work to do."""
        if not wait:
            return
        scores = [j.score for j in self.m.jobs.values() if j.state == state]
        ahead = min(scores, default=0) - self.now() + 2
        if 0 < ahead <= 100:
            time.sleep(ahead / 1000)

    def due(self, state: str, t0: int, t1: int, limit: int, k: int) -> list[str]:
        """The members a sweep that moved ``k`` of ``state`` must have moved, in sweep order;
        ``k`` must be legal for some server time in ``[t0, t1]``."""
        cands = sorted((j.score, jid) for jid, j in self.m.jobs.items() if j.state == state)
        lo = min(limit, sum(1 for s, _ in cands if s <= t0))
        hi = min(limit, sum(1 for s, _ in cands if s <= t1))
        assert lo <= k <= hi, f"a sweep of {state} moved {k}, expected {lo}..{hi}"
        note(f"sweep of {state}: {'moved' if k else 'nothing due'}")
        return [jid for _, jid in cands[:k]]

    # ------------------------------------------------------------------ producers

    @initialize(
        target=ids,
        flat=st.integers(0, 3),
        per_lane=st.integers(0, 4),
        limit=st.sampled_from((None, 1, 2)),
    )
    def seed(self, flat: int, per_lane: int, limit: int | None = None) -> Any:
        """Start with work in the flat set and every lane, so claims have a choice, and
        often with a limit on the first lane, so claims run into it."""
        if limit is not None:
            self.q.limit_lane(LANES[0], limit)
            self.m.limits[LANES[0]] = limit
        new = []
        for group, n in ((None, flat), *((g, per_lane) for g in LANES)):
            payloads = [f"{group}-{i}".encode() for i in range(n)]
            for e, payload in zip(
                self.q.enqueue_many(payloads, group=group), payloads, strict=True
            ):
                assert isinstance(e, Enqueued) and e.status == "enqueued"
                self.add(e.id, MJob(payload, group))
                new.append(e.id)
        return multiple(*new)

    @rule(
        target=ids,
        payload=PAYLOADS,
        group=GROUPS,
        delay=st.sampled_from((None, 0, 40, 10_000)),
    )
    def enqueue(self, payload: bytes, group: str | None, delay: int | None) -> str:
        t0 = self.now()
        e = self.q.enqueue(payload, group=group, delay_ms=delay)
        t1 = self.now()
        j = MJob(payload, group)
        if delay:
            assert e.status == "scheduled"
            j.state = "scheduled"
            j.score = self.score("schedule", e.id, t0 + delay, t1 + delay)
        else:
            assert e.status == "enqueued"
        self.add(e.id, j)
        return e.id

    @rule(
        target=ids,
        payloads=st.lists(PAYLOADS, max_size=4),
        group=GROUPS,
        delay=st.sampled_from((None, 0, 40)),
    )
    def enqueue_many(self, payloads: list[bytes], group: str | None, delay: int | None) -> Any:
        t0 = self.now()
        out = self.q.enqueue_many(payloads, group=group, delay_ms=delay)
        t1 = self.now()
        assert len(out) == len(payloads)
        assert all(isinstance(e, Enqueued) for e in out)
        new = [e.id for e in out if isinstance(e, Enqueued)]
        assert new == sorted(set(new)), "minted ids increase in input order"
        for e, payload in zip(out, payloads, strict=True):
            assert isinstance(e, Enqueued)
            j = MJob(payload, group)
            if delay:
                assert e.status == "scheduled"
                j.state = "scheduled"
                j.score = self.score("schedule", e.id, t0 + delay, t1 + delay)
            else:
                assert e.status == "enqueued"
            self.add(e.id, j)
        return multiple(*new)

    @rule(
        target=ids,
        dup=ids,
        payload=PAYLOADS,
        group=GROUPS,
        how=st.sampled_from(("same id", "wrong kind", "mixed batch")),
    )
    def enqueue_odd(self, dup: str, payload: bytes, group: str | None, how: str) -> Any:
        """Idempotency and refusals: an id that exists is a duplicate (row untouched), an id
        that was retired is free again, a non-JOB id is refused (nothing written)."""
        if how == "same id":
            e = self.q.enqueue(payload, id=dup, group=group)
            if dup in self.m.jobs:
                assert e == Enqueued(dup, "duplicate")
            else:
                assert e == Enqueued(dup, "enqueued")
                self.add(dup, MJob(payload, group))
            return multiple()
        bad = echomq.ids.mint("ORD")
        if how == "wrong kind":
            with pytest.raises(KindError):
                self.q.enqueue(payload, id=bad, group=group)
            assert self.q.get_job(bad) is None
            return multiple()
        items: list[Any] = [payload, (bad, payload), (dup, payload), (dup, b"again"), payload]
        out = self.q.enqueue_many(items, group=group)
        assert len(out) == 5
        assert isinstance(out[1], KindError)
        first, second = out[2], out[3]
        assert isinstance(first, Enqueued) and isinstance(second, Enqueued)
        assert (first.id, second.id) == (dup, dup)
        assert second.status == "duplicate"
        if dup in self.m.jobs:
            assert first.status == "duplicate"
        else:
            assert first.status == "enqueued"
            self.add(dup, MJob(payload, group))
        new = []
        for e in (out[0], out[4]):
            assert isinstance(e, Enqueued) and e.status == "enqueued"
            self.add(e.id, MJob(payload, group))
            new.append(e.id)
        assert new[0] < new[1]
        assert self.q.get_job(bad) is None
        return multiple(*new)

    @rule(jid=ids, payload=PAYLOADS, group=GROUPS, claim=st.booleans())
    def reincarnate(self, jid: str, payload: bytes, group: str | None, claim: bool) -> None:
        """A caller-chosen id used again: remove it (when it exists) and enqueue it anew,
        often claiming the new incarnation at once. The old incarnation's tickets stay in
        play: none of them may settle the new one (its count continues, no ABA)."""
        if jid in self.m.jobs:
            self.q.remove(jid)
            self.drop(jid)
        e = self.q.enqueue(payload, id=jid, group=group)
        assert e == Enqueued(jid, "enqueued")
        self.add(jid, MJob(payload, group))
        note("reincarnate: continued" if self.m.jobs[jid].floor else "reincarnate: fresh")
        if claim and not self.m.paused and self.m.capacity(group) > 0:
            # Make this incarnation the oldest of its set, so the claim below takes it.
            for other in self.m.waiting(group):
                if other != jid and other < jid:
                    return
            self.claim(lease=60_000)

    # ------------------------------------------------------------------ consumers

    @rule(lease=LEASES)
    def claim(self, lease: int) -> None:
        claimable = self.m.claimable()
        t0 = self.now()
        job = self.q.claim(lease_ms=lease)
        t1 = self.now()
        if job is None:
            assert claimable == 0, f"claim answered empty with {claimable} claimable"
            note("claim: paused" if self.m.paused else "claim: nothing claimable")
            return
        self.take(job)
        self.m.jobs[job.id].score = self.score("active", job.id, t0 + lease, t1 + lease)

    @rule(n=st.integers(1, 6), lease=LEASES)
    def claim_batch(self, n: int, lease: int) -> None:
        claimable = self.m.claimable()
        t0 = self.now()
        jobs = self.q.claim_batch(n, lease_ms=lease)
        t1 = self.now()
        assert len(jobs) == min(n, claimable), "a batch fills to n when n are claimable"
        for job in jobs:
            self.take(job)
        deadlines = set()
        for job in jobs:
            j = self.m.jobs[job.id]
            j.score = self.score("active", job.id, t0 + lease, t1 + lease)
            deadlines.add(j.score)
        assert len(deadlines) <= 1, "a batch shares one lease deadline"

    # ------------------------------------------------------------------ settling (D5)

    def do_complete(self, jid: str, token: int) -> None:
        err = self.fence("complete", jid, token)
        self.expect(err, self.q.complete, jid, token)
        if err is None:
            self.drop(jid)
            self.m.completed += 1

    def do_retry(self, jid: str, token: int, delay: int, max_attempts: int) -> None:
        err = self.fence("retry", jid, token)
        t0 = self.now()
        verdict = self.expect(
            err, self.q.retry, jid, token, delay_ms=delay, max_attempts=max_attempts, error="boom"
        )
        t1 = self.now()
        if err is None:
            assert verdict == self.retried(jid, delay, max_attempts, t0, t1)

    def retried(self, jid: str, delay: int, max_attempts: int, t0: int, t1: int) -> str:
        """Move the model along an accepted retry; its verdict."""
        j = self.m.jobs[jid]
        j.last_error, j.epoch = "boom", None
        if j.attempts - j.floor >= max_attempts:
            j.state = "dead"
            self.m.failed += 1
            return "dead"
        j.state = "scheduled"
        j.score = self.score("schedule", jid, t0 + delay, t1 + delay)
        return "scheduled"

    def do_delay(self, jid: str, token: int, delay: int) -> None:
        err = self.fence("delay", jid, token)
        t0 = self.now()
        self.expect(err, self.q.delay, jid, token, delay)
        t1 = self.now()
        if err is not None:
            return
        j = self.m.jobs[jid]
        j.epoch = None
        if delay == 0:
            j.state = "pending"
        else:
            j.state = "scheduled"
            j.score = self.score("schedule", jid, t0 + delay, t1 + delay)

    def do_extend(self, jid: str, token: int, lease: int) -> None:
        err = self.fence("extend", jid, token)
        t0 = self.now()
        self.expect(err, self.q.extend, jid, token, lease_ms=lease)
        t1 = self.now()
        if err is None:
            j = self.m.jobs[jid]
            j.state = "active"  # a reaped, unclaimed job is re-armed (D5)
            j.score = self.score("active", jid, t0 + lease, t1 + lease)

    def settle_with(self, verb: str, jid: str, token: int, ms: int, max_attempts: int) -> None:
        if verb == "complete":
            self.do_complete(jid, token)
        elif verb == "retry":
            self.do_retry(jid, token, ms, max_attempts)
        elif verb == "delay":
            self.do_delay(jid, token, ms)
        else:
            self.do_extend(jid, token, ms or 50)

    @rule(
        pick=PICK,
        verb=st.sampled_from(("complete", "retry", "delay", "extend")),
        ms=st.sampled_from((0, 30, 50, 10_000)),
        max_attempts=st.integers(1, 3),
    )
    def settle(self, pick: int, verb: str, ms: int, max_attempts: int) -> None:
        """A settle verb with a token a claim handed out (current, or stale by now)."""
        t = self.ticket(pick)
        if t is not None:
            self.settle_with(verb, *t, ms, max_attempts)

    @rule(
        jid=ids,
        verb=st.sampled_from(("complete", "retry", "delay", "extend")),
        delta=st.sampled_from((-1, 0, 1)),
    )
    def settle_forged(self, jid: str, verb: str, delta: int) -> None:
        """A settle verb with a token derived from the row's current one (delta 0: the
        current token, which is stale for a never-claimed job)."""
        j = self.m.jobs.get(jid)
        token = max(1, (j.attempts if j else 0) + delta)
        self.settle_with(verb, jid, token, 30, 2)

    @rule(
        done=st.lists(PICK, max_size=3),
        again=st.lists(PICK, max_size=2),
        n=st.integers(0, 3),
        lease=LEASES,
        delay=st.sampled_from((0, 30, 10_000)),
        max_attempts=st.integers(1, 3),
    )
    def settle_batch(
        self,
        done: list[int],
        again: list[int],
        n: int,
        lease: int,
        delay: int,
        max_attempts: int,
    ) -> None:
        """The worker's round trip: completes, then retries (each fenced on its own token,
        in order, as if sent one by one), then a claim of up to n on one lease."""
        completed, retried = self.ticket_list(done), self.ticket_list(again)
        t0 = self.now()
        out = self.q.settle(
            completed=completed,
            retried=[(jid, tok, delay, max_attempts, "boom") for jid, tok in retried],
            n=n,
            lease_ms=lease,
        )
        t1 = self.now()
        for (jid, tok), verdict in zip(completed, out.completed, strict=True):
            err = self.fence("complete", jid, tok)
            if err is None:
                assert verdict is None, f"complete {jid}/{tok} in a batch: {verdict!r}"
                self.drop(jid)
                self.m.completed += 1
            else:
                assert isinstance(verdict, err), f"complete {jid}/{tok}: {verdict!r}, not {err}"
        for (jid, tok), verdict in zip(retried, out.retried, strict=True):
            err = self.fence("retry", jid, tok)
            if err is None:
                assert verdict == self.retried(jid, delay, max_attempts, t0, t1)
            else:
                assert isinstance(verdict, err), f"retry {jid}/{tok}: {verdict!r}, not {err}"
        claimable = self.m.claimable()
        assert len(out.jobs) == min(n, claimable)
        for job in out.jobs:
            self.take(job)
        for job in out.jobs:
            self.m.jobs[job.id].score = self.score("active", job.id, t0 + lease, t1 + lease)
        assert len({self.m.jobs[job.id].score for job in out.jobs}) <= 1

    @rule(picks=st.lists(PICK, max_size=4))
    def complete_many(self, picks: list[int]) -> None:
        pairs = self.ticket_list(picks)
        want = []
        for jid, tok in pairs:  # fenced one by one, in order
            if self.fence("complete", jid, tok) is None:
                self.drop(jid)
                self.m.completed += 1
            else:
                want.append(jid)
        assert self.q.complete_many(pairs) == want

    @rule(picks=st.lists(PICK, max_size=3), lease=LEASES)
    def extend_many(self, picks: list[int], lease: int) -> None:
        pairs = self.ticket_list(picks)
        expected_failed = []
        ok = []
        for jid, token in pairs:  # each pair is fenced in turn, inside one script
            if self.m.fence(jid, token) is None:
                self.m.jobs[jid].state = "active"
                ok.append(jid)
            else:
                expected_failed.append(jid)
        t0 = self.now()
        failed = self.q.extend_many(pairs, lease_ms=lease)
        t1 = self.now()
        assert failed == expected_failed
        for jid in ok:
            self.m.jobs[jid].score = self.score("active", jid, t0 + lease, t1 + lease)

    # ------------------------------------------------------------------ sweeps

    @rule(limit=LIMITS, wait=st.booleans())
    def promote(self, limit: int, wait: bool) -> None:
        self.wait_for_due("scheduled", wait)
        t0 = self.now()
        k = self.q.promote(limit)
        t1 = self.now()
        for jid in self.due("scheduled", t0, t1, limit, k):
            self.m.jobs[jid].state = "pending"

    @rule(limit=LIMITS, wait=st.booleans())
    def reap(self, limit: int, wait: bool) -> None:
        self.wait_for_due("active", wait)
        t0 = self.now()
        k = self.q.reap(limit)
        t1 = self.now()
        for jid in self.due("active", t0, t1, limit, k):
            self.m.jobs[jid].state = "pending"  # attempts untouched

    @rule(max_stalled=st.integers(1, 3), limit=LIMITS, wait=st.booleans())
    def sweep_stalled(self, max_stalled: int, limit: int, wait: bool) -> None:
        self.wait_for_due("active", wait)
        t0 = self.now()
        recovered, dead = self.q.sweep_stalled(max_stalled=max_stalled, limit=limit)
        t1 = self.now()
        want_recovered, want_dead = [], []
        for jid in self.due("active", t0, t1, limit, len(recovered) + len(dead)):
            j = self.m.jobs[jid]
            j.stalled += 1
            if j.stalled >= max_stalled:
                j.state, j.last_error, j.epoch = "dead", "stalled", None
                self.m.failed += 1
                want_dead.append(jid)
            else:
                j.state = "pending"
                want_recovered.append(jid)
        assert (recovered, dead) == (want_recovered, want_dead)

    @rule(ms=st.sampled_from((60, 100)))
    def sleep(self, ms: int) -> None:
        """Let the server clock move on: short leases lapse, short delays come due."""
        time.sleep(ms / 1000)

    # ------------------------------------------------------------------ job admin

    @rule(jid=ids)
    def reprocess(self, jid: str) -> None:
        j = self.m.jobs.get(jid)
        err = JobGone if j is None else StateError if j.state != "dead" else None
        self.expect(err, self.q.reprocess, jid)
        if j is not None and err is None:
            # Back to its lane when grouped (D6), with a fresh stall count and a fresh
            # retry budget (floor = attempts; the token itself never goes down).
            j.state, j.last_error, j.stalled = "pending", None, 0
            j.floor = j.attempts

    @rule(jid=ids)
    def remove(self, jid: str) -> None:
        err = JobGone if jid not in self.m.jobs else None
        self.expect(err, self.q.remove, jid)
        if err is None:
            self.drop(jid)

    @rule(jid=ids, g=LANE)
    def reassign(self, jid: str, g: str) -> None:
        j = self.m.jobs.get(jid)
        if j is None:
            self.expect(JobGone, self.q.reassign, jid, g)
        elif j.group == g:
            assert self.q.reassign(jid, g) == "noop"
        elif j.state in ("pending", "scheduled"):
            assert self.q.reassign(jid, g) == "reassigned"
            j.group = g
        else:
            self.expect(StateError, self.q.reassign, jid, g)

    @rule(include_schedule=st.booleans())
    def drain(self, include_schedule: bool) -> None:
        states = ("pending", "scheduled") if include_schedule else ("pending",)
        doomed = [jid for jid, j in self.m.jobs.items() if j.state in states]
        assert self.q.drain(include_scheduled=include_schedule) == len(doomed)
        for jid in doomed:
            self.drop(jid)

    # ------------------------------------------------------------------ queue and lanes

    @rule(
        what=st.sampled_from(("pause queue", "pause lane", "limit lane", "weight lane")),
        g=LANE,
        n=st.sampled_from((None, 1, 2, 3)),
    )
    def admin(self, what: str, g: str, n: int | None) -> None:
        """Pause toggles (a paused queue or lane is always one step from running again),
        lane limits (None lifts it) and weights (which change which legal claim is made,
        never what is legal)."""
        m = self.m
        if what == "pause queue":
            if m.paused:
                self.q.resume()
            else:
                self.q.pause()
            m.paused = not m.paused
        elif what == "pause lane":
            if g in m.paused_lanes:
                self.q.resume_lane(g)
                m.paused_lanes.discard(g)
            else:
                self.q.pause_lane(g)
                m.paused_lanes.add(g)
        elif what == "limit lane":
            self.q.limit_lane(g, n)
            if n is None:
                m.limits.pop(g, None)
            else:
                m.limits[g] = n
        else:
            self.q.weight_lane(g, n or 1)

    # ------------------------------------------------------------------ agreement

    @invariant()
    def server_agrees_with_model(self) -> None:
        assert self.q.check() == []
        assert raw_violations(self.r, self.name) == []
        retired = self.r.hgetall(self.key("retired"))
        assert {k.decode(): int(v) for k, v in retired.items()} == self.m.retired
        assert self.q.counts() == self.m.counts()
        assert self.q.lanes() == self.m.lanes()
        assert self.q.is_paused() == self.m.paused
        fields = (
            "state",
            "attempts",
            "group",
            "stalled",
            "last_error",
            "payload",
            "lease_epoch",
            "floor",
        )
        pipe = self.r.pipeline(transaction=False)
        jobs = sorted(self.m.jobs.items())
        for jid, j in jobs:
            pipe.hmget(self.key("job:" + jid), fields)
            pipe.zscore(self.place_key(j), jid)
        gone = sorted(self.gone)
        for jid in gone:
            pipe.exists(self.key("job:" + jid), self.key(f"job:{jid}:logs"))
        replies = pipe.execute()
        now = self.now()
        for n, (jid, j) in enumerate(jobs):
            row, score = replies[2 * n], replies[2 * n + 1]
            want = [
                j.state.encode(),
                str(j.attempts).encode(),
                j.group.encode() if j.group else None,
                str(j.stalled).encode() if j.stalled else None,
                j.last_error.encode() if j.last_error is not None else None,
                j.payload,
                str(j.epoch).encode() if j.epoch is not None else None,
                str(j.floor).encode() if j.floor else None,
            ]
            assert row == want, f"{jid}: row {row} != model {want}"
            if j.state == "dead":  # D25: the server's time of death (after the run began)
                assert score is not None and 0 < score <= now, f"{jid} died at {score}"
                continue
            want_score = j.score if j.state in ("active", "scheduled") else 0
            assert score == want_score, f"{jid} ({j.state}) has score {score}, not {want_score}"
        assert replies[2 * len(jobs) :] == [0] * len(gone), "a retired job left a row behind"
        # job_state reads the sets, not the row: it must name the same place.
        calls = [_protocol.job_state(self.q._k, jid) for jid, _ in jobs]
        calls += [_protocol.job_state(self.q._k, jid) for jid in gone]
        states = self.q._x.pipeline(calls) if calls else []
        assert states == [j.state for _, j in jobs] + ["absent"] * len(gone)

    def teardown(self) -> None:
        # A fresh queue per example; obliterate must leave nothing of it behind.
        try:
            self.q.pause()
            self.q.obliterate(force=True)
            left = list(self.r.scan_iter(match=f"emq:{{{self.name}}}:*", count=1000))
            assert left == []
        finally:
            self.q.close()  # the client is shared; this closes the queue's own connections


# Each step checks the server against the model and the raw keys (reliability.raw_violations):
# ~40 s on a quiet machine, several minutes on a loaded one. A timeout inside hypothesis is
# reported as a flaky strategy, so it gets room of its own.
@pytest.mark.timeout(900)
def test_protocol_state_machine(redis_url: str, executor: str | None) -> None:
    client = redis.Redis.from_url(redis_url)
    client.script_flush()  # the NOSCRIPT -> EVAL path runs too
    try:
        run_state_machine_as_test(
            lambda: QueueMachine(client),
            settings=settings(
                # The native leg replays the same machine with fewer examples: the suite's
                # time, and the differential tests of tests/test_native_*.py cover it too.
                max_examples=25 if executor == "native" else 60,
                stateful_step_count=50,
                deadline=None,
                # No example database: a stored example replayed against a changed machine
                # (or a loaded server) is reported as a flaky strategy; CI starts without one.
                database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            ),
        )
    finally:
        client.close()


# ---------------------------------------------------------------------- fixed scenarios
# The chains that matter most, replayed through the same machine (so the model checks every
# step) without depending on hypothesis to find them in a given run.


@pytest.fixture
def sm(redis_url: str) -> Iterator[QueueMachine]:
    client = redis.Redis.from_url(redis_url)
    machine = QueueMachine(client)
    machine.server_agrees_with_model()
    yield machine
    machine.teardown()
    client.close()


class Steps:
    """Run machine rules by name, checking the server against the model after each."""

    def __init__(self, sm: QueueMachine) -> None:
        self.sm = sm

    def __getattr__(self, name: str) -> Callable[..., Any]:
        rule_fn = getattr(self.sm, name)

        def run(**kw: Any) -> Any:
            out = rule_fn(**kw)
            self.sm.server_agrees_with_model()
            return out

        return run


def job_of(sm: QueueMachine, pick: int = 0) -> MJob:
    t = sm.ticket(pick)
    assert t is not None
    return sm.m.jobs[t[0]]


@pytest.mark.parametrize("group", [None, "lb"])
@pytest.mark.parametrize("verb", ["complete", "retry", "delay", "extend"])
def test_reaped_lease_settles_once_by_its_holder(
    sm: QueueMachine, verb: str, group: str | None
) -> None:
    s = Steps(sm)
    jid = s.enqueue(payload=b"x", group=group, delay=None)
    s.claim(lease=30)
    token = 1
    s.reap(limit=100, wait=True)
    assert sm.m.jobs[jid].state == "pending" and sm.m.jobs[jid].epoch == token
    # The holder's token still owns the reaped, unclaimed job (D5) ...
    s.settle(pick=0, verb=verb, ms=0, max_attempts=3)
    # ... once: a second settle with it is refused (or, for extend, just extends again).
    before = sm.m.counts()
    s.settle(pick=0, verb="complete" if verb == "extend" else verb, ms=0, max_attempts=3)
    if verb != "extend":
        assert sm.m.counts() == before


def test_a_new_claim_fences_the_lapsed_holder(sm: QueueMachine) -> None:
    s = Steps(sm)
    s.seed(flat=1, per_lane=0)
    s.claim(lease=30)
    s.reap(limit=100, wait=True)
    s.claim(lease=60_000)
    assert [tok for _, tok in sm.tickets] == [1, 2]
    for verb in ("complete", "retry", "delay", "extend"):
        s.settle(pick=1, verb=verb, ms=0, max_attempts=3)  # token 1: stale
    assert job_of(sm).state == "active"
    s.settle(pick=0, verb="complete", ms=0, max_attempts=3)
    assert sm.m.completed == 1


@pytest.mark.parametrize("group", [None, "lb"])
def test_a_released_lease_never_settles_again(sm: QueueMachine, group: str | None) -> None:
    """retry -> promote, delay(0) and dead -> reprocess all bring the job back to pending
    with its old attempts; the old token must not settle it (D13)."""
    s = Steps(sm)
    jid = s.enqueue(payload=b"x", group=group, delay=None)
    s.claim(lease=60_000)
    s.settle(pick=0, verb="retry", ms=0, max_attempts=3)
    s.promote(limit=100, wait=True)
    assert sm.m.jobs[jid].state == "pending"
    s.settle(pick=0, verb="complete", ms=0, max_attempts=3)  # refused: lease settled
    s.claim_batch(n=3, lease=60_000)
    s.settle(pick=0, verb="delay", ms=0, max_attempts=3)
    assert sm.m.jobs[jid].state == "pending"
    s.settle(pick=0, verb="extend", ms=50, max_attempts=3)  # refused: lease settled
    s.claim(lease=60_000)
    s.settle(pick=0, verb="retry", ms=0, max_attempts=1)
    assert sm.m.jobs[jid].state == "dead"
    s.reprocess(jid=jid)
    s.settle(pick=0, verb="complete", ms=0, max_attempts=3)  # refused: lease settled
    assert sm.tickets == [(jid, 1), (jid, 2), (jid, 3)]
    assert sm.m.jobs[jid].state == "pending" and sm.m.completed == 0


def test_duplicate_pairs_in_one_batch_are_fenced_in_order(sm: QueueMachine) -> None:
    s = Steps(sm)
    # The same id with a stale and then the current token: the second completes it.
    s.seed(flat=1, per_lane=0)
    s.claim(lease=30)
    s.reap(limit=100, wait=True)
    s.claim(lease=60_000)
    s.settle_batch(done=[1, 0, 1], again=[], n=0, lease=50, delay=0, max_attempts=1)
    assert sm.m.completed == 1
    s.enqueue(payload=b"y", group=None, delay=None)
    s.claim(lease=30)
    s.reap(limit=100, wait=True)
    s.claim(lease=60_000)
    s.complete_many(picks=[1, 0, 0])
    assert sm.m.completed == 2
    s.seed(flat=3, per_lane=0)
    s.claim_batch(n=3, lease=60_000)
    s.settle(pick=0, verb="retry", ms=10_000, max_attempts=3)  # ticket 0: settled
    # A refused mention changes nothing: the next mention of the same id is fenced anew.
    s.settle_batch(done=[1, 1], again=[], n=0, lease=50, delay=0, max_attempts=1)
    s.settle_batch(done=[0, 2], again=[2, 0], n=0, lease=50, delay=0, max_attempts=1)
    s.complete_many(picks=[0, 0, 1, 2])
    assert sm.m.completed == 4 and sm.m.counts()["schedule"] == 1


def test_a_dead_lane_job_reprocesses_into_its_lane(sm: QueueMachine) -> None:
    s = Steps(sm)
    s.seed(flat=0, per_lane=2)
    s.admin(what="limit lane", g="la", n=1)
    s.claim_batch(n=6, lease=60_000)  # la gives one job (its limit), lb and lc two each
    assert len(sm.tickets) == 5
    la = [t for t in sm.tickets if sm.m.jobs[t[0]].group == "la"]
    assert len(la) == 1
    s.settle(pick=sm.tickets[::-1].index(la[0]), verb="retry", ms=0, max_attempts=1)
    jid = la[0][0]
    assert sm.m.jobs[jid].state == "dead"
    s.reprocess(jid=jid)
    assert sm.m.jobs[jid].state == "pending" and sm.m.lanes() == ["la"]
    s.claim_batch(n=6, lease=60_000)  # the lane's slot is free again: its oldest job
    assert sm.tickets[5:] == [(jid, 2)]


def test_reassign_moves_waiting_and_scheduled_jobs(sm: QueueMachine) -> None:
    s = Steps(sm)
    waiting = s.enqueue(payload=b"w", group="la", delay=None)
    later = s.enqueue(payload=b"s", group="la", delay=40)
    flat = s.enqueue(payload=b"f", group=None, delay=None)
    s.reassign(jid=waiting, g="lb")
    s.reassign(jid=later, g="lc")
    s.reassign(jid=flat, g="la")
    s.reassign(jid=flat, g="la")  # noop
    assert sm.m.lanes() == ["la", "lb"]
    s.promote(limit=100, wait=True)
    assert sm.m.lanes() == ["la", "lb", "lc"]
    s.claim_batch(n=1, lease=60_000)
    s.reassign(jid=sm.tickets[0][0], g="lc")  # not waiting: StateError
    s.remove(jid=later)
    s.reassign(jid=later, g="la")  # gone


def test_stalls_are_counted_to_the_ceiling(sm: QueueMachine) -> None:
    s = Steps(sm)
    s.seed(flat=1, per_lane=1)
    s.claim_batch(n=4, lease=30)
    s.sweep_stalled(max_stalled=2, limit=100, wait=True)
    assert sm.m.counts()["pending"] == 4
    s.claim_batch(n=4, lease=30)
    s.sweep_stalled(max_stalled=2, limit=1, wait=True)  # the earliest lease dies first
    s.sweep_stalled(max_stalled=2, limit=100, wait=True)
    assert sm.m.counts()["dead"] == 4 and sm.m.failed == 4
    assert all(j.last_error == "stalled" and j.stalled == 2 for j in sm.m.jobs.values())


def test_a_stale_token_never_settles_a_reincarnated_id(sm: QueueMachine) -> None:
    """Issue 10 #1 through the model: the first incarnation's token 1 must not settle the
    second, whose first claim now mints 2."""
    s = Steps(sm)
    jid = s.enqueue(payload=b"v1", group=None, delay=None)
    s.claim(lease=60_000)
    s.reincarnate(jid=jid, payload=b"v2", group=None, claim=True)
    assert sm.tickets == [(jid, 1), (jid, 2)]
    for verb in ("complete", "retry", "delay", "extend"):
        s.settle(pick=1, verb=verb, ms=0, max_attempts=1)  # the old holder: refused
    assert sm.m.jobs[jid].state == "active" and sm.m.counts()["dead"] == 0
    s.settle(pick=0, verb="complete", ms=0, max_attempts=3)
    assert sm.m.completed == 1 and sm.m.retired == {jid: 2}
