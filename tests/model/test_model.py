"""One reference model for the whole verb set (issue 22, point 3).

A hypothesis ``RuleBasedStateMachine`` drives random interleavings of every public verb of
``echomq.Queue`` against a real server, next to the pure model of tests/model/core.py, on two
queues (the second holds the other half of cross-queue flows). The verbs: enqueue (minted
and caller-chosen ids, re-admission of retired ids, dedup simple/throttle/debounce with dedup
ids up to 255 characters, delays, lanes), add_flow (one queue and across queues, both failure
policies, nested), claim / claim_batch / settle (the worker's batched round trip), complete
(with and without a kept result) / retry (with a kept death, "cancelled" included) / delay /
extend / extend_leases, reap / sweep_stalled / promote / pump / fire_due, reprocess, remove,
cancel (with and without remove=True), drain, wait, repeat / unrepeat, pause, lane pause and
limits, queue-wide and lane rate limits; and (issue 38, tests/model/verbs.py) enqueue_many,
complete_many, extend_many, reprocess_all, reassign, weight_lane, add_log, clear_logs,
update_progress, enable_events / disable_events and the read plane (browse, pending_size,
lane_depth, logs, errors, result, get_job, job_state, dedup_holder, dependencies,
children_values, ignored_failures, rate_limit_ttl). Which verbs the model drives is recorded
as it runs and compared with ``Queue``'s in tests/model/test_model_coverage.py.

After every step the server must agree with the model: ``check()`` is empty on both queues;
``counts()``, ``lanes()``, ``is_paused()`` and the retired record match; every row's fields
(the cancel flag, the flow fields and ``progress`` included), its set and score, its `:logs`
and `:errors` lists and its ``job_state`` are what the model says; an id without a row
leaves no key behind (row, logs, errors, flow keys); every kept result and notify list,
every dedup key, every parent's flow counters and hashes, and each queue's flow outbox
match. Replies are compared as they come, typed errors (``StaleToken``, ``JobGone``,
``StateError``, ``JobFailed``, ``TimeoutError``) included; a refused duplicate or
deduplicated enqueue must emit its event (while events are on).

Time. Every lease, delay and repeat period is either LONG (60 s: it never lapses within an
example) or SHORT (20 ms). The verbs whose outcome depends on the clock (reap, sweep_stalled,
promote, pump, fire_due) first *tick*: they sleep until the server's TIME is past every
short deadline the model holds (the deadlines are read back from the server after each call
and checked against the call's window). Then exactly the short ones are due and none of the
long ones, so the model predicts every sweep exactly. Dedup TTLs and rate windows are LONG.
No verdict depends on how loaded the machine is.

Besides one rule per verb, three rules take short walks a worker would take, so seams are
reached within the CI budget: ``work`` (claim a batch, settle each job as drawn), ``seam``
(a cancelled run that ends by retry, delay or lapse; a finished run that comes back by
reprocess or re-admission and is waited on) and ``flow_seam`` (an ignored child that dies,
is reprocessed and completes while its sibling waits, on one queue or across; a parent
removed before its children settle; a debounce onto a reaped holder). Each reply on the way
is checked like any other.

Legs: Lua, native (the conftest ``executor`` legs) and mixed (one queue driven alternately
through a Lua and a native client on a server that loads the module).

Budget: 30 examples of up to 40 steps per leg (the file takes ~40 s when it passes);
``ECHOMQ_MODEL_DEEP=1`` runs 20x the examples with twice the steps.

Triage (never in CI): ``ECHOMQ_MODEL_WAIVE=<tags>`` looks past reported findings (see
``strict``), ``ECHOMQ_MODEL_NOSHRINK=1`` reports the first failing sequence unshrunk,
``ECHOMQ_MODEL_STATS=1`` prints coverage counts; tests/model/replay.py replays a printed
sequence step by step; tests/model/mutations.py is the mutation check of issue 22 point 4.

Below the machine, fixed scenarios replay the seam chains of issue 22 through the same
machine (every step checked), so each is exercised on every run whatever hypothesis draws.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

import echomq
from echomq import Enqueued, FlowJob, JobFailed, JobGone, StaleToken, StateError, keyspace
from echomq import ids as emq_ids
from echomq.protocol import calls as _protocol
from echomq.server import EmbeddedServer
from model.core import KEEP_MS, LANES, LONG, SHORT, Flow, Job, QueueModel, World
from model.recording import recording
from model.verbs import VerbRules

pytestmark = pytest.mark.executors

DEEP = os.environ.get("ECHOMQ_MODEL_DEEP", "") not in ("", "0")
# Triage aid, never set in CI: ECHOMQ_MODEL_WAIVE=<tags> (events, did255, results, cancel,
# waitdead, orphans, count1, debounce, dropchild, ring, negdeps) turns the checks of known,
# reported findings (FINDINGS.md) into no-ops or models today's behaviour, so a run can look
# past them for the next discrepancy. Unset (the default), every check holds.
WAIVED = set(filter(None, os.environ.get("ECHOMQ_MODEL_WAIVE", "").split(",")))


def strict(tag: str) -> bool:
    return tag not in WAIVED


# Own servers: check() SCANs the keyspace each step.
@pytest.fixture(scope="module")
def session_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if os.environ.get("ECHOMQ_TEST_URL"):
        yield os.environ["ECHOMQ_TEST_URL"]
        return
    with EmbeddedServer(tmp_path_factory.mktemp("model"), appendonly=False) as srv:
        yield srv.url


@pytest.fixture(scope="module")
def module_server(
    tmp_path_factory: pytest.TempPathFactory, module_so: Path
) -> Iterator[EmbeddedServer]:
    with EmbeddedServer(
        tmp_path_factory.mktemp("model-native"),
        appendonly=False,
        args=["--loadmodule", str(module_so)],
    ) as srv:
        yield srv


GROUPS = st.sampled_from((None, *LANES))
LANE = st.sampled_from(LANES)
LEASES = st.sampled_from((SHORT, LONG))
DELAYS = st.sampled_from((None, 0, SHORT, LONG))
RETRY_DELAYS = st.sampled_from((0, SHORT, LONG))
# issue 24: 1 ms is made clearly expired (the machine waits past it), LONG clearly never
TTLS = st.sampled_from((None, None, None, 1, LONG))
PAYLOADS = st.binary(max_size=4)
# Which item of a list (tickets: counted from the most recent): mostly one of the last few.
PICK = st.one_of(st.integers(0, 2), st.integers(0, 255))
QI = st.sampled_from((0, 0, 0, 0, 1))
KEEP_LOGS = st.sampled_from((None, None, 1, 3))  # issue 38: the option keep_logs
PRIORITIES = st.sampled_from((0, 1, 5, 2**21))  # issue 24: the default, low, the maximum
# D3's grammar: a dedup id is [A-Za-z0-9._-]{1,255}; the long one is past the old 128 cap.
DIDS = ("d1", "d2", "L" * 200)
MODES = st.sampled_from(("simple", "throttle", "debounce"))
ERRORS = st.sampled_from(("boom", "boom", "cancelled"))
REPEATS = ("r1", "r2")
# What the admin rule does (test_model_coverage.py tours each).
ADMIN = (
    "pause",
    "pause lane",
    "limit lane",
    "rate",
    "rate lane",
    "clear rate",
    "clear lane",
    "keep",
    "keep dead",
)
_names = itertools.count()


def note(text: str) -> None:
    """A coverage event for ``--hypothesis-show-statistics`` (the scenarios run outside
    hypothesis, where there is nothing to record to)."""
    if currently_in_test_context():
        event(text)
        STATS[text] += 1


STATS: Counter[str] = Counter()  # ECHOMQ_MODEL_STATS=1 prints it after each machine run


def pick(items: list[Any], n: int) -> Any:
    return items[n % len(items)] if items else None


class ModelMachine(VerbRules, RuleBasedStateMachine):
    def __init__(self, client: redis.Redis, executors: tuple[str, ...]) -> None:
        super().__init__()
        self.r = client
        stem = f"m{next(_names)}-{os.getpid()}"
        self.names = [stem, stem + "-x"]
        # issue 38: every handle records the verbs called on it (test_model_coverage.py)
        self.calls: set[str] = set()
        self.handles = [
            [recording(echomq.Queue(n, client=client, executor=e), self.calls) for e in executors]
            for n in self.names
        ]
        self._turn = 0
        self.w = World(per_hash=not strict("count1"), keep_dropped=not strict("dropchild"))
        self.tickets: list[tuple[int, str, int]] = []
        self.dids_used: set[tuple[int, str]] = set()
        # i22close: the flow roots added per queue (add_flow may re-use a gone one's id) and
        # the source of add_flow marks.
        self.roots: list[list[str]] = [[], []]
        self.marks = itertools.count(1)
        for qs in self.handles:
            qs[0].enable_events(10_000)
        self.t_prev = self.now()  # the server time when the last step was checked (D25)

    # ------------------------------------------------------------------ helpers

    def q(self, qi: int) -> echomq.Queue:
        """The queue's handle for this call: on the mixed leg the executors take turns."""
        qs = self.handles[qi]
        self._turn += 1
        return qs[self._turn % len(qs)]

    def m(self, qi: int) -> QueueModel:
        return self.w.qs[qi]

    def key(self, qi: int, suffix: str) -> str:
        return keyspace.queue_key(self.names[qi], suffix)

    def jkey(self, qi: int, jid: str) -> str:
        return keyspace.job_key(self.names[qi], jid)

    def now(self) -> int:
        sec, usec = self.r.time()
        return int(sec) * 1000 + int(usec) // 1000

    def score(self, qi: int, place: str, jid: str, lo: int, hi: int) -> int:
        s = self.r.zscore(self.key(qi, place), jid)
        assert s is not None, f"{jid} is not in {place}"
        assert lo <= s <= hi, f"{jid} has {place} score {s}, outside [{lo}, {hi}]"
        return int(s)

    @staticmethod
    def expect(err: type[BaseException] | None, fn: Callable[..., Any], *a: Any, **kw: Any) -> Any:
        if err is None:
            return fn(*a, **kw)
        with pytest.raises(err):
            fn(*a, **kw)
        return None

    def tick(self, *states: str, repeats: bool = False) -> None:
        """Sleep until the server clock is past every SHORT deadline of jobs in ``states``
        (and every repeat's next fire): then exactly those are due."""
        now = self.now()
        horizon = now + LONG // 2
        due = [
            j.score
            for m in self.w.qs
            for j in m.jobs.values()
            if j.state in states and j.score < horizon
        ]
        if repeats:
            for qi in (0, 1):
                due += [rp.next_ms for rp in self.q(qi).repeats() if rp.next_ms is not None]
        while due and self.now() <= max(due):
            time.sleep(max(0.001, (max(due) - self.now() + 1) / 1000))

    def last_event(self, qi: int) -> bytes:
        got = self.r.xrevrange(self.key(qi, "events"), count=1)
        return got[0][0] if got else b"0"

    def events_since(self, qi: int, after: bytes) -> list[str]:
        got = self.r.xrange(self.key(qi, "events"), min=b"(" + after if after != b"0" else "-")
        return [f[b"event"].decode() for _, f in got]

    def fence(self, qi: int, jid: str, token: int) -> type[Exception] | None:
        v = self.m(qi).fence(jid, token)
        return None if v is None else JobGone if v == "gone" else StaleToken

    def ticket(self, n: int) -> tuple[int, str, int] | None:
        return self.tickets[-1 - n % len(self.tickets)] if self.tickets else None

    def take(self, qi: int, job: echomq.Job) -> Job:
        """Accept a claimed job if it is a legal choice, and move the model along."""
        m = self.m(qi)
        assert not m.paused, "a paused queue served a claim"
        j = m.jobs.get(job.id)
        assert j is not None and j.state == "pending", f"claimed {job.id}, which is {j}"
        assert m.capacity(j.group) > 0, f"claimed {job.id} from unserviceable {j.group}"
        assert m.rate is None or m.rate[1] < m.rate[0], "a claim past the queue's rate limit"
        assert m.limit is None or m.active_count() < m.limit, "a claim past the queue's limit"
        assert not j.expired, f"claimed {job.id} past its ttl (issue 24): it must be dead"
        # The head of its set: by priority, then mint order, the expired ones skipped.
        assert job.id == m.leasable(j.group)[0], "a claim must serve the head of its set"
        assert job.token == j.attempts + 1, f"token {job.token}, model {j.attempts + 1}"
        assert (job.group, job.payload) == (j.group, j.payload)
        m.take(job.id)
        self.tickets.append((qi, job.id, job.token))
        return j

    def live(self, qi: int, *states: str) -> list[str]:
        return sorted(i for i, j in self.m(qi).jobs.items() if not states or j.state in states)

    # ------------------------------------------------------------------ producers

    @initialize(n=st.integers(0, 3), g=GROUPS)
    def seed(self, n: int, g: str | None) -> None:
        for _ in range(n):
            self.enqueue(qi=0, payload=b"s", group=g, delay=None, did=None, mode="simple")

    # ---- kept history (issue 24): half the examples start with rows kept on queue 0, so
    # completed rows, their trims and their reprocess are reached within the CI budget.
    @initialize(keep=st.sampled_from((None, 1, 3)), dead=st.sampled_from((None, None, 2)))
    def keep_history(self, keep: int | None, dead: int | None) -> None:
        if keep is not None:
            self.admin(qi=0, what="keep", g=LANES[0], n=keep)
        if dead is not None:
            self.admin(qi=0, what="keep dead", g=LANES[0], n=dead)

    @rule(
        qi=QI,
        payload=PAYLOADS,
        group=GROUPS,
        delay=DELAYS,
        did=st.sampled_from((None, None, *DIDS)),
        mode=MODES,
        ttl=TTLS,
        budget=st.sampled_from((99, 1, 2)),
        keep_logs=KEEP_LOGS,
    )
    def enqueue(
        self,
        qi: int,
        payload: bytes,
        group: str | None,
        delay: int | None,
        did: str | None,
        mode: str,
        ttl: int | None = None,
        budget: int = 99,
        keep_logs: int | None = None,
    ) -> None:
        self.admit_one(qi, None, payload, group, delay, did, mode, ttl, budget, keep_logs=keep_logs)

    @rule(
        qi=QI,
        n=PICK,
        payload=PAYLOADS,
        group=GROUPS,
        did=st.sampled_from((None, None, *DIDS)),
        mode=MODES,
    )
    def enqueue_id(
        self, qi: int, n: int, payload: bytes, group: str | None, did: str | None, mode: str
    ) -> None:
        """A caller-chosen id: one that exists (duplicate) or one that was seen and is gone
        (a re-admission: a clean incarnation that continues the retired count)."""
        m = self.m(qi)
        gone = sorted(m.seen - set(m.jobs))
        jid = pick(gone, n) if n % 3 and gone else pick(sorted(m.seen), n)
        if jid is not None:
            note("enqueue_id: " + ("duplicate" if jid in m.jobs else "re-admission"))
            if m.results.get(jid):
                note("enqueue_id: re-admits an id with a kept result")
            self.admit_one(qi, jid, payload, group, None, did, mode)

    # --- issue 24, priorities: an enqueue with a priority, and change_priority of any job
    # the model knows (waiting or scheduled: set; active, dead, a held parent: StateError and
    # nothing written; gone: JobGone).

    @rule(qi=QI, payload=PAYLOADS, group=GROUPS, delay=DELAYS, priority=PRIORITIES, ttl=TTLS)
    def enqueue_prioritized(
        self,
        qi: int,
        payload: bytes,
        group: str | None,
        delay: int | None,
        priority: int,
        ttl: int | None = None,
    ) -> None:
        # A ttl with a priority: enqueue's ARGV[14] and ARGV[15] together (the merge of the
        # priorities and the expiry).
        self.admit_one(qi, None, payload, group, delay, None, "simple", ttl, priority=priority)

    @rule(qi=QI, n=PICK, priority=PRIORITIES)
    def change_priority(self, qi: int, n: int, priority: int) -> None:
        m = self.m(qi)
        jid = pick(sorted(m.seen), n)
        if jid is None:
            return
        j = m.jobs.get(jid)
        if j is None:
            self.expect(JobGone, self.q(qi).change_priority, jid, priority)
        elif j.state in ("pending", "scheduled"):
            self.q(qi).change_priority(jid, priority)
            j.priority = priority
        else:
            note(f"change_priority refused: {j.state}")
            self.expect(StateError, self.q(qi).change_priority, jid, priority)

    # --- issue 24, the queue-wide concurrency limit: at most n jobs of the queue active
    # (claimable() caps every claim path by it; take() refuses a claim past it).

    @rule(qi=QI, n=st.sampled_from((None, 1, 2, 3)))
    def limit_queue(self, qi: int, n: int | None) -> None:
        self.q(qi).limit(n)
        self.m(qi).limit = n
        assert self.q(qi).get_limit() == n

    # --- end of issue 24 (priorities, the queue limit)

    def admit_one(
        self,
        qi: int,
        jid: str | None,
        payload: bytes,
        group: str | None,
        delay: int | None,
        did: str | None,
        mode: str,
        ttl: int | None = None,
        budget: int = 99,
        priority: int = 0,
        keep_logs: int | None = None,
    ) -> None:
        m = self.m(qi)
        kw: dict[str, Any] = {}
        if priority:  # issue 24 (sent only when set: the default call stays the default)
            kw["priority"] = priority
        if did is not None:
            kw = {"dedup": did, "dedup_mode": mode}
            if mode != "simple":
                kw["dedup_ttl_ms"] = LONG
            self.dids_used.add((qi, did))
        if ttl is not None:
            kw["ttl_ms"] = ttl
        if keep_logs is not None:  # issue 38: sent with a dedup too (the named tail)
            kw["keep_logs"] = keep_logs
        sent_priority = kw.get("priority", 0)  # a dedup call sends none: the default, 0
        before = self.last_event(qi)
        holder = m.dedup.get(did) if did is not None else None
        h = m.jobs.get(holder) if holder else None
        old = (h.payload, h.state, h.score, h.epoch) if h else None
        t0 = self.now()
        if did is not None and len(did) > 128 and not strict("did255"):
            return
        folds = h is not None and mode == "debounce" and h.state in ("pending", "scheduled")
        if folds and h is not None and h.group != group:
            # Issue 37: a fold cannot move its holder to another lane.
            with pytest.raises(StateError, match="a fold cannot move it"):
                self.q(qi).enqueue(payload, id=jid, group=group, delay_ms=delay, **kw)
            return
        e = self.q(qi).enqueue(payload, id=jid, group=group, delay_ms=delay, **kw)
        t1 = self.now()
        new = self.events_since(qi, before)
        # issue 38: with events disabled nothing is recorded (the stream written is kept)
        assert m.events or new == [], f"events disabled, yet {new}"
        if holder is not None:
            assert e == Enqueued(holder, "deduplicated"), f"{e} but {did} is held by {holder}"
            assert "deduplicated" in new or not m.events or not strict("events"), new
            if h is not None and mode == "debounce" and h.state in ("pending", "scheduled"):
                self.debounced(qi, holder, h, payload, delay, t0, t1, old)
                if h.payload == payload:  # folded (issue 37): the newest call's ttl too
                    h.priority = sent_priority  # and its priority (F28)
                    h.keep_logs = keep_logs  # and its log bound (issue 38; None drops it)
                    if ttl is not None:
                        h.expired = False
                        self.expiry(qi, holder, h, ttl, t0, t1)
                    else:
                        h.expires, h.expired = None, False
            return
        if jid is not None and jid in m.jobs:
            assert e == Enqueued(jid, "duplicate")
            assert "duplicate" in new or not m.events or not strict("events"), new
            return
        j = Job(payload, group, priority=priority, keep_logs=keep_logs)
        if delay:
            assert e.status == "scheduled", e
            j.state = "scheduled"
            j.score = self.score(qi, "schedule", e.id, t0 + delay, t1 + delay)
        else:
            assert e.status == "enqueued", e
        if jid is not None:
            assert e.id == jid
        m.admit(e.id, j)
        j.budget = budget
        if ttl is not None:
            self.expiry(qi, e.id, j, ttl, t0, t1)
        if did is not None:
            j.dedup = did
            m.dedup[did] = e.id
            if mode == "simple":
                m.dedup_ttl.discard(did)
            else:
                m.dedup_ttl.add(did)

    def debounced(
        self,
        qi: int,
        holder: str,
        h: Job,
        payload: bytes,
        delay: int | None,
        t0: int,
        t1: int,
        old: tuple[bytes, str, int, int | None] | None,
    ) -> None:
        """D20 debounce: a waiting holder takes the refused call's payload and run time. A
        holder whose lease lapsed (reaped, its generation still open) is either not waiting
        (left alone) or, when it takes the new payload, its old holder's token must not
        settle the new content (reap x dedup)."""
        row = self.r.hmget(self.jkey(qi, holder), "payload", "lease_epoch")
        if h.state == "pending" and h.epoch is not None:
            if row[1] is not None and not strict("debounce") and row[0] != h.payload:
                h.payload = payload  # today's behaviour: replaced, the lease still open
                return
            if row[1] is not None:
                # Treated as held by its running holder: it must be left alone entirely.
                assert row[0] == h.payload, (
                    f"debounce replaced the payload of {holder}, whose lease lapsed but is "
                    "still open: its old holder can complete it and the new payload never runs"
                )
                return
            h.epoch = None
        h.payload = payload
        if h.state == "scheduled":
            lo, hi = (t0 + delay, t1 + delay) if delay else (t0, t1)
            h.score = self.score(qi, "schedule", holder, lo, hi)
        elif delay:
            h.state = "scheduled"
            h.score = self.score(qi, "schedule", holder, t0 + delay, t1 + delay)

    @rule(
        qi=QI,
        shape=st.lists(
            st.tuples(
                st.integers(0, 2),  # children of this node (0 for a leaf)
                st.booleans(),  # fail_parent
                st.sampled_from((0, 0, 1)),  # 1: on the other queue than its parent
                GROUPS,
            ),
            min_size=2,
            max_size=6,
        ),
        reuse=st.one_of(st.none(), PICK),
    )
    def add_flow(
        self, qi: int, shape: list[tuple[int, bool, int, str | None]], reuse: int | None = None
    ) -> None:
        """A tree laid out breadth-first from ``shape``: node 0 is the root; each node takes
        the next nodes as its children. ``reuse`` names the root with a gone flow parent's id
        (its old children may still live)."""
        nodes = [(emq_ids.mint(), *s) for s in shape]
        # ---- issue 22 (i22close): a parent id re-used for a new flow ----
        # Every node of one add_flow carries its mark; an old child of a gone parent whose
        # id names the new root counts toward nothing (PROTOCOL §2.4, row field `flow`).
        mark = next(self.marks)
        gone = [p for p in self.roots[qi] if p not in self.m(qi).jobs]
        if reuse is not None and gone:
            nodes[0] = (pick(gone, reuse), *shape[0])
            note("add_flow: a re-used parent id")
        self.roots[qi].append(nodes[0][0])
        # ---- end i22close ----
        kids: dict[int, list[int]] = {0: []}
        queue_of = {0: qi}
        nxt, frontier = 1, [0]
        while frontier and nxt < len(nodes):
            i = frontier.pop(0)
            want = nodes[i][1] if i else max(1, nodes[i][1])
            for _ in range(want):
                if nxt >= len(nodes):
                    break
                kids.setdefault(i, []).append(nxt)
                queue_of[nxt] = queue_of[i] ^ nodes[nxt][3]
                frontier.append(nxt)
                nxt += 1
        used = sorted(queue_of)

        def build(i: int) -> FlowJob:
            jid, _, fp, _, g = nodes[i]
            return FlowJob(
                f"f{i}".encode(),
                id=jid,
                queue=self.names[queue_of[i]],
                group=g,
                fail_parent=fp,
                children=[build(c) for c in kids.get(i, [])],
            )

        added = self.q(qi).add_flow(build(0))
        assert added.parent_id == nodes[0][0]
        assert added.child_ids == [nodes[c][0] for c in kids[0]]
        parent_of = {c: p for p, cs in kids.items() for c in cs}
        for i in used:
            jid, _, fp, _, g = nodes[i]
            m = self.m(queue_of[i])
            j = Job(f"f{i}".encode(), g)
            n_kids = len(kids.get(i, []))
            if n_kids:
                j.state = "awaiting_children"
                j.children = n_kids
            j.mark = mark  # i22close: the flow's mark, on every node
            if i in parent_of:
                p = parent_of[i]
                j.parent = nodes[p][0]
                j.policy = "fp" if fp else "id"
                if queue_of[p] != queue_of[i]:
                    j.pq = queue_of[p]
            m.admit(jid, j)
            if n_kids:
                m.flows[jid] = Flow(n_kids, mark=mark)
            # issue 24: the parent's `kids` lists its children on its own queue
            j.kids = [nodes[c][0] for c in kids.get(i, []) if queue_of[c] == queue_of[i]]

    @rule(
        qi=QI,
        steps=st.integers(2, 5),
        cross=st.lists(st.sampled_from((0, 0, 1)), min_size=5, max_size=5),
        lane=GROUPS,
    )
    def add_chain(self, qi: int, steps: int, cross: list[int], lane: str | None) -> None:
        """Issue 42: a chain (``app.chain``, echomq.tasks.workflows) is this nested flow: the last
        step the root, each step the only child of the next, ``fail_parent`` on every step
        (a dead step kills the rest), steps flipping between the two queues. Its values and
        the ``keep_ms``/``prev`` options travel in the payloads, which the model does not
        read: the server's side is add_flow's, driven here in a chain's shape."""
        shape = [(1 if i < steps - 1 else 0, True, cross[i], lane) for i in range(steps)]
        self.add_flow(qi=qi, shape=shape)

    # ------------------------------------------------------------------ consumers

    @rule(qi=QI, lease=LEASES)
    def claim(self, qi: int, lease: int) -> None:
        claimable = self.m(qi).claimable()
        t0 = self.now()
        job = self.q(qi).claim(lease_ms=lease)
        self.expired_met(qi)  # the expired jobs this claim met died in it, before what follows
        t1 = self.now()
        if job is None:
            assert claimable == 0, f"claim answered empty with {claimable} claimable"
            return
        j = self.take(qi, job)
        j.score = self.score(qi, "active", job.id, t0 + lease, t1 + lease)

    @rule(qi=QI, n=st.integers(1, 5), lease=LEASES)
    def claim_batch(self, qi: int, n: int, lease: int) -> None:
        claimable = self.m(qi).claimable()
        t0 = self.now()
        jobs = self.q(qi).claim_batch(n, lease_ms=lease)
        self.expired_met(qi)  # the expired jobs this claim met died in it, before what follows
        t1 = self.now()
        assert len(jobs) == min(n, claimable), f"{len(jobs)} of {n}, {claimable} claimable"
        for job in jobs:
            self.take(qi, job)
        for job in jobs:
            self.m(qi).jobs[job.id].score = self.score(qi, "active", job.id, t0 + lease, t1 + lease)
        deadlines = {self.m(qi).jobs[job.id].score for job in jobs}
        assert len(deadlines) <= 1, f"a batch shares one lease deadline: {deadlines}"

    @rule(
        qi=QI,
        outcomes=st.lists(
            st.sampled_from(("done", "done+keep", "fail", "die", "die+keep", "hold")),
            min_size=1,
            max_size=4,
        ),
    )
    def work(self, qi: int, outcomes: list[str]) -> None:
        """A worker's turn: claim a batch and settle each job as drawn (complete, with a kept
        result or not; retry; dead-letter; or keep holding it)."""
        claimable = self.m(qi).claimable()
        t0 = self.now()
        jobs = self.q(qi).claim_batch(len(outcomes), lease_ms=LONG)
        self.expired_met(qi)  # the expired jobs this claim met died in it, before what follows
        t1 = self.now()
        assert len(jobs) == min(len(outcomes), claimable)
        for job in jobs:
            self.take(qi, job)
        for job in jobs:
            self.m(qi).jobs[job.id].score = self.score(qi, "active", job.id, t0 + LONG, t1 + LONG)
        for job, how in zip(jobs, outcomes, strict=False):
            keep = how.endswith("+keep")
            if how.startswith("done"):
                self.do_complete(qi, job.id, job.token, keep, b"w" + job.id[-2:].encode())
            elif how == "fail":
                self.do_retry(qi, job.id, job.token, 0, 99, "boom", False)
            elif how.startswith("die"):
                self.do_retry(qi, job.id, job.token, 0, 1, "boom", keep)

    @rule(
        qi=QI,
        chain=st.sampled_from(
            ("cancel-retry", "cancel-lapse", "cancel-delay", "rerun-dead", "rerun-done")
        ),
        remove=st.booleans(),
        keep=st.booleans(),
    )
    def seam(self, qi: int, chain: str, remove: bool, keep: bool) -> None:
        """A short chain at an incarnation seam, on whatever job a claim serves: a
        cancelled run that ends (retry, lapse, delay), or a finished run that comes back
        (reprocess, re-admission) and is waited on. Every reply is checked on the way."""
        m = self.m(qi)
        lease = SHORT if chain == "cancel-lapse" else LONG
        claimable = m.claimable()
        t0 = self.now()
        job = self.q(qi).claim(lease_ms=lease)
        self.expired_met(qi)  # the expired jobs this claim met died in it, before what follows
        t1 = self.now()
        if job is None:
            assert claimable == 0
            return
        j = self.take(qi, job)
        j.score = self.score(qi, "active", job.id, t0 + lease, t1 + lease)
        jid, tok = job.id, job.token
        note(f"seam: {chain}{' (a flow child)' if j.parent else ''}")
        if chain.startswith("cancel"):
            self.do_cancel(qi, jid, remove)
            self.extend_leases(qi=qi, picks=[0], lease=lease)
            if chain == "cancel-retry":
                self.do_retry(qi, jid, tok, 0, 1, "cancelled", keep)
            elif chain == "cancel-delay":
                self.do_delay(qi, jid, tok, 0)
            else:
                self.reap(qi=qi)
            j2 = m.jobs.get(jid)
            if j2 is not None and j2.state == "dead":
                self.do_reprocess(qi, jid)
            return
        if chain == "rerun-dead":
            # issue 38: the run reports progress and logs a line, which its rerun must not
            # inherit (progress) and keeps (logs, like the errors of every run).
            j.logs.append("ran")
            assert self.q(qi).add_log(jid, "ran") == len(j.logs)
            self.q(qi).update_progress(jid, "half")
            j.progress = "half"
            self.do_retry(qi, jid, tok, 0, 1, "boom", keep)
            if jid in m.jobs and m.jobs[jid].state == "dead":
                self.do_wait(qi, jid)
                self.do_reprocess(qi, jid)
        else:
            self.do_complete(qi, jid, tok, keep, b"s")
            self.do_wait(qi, jid)
            self.admit_one(qi, jid, b"again", None, None, None, "simple")
        self.do_wait(qi, jid)

    def claim_only(self, qi: int, lease: int, wanted: set[str]) -> dict[str, int]:
        """Claim everything claimable and hand back (delay 0: no attempt spent) all but the
        ``wanted`` ids: a worker that takes a batch and gives back what it cannot run.
        Returns the tokens of the wanted ids it got."""
        m = self.m(qi)
        n = m.claimable()
        if n == 0:
            return {}
        t0 = self.now()
        jobs = self.q(qi).claim_batch(n, lease_ms=lease)
        self.expired_met(qi)  # the expired jobs this claim met died in it, before what follows
        t1 = self.now()
        assert len(jobs) == n
        for job in jobs:
            self.take(qi, job)
        for job in jobs:
            m.jobs[job.id].score = self.score(qi, "active", job.id, t0 + lease, t1 + lease)
        got = {}
        for job in jobs:
            if job.id in wanted:
                got[job.id] = job.token
            else:
                self.do_delay(qi, job.id, job.token, 0)
        return got

    @rule(
        chain=st.sampled_from(("child-rerun", "parent-removed", "debounce-lapse")),
        cross=st.sampled_from((0, 0, 1)),
    )
    def flow_seam(self, chain: str, cross: int) -> None:
        """The seams between flows or dedup and the other verbs, as a worker would meet them:
        an ignored child that dies, is reprocessed and completes while its sibling waits; a
        parent removed before its children settle; a debounce onto a reaped holder."""
        note(f"flow_seam: {chain}")
        if chain == "debounce-lapse":
            did = DIDS[0]
            self.admit_one(0, None, b"v1", None, None, did, "debounce")
            holder = self.m(0).dedup.get(did)
            h = self.m(0).jobs.get(holder) if holder else None
            if h is None or h.state != "pending":
                return
            tok = self.claim_only(0, SHORT, {holder}).get(holder)
            if tok is None:
                return
            self.reap(qi=0)
            self.admit_one(0, None, b"v2", None, None, did, "debounce")
            self.do_complete(0, holder, tok, False, b"")
            return
        self.add_flow(qi=0, shape=[(2, True, 0, None), (0, False, cross, None), (0, True, 0, None)])
        root = max(self.m(0).flows)  # ids are minted increasing: the newest root
        kids = [
            (qi, jid) for qi in (0, 1) for jid, j in self.m(qi).jobs.items() if j.parent == root
        ]
        ignored = next((k for k in kids if self.m(k[0]).jobs[k[1]].policy == "id"), None)
        if ignored is None:
            return
        qi, cid = ignored
        if chain == "parent-removed":
            self.remove_id(0, root)
            for kq, kid in kids:
                tok = self.claim_only(kq, LONG, {kid}).get(kid)
                if tok is not None:
                    self.do_complete(kq, kid, tok, False, b"late")
            return
        tok = self.claim_only(qi, LONG, {cid}).get(cid)
        if tok is None:
            return
        self.do_retry(qi, cid, tok, 0, 1, "boom", False)
        if cross:
            self.pump(qi=1)
        self.do_reprocess(qi, cid)
        tok = self.claim_only(qi, LONG, {cid}).get(cid)
        if tok is not None:
            self.do_complete(qi, cid, tok, False, b"second")
            if cross:
                self.pump(qi=1)

    # ------------------------------------------------------------------ settling

    def do_complete(self, qi: int, jid: str, token: int, keep: bool, result: bytes) -> None:
        err = self.fence(qi, jid, token)
        self.expect(
            err,
            self.q(qi).complete,
            jid,
            token,
            result=result,
            keep_result_ms=KEEP_MS if keep else 0,
        )
        if err is None:
            self.completed(qi, jid, result, keep)

    def completed(self, qi: int, jid: str, result: bytes, keep: bool, trim: bool = True) -> None:
        m = self.m(qi)
        if m.keep_count is not None:
            self.kept_completion(qi, jid, result, keep, trim)
            return
        j = m.drop(jid)
        m.completed += 1
        if keep:
            m.keep(jid, result, j.attempts, None)
        self.w.child_done(qi, jid, j, result)

    # ---- kept history (issue 24) ----------------------------------------------------------

    def kept_completion(
        self, qi: int, jid: str, result: bytes, keep: bool, trim: bool = True
    ) -> None:
        """A completion while the queue keeps rows: the row stays as completed, scored by
        its finish time (read back: the server clock), then the set is trimmed by count --
        at once, or (``trim=False``) by the caller after the rest of its batch."""
        m = self.m(qi)
        j = m.jobs[jid]
        m.completed += 1
        if keep:
            m.keep(jid, result, j.attempts, None)
        s = self.r.zscore(self.key(qi, "completed"), jid)
        if s is None:
            # Trimmed by its own call: only a batch's completions can be, sharing one finish
            # time (then ordered by id), and a batch's newest survive (a bound is >= 1), so
            # the set's newest score is this call's. The model's trim then decides whether
            # the server was right to drop it.
            newest = self.r.zrange(self.key(qi, "completed"), -1, -1, withscores=True)
            s = newest[0][1] if newest else self.now()
        m.keep_completed_row(jid, int(s))
        self.w.child_done(qi, jid, j, result)
        if trim:
            m.trim("completed", m.keep_count)

    def dead_lettered(self, qi: int) -> None:
        """A script dead-lettered on queue qi: it trims the dead set (keep_dead)."""
        self.m(qi).dead_added = True

    def trim_dead(self, qi: int) -> None:
        """The model's keep_dead trim after a step that dead-lettered on queue qi. The dead
        set is scored by the server's time of death (D25): the model reads those times back
        (it cannot know the clock). A death of an earlier step keeps the time read when that
        step was checked. A death this step's own trim removed has no score left; it died
        after the previous step was checked (``t_prev``), so it takes t_prev - 0.5:
        above every death before that instant, below every death since, where a fresh death
        must outrank it only by its own time -- the model still catches a trim that drops a
        fresh death while an older one stays."""
        m = self.m(qi)
        if not m.dead_added:
            return
        on = dict(self.r.zrange(self.key(qi, "dead"), 0, -1, withscores=True))
        for jid, j in m.jobs.items():
            if j.state == "dead":
                s = on.get(jid.encode())
                if s is not None:
                    j.died = float(s)
                elif not j.died:  # a death of an earlier step keeps the time checked then
                    j.died = self.t_prev - 0.5
        m.trim_dead()

    def do_retry(
        self, qi: int, jid: str, token: int, delay: int, max_attempts: int, error: str, keep: bool
    ) -> None:
        err = self.fence(qi, jid, token)
        t0 = self.now()
        verdict = self.expect(
            err,
            self.q(qi).retry,
            jid,
            token,
            delay_ms=delay,
            max_attempts=max_attempts,
            error=error,
            keep_result_ms=KEEP_MS if keep else 0,
        )
        t1 = self.now()
        if err is None:
            want = self.retried(qi, jid, delay, max_attempts, error, keep, t0, t1, verdict)
            assert verdict == want, f"retry {jid}/{token}: {verdict!r}, model {want!r}"

    def retried(
        self,
        qi: int,
        jid: str,
        delay: int,
        max_attempts: int,
        error: str,
        keep: bool,
        t0: int,
        t1: int,
        got: Any = None,
    ) -> str:
        m = self.m(qi)
        j = m.jobs[jid]
        flag = j.cancel
        if not strict("cancel"):  # follow the server, whatever run its flag belongs to
            flag = "remove" if got == "removed" else None
        if error == "cancelled" and flag == "remove":
            self.w.removed(qi, jid)
            if keep:
                m.keep(jid, b"", j.attempts, error)
            return "removed"
        m.leave_active(j)
        m.log_error(jid, error)  # issue 38: `:errors`, before the verdict (dead or not)
        j.epoch, j.last_error = None, error
        if j.attempts - j.floor >= max_attempts:
            j.state = "dead"
            m.failed += 1
            m.release_dedup(jid)
            if keep or jid in m.wanted:  # a death while a waiter waits: kept 60 s (D17)
                m.keep(jid, b"", j.attempts, error)
            self.w.child_dead(qi, jid, j, error)
            self.dead_lettered(qi)
            self.trim_dead(qi)
            return "dead"
        j.state = "scheduled"
        j.score = self.score(qi, "schedule", jid, t0 + delay, t1 + delay)
        return "scheduled"

    def do_delay(self, qi: int, jid: str, token: int, delay: int) -> None:
        err = self.fence(qi, jid, token)
        t0 = self.now()
        self.expect(err, self.q(qi).delay, jid, token, delay)
        t1 = self.now()
        if err is None:
            j = self.m(qi).jobs[jid]
            self.m(qi).leave_active(j)
            j.epoch = None
            if delay == 0:
                j.state = "pending"
            else:
                j.state = "scheduled"
                j.score = self.score(qi, "schedule", jid, t0 + delay, t1 + delay)

    def do_extend(self, qi: int, jid: str, token: int, lease: int) -> None:
        err = self.fence(qi, jid, token)
        t0 = self.now()
        self.expect(err, self.q(qi).extend, jid, token, lease_ms=lease)
        t1 = self.now()
        if err is None:
            j = self.m(qi).jobs[jid]
            j.state = "active"
            j.score = self.score(qi, "active", jid, t0 + lease, t1 + lease)

    @rule(
        n=PICK,
        verb=st.sampled_from(("complete", "complete", "retry", "retry", "delay", "extend")),
        ms=RETRY_DELAYS,
        max_attempts=st.integers(1, 2),
        keep=st.booleans(),
        error=ERRORS,
    )
    def settle(self, n: int, verb: str, ms: int, max_attempts: int, keep: bool, error: str) -> None:
        """A settle verb with a token a claim handed out (current, or stale by now)."""
        t = self.ticket(n)
        if t is None:
            return
        qi, jid, token = t
        if verb == "complete":
            self.do_complete(qi, jid, token, keep, b"r" + jid[-2:].encode())
        elif verb == "retry":
            self.do_retry(qi, jid, token, ms, max_attempts, error, keep)
        elif verb == "delay":
            self.do_delay(qi, jid, token, ms)
        else:
            self.do_extend(qi, jid, token, ms or SHORT)

    @rule(
        qi=QI,
        done=st.lists(PICK, max_size=2),
        again=st.lists(PICK, max_size=2),
        n=st.integers(0, 3),
        lease=LEASES,
        delay=RETRY_DELAYS,
        max_attempts=st.integers(1, 2),
    )
    def settle_batch(
        self,
        qi: int,
        done: list[int],
        again: list[int],
        n: int,
        lease: int,
        delay: int,
        max_attempts: int,
    ) -> None:
        """The worker's round trip on one queue: completes, retries, then a claim."""
        mine = [t for t in self.tickets if t[0] == qi]
        comp = [(t[1], t[2]) for t in (pick(mine, d) for d in done) if t]
        retr = [(t[1], t[2]) for t in (pick(mine, d) for d in again) if t]
        t0 = self.now()
        out = self.q(qi).settle(
            completed=comp,
            retried=[(jid, tok, delay, max_attempts, "boom") for jid, tok in retr],
            n=n,
            lease_ms=lease,
        )
        t1 = self.now()
        for (jid, tok), verdict in zip(comp, out.completed, strict=True):
            err = self.fence(qi, jid, tok)
            if err is None:
                assert verdict is None, f"complete {jid}/{tok} in a batch: {verdict!r}"
                self.completed(qi, jid, b"", False, trim=False)
            else:
                assert isinstance(verdict, err), f"complete {jid}/{tok}: {verdict!r}, not {err}"
        # The batch trims its kept rows once, after every complete's verdict and before the
        # retries (include/settle.lua complete_many): a complete of a row this batch's trim
        # drops still finds it (FINDINGS F20).
        if self.m(qi).keep_count is not None:
            self.m(qi).trim("completed", self.m(qi).keep_count)
        for (jid, tok), verdict in zip(retr, out.retried, strict=True):
            err = self.fence(qi, jid, tok)
            if err is None:
                want = self.retried(qi, jid, delay, max_attempts, "boom", False, t0, t1, verdict)
                assert verdict == want, f"retry {jid}/{tok} in a batch: {verdict!r}, not {want}"
            else:
                assert isinstance(verdict, err), f"retry {jid}/{tok}: {verdict!r}, not {err}"
        claimable = self.m(qi).claimable()
        assert len(out.jobs) == min(n, claimable), f"{len(out.jobs)} of {n}, {claimable}"
        for job in out.jobs:
            self.take(qi, job)
        for job in out.jobs:
            self.m(qi).jobs[job.id].score = self.score(qi, "active", job.id, t0 + lease, t1 + lease)

    @rule(qi=QI, picks=st.lists(PICK, min_size=1, max_size=3), lease=LEASES)
    def extend_leases(self, qi: int, picks: list[int], lease: int) -> None:
        """The heartbeat: each pair fenced in turn; the flagged ids are reported (D22)."""
        mine = [t for t in self.tickets if t[0] == qi]
        pairs = [(t[1], t[2]) for t in (pick(mine, p) for p in picks) if t]
        if not pairs:
            return
        m = self.m(qi)
        failed, flagged, ok = [], [], []
        for jid, tok in pairs:
            if m.fence(jid, tok) is None:
                j = m.jobs[jid]
                j.state = "active"
                ok.append(jid)
                if j.cancel:
                    flagged.append(jid)
            else:
                failed.append(jid)
        t0 = self.now()
        got = self.q(qi).extend_leases(pairs, lease_ms=lease)
        t1 = self.now()
        if not strict("cancel"):
            flagged = got[1]
        assert got == (failed, flagged), f"extend_leases {pairs}: {got}, model {(failed, flagged)}"
        for jid in ok:
            m.jobs[jid].score = self.score(qi, "active", jid, t0 + lease, t1 + lease)

    # ------------------------------------------------------------------ sweeps

    @rule(qi=QI)
    def reap(self, qi: int) -> None:
        self.tick("active")
        now = self.now()
        m = self.m(qi)
        due = [i for i, j in m.jobs.items() if j.state == "active" and j.score <= now]
        got = self.q(qi).reap(100)
        flagged = [i for i in due if m.jobs[i].cancel]
        # A flagged run that lapsed is not run again (D22 as issue 22 settles it); whether
        # reap counts it among the jobs it moved is the script's choice.
        assert len(due) - len(flagged) <= got <= len(due), f"reap moved {got} of {due}"
        for jid in due:
            j = m.jobs[jid]
            if j.cancel and strict("cancel"):
                self.lapsed_cancelled(qi, jid)
                continue
            m.leave_active(j)
            j.state = "pending"
        self.trim_dead(qi)
        self.ring_repair(qi)

    def ring_repair(self, qi: int) -> None:
        """Waiver ``ring`` (FINDINGS F12): a promote right after a sweep repairs the ring the
        sweep broke, so a run can look past F12 (the promote is modelled as any other)."""
        if not strict("ring"):
            self.promote(qi=qi)

    @rule(qi=QI, max_stalled=st.integers(1, 2))
    def sweep_stalled(self, qi: int, max_stalled: int) -> None:
        self.tick("active")
        now = self.now()
        m = self.m(qi)
        due = sorted(
            (j.score, i) for i, j in m.jobs.items() if j.state == "active" and j.score <= now
        )
        recovered, dead = self.q(qi).sweep_stalled(max_stalled=max_stalled, limit=100)
        want_r, want_d = [], []
        for _, jid in due:
            j = m.jobs[jid]
            if j.cancel and strict("cancel"):
                assert jid not in recovered, f"the cancelled run {jid} was recovered"
                dead = [d for d in dead if d != jid]
                self.lapsed_cancelled(qi, jid)
                continue
            m.leave_active(j)
            j.stalled += 1
            if j.stalled >= max_stalled:
                j.state, j.last_error, j.epoch = "dead", "stalled", None
                m.failed += 1
                m.release_dedup(jid)
                if jid in m.wanted:
                    m.keep(jid, b"", j.attempts, "stalled")
                self.w.child_dead(qi, jid, j, "stalled")
                self.dead_lettered(qi)
                want_d.append(jid)
            else:
                j.state = "pending"
                want_r.append(jid)
        self.trim_dead(qi)
        assert (sorted(recovered), sorted(dead)) == (sorted(want_r), sorted(want_d))
        self.ring_repair(qi)

    def lapsed_cancelled(self, qi: int, jid: str) -> None:
        """A flagged run whose lease lapsed: dead-lettered "cancelled" (removed for
        ``remove=True``), never run again."""
        m = self.m(qi)
        j = m.jobs[jid]
        if j.cancel == "remove":
            self.w.removed(qi, jid)
            if jid in m.wanted:
                m.keep(jid, b"", j.attempts, "cancelled")
            return
        m.leave_active(j)
        j.state, j.last_error, j.epoch = "dead", "cancelled", None
        self.dead_lettered(qi)
        m.failed += 1
        m.release_dedup(jid)
        if jid in m.wanted:
            m.keep(jid, b"", j.attempts, "cancelled")
        self.w.child_dead(qi, jid, j, "cancelled")

    def promoted(self, qi: int, now: int, limit: int = 100) -> int:
        """The ``limit`` earliest due scheduled jobs (by run time, then id) wait again."""
        m = self.m(qi)
        due = sorted((j.score, i) for i, j in m.jobs.items() if j.state == "scheduled")
        due = [(s, i) for s, i in due if s <= now][:limit]
        for _, jid in due:
            m.jobs[jid].state = "pending"
        return len(due)

    @rule(qi=QI, limit=st.sampled_from((1, 100, 100)))
    def promote(self, qi: int, limit: int = 100) -> None:
        self.tick("scheduled")
        now = self.now()
        want = self.promoted(qi, now, limit)
        assert self.q(qi).promote(limit) == want

    def fired(self, qi: int, got: int) -> None:
        """Every registered repeat fired one occurrence (the tick made each due): find the
        new jobs by payload (identity is the server's to choose, issue 22 #2)."""
        m = self.m(qi)
        # issue 24: limits; issue 26: a paused repeat never comes due
        live = {n: v for n, v in m.repeats.items() if m.repeat_due(n)}
        assert got == len(live), f"fired {got}, {len(live)} repeats due"
        if not live:
            return
        known = set(m.jobs)
        for name, (payload, g) in sorted(live.items()):
            key = keyspace.lane_key(self.names[qi], g) if g else self.key(qi, "pending")
            fresh = [
                i.decode()
                for i in self.r.zrange(key, 0, -1)
                if i.decode() not in known
                and self.r.hget(self.jkey(qi, i.decode()), "payload") == payload
            ]
            assert len(fresh) == 1, f"repeat {name}: occurrences {fresh}"
            m.admit(fresh[0], Job(payload, g))
            known.add(fresh[0])
            if m.repeat_limit.get(name) is not None:
                m.repeat_fired[name] = m.repeat_fired.get(name, 0) + 1

    @rule(qi=QI)
    def fire_due(self, qi: int) -> None:
        self.tick(repeats=True)
        self.fired(qi, self.q(qi).fire_due(100))

    @rule(qi=QI)
    def pump(self, qi: int) -> None:
        """promote + fire due repeats + deliver this queue's flow outbox."""
        self.tick("scheduled", repeats=True)
        now = self.now()
        promoted = self.promoted(qi, now)
        delivered = len(self.m(qi).outbox)
        known = set(self.m(qi).jobs)
        got = self.q(qi).pump(100)
        fired = got - promoted - delivered
        self.fired(qi, fired)
        for jid in set(self.m(qi).jobs) - known:
            assert self.m(qi).jobs[jid].payload in {p for p, _ in self.m(qi).repeats.values()}
        self.w.deliver(qi)
        for oqi in (0, 1):  # a delivered fail_parent death trims its parent's queue
            self.trim_dead(oqi)

    # ------------------------------------------------------------------ repeats

    @rule(qi=QI, name=st.sampled_from(REPEATS), g=GROUPS)
    def repeat(self, qi: int, name: str, g: str | None) -> None:
        m = self.m(qi)
        got = self.q(qi).repeat(name, name.encode(), every_ms=SHORT, group=g)
        assert got == ("updated" if name in m.repeats else "registered")
        m.repeats[name] = (name.encode(), g)
        m.repeat_limit[name] = None  # issue 24: no limit (its fired count stays in the row)
        if name in m.repeat_paused:  # issue 26: registered again, still paused
            [rep] = [x for x in self.q(qi).repeats() if x.name == name]
            assert rep.paused and rep.next_ms is None, rep

    @rule(qi=QI, name=st.sampled_from(REPEATS))
    def unrepeat(self, qi: int, name: str) -> None:
        m = self.m(qi)
        assert self.q(qi).unrepeat(name) == (name in m.repeats)
        m.repeats.pop(name, None)
        m.repeat_limit.pop(name, None)
        m.repeat_fired.pop(name, None)
        m.repeat_paused.discard(name)  # issue 26: the pause goes with the spec

    @rule(qi=QI, name=st.sampled_from(REPEATS))
    def pause_repeat(self, qi: int, name: str) -> None:
        """Issue 26: a paused repeat keeps its spec, shows no next fire and never comes due
        (the fire rules count only the others); a re-registration keeps it paused."""
        m = self.m(qi)
        assert self.q(qi).pause_repeat(name) == (name in m.repeats)
        if name in m.repeats:
            m.repeat_paused.add(name)
            [rep] = [x for x in self.q(qi).repeats() if x.name == name]
            assert rep.paused and rep.next_ms is None and not rep.ended, rep

    @rule(qi=QI, name=st.sampled_from(REPEATS))
    def resume_repeat(self, qi: int, name: str) -> None:
        """Issue 26: a resumed repeat's next fire is now + every_ms on the server clock (or
        none when it is spent); a repeat that was not paused keeps its next fire."""
        m = self.m(qi)
        before = {x.name: x for x in self.q(qi).repeats()}
        t0 = self.now()
        assert self.q(qi).resume_repeat(name) == (name in m.repeats)
        t1 = self.now()
        if name not in m.repeats:
            return
        [rep] = [x for x in self.q(qi).repeats() if x.name == name]
        assert not rep.paused, rep
        if name not in m.repeat_paused:
            assert rep.next_ms == before[name].next_ms, (rep, before[name])
        elif m.repeat_live(name):
            assert rep.next_ms is not None and t0 + SHORT <= rep.next_ms <= t1 + SHORT, rep
        else:
            assert rep.next_ms is None and rep.ended, rep
        m.repeat_paused.discard(name)

    # ------------------------------------------------------------------ job admin

    @rule(qi=QI, n=PICK, delay=st.sampled_from((None, None, 0, SHORT, LONG)))
    def reprocess(self, qi: int, n: int, delay: int | None = None) -> None:
        """Mostly a dead or kept completed job (a fresh incarnation: no result, no flag, a
        fresh budget), now or with a delay (issue 24)."""
        m = self.m(qi)
        ended = self.live(qi, "dead", "completed")
        jid = pick(ended, n) if n % 4 else pick(sorted(m.seen), n)
        if jid is not None:
            self.do_reprocess(qi, jid, delay)

    def do_reprocess(self, qi: int, jid: str, delay: int | None = None) -> None:
        m = self.m(qi)
        j = m.jobs.get(jid)
        ended = j is not None and j.state in ("dead", "completed")
        err = JobGone if j is None else None if ended else StateError
        t0 = self.now()
        self.expect(err, self.q(qi).reprocess, jid, delay_ms=delay)
        t1 = self.now()
        note(f"reprocess: {j.state if j else 'gone'}{' with a result' if jid in m.results else ''}")
        if j is not None and err is None:
            self.reprocessed(qi, jid, delay, t0, t1)

    def reprocessed(self, qi: int, jid: str, delay: int | None, t0: int, t1: int) -> None:
        """A dead or kept completed job starts a new incarnation (reprocess, reprocess_all):
        no result, flag, progress or ttl, a fresh budget; its logs and errors stay."""
        m = self.m(qi)
        j = m.jobs[jid]
        j.state, j.last_error, j.stalled, j.cancel = "pending", None, 0, None
        j.progress = None  # issue 38: a row field a reprocess clears (PROTOCOL §2.4)
        j.died = 0  # a new incarnation: its next death is read afresh (D25)
        j.floor = j.attempts
        j.expires, j.expired = None, False  # issue 24: a reprocess starts without a ttl
        m.results.pop(jid, None)
        if delay:
            j.state = "scheduled"
            j.score = self.score(qi, "schedule", jid, t0 + delay, t1 + delay)

    @rule(qi=QI, n=PICK, children=st.booleans())
    def remove(self, qi: int, n: int, children: bool = False) -> None:
        m = self.m(qi)
        held = self.live(qi, "awaiting_children")
        jid = (
            pick(held, n)
            if children and n % 2 and held
            else pick(self.live(qi), n)
            if n % 4
            else pick(sorted(m.seen), n)
        )
        if jid is None:
            return
        self.remove_id(qi, jid, children)

    def remove_id(self, qi: int, jid: str, children: bool = False) -> None:
        m = self.m(qi)
        err = JobGone if jid not in m.jobs else None
        self.expect(err, self.q(qi).remove, jid, children=children)
        if err is None and children:
            note(f"remove with children: {len(m.jobs[jid].kids)} kids")
            self.w.remove_tree(qi, jid)
        elif err is None:
            self.w.removed(qi, jid)

    @rule(qi=QI, n=PICK, remove=st.booleans())
    def cancel(self, qi: int, n: int, remove: bool) -> None:
        m = self.m(qi)
        active = self.live(qi, "active")
        jid = (
            pick(active, n)
            if n % 2 and active
            else pick(self.live(qi), n)
            if n % 4
            else pick(sorted(m.seen), n)
        )
        if jid is not None:
            self.do_cancel(qi, jid, remove)

    def do_cancel(self, qi: int, jid: str, remove: bool) -> None:
        m = self.m(qi)
        j = m.jobs.get(jid)
        note(f"cancel: {j.state if j else 'gone'}")
        got = self.q(qi).cancel(jid, remove=remove)
        if j is None or j.state in ("dead", "completed", "awaiting_children"):
            assert got == "absent"
        elif j.state == "active":
            assert got == "signalled"
            j.cancel = "remove" if remove else "1"
        else:
            assert got == "removed"
            self.w.removed(qi, jid)
            if jid in m.wanted:
                m.keep(jid, b"", j.attempts, "cancelled")

    @rule(qi=QI, include_schedule=st.booleans())
    def drain(self, qi: int, include_schedule: bool) -> None:
        m = self.m(qi)
        states = ("pending", "scheduled") if include_schedule else ("pending",)
        doomed = [jid for jid, j in m.jobs.items() if j.state in states]
        held = {jid for jid, j in m.jobs.items() if j.state == "awaiting_children"}
        got = self.q(qi).drain(include_scheduled=include_schedule)
        for jid in doomed:
            self.w.removed(qi, jid)
        # A parent the drain itself released (its last children drained: dropped) is waiting
        # before the drain ends; whether the drain takes it too depends on the order it
        # walks the sets (FINDINGS F11). The model follows the server, one release at a time.
        extra = 0
        while True:
            released = [
                jid for jid in sorted(held) if jid in m.jobs and m.jobs[jid].state in states
            ]
            taken = [jid for jid in released if not self.r.exists(self.jkey(qi, jid))]
            if not taken:
                break
            for jid in taken:
                note("drain: took a parent it released")
                self.w.removed(qi, jid)
                extra += 1
        assert got == len(doomed) + extra, f"drained {got}, model {len(doomed)} + {extra}"

    @rule(qi=QI, n=PICK)
    def wait(self, qi: int, n: int) -> None:
        """wait() at timeout 0: a kept outcome, JobFailed at once for a dead job (its row's
        last_error), else TimeoutError. It leaves the want marker."""
        jid = pick(sorted(self.m(qi).seen), n)
        if jid is not None:
            self.do_wait(qi, jid)

    def do_wait(self, qi: int, jid: str) -> None:
        m = self.m(qi)
        m.wanted.add(jid)
        kept = m.results.get(jid)
        j = m.jobs.get(jid)
        if kept is None and j is not None and j.state == "dead":
            if not strict("waitdead"):
                with pytest.raises((JobFailed, TimeoutError)):
                    self.q(qi).wait(jid, timeout_s=0)
                return
            with pytest.raises(JobFailed) as failed:
                self.q(qi).wait(jid, timeout_s=0)
            if strict("results"):
                assert failed.value.error == j.last_error, f"wait {jid}: {failed.value.error!r}"
            return
        if not strict("results"):
            with contextlib.suppress(JobFailed, TimeoutError):
                self.q(qi).wait(jid, timeout_s=0)
            return
        if kept is not None and kept.error is None:
            got = self.q(qi).wait(jid, timeout_s=0)
            assert (got.value, got.attempts, got.error) == (kept.value, kept.attempts, None)
        elif kept is not None or (j is not None and j.state == "dead"):
            with pytest.raises(JobFailed) as info:
                self.q(qi).wait(jid, timeout_s=0)
            want = kept.error if kept is not None else j.last_error if j else None
            assert info.value.error == want, f"wait {jid}: {info.value.error!r}, not {want!r}"
        else:
            with pytest.raises(TimeoutError):
                self.q(qi).wait(jid, timeout_s=0)

    # ------------------------------------------------------------------ queue and lanes

    @rule(
        qi=QI,
        what=st.sampled_from(ADMIN),
        g=LANE,
        n=st.sampled_from((None, 1, 2)),
    )
    def admin(self, qi: int, what: str, g: str, n: int | None) -> None:
        m = self.m(qi)
        q = self.q(qi)
        if what == "pause":
            q.resume() if m.paused else q.pause()
            m.paused = not m.paused
        elif what == "pause lane":
            if g in m.paused_lanes:
                q.resume_lane(g)
                m.paused_lanes.discard(g)
            else:
                q.pause_lane(g)
                m.paused_lanes.add(g)
        elif what == "limit lane":
            q.limit_lane(g, n)
            if n is None:
                m.limits.pop(g, None)
            else:
                m.limits[g] = n
        elif what == "rate":
            q.rate_limit(n or 3, LONG)
            m.rate = (n or 3, m.rate[1] if m.rate else 0)
        elif what == "rate lane":
            q.rate_limit_lane(g, n or 3, LONG)
            m.lane_rate[g] = (n or 3, m.lane_rate[g][1] if g in m.lane_rate else 0)
        elif what == "clear rate":
            q.clear_rate_limit()
            m.rate = None
        elif what == "keep":  # kept history (issue 24): None turns it off
            q.keep_completed(n or 0)
            m.keep_count = n
        elif what == "keep dead":  # a lowered bound applies at the next death
            q.keep_dead(n)
            m.keep_dead = n
        else:
            q.clear_rate_limit(g)
            m.lane_rate.pop(g, None)

    # ------------------------------------------------------------------ agreement

    # ================================================================== issue 24 (i24ctl)
    # Per-job budgets, expiry and the small controls: run_now, reschedule, update_payload,
    # cancel_all, repeat limits (remove with children is the `remove` rule's `children`).

    def expiry(self, qi: int, jid: str, j: Job, ttl: int, t0: int, t1: int) -> None:
        """An admitted job with a ttl: its row's deadline is enqueue + ttl on the server clock;
        a 1 ms ttl is waited out, so any later claim must dead-letter it (never lease it)."""
        got = self.r.hget(self.jkey(qi, jid), "expires")
        assert got is not None, f"{jid} was enqueued with ttl_ms={ttl} but has no expires"
        j.expires = int(got)
        assert t0 + ttl <= j.expires <= t1 + ttl, f"expires {j.expires}, enqueued {t0}..{t1}"
        if ttl == 1:
            while self.now() <= j.expires:
                time.sleep(0.001)
            j.expired = True

    def expired_met(self, qi: int) -> None:
        """The claims since the last check dead-lettered the expired jobs they met (which
        ones depends on the sets the ring served): an expired job the server holds dead is
        dead "expired" in the model too; any other death is caught by the comparison."""
        m = self.m(qi)
        doomed = [i for i, j in m.jobs.items() if j.expired and j.state == "pending"]
        if not doomed:
            return
        pipe = self.r.pipeline(transaction=False)
        for jid in doomed:
            pipe.hget(self.jkey(qi, jid), "state")
        for jid, state in zip(doomed, pipe.execute(), strict=True):
            # No row: dead-lettered, then trimmed by the same claim (keep_dead, kept history).
            if state == b"dead" or (state is None and m.keep_dead is not None):
                note("expiry: a claim dead-lettered an expired job")
                self.w.expire(qi, jid)
        self.trim_dead(qi)  # the claim that dead-lettered them trimmed dead in the same call

    @rule(qi=QI, n=PICK)
    def fail_with_budget(self, qi: int, n: int) -> None:
        """A held job fails and its worker retries it with the job's own budget (the
        envelope's max_attempts, app layer): dead exactly when this incarnation's attempts
        (from its floor: a reprocess or a re-admission restarts it) reach it."""
        held = self.live(qi, "active")
        jid = pick(held, n)
        if jid is not None:
            j = self.m(qi).jobs[jid]
            note(f"budget {j.budget}: attempt {j.attempts - j.floor}")
            self.do_retry(qi, jid, j.attempts, 0, j.budget, "over budget", False)

    @rule(qi=QI, n=PICK)
    def run_now(self, qi: int, n: int) -> None:
        m = self.m(qi)
        jid = pick(self.live(qi, "scheduled"), n) if n % 3 else pick(sorted(m.seen), n)
        if jid is None:
            return
        j = m.jobs.get(jid)
        err = JobGone if j is None else StateError if j.state != "scheduled" else None
        self.expect(err, self.q(qi).run_now, jid)
        if j is not None and err is None:
            j.state, j.score = "pending", 0

    @rule(qi=QI, n=PICK, due=st.booleans())
    def reschedule(self, qi: int, n: int, due: bool) -> None:
        """A scheduled job's run time, as an absolute at_ms: due now or an hour away."""
        m = self.m(qi)
        jid = pick(self.live(qi, "scheduled"), n) if n % 3 else pick(sorted(m.seen), n)
        if jid is None:
            return
        j = m.jobs.get(jid)
        at = self.now() + (-1 if due else LONG)
        err = JobGone if j is None else StateError if j.state != "scheduled" else None
        self.expect(err, self.q(qi).reschedule, jid, at_ms=at)
        if j is not None and err is None:
            j.score = at

    @rule(qi=QI, n=PICK, payload=PAYLOADS)
    def update_payload(self, qi: int, n: int, payload: bytes) -> None:
        m = self.m(qi)
        jid = pick(self.live(qi), n) if n % 4 else pick(sorted(m.seen), n)
        if jid is None:
            return
        j = m.jobs.get(jid)
        err = (
            JobGone
            if j is None
            else StateError
            if j.state not in ("pending", "scheduled")
            else None
        )
        self.expect(err, self.q(qi).update_payload, jid, payload)
        note(f"update_payload: {j.state if j else 'gone'}")
        if j is not None and err is None:
            j.payload = payload
            if j.epoch is not None:  # a reaped job: its old holder can settle it no more
                j.epoch, j.cancel = None, None

    @rule(qi=QI)
    def cancel_all(self, qi: int) -> None:
        """Every waiting and scheduled job removed as cancel removes one (a waiter learns
        "cancelled"), every active job not already flagged signalled; a parent the walk
        itself released is waiting before it ends and goes too (as drain, FINDINGS F11)."""
        m = self.m(qi)
        self.expired_met(qi)
        doomed = sorted(i for i, j in m.jobs.items() if j.state in ("pending", "scheduled"))
        flag = sorted(i for i, j in m.jobs.items() if j.state == "active" and j.cancel is None)
        held = {i for i, j in m.jobs.items() if j.state == "awaiting_children"}
        got = self.q(qi).cancel_all()

        def gone(jid: str) -> None:
            j = self.w.removed(qi, jid)
            if jid in m.wanted:
                m.keep(jid, b"", j.attempts, "cancelled")

        for jid in doomed:
            gone(jid)
        extra = 0
        while True:
            released = sorted(
                i for i in held if i in m.jobs and m.jobs[i].state in ("pending", "scheduled")
            )
            if not released:
                break
            for jid in released:
                note("cancel_all: took a parent it released")
                gone(jid)
                extra += 1
        for jid in flag:
            m.jobs[jid].cancel = "1"
        assert got == {"removed": len(doomed) + extra, "signalled": len(flag)}, (got, doomed)

    @rule(qi=QI, name=st.sampled_from(REPEATS), g=GROUPS, limit=st.sampled_from((None, 1, 2)))
    def repeat_limited(self, qi: int, name: str, g: str | None, limit: int | None) -> None:
        """repeat(limit=): a repeat stops after that many fires; the count survives an update
        (and is only kept while a limit is set), a new limit above it revives it."""
        m = self.m(qi)
        got = self.q(qi).repeat(name, name.encode(), every_ms=SHORT, group=g, limit=limit)
        assert got == ("updated" if name in m.repeats else "registered")
        m.repeats[name] = (name.encode(), g)
        m.repeat_limit[name] = limit
        [rep] = [x for x in self.q(qi).repeats() if x.name == name]
        ended = not m.repeat_live(name) and name not in m.repeat_paused  # issue 26
        assert (
            rep.limit == limit and rep.ended == ended and rep.paused == (name in m.repeat_paused)
        ), rep
        assert rep.fired == m.repeat_fired.get(name, 0), (rep, m.repeat_fired)

    # ================================================================== end issue 24

    @invariant()
    def server_agrees_with_model(self) -> None:
        note("step")
        for qi in (0, 1):
            self.agrees(qi)
        self.t_prev = self.now()

    def agrees(self, qi: int) -> None:
        m, q, name = self.m(qi), self.handles[qi][0], self.names[qi]
        self.expired_met(qi)
        violations = q.check()
        if not strict("negdeps"):  # FINDINGS F13
            violations = [v for v in violations if "is negative" not in v]
        assert violations == [], f"{name}: check()"
        retired = self.r.hgetall(self.key(qi, "retired"))
        assert {k.decode(): int(v) for k, v in retired.items()} == m.retired
        assert q.counts() == m.counts()
        assert q.lanes() == m.lanes()
        assert q.is_paused() == m.paused
        fields = (
            "state",
            "attempts",
            "group",
            "stalled",
            "last_error",
            "payload",
            "lease_epoch",
            "floor",
            "cancel",
            "parent",
            "parent_policy",
            "parent_queue",
            "children",
            "priority",  # issue 24: absent for 0
            "expires",
            "progress",  # issue 38: update_progress
            "keep_logs",  # issue 38: the option
            "kids",  # last: compared as a set of ids below
        )
        jobs = sorted(m.jobs.items())
        gone = sorted(m.seen - set(m.jobs))
        seen = sorted(m.seen)
        pipe = self.r.pipeline(transaction=False)
        for jid, j in jobs:
            pipe.hmget(self.jkey(qi, jid), fields)
            pipe.zscore(self.place(qi, j), jid)
            pipe.lrange(self.jkey(qi, jid) + ":logs", 0, -1)  # issue 38: add_log
            pipe.lrange(self.jkey(qi, jid) + ":errors", 0, -1)  # and retry's error history
        for jid in gone:
            jk = self.jkey(qi, jid)
            sides: tuple[str, ...] = (":logs", ":errors")
            if strict("orphans"):
                sides += (":deps", ":processed", ":failed", ":unsuccessful")
            pipe.exists(jk, *(jk + s for s in sides))
        for jid in seen:
            pipe.hgetall(self.key(qi, "result:" + jid))
            pipe.exists(self.key(qi, "notify:" + jid))
        flowless = [jid for jid, _ in jobs if jid not in m.flows]
        if strict("orphans") and strict("negdeps"):
            for jid in flowless:
                jk = self.jkey(qi, jid)
                pipe.exists(*(jk + s for s in (":deps", ":processed", ":failed", ":unsuccessful")))
        flows = sorted(m.flows.items())
        for pid, _ in flows:
            jk = self.jkey(qi, pid)
            pipe.get(jk + ":deps")
            pipe.hgetall(jk + ":processed")
            pipe.hgetall(jk + ":failed")
            pipe.hgetall(jk + ":unsuccessful")
        dids = sorted(d for qq, d in self.dids_used if qq == qi)
        for did in dids:
            pipe.get(self.key(qi, "de:" + did))
        pipe.lrange(self.key(qi, "flow:outbox"), 0, -1)
        replies = iter(pipe.execute())
        for jid, j in jobs:
            row, score = next(replies), next(replies)
            logs, errors = next(replies), next(replies)
            assert [x.decode() for x in logs] == j.logs, f"{name} {jid}: logs {logs}, {j.logs}"
            assert [x.decode() for x in errors] == j.errors, f"{jid}: errors {errors}, {j.errors}"
            want = [
                j.state,
                str(j.attempts),
                j.group,
                str(j.stalled) if j.stalled else None,
                j.last_error,
                j.payload,
                str(j.epoch) if j.epoch is not None else None,
                str(j.floor) if j.floor else None,
                j.cancel,
                j.parent,
                j.policy,
                self.names[j.pq] if j.pq is not None else None,
                str(j.children) if j.children else None,
                str(j.priority) if j.priority else None,
                str(j.expires) if j.expires is not None else None,
                j.progress,
                str(j.keep_logs) if j.keep_logs is not None else None,
                _kids(j.kids),
            ]
            got = [
                v if v is None or f == "payload" else v.decode()
                for f, v in zip(fields, row, strict=True)
            ]
            got[-1] = _kids(_chunks(got[-1])) if got[-1] else None
            if not strict("cancel"):
                want[8] = got[8]
            assert got == want, (
                f"{name} {jid}: row {dict(zip(fields, got, strict=True))} "
                f"!= model {dict(zip(fields, want, strict=True))}"
            )
            want_score = j.score if j.state in ("active", "scheduled", "completed") else 0
            if j.state == "pending":
                want_score = j.priority  # issue 24: a waiting job is scored by its priority
            if j.state != "dead":
                j.died = 0
            elif score is not None and not j.died:
                # D25: a death since the last check is scored by the server's time of it.
                assert self.t_prev - 1 <= score <= self.now(), f"{jid} died at {score}"
                j.died = want_score = score
            else:
                want_score = j.died
            if j.state == "awaiting_children":
                assert score is None, f"{jid} is awaiting its children but is in a set"
            else:
                assert score == want_score, f"{jid} ({j.state}) score {score}, not {want_score}"
        for jid in gone:
            assert next(replies) == 0, f"{name}: {jid} has no row but left keys behind"
        for jid in seen:
            res, notify = next(replies), next(replies)
            kept = m.results.get(jid)
            got_r = (
                None
                if not res
                else (
                    res.get(b"result", b""),
                    int(res.get(b"attempts", b"0")),
                    res[b"error"].decode() if b"error" in res else None,
                )
            )
            want_r = None if kept is None else (kept.value, kept.attempts, kept.error)
            if strict("results"):
                assert got_r == want_r, f"{name} result:{jid} {got_r} != model {want_r}"
                assert not notify or kept is not None, f"notify:{jid} outlives its result"
        if strict("orphans") and strict("negdeps"):
            for jid in flowless:
                assert next(replies) == 0, f"{name}: {jid} is in no flow but has flow keys"
        for pid, fl in flows:
            deps, proc, fail, unsucc = (next(replies) for _ in range(4))
            got_f = (
                int(deps) if deps is not None else None,
                {k.decode(): v for k, v in proc.items()},
                {k.decode(): v.decode() for k, v in fail.items()},
                {k.decode(): v.decode() for k, v in unsucc.items()},
            )
            want_f = (fl.deps, fl.processed, fl.failed, fl.unsuccessful)
            assert got_f == want_f, f"{name} flow of {pid}: {got_f} != model {want_f}"
        for did in dids:
            holder = next(replies)
            got_h = holder.decode() if holder else None
            assert got_h == m.dedup.get(did), f"{name} de:{did[:8]} {got_h} != {m.dedup.get(did)}"
        outbox = next(replies)
        assert len(outbox) == len(m.outbox), f"{name} outbox {outbox} != {m.outbox}"
        calls = [_protocol.job_state(q._k, jid) for jid in seen]
        states = q._x.pipeline(calls) if calls else []
        want_states = [m.jobs[j].state if j in m.jobs else "absent" for j in seen]
        assert states == want_states

    def place(self, qi: int, j: Job) -> str:
        if j.state == "pending":
            return (
                keyspace.lane_key(self.names[qi], j.group) if j.group else self.key(qi, "pending")
            )
        return self.key(
            qi,
            {
                "active": "active",
                "scheduled": "schedule",
                "dead": "dead",
                "completed": "completed",
            }.get(j.state, "pending"),
        )

    def teardown(self) -> None:
        try:
            for qs in self.handles:
                qs[0].pause()
                qs[0].obliterate(force=True)
            for name in self.names:
                left = list(self.r.scan_iter(match=f"emq:{{{name}}}:*", count=1000))
                assert left == [], f"obliterate left {left[:5]}"
        finally:
            for qs in self.handles:
                for q in qs:
                    q.close()


