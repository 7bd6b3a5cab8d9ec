"""The model machine's settle and upkeep rules: complete, retry, delay, extend, settle
and settle_batch, kept history; reap, ring repair, sweep, promote and repeat fires.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import (
    rule,
)

from echomq import keyspace
from model.core import KEEP_MS, SHORT, Job
from model.draws import ERRORS, LEASES, PICK, QI, RETRY_DELAYS, pick, strict


class SettleRules:
    """Rules of ModelMachine (test_model.py), which holds the queues, the model and the
    helpers they call (q, m, take, expect, tick, ...)."""

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
        done = keyspace.queue_key(self.jqueue(qi, jid), "completed")
        s = self.r.zscore(done, jid)
        if s is None:
            # Trimmed by its own call: only a batch's completions can be, sharing one finish
            # time (then ordered by id), and a batch's newest survive (a bound is >= 1), so
            # the set's newest score is this call's. The model's trim then decides whether
            # the server was right to drop it.
            newest = self.r.zrange(done, -1, -1, withscores=True)
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
        on = self.dead_scores(qi)
        for jid, j in m.jobs.items():
            if j.state == "dead":
                s = on.get(jid)
                if s is not None:
                    j.died = float(s)
                elif not j.died:  # a death of an earlier step keeps the time checked then
                    j.died = self.t_prev - 0.5
        m.trim_dead()

    def dead_scores(self, qi: int) -> dict[str, float]:
        """The dead set's ids and scores (the sharded leg: every shard's)."""
        on = self.r.zrange(self.key(qi, "dead"), 0, -1, withscores=True)
        return {k.decode(): s for k, s in on}

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
            fresh = [
                i
                for i in self.waiting_ids(qi, g)
                if i not in known and self.r.hget(self.jkey(qi, i), "payload") == payload
            ]
            assert len(fresh) == 1, f"repeat {name}: occurrences {fresh}"
            m.admit(fresh[0], Job(payload, g))
            known.add(fresh[0])
            if m.repeat_limit.get(name) is not None:
                m.repeat_fired[name] = m.repeat_fired.get(name, 0) + 1

    def waiting_ids(self, qi: int, g: str | None) -> list[str]:
        """The ids in a waiting set of queue qi (the sharded leg: every shard's)."""
        key = keyspace.lane_key(self.names[qi], g) if g else self.key(qi, "pending")
        return [i.decode() for i in self.r.zrange(key, 0, -1)]

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
