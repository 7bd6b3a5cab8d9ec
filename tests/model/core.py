"""A pure-Python model of one echomq deployment: two queues, every job's row and place, and
the side state a job owns (kept result, dedup key, cancel flag, flow counters, the flow
outbox, want markers), as docs/PROTOCOL.md, docs/API.md, docs/GUARANTEES.md and issue 22
say it should be -- the *intended* semantics, not the code's.

No I/O here. What the model cannot know in advance (which lane a claim serves, the server
clock) is given to it by the machine in tests/model/test_model.py, which reads it from the server
and checks it is legal first.

Incarnations (issue 22): a re-admission of an id (enqueue, add_flow, a repeat occurrence) and
a reprocess start a clean incarnation: no kept result, no notify token, no cancel flag. The
cancel flag belongs to one run: it lives only while the job is active and any move out of
`active` ends it. A flow child counts once per parent (``counted``), and the parent's hashes
hold its latest outcome. A settle toward a parent that is gone touches nothing, nor toward a
new flow's parent under the re-used id: every node of one add_flow carries that call's
``mark``, and a child counts only toward a parent with its mark.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LANES = ("la", "lb")
KEEP_MS = 60_000  # every kept result outlives an example
ERRORS_KEPT = 10  # a row's `:errors` keeps its last ten retries' errors
SHORT = 20  # ms: a lease, delay or repeat period the machine lets lapse with a tick
LONG = 60_000  # ms: never lapses within an example


@dataclass
class Job:
    payload: bytes
    group: str | None
    state: str = "pending"  # pending | active | scheduled | dead | completed | awaiting_children
    attempts: int = 0
    floor: int = 0
    epoch: int | None = None
    stalled: int = 0
    last_error: str | None = None
    score: int = 0  # the lease deadline (active), run time (scheduled), finish (completed)
    died: float = 0  # dead: the time of death, the dead set's score (read back, D25)
    cancel: str | None = None  # '1' | 'remove' while its run was asked to stop
    dedup: str | None = None
    parent: str | None = None
    policy: str | None = None  # 'fp' | 'id'
    pq: int | None = None  # the parent's queue index when it is not this job's queue
    children: int | None = None  # an inner flow node's child count
    # --- issue 24, priorities: the row field `priority` (absent for 0) and the job's score
    # in its waiting set. Only an enqueue or change_priority sets it; every way back to
    # waiting (promote, reap, stall, delay, reprocess, run_now) keeps it.
    priority: int = 0
    # issue 38's option keep_logs: the row field `keep_logs` (absent: None), the bound an
    # add_log without its own keep trims to. Set at admission, taken by a debounce fold (the
    # newest call's, None drops it), kept by a reprocess.
    keep_logs: int | None = None
    # ---- issue 24 (budgets, expiry, controls) ----
    expires: int | None = None  # the row's `expires` (ttl_ms) until the first claim
    expired: bool = False  # the machine waited past `expires`: a claim dead-letters it
    kids: list[str] = field(default_factory=list)  # same-queue children (add_flow), `kids`
    budget: int = 99  # this job's own attempt budget (the worker sends it to retry)
    # ---- issue 38: the per-job side state of add_log / update_progress / retry (PROTOCOL
    # §2.4): `:logs` and `:errors` go with the row and survive a reprocess; `progress` is a
    # row field a reprocess clears.
    logs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # the last ERRORS_KEPT retries' errors
    progress: str | None = None


@dataclass
class Flow:
    """A parent's flow keys: deps, processed, failed, unsuccessful, and which children have
    been counted toward deps (each child once)."""

    deps: int
    processed: dict[str, bytes] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    unsuccessful: dict[str, str] = field(default_factory=dict)
    counted: set[str] = field(default_factory=set)
    mark: int | None = None  # the add_flow call that wrote this parent


@dataclass
class Kept:
    value: bytes
    attempts: int
    error: str | None


@dataclass
class Entry:
    """One flow outbox entry (a cross-queue child's settle), waiting for a pump."""

    kind: str  # done | fail
    pq: int
    pid: str
    cid: str
    policy: str
    value: bytes
    mark: int | None = None  # the child's flow mark


class QueueModel:
    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}
        self.retired: dict[str, int] = {}
        self.flows: dict[str, Flow] = {}
        self.results: dict[str, Kept] = {}
        self.wanted: set[str] = set()  # want:<id> markers a wait() left (30 s TTL)
        self.dedup: dict[str, str] = {}  # did -> holder id
        self.dedup_ttl: set[str] = set()  # dids held with a TTL (throttle, debounce)
        self.outbox: list[Entry] = []
        self.repeats: dict[str, tuple[bytes, str | None]] = {}
        # issue 24: a repeat's limit (None: none) and its fires counted while it has one
        self.repeat_limit: dict[str, int | None] = {}
        self.repeat_fired: dict[str, int] = {}
        # issue 26: the paused repeats (pause_repeat; a re-registration keeps the pause)
        self.repeat_paused: set[str] = set()
        self.paused = False
        self.paused_lanes: set[str] = set()
        self.limits: dict[str, int] = {}
        self.rate: tuple[int, int] | None = None  # (max, used) queue-wide, window LONG
        self.lane_rate: dict[str, tuple[int, int]] = {}
        # --- issue 24, the queue-wide concurrency limit (meta `limit`): at most this many
        # jobs of the queue in active, lanes included.
        self.limit: int | None = None
        # --- issue 43, the stored layout of a sharded queue (meta `shards`); None: not stored
        self.layout: list[str] | None = None
        self.completed = 0
        self.failed = 0
        self.seen: set[str] = set()  # every id this queue ever held
        # ---- kept history (issue 24): keep_completed / keep_dead, by count only (the age
        # bound reads the server clock; tests/features/test_kept_history.py drives it).
        self.keep_count: int | None = None  # keep_completed(count): None = off
        self.keep_dead: int | None = None  # keep_dead(count): None = unbounded
        self.dead_added = False  # a dead-letter since the last trim (only those trim)
        self.events = True  # issue 38: enable_events / disable_events (the machine enables)

    # ------------------------------------------------------------------ reads

    def waiting(self, g: str | None) -> list[str]:
        """A waiting set in claim order: by priority, then mint order (issue 24)."""
        found = [
            (j.priority, i) for i, j in self.jobs.items() if j.state == "pending" and j.group == g
        ]
        return [i for _, i in sorted(found)]

    def leasable(self, g: str | None) -> list[str]:
        """The waiting jobs a claim may lease: an expired one is dead-lettered (issue 24)."""
        return [i for i in self.waiting(g) if not self.jobs[i].expired]

    def repeat_live(self, name: str) -> bool:
        """Issue 24: a repeat with a limit it has reached fires no more."""
        most = self.repeat_limit.get(name)
        return most is None or self.repeat_fired.get(name, 0) < most

    def repeat_due(self, name: str) -> bool:
        """Issue 26: a repeat comes due when it is live and not paused."""
        return self.repeat_live(name) and name not in self.repeat_paused

    def active_in(self, g: str) -> int:
        return sum(1 for j in self.jobs.values() if j.state == "active" and j.group == g)

    def capacity(self, g: str | None) -> int:
        depth = len(self.leasable(g))
        if g is None:
            return depth
        if g in self.paused_lanes:
            return 0
        cap = depth
        if g in self.limits:
            cap = min(cap, self.limits[g] - self.active_in(g))
        if g in self.lane_rate:
            mx, used = self.lane_rate[g]
            cap = min(cap, mx - used)
        return max(0, cap)

    def claimable(self) -> int:
        if self.paused:
            return 0
        n = sum(self.capacity(g) for g in (None, *LANES))
        if self.rate is not None:
            n = min(n, max(0, self.rate[0] - self.rate[1]))
        if self.limit is not None:  # issue 24: the queue-wide limit's room
            n = min(n, max(0, self.limit - self.active_count()))
        return n

    def active_count(self) -> int:
        return sum(1 for j in self.jobs.values() if j.state == "active")

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
            "kept": n("completed"),
        }

    def fence(self, jid: str, token: int) -> str | None:
        """D5: 'gone', 'stale', or None when a settle verb goes through."""
        j = self.jobs.get(jid)
        if j is None:
            return "gone"
        if token != j.attempts or token != j.epoch or j.state not in ("active", "pending"):
            return "stale"
        return None

    # ------------------------------------------------------------------ admission

    def admit(self, jid: str, j: Job) -> None:
        """A new incarnation of ``jid``: its count continues from the retired record, and it
        starts with no kept result and no notify token (issue 22 #5)."""
        assert jid not in self.jobs
        j.attempts = j.floor = self.retired.pop(jid, 0)
        self.jobs[jid] = j
        self.results.pop(jid, None)
        self.seen.add(jid)

    def take(self, jid: str) -> Job:
        """A claim of ``jid`` (the machine checked it was a legal choice)."""
        j = self.jobs[jid]
        j.attempts += 1
        j.state = "active"
        j.epoch = j.attempts
        j.cancel = None  # a new run starts without its predecessor's flag (issue 22 #4)
        j.expires, j.expired = None, False  # issue 24: the ttl bounds the first wait only
        if self.rate is not None:
            self.rate = (self.rate[0], self.rate[1] + 1)
        if j.group in self.lane_rate:
            mx, used = self.lane_rate[j.group]
            self.lane_rate[j.group] = (mx, used + 1)
        return j

    # ------------------------------------------------------------------ endings

    def release_dedup(self, jid: str) -> None:
        j = self.jobs[jid]
        if j.dedup and self.dedup.get(j.dedup) == jid and j.dedup not in self.dedup_ttl:
            del self.dedup[j.dedup]

    def drop(self, jid: str) -> Job:
        """The row is deleted (complete, remove, cancel, drain): retired, its simple dedup
        key released, its own flow keys deleted."""
        self.release_dedup(jid)
        j = self.jobs.pop(jid)
        self.retired[jid] = j.attempts  # 0 too: a resend of its enqueue looks here (issue 28)
        self.flows.pop(jid, None)
        return j

    def log_error(self, jid: str, error: str) -> None:
        """A retry that releases the lease records ``attempt N: error`` (N counted from the
        incarnation's floor) in the row's `:errors`, the last ERRORS_KEPT kept."""
        j = self.jobs[jid]
        j.errors = [*j.errors, f"attempt {j.attempts - j.floor}: {error}"][-ERRORS_KEPT:]

    def keep(self, jid: str, value: bytes, attempts: int, error: str | None) -> None:
        self.results[jid] = Kept(value, attempts, error)

    def leave_active(self, j: Job) -> None:
        """Any move out of active ends the run: its cancel flag goes (issue 22 #4)."""
        j.cancel = None

    # ---- kept history (issue 24) ----------------------------------------------------------

    def keep_completed_row(self, jid: str, finished: int) -> None:
        """A completion while the queue keeps rows: the row stays, state completed, scored by
        its finish time; its dedup key is released, its flow hashes stay, nothing retired."""
        self.release_dedup(jid)
        j = self.jobs[jid]
        j.state, j.epoch, j.cancel, j.score = "completed", None, None, finished

    def trim(self, state: str, bound: int | None) -> None:
        """The completing (dead-lettering) script's trim by count: the oldest go, by finish
        time (completed) or time of death (dead), then id, each deleted with its side keys
        and its token retired. Top-k is closed under repetition, so trimming once per model
        step equals trimming once per script call."""
        if bound is None:
            return
        held = sorted(
            (j.score if state == "completed" else j.died, i)
            for i, j in self.jobs.items()
            if j.state == state
        )
        for _, jid in held[: max(0, len(held) - bound)]:
            j = self.jobs.pop(jid)
            self.retired[jid] = j.attempts
            self.flows.pop(jid, None)

    def trim_dead(self) -> None:
        """Only a script that dead-lettered trims: a lowered bound waits for the next death."""
        if self.dead_added:
            self.dead_added = False
            self.trim("dead", self.keep_dead)