def _chunks(kids: str) -> list[str]:
    return [kids[i : i + 14] for i in range(0, len(kids), 14)]


def _kids(kids: list[str]) -> str | None:
    """A `kids` field compared as a set: the order is the flattened tree's."""
    return "".join(sorted(kids)) or None


def budget(examples: int) -> settings:
    return settings(
        max_examples=examples * 20 if DEEP else examples,
        stateful_step_count=80 if DEEP else 40,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        report_multiple_bugs=False,
        # Triage aid: ECHOMQ_MODEL_NOSHRINK=1 reports the first failure unshrunk (a shrink
        # against a real server can take minutes).
        phases=[Phase.explicit, Phase.generate]
        if os.environ.get("ECHOMQ_MODEL_NOSHRINK")
        else list(Phase),
    )


def run(client: redis.Redis, executors: tuple[str, ...], examples: int) -> None:
    client.script_flush()
    STATS.clear()
    try:
        run_state_machine_as_test(
            lambda: ModelMachine(client, executors), settings=budget(examples)
        )
    finally:
        client.close()
        if os.environ.get("ECHOMQ_MODEL_STATS"):
            print(sorted(STATS.items()))


@pytest.mark.timeout(3600)
def test_machine(redis_url: str, executor: str) -> None:
    run(redis.Redis.from_url(redis_url), (executor,), 30)


