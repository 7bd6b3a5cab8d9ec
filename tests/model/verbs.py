"""The model's rules for the verbs issue 38 (item 5) found undriven, mixed into
``ModelMachine`` (tests/model/test_model.py) so hypothesis draws them among all the others.

Writes: ``enqueue_many`` (minted and named ids, duplicates in the call and against the queue,
re-admissions, a refused non-JOB id, lanes, delays, a priority), ``complete_many`` and
``extend_many`` (each pair fenced in turn: a stale token refused), ``reprocess_all``,
``reassign``, ``propose_shards`` (a layout that only grows), ``weight_lane``, ``add_log`` /
``clear_logs`` / ``update_progress`` (their side state is in the model's keyspace check:
`:logs` and `progress`, PROTOCOL §2.4), and ``enable_events`` / ``disable_events`` (an enqueue
records nothing while they are off), and ``forge``: a settle verb with a token derived from the
row's count rather than handed out by a claim.

Reads: ``look`` checks the read plane against the model on one queue: ``browse`` of every
state, ``pending_size``, ``lane_depth``, ``logs``, ``errors``, ``result``, ``get_job``,
``job_state``, ``dedup_holder``, ``dependencies``, ``children_values``,
``ignored_failures`` and ``rate_limit_ttl``, and runs the raw-key checker of
tests/reliability.py (independent of ``check()``).

The mixin uses the machine's helpers (``q``, ``m``, ``fence``, ``take``, ``score``,
``completed``, ``reprocessed`` ...); it holds no state of its own.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import rule

from echomq import Enqueued, JobGone, KindError, StateError
from echomq import ids as emq_ids
from echomq.client import shards as _shards
from model.core import LANES, LONG, SHORT, Job
from reliability import raw_violations

QI = st.sampled_from((0, 0, 0, 0, 1))
PICK = st.one_of(st.integers(0, 2), st.integers(0, 255))
LANE = st.sampled_from(LANES)
LEASES = st.sampled_from((SHORT, LONG))
# One item of an enqueue_many call: a minted payload, a named id the queue has seen (held:
# a duplicate; gone: a re-admission), the same named id again in the call, or a non-JOB id.
ITEMS = st.lists(st.sampled_from(("mint", "mint", "seen", "again", "bad")), min_size=1, max_size=5)


def _pick(items: list[Any], n: int) -> Any:
    return items[n % len(items)] if items else None


class VerbRules:
    # ------------------------------------------------------------------ producers

    @rule(
        qi=QI,
        items=ITEMS,
        n=PICK,
        group=st.sampled_from((None, *LANES)),
        delay=st.sampled_from((None, None, SHORT, LONG)),
        priority=st.sampled_from((0, 0, 3)),
        keep_logs=st.sampled_from((None, None, 2)),
    )
    def enqueue_many(
        self: Any,
        qi: int,
        items: list[str],
        n: int,
        group: str | None,
        delay: int | None,
        priority: int,
        keep_logs: int | None = None,
    ) -> None:
        """One verdict per item in input order; minted ids increase in it; an id named
        twice in the call is a duplicate the second time; a non-JOB id is refused
        (KindError) and written nowhere; the rest are admitted like enqueue's."""
        m = self.m(qi)
        seen = sorted(m.seen)
        named = _pick(seen, n) or emq_ids.mint()
        bad = emq_ids.mint("ORD")
        sent: list[bytes | tuple[str, bytes]] = []
        for i, kind in enumerate(items):
            payload = b"m%d" % i
            if kind == "mint":
                sent.append(payload)
            elif kind == "bad":
                sent.append((bad, payload))
            else:  # "seen" and "again" name the same id: the second mention is a duplicate
                sent.append((named, payload))
        kw: dict[str, Any] = {"group": group, "delay_ms": delay}
        if priority:
            kw["priority"] = priority
        if keep_logs is not None:
            kw["keep_logs"] = keep_logs
        t0 = self.now()
        out = self.q(qi).enqueue_many(sent, **kw)
        t1 = self.now()
        assert len(out) == len(sent), out
        minted: list[str] = []
        for item, got in zip(sent, out, strict=True):
            if isinstance(item, tuple) and item[0] == bad:
                assert isinstance(got, KindError), got
                continue
            assert isinstance(got, Enqueued), got
            jid = item[0] if isinstance(item, tuple) else got.id
            payload = item[1] if isinstance(item, tuple) else item
            if not isinstance(item, tuple):
                minted.append(got.id)
            if jid in m.jobs:  # held, or named earlier in this call
                assert got == Enqueued(jid, "duplicate"), (item, got)
                continue
            assert got.id == jid and got.status == ("scheduled" if delay else "enqueued"), got
            self.admitted_many(qi, jid, payload, group, delay, priority, t0, t1, keep_logs)
        assert minted == sorted(minted), f"minted ids out of input order: {minted}"
        if "bad" in items:  # and alone: refused before anything is written
            with pytest.raises(KindError):
                self.q(qi).enqueue(b"x", id=bad, group=group)
        assert self.r.exists(self.jkey(qi, bad)) == 0, "a refused id was written"

    def admitted_many(
        self: Any,
        qi: int,
        jid: str,
        payload: bytes,
        group: str | None,
        delay: int | None,
        priority: int,
        t0: int,
        t1: int,
        keep_logs: int | None = None,
    ) -> None:
        j = Job(payload, group, priority=priority, keep_logs=keep_logs)
        if delay:
            j.state = "scheduled"
            j.score = self.score(qi, "schedule", jid, t0 + delay, t1 + delay)
        self.m(qi).admit(jid, j)

    # ------------------------------------------------------------------ batches of settles

    @rule(qi=QI, picks=st.lists(PICK, min_size=1, max_size=4))
    def complete_many(self: Any, qi: int, picks: list[int]) -> None:
        """Each pair fenced in turn (a pair repeated: the second is refused); the refused
        ids answered; a kept-rows queue trims once, after the verdicts (as settle, F20)."""
        mine = [t for t in self.tickets if t[0] == qi]
        pairs = [(t[1], t[2]) for t in (_pick(mine, p) for p in picks) if t]
        if not pairs:
            return
        got = self.q(qi).complete_many(pairs)
        want = []
        for jid, tok in pairs:  # after the call: a kept row's finish time is read back
            if self.m(qi).fence(jid, tok) is None:
                self.completed(qi, jid, b"", False, trim=False)
            else:
                want.append(jid)
        if self.m(qi).keep_count is not None:
            self.m(qi).trim("completed", self.m(qi).keep_count)
        assert got == want, f"complete_many {pairs}: refused {got}, model {want}"

    @rule(qi=QI, picks=st.lists(PICK, min_size=1, max_size=3), lease=LEASES)
    def extend_many(self: Any, qi: int, picks: list[int], lease: int) -> None:
        """The heartbeat without the cancel report: a held (or reaped, unclaimed) lease is
        pushed to now + lease; a stale or gone pair is answered as failed."""
        mine = [t for t in self.tickets if t[0] == qi]
        pairs = [(t[1], t[2]) for t in (_pick(mine, p) for p in picks) if t]
        if not pairs:
            return
        m = self.m(qi)
        failed, ok = [], []
        for jid, tok in pairs:
            if m.fence(jid, tok) is None:
                m.jobs[jid].state = "active"
                ok.append(jid)
            else:
                failed.append(jid)
        t0 = self.now()
        got = self.q(qi).extend_many(pairs, lease_ms=lease)
        t1 = self.now()
        assert got == failed, f"extend_many {pairs}: {got}, model {failed}"
        for jid in ok:
            m.jobs[jid].score = self.score(qi, "active", jid, t0 + lease, t1 + lease)

    @rule(
        qi=QI,
        n=PICK,
        verb=st.sampled_from(("complete", "retry", "delay", "extend")),
        delta=st.sampled_from((-1, 0, 1)),
    )
    def forge(self: Any, qi: int, n: int, verb: str, delta: int) -> None:
        """A settle with a token no claim handed out but derived from the row's count (0:
        the current one, which is stale for a job not held; +1: the next claim's): the
        fence decides, as for any ticket."""
        m = self.m(qi)
        jid = _pick(self.live(qi), n) if n % 4 else _pick(sorted(m.seen), n)
        if jid is None:
            return
        j = m.jobs.get(jid)
        token = max(1, (j.attempts if j else 0) + delta)
        if verb == "complete":
            self.do_complete(qi, jid, token, False, b"forged")
        elif verb == "retry":
            self.do_retry(qi, jid, token, SHORT, 2, "boom", False)
        elif verb == "delay":
            self.do_delay(qi, jid, token, 0)
        else:
            self.do_extend(qi, jid, token, LONG)

    # ------------------------------------------------------------------ job admin

    @rule(
        qi=QI,
        state=st.sampled_from(("dead", "dead", "completed")),
        delay=st.sampled_from((None, None, LONG)),
    )
    def reprocess_all(self: Any, qi: int, state: str, delay: int | None) -> None:
        """Every job of ``state`` starts a new incarnation, each once; the count answered."""
        m = self.m(qi)
        doomed = self.live(qi, state)
        t0 = self.now()
        got = self.q(qi).reprocess_all(state, delay_ms=delay)
        t1 = self.now()
        assert got == len(doomed), f"reprocess_all {state}: {got}, model {doomed}"
        for jid in doomed:
            self.reprocessed(qi, jid, delay, t0, t1)
        assert all(m.jobs[j].state in ("pending", "scheduled") for j in doomed)

    @rule(qi=QI, n=PICK, g=LANE)
    def reassign(self: Any, qi: int, n: int, g: str) -> None:
        """A waiting or scheduled job moves to lane ``g`` (its priority along); already
        there: noop, whatever its state; any other state: StateError; no row: JobGone."""
        m = self.m(qi)
        jid = _pick(self.live(qi, "pending", "scheduled"), n) if n % 3 else _pick(sorted(m.seen), n)
        if jid is not None:
            self.do_reassign(qi, jid, g)

    def do_reassign(self: Any, qi: int, jid: str, g: str) -> None:
        j = self.m(qi).jobs.get(jid)
        if j is None:
            self.expect(JobGone, self.q(qi).reassign, jid, g)
        elif j.group == g:
            assert self.q(qi).reassign(jid, g) == "noop"
        elif j.state in ("pending", "scheduled"):
            assert self.q(qi).reassign(jid, g) == "reassigned"
            j.group = g
        else:
            self.expect(StateError, self.q(qi).reassign, jid, g)

    @rule(qi=QI, n=st.integers(1, 4), grow=st.booleans())
    def layout(self: Any, qi: int, n: int, grow: bool) -> None:
        """``propose_shards`` (issue 43) stores a layout only when it extends the stored one
        (or nothing is stored and it names more than the queue); anything else leaves the
        stored layout, which it answers either way; the first layout of a queue with a
        queue-wide limit or rate limit is refused (EMQSTATE limited). The jobs are untouched:
        a layout names sub-queues, it moves nothing."""
        m, name = self.m(qi), self.names[qi]
        stored = m.layout or [name]
        proposal = (
            _shards.grow(name, stored, max(n, len(stored))) if grow else _shards.layout(name, n)
        )
        extends = len(proposal) > len(stored) and proposal[: len(stored)] == stored
        if extends and m.layout is None and (m.limit is not None or m.rate is not None):
            # A queue-wide limit or rate limit would bind shard 0 alone: refused, nothing
            # stored (issue 43); a queue already sharded keeps any limit set by hand.
            with pytest.raises(StateError, match=r"^EMQSTATE limited "):
                self.q(qi).propose_shards(proposal)
            return
        expected = proposal if extends else stored
        assert self.q(qi).propose_shards(proposal) == expected
        m.layout = expected if len(expected) > 1 else None

    @rule(qi=QI, g=LANE, w=st.integers(1, 3))
    def weight_lane(self: Any, qi: int, g: str, w: int) -> None:
        """A lane's share changes which legal claim is made, never what is legal: the
        claim rules accept any serviceable lane's head, so the model has nothing to move."""
        self.q(qi).weight_lane(g, w)

    @rule(
        qi=QI,
        n=PICK,
        what=st.sampled_from(("log", "log", "progress", "clear")),
        keep=st.sampled_from((0, 0, 2, None)),
    )
    def annotate(self: Any, qi: int, n: int, what: str, keep: int | None) -> None:
        """A handler's notes on a job of any state: a log line (``keep`` > 0: only the newest
        kept; None: the job's ``keep_logs``, issue 38), its progress, or ``clear_logs`` (all
        lines but the newest ``keep`` dropped, answering how many); no row: JobGone, nothing
        written."""
        m = self.m(qi)
        jid = _pick(self.live(qi), n) if n % 4 else _pick(sorted(m.seen), n)
        if jid is None:
            return
        j = m.jobs.get(jid)
        text = f"{what}{n}"
        if what == "clear":
            keep = keep or 0  # clear_logs has no row default
            if j is None:
                self.expect(JobGone, self.q(qi).clear_logs, jid, keep=keep)
                return
            removed = max(0, len(j.logs) - keep)
            j.logs = j.logs[-keep:] if keep else []
            assert self.q(qi).clear_logs(jid, keep=keep) == removed
        elif what == "log":
            if j is None:
                self.expect(JobGone, self.q(qi).add_log, jid, text, keep=keep)
                return
            lines = [*j.logs, text]
            bound = keep if keep is not None else j.keep_logs  # None: the row's (issue 38)
            j.logs = lines[-bound:] if bound else lines
            assert self.q(qi).add_log(jid, text, keep=keep) == len(j.logs)
        elif j is None:
            self.expect(JobGone, self.q(qi).update_progress, jid, text)
        else:
            self.q(qi).update_progress(jid, text)
            j.progress = text

    @rule(qi=QI)
    def switch_events(self: Any, qi: int) -> None:
        """disable_events / enable_events: while off, an enqueue records nothing (admit_one
        checks every enqueue's events against the switch)."""
        m = self.m(qi)
        if m.events:
            self.q(qi).disable_events()
        else:
            self.q(qi).enable_events(10_000)
        m.events = not m.events

    # ------------------------------------------------------------------ the read plane

    @rule(qi=QI, n=PICK)
    def look(self: Any, qi: int, n: int) -> None:
        """The read verbs answer what the model holds, for one queue and one job."""
        m = self.m(qi)
        self.expired_met(qi)  # a read never dead-letters; the model's view must be current
        q = self.q(qi)
        big = 1000
        assert q.pending_size() == len(m.waiting(None))
        for g in LANES:
            assert q.lane_depth(g) == len(m.waiting(g)), g
            assert q.browse("pending", big, group=g) == m.waiting(g)[::-1], g
        # Reverse claim order for a waiting set; the other sets by score, whose ties (one
        # batch's deadline, one call's deaths) the model does not order: compared as sets.
        assert q.browse("pending", big) == m.waiting(None)[::-1]
        for state in ("active", "scheduled", "dead", "completed"):
            assert sorted(q.browse(state, big)) == self.live(qi, state), state
        jid = _pick(sorted(m.seen), n)
        if jid is not None:
            self.look_at(qi, jid)
        did = _pick(sorted(d for qq, d in self.dids_used if qq == qi), n)
        if did is not None:
            assert q.dedup_holder(did) == m.dedup.get(did), did
        # A spent window (the model counts claims; a window is LONG) reopens within LONG.
        for g, rate in ((None, m.rate), *((g, m.lane_rate.get(g)) for g in LANES)):
            ttl = q.rate_limit_ttl(g)
            spent = rate is not None and rate[1] >= rate[0]
            assert (0 < ttl <= LONG) if spent else ttl == 0, (g, rate, ttl)
        if n % 3 == 0:
            self.raw_agrees(qi)

    def raw_agrees(self: Any, qi: int) -> None:
        """A second checker, on the raw keys (tests/reliability.py; it SCANs the queue, so
        a third of the looks run it), which knows neither kept completed rows (D25) nor rate
        limits (a spent lane leaves the ring, D21): the model says which rows those are and
        whether a lane's window is spent."""
        m = self.m(qi)
        kept = {f"{jid} (state completed) is in no set" for jid in self.live(qi, "completed")}
        held = any(used >= most for most, used in m.lane_rate.values())
        raw = [
            v
            for sub in self.subqueues(qi)
            for v in raw_violations(self.r, sub)
            if v not in kept and not (held and v.startswith("the live ring is"))
        ]
        assert raw == [], raw

    def look_at(self: Any, qi: int, jid: str) -> None:
        m = self.m(qi)
        q = self.q(qi)
        j = m.jobs.get(jid)
        kept = m.results.get(jid)
        got = q.result(jid)
        if kept is not None:
            assert got is not None and (got.value, got.attempts, got.error) == (
                kept.value,
                kept.attempts,
                kept.error,
            ), (jid, got, kept)
        elif j is not None and j.state == "dead":  # a death with no kept outcome: the row's
            assert got is not None and (got.error, got.attempts) == (j.last_error, j.attempts)
        else:
            assert got is None, (jid, got)
        assert q.job_state(jid) == (j.state if j else "absent")
        row = q.get_job(jid)
        if j is None:
            assert row is None
            for verb in (q.logs, q.errors):
                with pytest.raises(JobGone):
                    verb(jid)
            return
        assert row is not None and (row["state"], row["payload"]) == (j.state, j.payload)
        assert [x.decode() for x in q.logs(jid)] == j.logs
        assert q.errors(jid) == j.errors
        fl = m.flows.get(jid)
        assert q.dependencies(jid) == (fl.deps if fl else 0)
        assert q.children_values(jid) == (fl.processed if fl else {})
        assert q.ignored_failures(jid) == (fl.unsuccessful if fl else {})
