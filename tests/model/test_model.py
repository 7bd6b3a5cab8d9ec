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
propose_shards and shards (issue 43, a layout that only grows), update_progress,
enable_events / disable_events and the read plane (browse, pending_size, lane_depth, logs,
errors, result, get_job, job_state, dedup_holder, dependencies, children_values,
ignored_failures, rate_limit_ttl). Which verbs the model drives is recorded
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
through a Lua and a native client on a server that loads the module). The sharded leg
(issue 43, test_model_sharded.py) runs this machine on ``Queue(name, shards=3)``, through
the hooks ``open_queue``, ``jqueue``, ``head``, ``subqueues`` and ``parent_queue`` here
(identities for the plain legs).

Budget: 30 examples of up to 40 steps per leg (the file takes ~40 s when it passes);
``ECHOMQ_MODEL_DEEP=1`` runs 20x the examples with twice the steps.

Triage (never in CI): ``ECHOMQ_MODEL_WAIVE=<tags>`` looks past reported findings (see
``strict``), ``ECHOMQ_MODEL_NOSHRINK=1`` reports the first failing sequence unshrunk,
``ECHOMQ_MODEL_STATS=1`` prints coverage counts; tests/model/replay.py replays a printed
sequence step by step; tests/model/mutations.py is the mutation check of issue 22 point 4.

The machine's rules sit in mixins by verb family: tests/model/rules_enqueue.py (producers
and claims), rules_settle.py (settles and upkeep), rules_admin.py (repeats, controls, admin)
and verbs.py (issue 38's verbs); its strategies, waivers and budget in tests/model/draws.py.
This file holds the machine's state, its per-step check and its legs. The fixed scenarios
that replay the seam chains of issue 22 through the same machine (every step checked), so
each is exercised on every run whatever hypothesis draws, are in test_model_scenarios.py.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    run_state_machine_as_test,
)

import echomq
from echomq import JobGone, StaleToken, keyspace
from echomq.protocol import calls as _protocol
from echomq.server import EmbeddedServer
from model import draws
from model.core import LONG, Flow, Job, QueueModel, World
from model.draws import STATS, _chunks, _kids, _names, budget, note, strict
from model.recording import recording
from model.rules_admin import AdminRules
from model.rules_enqueue import EnqueueClaimRules
from model.rules_settle import SettleRules
from model.verbs import VerbRules

pytestmark = pytest.mark.executors


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


def place_key(queue: str, j: Job) -> str:
    """The set of ``queue`` that holds a job in ``j``'s state (its lane's, waiting)."""
    if j.state == "pending":
        return (
            keyspace.lane_key(queue, j.group) if j.group else keyspace.queue_key(queue, "pending")
        )
    sets = {"active": "active", "scheduled": "schedule", "dead": "dead", "completed": "completed"}
    return keyspace.queue_key(queue, sets.get(j.state, "pending"))


def flow_agrees(
    name: str, pid: str, fl: Flow, deps: Any, proc: Any, fail: Any, unsucc: Any
) -> None:
    """A parent's flow keys (`:deps`, `:processed`, `:failed`, `:unsuccessful`) as read."""
    got_f = (
        int(deps) if deps is not None else None,
        {k.decode(): v for k, v in proc.items()},
        {k.decode(): v.decode() for k, v in fail.items()},
        {k.decode(): v.decode() for k, v in unsucc.items()},
    )
    want_f = (fl.deps, fl.processed, fl.failed, fl.unsuccessful)
    assert got_f == want_f, f"{name} flow of {pid}: {got_f} != model {want_f}"