@pytest.mark.timeout(3600)
def test_machine_mixed_executors(module_server: EmbeddedServer) -> None:
    """One queue driven alternately through a Lua and a native client."""
    run(redis.Redis.from_url(module_server.url), ("lua", "native"), 30)


# ---------------------------------------------------------------------- fixed scenarios
# The seam chains of issue 22, replayed through the same machine (every step checked against
# the model), so each runs on every CI run whatever hypothesis draws.


@pytest.fixture
def sm(redis_url: str, executor: str) -> Iterator[ModelMachine]:
    yield from machine_on(redis_url, executor)


def machine_on(redis_url: str, executor: str) -> Iterator[ModelMachine]:
    """A machine for fixed scenarios (the ``sm`` fixture here and in test_model_protocol.py)."""
    client = redis.Redis.from_url(redis_url)
    machine = ModelMachine(client, (executor,))
    machine.server_agrees_with_model()
    yield machine
    machine.teardown()
    client.close()


class Steps:
    """Run machine rules by name, checking the server against the model after each."""

    def __init__(self, sm: ModelMachine) -> None:
        self.sm = sm

    def __getattr__(self, name: str) -> Callable[..., Any]:
        rule_fn = getattr(self.sm, name)

        def run(**kw: Any) -> Any:
            out = rule_fn(**kw)
            self.sm.server_agrees_with_model()
            return out

        return run