class World:
    """Two queues: 0 is the main one, 1 holds the other half of cross-queue flows.

    ``per_hash`` (a triage waiver, tests/model/test_model.py ``count1``) models today's counting,
    once per hash instead of once per child, so a run can look past FINDINGS F5."""

    def __init__(self, per_hash: bool = False, keep_dropped: bool = False) -> None:
        self.qs = [QueueModel(), QueueModel()]
        self.per_hash = per_hash
        self.keep_dropped = keep_dropped  # waiver dropchild: a removed child is not dropped

    # ------------------------------------------------------------------ flows (D18)

    def child_done(self, qi: int, cid: str, j: Job, result: bytes) -> None:
        if j.parent is None:
            return
        if j.pq is not None:
            self.qs[qi].outbox.append(
                Entry("done", j.pq, j.parent, cid, j.policy or "fp", result, j.mark)
            )
        else:
            self.settle_to_parent(qi, j.parent, cid, "processed", result, j.mark)

    def child_dead(self, qi: int, cid: str, j: Job, error: str) -> None:
        if j.parent is None:
            return
        if j.pq is not None:
            self.qs[qi].outbox.append(
                Entry("fail", j.pq, j.parent, cid, j.policy or "fp", error.encode(), j.mark)
            )
            return
        self.parent_told_dead(qi, j.parent, cid, j.policy or "fp", error, j.mark)

    # ---- issue 24: expiry and remove with children ---------------------------------------

    def expire(self, qi: int, jid: str) -> None:
        """A claim met an expired job: dead-lettered "expired", never leased, as any death
        (metrics, its simple dedup key, a waiter, its flow parent)."""
        m = self.qs[qi]
        j = m.jobs[jid]
        assert j.expired and j.state == "pending", f"{jid} expired but {j}"
        j.state, j.last_error = "dead", "expired"
        m.dead_added = True  # kept history: the claim that expired it trims dead
        m.failed += 1
        m.release_dedup(jid)
        if jid in m.wanted:
            m.keep(jid, b"", j.attempts, "expired")
        self.child_dead(qi, jid, j, "expired")

    def remove_tree(self, qi: int, pid: str) -> None:
        """remove(children=True): the job, then its waiting same-queue descendants (down the
        `kids` of each removed node, a kid that still names it as parent)."""
        m = self.qs[qi]
        todo = [(pid, self.removed(qi, pid).kids)]
        while todo:
            parent, kids = todo.pop(0)
            for kid in kids:
                k = m.jobs.get(kid)
                if (
                    k is not None
                    and k.parent == parent
                    and k.pq is None
                    and k.state
                    in (
                        "pending",
                        "scheduled",
                        "awaiting_children",
                    )
                ):
                    todo.append((kid, self.removed(qi, kid).kids))

    # ---- end issue 24 ----------------------------------------------------------------------

    def removed(self, qi: int, jid: str) -> Job:
        """The row is deleted without an outcome (remove, cancel, drain, a ``remove=True``
        cancel's settle): a child is dropped from its parent, which stops waiting for it
        (PROTOCOL D18 as issue 22 settles it)."""
        j = self.qs[qi].drop(jid)
        if j.parent is not None and not self.keep_dropped:
            if j.pq is not None:
                self.qs[qi].outbox.append(
                    Entry("drop", j.pq, j.parent, jid, j.policy or "fp", b"", j.mark)
                )
            else:
                self.settle_to_parent(qi, j.parent, jid, "dropped", b"", j.mark)
        return j

    def parent_told_dead(
        self, pqi: int, pid: str, cid: str, policy: str, error: str, mark: int | None
    ) -> None:
        if policy == "id":
            self.settle_to_parent(pqi, pid, cid, "unsuccessful", error.encode(), mark)
            return
        m = self.qs[pqi]
        p = m.jobs.get(pid)
        fl = m.flows.get(pid)
        if p is None or fl is None or fl.mark != mark:
            return  # the parent is gone (remove x flows), or a new flow under its id
        if cid in fl.failed:
            return
        fl.failed[cid] = error
        if p.state != "awaiting_children":
            return
        p.state = "dead"
        m.dead_added = True  # kept history: the script that killed it trims dead
        p.last_error = f"child {cid} failed"
        if pid in m.wanted:  # a death while a waiter waits is kept 60 s (D17)
            m.keep(pid, b"", p.attempts, p.last_error)
        self.child_dead(pqi, pid, p, p.last_error)

    def settle_to_parent(
        self, pqi: int, pid: str, cid: str, how: str, value: bytes, mark: int | None
    ) -> None:
        m = self.qs[pqi]
        p = m.jobs.get(pid)
        fl = m.flows.get(pid)
        if p is None or fl is None or fl.mark != mark:
            return  # gone, or a new flow's parent under the re-used id: nothing counts
        if self.per_hash:
            if how == "dropped":
                if cid in fl.counted:
                    return
                fl.counted.add(cid)
            elif how == "processed":
                if cid in fl.processed:
                    return
                fl.processed[cid] = value
            else:
                if cid in fl.unsuccessful:
                    return
                fl.unsuccessful[cid] = value.decode()
            fl.deps -= 1
            if fl.deps <= 0 and p.state == "awaiting_children":
                p.state = "pending"
            return
        # Its latest outcome, once: a child reprocessed after an ignored death and then
        # completed moves from unsuccessful to processed, and is not counted again (#1).
        if how == "dropped":
            # Nothing recorded; a child already recorded (counted, or one that failed its
            # parent and so was never counted) is not dropped again.
            if cid in fl.failed or cid in fl.processed or cid in fl.unsuccessful:
                return
        elif how == "processed":
            # A child is recorded in at most one hash: a completion after a reprocess moves
            # its record out of unsuccessful (or failed, the parent being dead already).
            fl.unsuccessful.pop(cid, None)
            fl.failed.pop(cid, None)
            # Its latest outcome: a kept completed child reprocessed and completed again
            # (issue 24) overwrites its record (a pump's redelivery carries the same value).
            fl.processed[cid] = value
        else:
            # Its latest outcome, again: a kept completed child reprocessed (issue 24) whose
            # new run dies ignored moves from processed to unsuccessful (PROTOCOL §2.4).
            fl.processed.pop(cid, None)
            fl.unsuccessful[cid] = value.decode()
        if cid in fl.counted:
            return
        fl.counted.add(cid)
        fl.deps -= 1
        if fl.deps <= 0 and p.state == "awaiting_children":
            p.state = "pending"

    def deliver(self, qi: int) -> int:
        """The pump's outbox pass on queue ``qi``: every entry applied on its parent's
        queue (at most once per child), then trimmed."""
        m = self.qs[qi]
        n = 0
        for e in m.outbox:
            if e.kind == "done":
                self.settle_to_parent(e.pq, e.pid, e.cid, "processed", e.value, e.mark)
            elif e.kind == "drop":
                self.settle_to_parent(e.pq, e.pid, e.cid, "dropped", b"", e.mark)
            else:
                self.parent_told_dead(e.pq, e.pid, e.cid, e.policy, e.value.decode(), e.mark)
            n += 1
        m.outbox.clear()
        return n
