"""The model machine's producer and claim rules: enqueue (ids, priorities, the queue
limit, dedup and debounce), flows and chains; claim, claim_batch, work and the seams.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    initialize,
    rule,
)

from echomq import Enqueued, FlowJob, JobGone, StateError
from echomq import ids as emq_ids
from model.core import LANES, LONG, SHORT, Flow, Job
from model.draws import (
    DELAYS,
    DIDS,
    GROUPS,
    KEEP_LOGS,
    LEASES,
    MODES,
    PAYLOADS,
    PICK,
    PRIORITIES,
    QI,
    TTLS,
    note,
    pick,
    strict,
)


class EnqueueClaimRules:
    """Rules of ModelMachine (test_model.py), which holds the queues, the model and the
    helpers they call (q, m, take, expect, tick, ...)."""

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
        self.one_deadline(qi, [job.id for job in jobs])

    def one_deadline(self, qi: int, ids: list[str]) -> None:
        """A batch shares one lease deadline (the sharded leg: one per shard's batch)."""
        deadlines = {self.m(qi).jobs[jid].score for jid in ids}
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