def waive(monkeypatch: pytest.MonkeyPatch, *tags: str) -> None:
    """A scenario aimed at one seam waives the checks other scenarios cover, so it fails for
    its own finding only."""
    monkeypatch.setattr(sys.modules[__name__], "WAIVED", WAIVED | set(tags))


def live_pick(sm: ModelMachine, qi: int, jid: str) -> int:
    """The ``n`` with which remove/cancel/reprocess pick ``jid`` among the live jobs."""
    live = sm.live(qi)
    n = live.index(jid)
    while n % 4 == 0:
        n += len(live)
    return n


@pytest.mark.parametrize("cross", [0, 1])
def test_a_reprocessed_child_counts_once(sm: ModelMachine, cross: int) -> None:
    """#1: an ignored child's death, then its reprocess and completion, count once: the
    parent waits for its other child."""
    s = Steps(sm)
    s.admin(qi=0, what="pause lane", g="la", n=None)  # holds the other child back
    # root on queue 0; children: an ignored one (maybe on queue 1) and one in lane la.
    s.add_flow(qi=0, shape=[(2, True, 0, None), (0, False, cross, None), (0, True, 0, "la")])
    root = next(iter(sm.m(0).flows))
    ignored: tuple[int, str] | None = None
    other: tuple[int, str] | None = None
    for qi in (0, 1):
        for jid, j in sm.m(qi).jobs.items():
            if j.parent == root and j.policy == "id":
                ignored = (qi, jid)
            elif j.parent == root:
                other = (qi, jid)
    assert ignored and other
    qi = ignored[0]
    s.work(qi=qi, outcomes=["die"])  # the flat set first: the ignored child
    if cross:
        s.pump(qi=1)
    s.reprocess(qi=qi, n=1)
    s.work(qi=qi, outcomes=["done"])
    if cross:
        s.pump(qi=1)
    assert sm.m(0).jobs[root].state == "awaiting_children"


