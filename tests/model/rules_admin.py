"""The model machine's admin and control rules: repeats (set, pause, resume, limits),
reprocess, remove, cancel, drain, wait, admin verbs, expiry, run_now, reschedule,
update_payload and cancel_all.
"""

from __future__ import annotations

import contextlib
import time

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    rule,
)

from echomq import JobFailed, JobGone, StateError
from model.core import LONG, SHORT, Job
from model.draws import ADMIN, GROUPS, LANE, PAYLOADS, PICK, QI, REPEATS, note, pick, strict


class AdminRules:
    """Rules of ModelMachine (test_model.py), which holds the queues, the model and the
    helpers they call (q, m, take, expect, tick, ...)."""

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