# The row fields the per-step check compares with the model.
FIELDS = (
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


class ModelMachine(EnqueueClaimRules, SettleRules, AdminRules, VerbRules, RuleBasedStateMachine):
    def __init__(self, client: redis.Redis, executors: tuple[str, ...]) -> None:
        super().__init__()
        self.r = client
        stem = f"m{next(_names)}-{os.getpid()}"
        self.names = [stem, stem + "-x"]
        # issue 38: every handle records the verbs called on it (test_model_coverage.py)
        self.calls: set[str] = set()
        self.handles = [
            [recording(self.open_queue(n, client, e), self.calls) for e in executors]
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

    def open_queue(self, name: str, client: redis.Redis, executor: str) -> echomq.Queue:
        """The machine's handle on a queue (the sharded leg opens a sharded queue)."""
        return echomq.Queue(name, client=client, executor=executor)

    def jqueue(self, qi: int, jid: str) -> str:
        """The queue whose keys hold ``jid``'s row and side keys (the sharded leg: the
        shard holding it)."""
        return self.names[qi]

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
        return keyspace.job_key(self.jqueue(qi, jid), jid)

    def now(self) -> int:
        sec, usec = self.r.time()
        return int(sec) * 1000 + int(usec) // 1000

    def score(self, qi: int, place: str, jid: str, lo: int, hi: int) -> int:
        s = self.r.zscore(keyspace.queue_key(self.jqueue(qi, jid), place), jid)
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
        assert job.id == self.head(qi, j.group, job.id), "a claim must serve the head of its set"
        assert job.token == j.attempts + 1, f"token {job.token}, model {j.attempts + 1}"
        assert (job.group, job.payload) == (j.group, j.payload)
        m.take(job.id)
        self.tickets.append((qi, job.id, job.token))
        return j

    def head(self, qi: int, g: str | None, jid: str) -> str:
        """The job a claim that served ``jid`` (of lane ``g``) had to serve: its set's head."""
        return self.m(qi).leasable(g)[0]

    def live(self, qi: int, *states: str) -> list[str]:
        return sorted(i for i, j in self.m(qi).jobs.items() if not states or j.state in states)

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
        assert q.shards() == (m.layout or [name])
        jobs = sorted(m.jobs.items())
        gone = sorted(m.seen - set(m.jobs))
        seen = sorted(m.seen)
        pipe = self.r.pipeline(transaction=False)
        for jid, j in jobs:
            pipe.hmget(self.jkey(qi, jid), FIELDS)
            pipe.zscore(place_key(self.jqueue(qi, jid), j), jid)
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
            self.row_agrees(qi, jid, j, row, score, logs, errors)
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
            flow_agrees(name, pid, fl, *(next(replies) for _ in range(4)))
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

    def row_agrees(
        self, qi: int, jid: str, j: Job, row: list[Any], score: float | None, logs: Any, errors: Any
    ) -> None:
        """One job's row (FIELDS), its score in its set, its `:logs` and `:errors` against
        the model's ``j``."""
        name = self.names[qi]
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
            self.parent_queue(j),
            str(j.children) if j.children else None,
            str(j.priority) if j.priority else None,
            str(j.expires) if j.expires is not None else None,
            j.progress,
            str(j.keep_logs) if j.keep_logs is not None else None,
            _kids(j.kids),
        ]
        got = [
            v if v is None or f == "payload" else v.decode()
            for f, v in zip(FIELDS, row, strict=True)
        ]
        got[-1] = _kids(_chunks(got[-1])) if got[-1] else None
        if not strict("cancel"):
            want[8] = got[8]
        assert got == want, (
            f"{name} {jid}: row {dict(zip(FIELDS, got, strict=True))} "
            f"!= model {dict(zip(FIELDS, want, strict=True))}"
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

    def parent_queue(self, j: Job) -> str | None:
        """The row field `parent_queue` of a cross-queue flow child: its parent's queue."""
        return self.names[j.pq] if j.pq is not None else None

    def subqueues(self, qi: int) -> list[str]:
        """The queues queue qi is made of (the sharded leg: its shards)."""
        return [self.names[qi]]

    def teardown(self) -> None:
        try:
            for qs in self.handles:
                qs[0].pause()
                qs[0].obliterate(force=True)
            for name in (sub for qi in (0, 1) for sub in self.subqueues(qi)):
                left = list(self.r.scan_iter(match=f"emq:{{{name}}}:*", count=1000))
                assert left == [], f"obliterate left {left[:5]}"
        finally:
            for qs in self.handles:
                for q in qs:
                    q.close()


def run(
    client: redis.Redis,
    executors: tuple[str, ...],
    examples: int,
    machine: type[ModelMachine] = ModelMachine,
) -> None:
    client.script_flush()
    STATS.clear()
    try:
        run_state_machine_as_test(lambda: machine(client, executors), settings=budget(examples))
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
# Helpers of the fixed scenarios (test_model_scenarios.py, test_model_protocol.py, ...): a
# machine on one server, its rules run by name, waivers and picks.


def machine_on(
    redis_url: str, executor: str, kind: type[ModelMachine] = ModelMachine
) -> Iterator[ModelMachine]:
    """A machine for fixed scenarios (the ``sm`` fixture of test_model_scenarios.py and
    test_model_protocol.py)."""
    client = redis.Redis.from_url(redis_url)
    machine = kind(client, (executor,))
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
    monkeypatch.setattr(draws, "WAIVED", draws.WAIVED | set(tags))


def live_pick(sm: ModelMachine, qi: int, jid: str) -> int:
    """The ``n`` with which remove/cancel/reprocess pick ``jid`` among the live jobs."""
    live = sm.live(qi)
    n = live.index(jid)
    while n % 4 == 0:
        n += len(live)
    return n