@pytest.mark.parametrize("cross", [0, 1])
def test_a_chain_stops_at_its_dead_step(sm: ModelMachine, cross: int) -> None:
    """Issue 42: a chain of three steps (a nested flow, one child per level, the middle step
    maybe on the other queue): the first completes and releases the second; the second dies
    and kills the last (never claimable); then its reprocess and completion release nothing
    (the last step is dead already)."""
    s = Steps(sm)
    s.add_chain(qi=0, steps=3, cross=[0, cross, cross, 0, 0], lane=None)
    root = next(iter(sm.m(0).flows))
    s.work(qi=0, outcomes=["done+keep"])  # the first step (on queue 0 with cross: 0 ^ 1 ^ 1)
    middle = 1 if cross else 0
    if cross:
        s.pump(qi=0)
    s.work(qi=middle, outcomes=["die"])
    if cross:
        s.pump(qi=1)
    assert sm.m(0).jobs[root].state == "dead"
    mid = next(jid for jid, j in sm.m(middle).jobs.items() if j.parent == root)
    s.do_reprocess(qi=middle, jid=mid)
    s.work(qi=middle, outcomes=["done"])
    if cross:
        s.pump(qi=1)
    assert sm.m(0).jobs[root].state == "dead"


def test_a_reprocessed_job_starts_without_its_result(sm: ModelMachine) -> None:
    """#5: a re-admission or a reprocess must not read the previous incarnation's result."""
    s = Steps(sm)
    s.enqueue(qi=0, payload=b"a", group=None, delay=None, did=None, mode="simple")
    jid = sorted(sm.m(0).jobs)[0]
    s.wait(qi=0, n=0)  # leaves the want marker: the death pushes a notify token
    s.work(qi=0, outcomes=["die+keep"])
    s.wait(qi=0, n=0)  # JobFailed boom
    s.reprocess(qi=0, n=1)
    s.wait(qi=0, n=0)  # the new incarnation has not run: TimeoutError
    s.work(qi=0, outcomes=["done+keep"])
    s.enqueue_id(qi=0, n=0, payload=b"b", group=None, did=None, mode="simple")
    assert sm.m(0).jobs[jid].payload == b"b"
    s.wait(qi=0, n=0)  # re-admitted, not run: TimeoutError, not the old value


def test_a_cancel_flag_ends_with_its_run(sm: ModelMachine) -> None:
    """#4: a cancelled run's flag does not reach the next run (retry, lapse, reprocess)."""
    s = Steps(sm)
    s.enqueue(qi=0, payload=b"a", group=None, delay=None, did=None, mode="simple")
    s.claim(qi=0, lease=LONG)
    s.cancel(qi=0, n=1, remove=False)
    s.extend_leases(qi=0, picks=[0], lease=SHORT)  # reports the flag
    s.settle(n=0, verb="retry", ms=0, max_attempts=1, keep=False, error="cancelled")  # dead
    s.reprocess(qi=0, n=1)
    s.claim(qi=0, lease=SHORT)
    s.extend_leases(qi=0, picks=[0], lease=SHORT)  # a new run: nothing to report
    s.cancel(qi=0, n=1, remove=True)
    s.reap(qi=0)  # the run lapsed: the flag ends with it
    s.claim(qi=0, lease=LONG)
    s.extend_leases(qi=0, picks=[0], lease=LONG)
    s.settle(n=0, verb="retry", ms=0, max_attempts=1, keep=False, error="cancelled")


def test_wait_on_a_dead_job_fails_at_once(sm: ModelMachine) -> None:
    s = Steps(sm)
    s.enqueue(qi=0, payload=b"a", group=None, delay=None, did=None, mode="simple")
    s.work(qi=0, outcomes=["die"])  # no kept result: the row says dead
    s.wait(qi=0, n=0)
    s.add_flow(qi=0, shape=[(1, True, 0, None), (0, True, 0, None)])
    s.work(qi=0, outcomes=["die"])  # the fail_parent child kills its parent
    for n in range(3):
        s.wait(qi=0, n=n)


def test_dedup_and_duplicate_refusals(sm: ModelMachine) -> None:
    s = Steps(sm)
    for did in DIDS:
        s.enqueue(qi=0, payload=b"a", group=None, delay=None, did=did, mode="simple")
        s.enqueue(qi=0, payload=b"b", group=None, delay=None, did=did, mode="simple")
    s.enqueue_id(qi=0, n=0, payload=b"c", group=None, did=None, mode="simple")


def test_a_removed_parent_is_told_nothing(sm: ModelMachine) -> None:
    """remove x flows: a child settling after its parent was removed writes no key of it."""
    s = Steps(sm)
    s.add_flow(qi=0, shape=[(2, True, 0, None), (0, False, 0, None), (0, True, 0, None)])
    root = next(iter(sm.m(0).flows))
    s.remove(qi=0, n=live_pick(sm, 0, root))
    assert root not in sm.m(0).jobs
    s.work(qi=0, outcomes=["done", "die"])


def test_a_reaped_holder_and_its_debounce(
    sm: ModelMachine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """reap x dedup: a debounce that finds its holder reaped (pending, its lease still
    open) must not hand the new payload to the old holder's settle."""
    waive(monkeypatch, "events")
    s = Steps(sm)
    s.enqueue(qi=0, payload=b"v1", group=None, delay=None, did="d1", mode="debounce")
    s.claim(qi=0, lease=SHORT)
    s.reap(qi=0)
    s.enqueue(qi=0, payload=b"v2", group=None, delay=None, did="d1", mode="debounce")
    s.settle(n=0, verb="complete", ms=0, max_attempts=1, keep=False, error="boom")


@pytest.mark.parametrize("how", ["drain", "cancel"])
def test_a_released_parent_drained_or_cancelled_leaves_nothing(sm: ModelMachine, how: str) -> None:
    s = Steps(sm)
    s.add_flow(qi=0, shape=[(1, True, 0, None), (0, True, 0, None)])
    root = next(iter(sm.m(0).flows))
    s.work(qi=0, outcomes=["done+keep"])
    assert sm.m(0).jobs[root].state == "pending"
    if how == "drain":
        s.drain(qi=0, include_schedule=False)
    else:
        s.cancel(qi=0, n=live_pick(sm, 0, root), remove=False)
    assert root not in sm.m(0).jobs


@pytest.mark.parametrize("sweep", ["reap", "sweep_stalled"])
def test_a_sweep_that_releases_a_parent_keeps_the_flat_set_served(
    sm: ModelMachine, sweep: str
) -> None:
    """FINDINGS F12: a lapsed job parked by a sweep and a parent released by the same sweep
    (its last child's cancelled run removed) must both be claimable."""
    s = Steps(sm)
    s.enqueue(qi=0, payload=b"a", group=None, delay=None, did=None, mode="simple")
    s.add_flow(qi=0, shape=[(1, True, 0, None), (0, True, 0, None)])
    s.claim_batch(qi=0, n=2, lease=SHORT)
    child = next(j for j, row in sm.m(0).jobs.items() if row.parent)
    sm.do_cancel(0, child, True)
    sm.server_agrees_with_model()
    if sweep == "reap":
        s.reap(qi=0)
    else:
        s.sweep_stalled(qi=0, max_stalled=2)
    s.claim_batch(qi=0, n=3, lease=LONG)  # the flat job and the released parent


@pytest.mark.parametrize("end", ["complete", "remove"])
def test_an_old_child_never_settles_into_a_new_incarnation(sm: ModelMachine, end: str) -> None:
    """FINDINGS F13: the parent's id removed and admitted again as an unrelated job; its old
    child's completion (or removal) must not count down the new row."""
    s = Steps(sm)
    s.add_flow(qi=0, shape=[(1, True, 0, None), (0, True, 0, "la")])
    root = next(iter(sm.m(0).flows))
    child = next(j for j, row in sm.m(0).jobs.items() if row.parent == root)
    s.remove(qi=0, n=live_pick(sm, 0, root))
    sm.admit_one(0, root, b"a new job", "lb", None, None, "simple")
    sm.server_agrees_with_model()
    if end == "remove":
        s.remove(qi=0, n=live_pick(sm, 0, child))
    else:
        tok = sm.claim_only(0, LONG, {child})[child]
        sm.do_complete(0, child, tok, False, b"R")
        sm.server_agrees_with_model()


# ---------------------------------------------------------------------- issue 24 scenarios
# Priorities and the queue-wide limit, replayed through the machine (every step checked
# against the model), so each runs on every CI run whatever hypothesis draws.


def test_priorities_order_claims_and_survive_every_return(sm: ModelMachine) -> None:
    s = Steps(sm)
    for p in (5, 1, 2**21, 0, 1):
        s.enqueue_prioritized(qi=0, payload=b"f", group=None, delay=None, priority=p)
    s.enqueue_prioritized(qi=0, payload=b"l", group="la", delay=None, priority=3)
    s.enqueue_prioritized(qi=0, payload=b"s", group=None, delay=SHORT, priority=2)
    s.claim_batch(qi=0, n=3, lease=SHORT)  # take() checks each is the head of its set
    s.reap(qi=0)  # back to waiting with their priorities
    s.work(qi=0, outcomes=["fail", "die", "hold"])  # retried, dead, held
    s.promote(qi=0)
    m = sm.m(0)
    dead = next(i for i, j in m.jobs.items() if j.state == "dead")
    s.reprocess(qi=0, n=live_pick(sm, 0, dead))
    assert m.jobs[dead].priority != 0 or m.jobs[dead].state == "pending"
    for state in ("active", "pending", "scheduled"):
        for jid in [i for i, j in m.jobs.items() if j.state == state][:1]:
            s.change_priority(qi=0, n=sorted(m.seen).index(jid), priority=7)
    s.claim_batch(qi=0, n=5, lease=LONG)


def test_the_queue_limit_caps_every_claim_path(sm: ModelMachine) -> None:
    s = Steps(sm)
    for g in (None, "la", "lb", None):
        s.enqueue_prioritized(qi=0, payload=b"x", group=g, delay=None, priority=0)
    s.limit_queue(qi=0, n=2)
    s.claim(qi=0, lease=LONG)
    s.claim_batch(qi=0, n=5, lease=LONG)  # the room left: one
    s.claim(qi=0, lease=LONG)  # empty at the limit
    s.work(qi=0, outcomes=["done"])  # nothing claimable: nothing done
    s.limit_queue(qi=0, n=3)
    s.work(qi=0, outcomes=["done", "done"])  # one slot: one claimed, completed
    s.limit_queue(qi=0, n=None)
    s.claim_batch(qi=0, n=5, lease=LONG)
    assert sm.m(0).active_count() == 3  # four jobs, one completed


# ---------------------------------------------------------------------- kept history (issue 24)
# keep_completed / keep_dead by count (the age bound reads the server clock: it is driven
# in tests/features/test_kept_history.py), the completed state, reprocess of a kept
# completed job with and without a delay, re-admission, remove and cancel of a kept row;
# every step checked.


def test_kept_completed_rows_trim_by_count_and_rerun(sm: ModelMachine) -> None:
    s = Steps(sm)
    s.admin(qi=0, what="keep", g="la", n=2)
    for i in range(4):
        s.enqueue(qi=0, payload=b"k%d" % i, group=None, delay=None, did=None, mode="simple")
    s.work(qi=0, outcomes=["done", "done+keep", "done", "done+keep"])  # trims to 2
    kept = sm.live(0, "completed")
    assert len(kept) == 2
    s.enqueue_id(qi=0, n=1, payload=b"x", group=None, did=None, mode="simple")  # a duplicate
    s.do_reprocess(qi=0, jid=kept[0], delay=LONG)  # a kept completed job, later
    assert sm.m(0).jobs[kept[0]].state == "scheduled"
    s.do_reprocess(qi=0, jid=kept[1])  # and now
    assert sm.m(0).jobs[kept[1]].state == "pending"
    s.admin(qi=0, what="keep", g="la", n=1)  # a lower bound: the next completion trims
    s.work(qi=0, outcomes=["done"])
    assert len(sm.live(0, "completed")) == 1
    s.do_cancel(qi=0, jid=sm.live(0, "completed")[0], remove=False)  # absent: nothing runs
    s.remove_id(qi=0, jid=sm.live(0, "completed")[0])
    s.admin(qi=0, what="keep", g="la", n=None)  # off: completions delete again
    s.work(qi=0, outcomes=["done", "done"])


def test_kept_dead_rows_trim_by_count(sm: ModelMachine) -> None:
    s = Steps(sm)
    s.admin(qi=0, what="keep dead", g="la", n=1)
    for i in range(3):
        s.enqueue(qi=0, payload=b"d%d" % i, group="la", delay=None, did=None, mode="simple")
    s.work(qi=0, outcomes=["die", "die+keep", "hold"])
    assert len(sm.live(0, "dead")) == 1
    s.claim(qi=0, lease=SHORT)
    s.sweep_stalled(qi=0, max_stalled=1)  # a stall death trims too
    assert len(sm.live(0, "dead")) == 1
    s.do_reprocess(qi=0, jid=sm.live(0, "dead")[0], delay=SHORT)
    s.pump(qi=0)  # due: promoted back to waiting
    s.admin(qi=0, what="keep dead", g="la", n=None)


def test_a_kept_flow_parent_and_its_rerun_child(sm: ModelMachine) -> None:
    """A kept parent keeps its children's outcomes; a kept child reprocessed and completed
    again moves its record, never counts twice."""
    s = Steps(sm)
    s.admin(qi=0, what="keep", g="la", n=2)
    s.add_flow(qi=0, shape=[(1, True, 0, None), (0, True, 0, None)])
    s.work(qi=0, outcomes=["done+keep"])  # the child
    s.work(qi=0, outcomes=["done"])  # the parent
    child = next(i for i, j in sm.m(0).jobs.items() if j.parent is not None)
    assert sm.m(0).jobs[child].state == "completed"
    s.do_reprocess(qi=0, jid=child)
    s.work(qi=0, outcomes=["done"])


def test_a_kept_child_rerun_that_dies_moves_its_record(sm: ModelMachine) -> None:
    """Found by the machine (deep run): a flow child that completed and was kept (issue 24)
    is reprocessed and its new run dies, ignored: its record moves from processed to
    unsuccessful (its latest outcome, PROTOCOL §2.4), still counted once."""
    s = Steps(sm)
    s.keep_history(keep=1, dead=None)
    s.seed(n=0, g=None)
    s.drain(include_schedule=False, qi=0)
    s.flow_seam(chain="child-rerun", cross=0)
    s.reprocess(delay=None, n=1, qi=0)
    s.settle_batch(again=[], delay=0, done=[], lease=20, max_attempts=1, n=0, qi=0)
    s.flow_seam(chain="debounce-lapse", cross=0)
    s.seam(chain="cancel-retry", keep=False, qi=0, remove=False)


def test_a_batch_trims_its_kept_rows_after_its_verdicts(sm: ModelMachine) -> None:
    """Found by the machine (FINDINGS F20): a batch that completes an active job and, again,
    a job completed and kept earlier, with keep_completed 1. The script answers every
    complete first and trims once after (the earlier row still there: StaleToken, "lease
    settled"); the model trimmed after each completion and expected JobGone."""
    s = Steps(sm)
    s.keep_history(keep=1, dead=None)
    s.seed(n=3, g=None)
    s.reschedule(due=False, n=0, qi=0)
    s.fire_due(qi=0)
    s.settle_batch(again=[], delay=0, done=[], lease=20, max_attempts=1, n=3, qi=0)
    s.settle(error="boom", keep=False, max_attempts=1, ms=0, n=0, verb="complete")
    s.settle_batch(again=[], delay=0, done=[0, 2], lease=20, max_attempts=1, n=0, qi=0)


def test_an_expiry_a_seam_claim_meets_dies_before_the_seam_goes_on(sm: ModelMachine) -> None:
    """Found by the machine (deep run): a claim inside a multi-step rule dead-letters the
    expired job it meets at once, so a bounded dead set trims it in time order with the
    deaths that follow in the same rule; the model learnt of the expiry only at its next
    check, after the rule, and trimmed the wrong job."""
    s = Steps(sm)
    s.seed(n=0, g=None)
    s.keep_history(keep=None, dead=2)
    s.flow_seam(chain="child-rerun", cross=0)
    s.seam(chain="cancel-retry", keep=False, qi=0, remove=False)
    s.enqueue_prioritized(delay=None, group=None, payload=b"", priority=0, qi=0, ttl=1)
    s.flow_seam(chain="child-rerun", cross=0)


def test_kept_dead_trims_by_the_time_of_death_not_the_last_lease(sm: ModelMachine) -> None:
    """Found by the machine: a claimed job that dies and a never-claimed flow parent killed by
    its child are ordered by their time of death in the dead set (D25), not by a past lease."""
    s = Steps(sm)
    s.admin(qi=0, what="keep dead", g="la", n=2)
    s.enqueue(qi=0, payload=b"", group=None, delay=None, did=None, mode="simple")
    s.add_flow(qi=0, shape=[(0, False, 0, None), (0, True, 0, None)])
    s.work(qi=0, outcomes=["die", "die"])
    assert len(sm.live(0, "dead")) == 2


# ---- issue 22 (i22close): a parent id re-used for a new flow ----
@pytest.mark.parametrize("cross", [0, 1])
def test_an_old_child_never_counts_toward_a_new_flow(sm: ModelMachine, cross: int) -> None:
    """The parent's id re-used for a new flow (add_flow with that id) while its old child
    lives: the old child's completion must not count toward the new parent, whose own child
    still waits."""
    s = Steps(sm)
    s.add_flow(qi=0, shape=[(1, True, 0, None), (0, True, cross, "la")])
    root = next(iter(sm.m(0).flows))
    s.remove(qi=0, n=live_pick(sm, 0, root))
    s.add_flow(qi=0, shape=[(1, True, 0, None), (0, True, 0, "lb")], reuse=0)
    assert sm.m(0).jobs[root].state == "awaiting_children"
    old = next(j for j, row in sm.m(cross).jobs.items() if row.parent == root and row.group == "la")
    tok = sm.claim_only(cross, LONG, {old})[old]
    sm.do_complete(cross, old, tok, False, b"old")
    sm.server_agrees_with_model()
    s.pump(qi=1)
    assert sm.m(0).jobs[root].state == "awaiting_children"


# ---- end i22close ----
# ---------------------------------------------------------------------- issue 24 (i24ctl)
# Budgets, expiry and the small controls, replayed through the machine on every leg.


def test_an_expired_job_is_dead_lettered_and_reprocessed_without_its_ttl(
    sm: ModelMachine,
) -> None:
    s = Steps(sm)
    s.enqueue(qi=0, payload=b"a", group="la", delay=None, did="d1", mode="simple", ttl=1)
    s.enqueue(qi=0, payload=b"b", group="la", delay=None, did=None, mode="simple", ttl=LONG)
    s.enqueue(qi=0, payload=b"c", group=None, delay=None, did=None, mode="simple", ttl=1)
    s.wait(qi=0, n=0)  # a waiter on the first job: its expiry wakes it
    s.claim_batch(qi=0, n=5, lease=LONG)  # meets both expired ones, leases "b"
    dead = sm.live(0, "dead")
    assert len(dead) == 2 and all(sm.m(0).jobs[j].last_error == "expired" for j in dead)
    assert sm.m(0).counts()["active"] == 1
    s.reprocess(qi=0, n=1)
    s.claim(qi=0, lease=LONG)
    assert sm.m(0).counts()["active"] == 2


def test_a_jobs_own_budget_restarts_after_reprocess(sm: ModelMachine) -> None:
    s = Steps(sm)
    s.enqueue(qi=0, payload=b"a", group=None, delay=None, did=None, mode="simple", budget=2)
    for _ in range(2):
        s.claim(qi=0, lease=LONG)
        s.fail_with_budget(qi=0, n=0)
        sm.tick("scheduled")
        s.promote(qi=0)
    assert sm.live(0, "dead"), "two attempts of a budget of 2: dead"
    s.reprocess(qi=0, n=1)
    s.claim(qi=0, lease=LONG)
    s.fail_with_budget(qi=0, n=0)
    assert sm.live(0, "scheduled"), "a reprocess restarts the budget"


def test_controls_of_scheduled_and_waiting_jobs(sm: ModelMachine) -> None:
    s = Steps(sm)
    s.enqueue(qi=0, payload=b"a", group=None, delay=LONG, did=None, mode="simple", ttl=LONG)
    s.enqueue(qi=0, payload=b"b", group="lb", delay=LONG, did=None, mode="simple")
    s.enqueue(qi=0, payload=b"c", group=None, delay=None, did=None, mode="simple")
    s.reschedule(qi=0, n=1, due=True)
    s.reschedule(qi=0, n=0, due=False)  # n % 3 == 0: any id, refused unless scheduled
    s.update_payload(qi=0, n=1, payload=b"new")
    s.run_now(qi=0, n=2)
    s.promote(qi=0)
    s.cancel_all(qi=0)
    assert not sm.m(0).jobs


def test_cancel_all_signals_the_running_and_takes_a_released_parent(sm: ModelMachine) -> None:
    s = Steps(sm)
    s.enqueue(qi=0, payload=b"run", group=None, delay=None, did=None, mode="simple")
    s.claim(qi=0, lease=LONG)
    s.add_flow(qi=0, shape=[(1, True, 0, None), (0, True, 0, "la")])
    s.cancel_all(qi=0)
    assert [j.cancel for j in sm.m(0).jobs.values()] == ["1"]


@pytest.mark.parametrize("children", [True, False])
def test_remove_a_flow_parent_with_or_without_its_children(
    sm: ModelMachine, children: bool
) -> None:
    s = Steps(sm)
    s.add_flow(
        qi=0,
        shape=[(2, True, 0, None), (2, False, 0, "la"), (0, True, 0, None), (0, True, 0, "lb")],
    )
    s.claim(qi=0, lease=LONG)  # one leaf runs on
    root = next(i for i, j in sm.m(0).jobs.items() if j.parent is None)
    s.remove_id(qi=0, jid=root, children=children)
    left = {j.state for j in sm.m(0).jobs.values()}
    assert left == ({"active"} if children else {"active", "pending", "awaiting_children"})


def test_a_repeat_limit_stops_it(sm: ModelMachine) -> None:
    s = Steps(sm)
    s.repeat_limited(qi=0, name="r1", g=None, limit=2)
    for _ in range(3):
        s.fire_due(qi=0)
    assert sm.m(0).repeat_fired["r1"] == 2 and not sm.m(0).repeat_live("r1")
    s.repeat_limited(qi=0, name="r1", g=None, limit=2)  # the same limit: still spent
    s.repeat(qi=0, name="r1", g=None)  # no limit: fires again, the count kept
    s.fire_due(qi=0)


def test_a_paused_repeat_never_fires_and_resumes_from_now(sm: ModelMachine) -> None:
    s = Steps(sm)
    s.repeat(qi=0, name="r1", g=None)
    s.repeat_limited(qi=0, name="r2", g="la", limit=1)
    s.pause_repeat(qi=0, name="r1")
    s.fire_due(qi=0)  # only r2
    s.repeat(qi=0, name="r1", g=None)  # a worker start: still paused
    s.pause_repeat(qi=0, name="r2")  # spent and paused
    s.fire_due(qi=0)  # nothing due
    s.resume_repeat(qi=0, name="r2")  # spent: stays ended
    s.resume_repeat(qi=0, name="r1")
    s.resume_repeat(qi=0, name="r1")  # not paused: left alone
    s.fire_due(qi=0)
    s.pause_repeat(qi=0, name="r1")
    s.unrepeat(qi=0, name="r1")
    s.pause_repeat(qi=0, name="r1")  # unknown now: False, nothing written


def test_every_mutation_anchor_is_in_the_tree() -> None:
    """tests/model/mutations.py re-introduces each seam bug by exact-text edits of the fixed
    code (Lua and its C twin); a refactor that moves or respells that code must move the
    anchor with it, or the mutation check reports "anchor not found" long after."""
    from model.mutations import PATCHES

    root = Path(__file__).resolve().parents[2]
    for seam, patches in PATCHES.items():
        for path, old, _new in patches:
            assert (root / path).read_text().count(old) == 1, (seam, path, old)


def test_a_repeat_limit_lowered_below_its_fires_is_no_violation(q: echomq.Queue) -> None:
    """Found by the machine (FINDINGS F27, `test_machine[lua]` during the issue-37 mutation
    check): `repeat(limit=)` keeps the fire count across an update (issue 26), so a limit
    set below it is a spent repeat, yet check() (676ec2f) reports "fired 2 times, past its
    limit 1". Fired by `fire_due` until the count is 2, however long that takes."""
    q.repeat("r2", b"x", every_ms=1, limit=2)
    deadline = time.monotonic() + 120
    fired = 0
    while fired < 2 and time.monotonic() < deadline:
        q.fire_due()
        fired = next(x.fired for x in q.repeats() if x.name == "r2")
    assert fired == 2
    assert q.check() == []
    q.repeat("r2", b"x", every_ms=1, limit=1)  # lowered below the count: now spent
    [rep] = [x for x in q.repeats() if x.name == "r2"]
    assert (rep.limit, rep.fired) == (1, 2)
    assert q.check() == []


def test_a_debounce_fold_takes_the_calls_default_priority(sm: ModelMachine) -> None:
    """Found by the machine (FINDINGS F28, `test_machine_mixed_executors` during the issue-37
    mutation check): a fold takes the newest call's priority (d069e9e), the default 0 for a
    call that names none, so a holder raised to priority 5 loses it; the model kept it."""
    s = Steps(sm)
    s.enqueue(
        budget=99, delay=60000, did="d1", group=None, mode="debounce", payload=b"a", qi=0, ttl=None
    )
    s.change_priority(n=0, priority=5, qi=0)
    s.enqueue(budget=99, delay=20, did="d1", group=None, mode="debounce", payload=b"b", qi=0, ttl=1)
