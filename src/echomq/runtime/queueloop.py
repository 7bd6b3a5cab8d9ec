"""One queue's state inside the worker: runs, settles, its pump.

One queue's state inside the worker — its runs in flight, its settles waiting for a turn,
the two events that drive its pump, the calls it makes — and the worker's counters.

Runs are keyed by ``(id, token)``, and the newest run of each id is known: when the worker
claims a job again that it still runs (its lease lapsed and a sweep recovered it), the older
run is displaced — lost, never settled — and its end cannot remove the newer run's entry (the
entry that gives the newer run its heartbeat).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from echomq._appface import AppFace
from echomq.client.connect import DEFAULT_RETRY_FOR, TRANSIENT, Budget, backoff_delay
from echomq.client.drive import Drive
from echomq.client.executor import AsyncExecutor
from echomq.errors import DurabilityError, InvalidArgument, InvalidId, JobGone, StaleToken
from echomq.protocol import calls as _p
from echomq.protocol import compose as _compose
from echomq.protocol import control as _ctl
from echomq.protocol.kernel import Call, Completed, Keys, Retried
from echomq.runtime.logfmt import warn_repeated
from echomq.runtime.runner import Running, Settle

__all__ = ["QueueLoop", "WorkerStats", "applied", "cancel_tasks", "first_fence"]

log = logging.getLogger("echomq.worker")

# How often an idle worker looks at a queue's rate limits when it has none (D21).
_RATE_RECHECK_S = 5.0


@dataclass
class WorkerStats:
    """Counters of one worker process (settles this worker made and saw accepted)."""

    claimed: int = 0
    completed: int = 0
    retried: int = 0
    dead: int = 0
    lost: int = 0  # leases lost (extend or settle refused, or re-claimed): another run owns it
    handed_back: int = 0  # returned to pending at shutdown
    recovered: int = 0  # stalled jobs this worker's sweeps returned to pending
    swept_dead: int = 0  # stalled jobs this worker's sweeps dead-lettered
    stale_refused: int = 0  # settles the fence refused (StaleToken/JobGone); also in lost
    # A gauge, not a counter: sync handler threads running now past their run's end.
    stranded_threads: int = 0

    def count_call(self, settles: list[Settle], result: _p.Settled, queue: str) -> list[int]:
        """Count one settle call's verdicts (in the order settle_call sent them); returns the
        promote delays of its accepted short retries."""
        done, again = iter(result.completed), iter(result.retried)
        promote = []
        verdict: Any
        for s in settles:
            if s.kind == "completed":
                verdict = next(done)
                if verdict is None:  # accepted: the common case, counted inline
                    self.completed += 1
                    continue
            else:
                verdict = next(again)
            if self.count(s, verdict, queue) and s.promote_ms:
                promote.append(s.promote_ms)
        return promote

    def count(self, s: Settle, verdict: Any, queue: str = "") -> bool:
        """Count the server's verdict on one settle; True when it was an accepted retry."""
        if isinstance(verdict, (StaleToken, JobGone)):
            self.lost += 1
            self.stale_refused += 1
            why = "the job is gone" if isinstance(verdict, JobGone) else "a newer token holds it"
            attempt = s.token - s.floor
            log.warning(
                "job %s (task %s, queue %s, attempt %d) stale settle refused: %s (%s)",
                s.job_id, s.task or "?", queue, attempt, why, verdict,
                extra={
                    "queue": queue, "job_id": s.job_id, "task": s.task or "?",
                    "attempt": attempt, "error": str(verdict),
                },
            )  # fmt: skip
        elif isinstance(verdict, BaseException):
            log.error("job %s: settle failed: %r", s.job_id, verdict)
        elif s.kind == "completed":
            self.completed += 1
        elif verdict in ("dead", "removed"):  # removed: a cancel(remove=True) (D22)
            self.dead += 1
        else:
            self.retried += 1
            return True
        return False


def _unset_finish(r: Running, settle: Settle | None) -> None:
    raise RuntimeError("QueueLoop.finish is set by the worker that runs the queue")


@dataclass(eq=False)
class QueueLoop:
    """One queue's state inside the worker."""

    keys: Keys
    lease_ms: int
    logical: str = ""  # the logical queue of a shard (runtime.shardset); "": keys.name
    # Asked for slots and found none: its ticket (0: not starved); the oldest ticket gets the
    # next free slot (runtime.shardset.take_turn).
    starved: int = 0
    inflight: dict[tuple[str, int], Running] = field(default_factory=dict)  # by (id, token)
    newest: dict[str, Running] = field(default_factory=dict)  # the latest run of each id
    settles: list[Settle] = field(default_factory=list)
    kick: asyncio.Event = field(default_factory=asyncio.Event)  # the pump has work
    idle: asyncio.Event = field(default_factory=asyncio.Event)  # parked: the waker waits
    turns: set[asyncio.Future[None]] = field(default_factory=set)  # settle calls in flight
    full: bool = False  # the last claim got all it asked for: the queue has a backlog
    # The last claim left the queue at its queue-wide limit while jobs wait (Settled.at_limit,
    # issue 41): the next settles carry a claim, which takes the room they free.
    at_limit: bool = False
    # The worker's _finish for this queue's runs (one callable, built once by the worker).
    finish: Callable[[Running, Settle | None], None] = field(default=_unset_finish)
    failures: int = 0
    # The waker's state (park): when to read the rate limits again, what they held back.
    check_at: float = 0.0
    held: int = 0  # ms until the queue-wide window reopens
    lane_held: int = 0  # ms until the first rate-held lane is readmitted
    woke: bool = False  # the last park ended on a wake token
    park_failures: int = 0
    extended_at: float = 0.0  # time.monotonic() of the last extend that went through

    def turn_done(self, turn: asyncio.Future[None]) -> None:
        """A settle call ended: its turn slot is free, and settles may be waiting for it."""
        self.turns.discard(turn)
        self.kick.set()

    async def park(self, x: AsyncExecutor, beat_ms: int) -> None:
        """One idle wait of the worker's waker: a blocking pop of the wake list, at most a
        beat. D21: a spent queue-wide window is slept out (claims would find nothing); a
        rate-held lane shortens the park to its readmission, when claims resume. The rate
        limits are read every _RATE_RECHECK_S while the queue has none (an idle worker's
        traffic stays one round trip a beat), after a wake token (the claim it caused may
        have found the queue rate-held), and before every park while one holds."""
        loop = asyncio.get_running_loop()
        try:
            if self.woke or self.held or self.lane_held or loop.time() >= self.check_at:
                self.held, self.lane_held = await x.call(_ctl.idle_wait_ms(self.keys))
                self.check_at = loop.time() + _RATE_RECHECK_S
            if self.held > 0:
                await asyncio.sleep(min(self.held, beat_ms) / 1000)
                self.woke = False
            else:
                wait = min(self.lane_held, beat_ms) if self.lane_held > 0 else beat_ms
                self.woke = await x.call(_p.wake_wait(self.keys, wait))
            self.park_failures = 0
        except Exception as exc:  # a network error or a reply (BUSY ...): wait, then claim
            self.park_failures += 1
            warn_repeated(log, f"wake:{self.keys.name}", "wake wait failed (%s)", exc)
            await asyncio.sleep(backoff_delay(self.park_failures, base=0.1, cap=2.0))

    def track(self, r: Running) -> Running | None:
        """Add a run; returns the older run of the same id it displaces (still running and
        not yet lost), which the caller marks lost."""
        older = self.newest.get(r.job.id)
        self.inflight[r.key] = self.newest[r.job.id] = r
        return older if older is not None and not older.lost else None

    def untrack(self, r: Running) -> None:
        """Remove a run that ended — only its own entries, never a newer run's."""
        if self.inflight.get(r.key) is r:
            del self.inflight[r.key]
        if self.newest.get(r.job.id) is r:
            del self.newest[r.job.id]

    async def register(self, x: AsyncExecutor, app: AppFace) -> None:
        """At worker start: the app's ``@app.periodic`` repeats of this queue (stale ones of
        the same app dropped, D19), its tasks' queue-wide ``rate_limit`` (D21) and the app's
        kept-history settings (``App(keep_completed=, keep_dead=)``, D25)."""
        if self.logical and self.logical != self.keys.name:  # a shard > 0: kept history only
            await self._keep(x, app)
            return
        await x.run(app.sync_periodic(self.keys))
        await self._keep(x, app)
        for task in app.tasks.values():
            if task.queue == self.keys.name and task.rate_limit is not None:
                await x.call(_ctl.rate_limit(self.keys, *task.rate_limit))

    async def _keep(self, x: AsyncExecutor, app: AppFace) -> None:
        if app.keep_completed is not None:
            await x.call(_p.keep_completed(self.keys, *app.keep_completed))
        if app.keep_dead is not None:
            await x.call(_p.keep_dead(self.keys, *app.keep_dead))

    async def push_back(self, x: AsyncExecutor, pushed: list[Settle], stats: WorkerStats) -> None:
        """Hand rate-limited jobs back without spending an attempt (``echomq.RateLimit``). A
        call that fails leaves the lease to lapse: the stall sweep recovers the job."""
        for s in pushed:
            try:
                await x.call(_ctl.push_back(self.keys, s.job_id, s.token, s.delay_ms))
                stats.retried += 1
            except Exception as exc:
                log.warning("job %s: push back failed (%s)", s.job_id, exc)

    async def extend(self, x: AsyncExecutor) -> list[Running]:
        """Extend every held lease in one call; returns the runs whose extend failed (their
        job is someone else's now). One run per id is held: an older run of a re-claimed id
        is already lost (see :meth:`track`), so a failed id names exactly one run. A run whose
        job was cancelled (D22: the reply flags it) is cancelled here."""
        held = {r.job.id: r for r in self.inflight.values() if not r.lost}
        if not held:
            return []
        pairs = [r.key for r in held.values()]
        flagged: list[str] = []
        try:
            failed, flagged = await x.run(_ctl.extend_leases(self.keys, pairs, self.lease_ms))
        except DurabilityError as exc:  # applied on the primary: its verdicts still hold
            if not isinstance(exc.reply, list):
                raise
            failed, flagged = _ctl.split_flags(exc.reply)
        self.extended_at = time.monotonic()  # the health probes' "past its lease"
        for job_id in flagged:
            run = held.get(job_id)
            if run is not None and self.inflight.get(run.key) is run:
                run.cancel()
        found = (held.get(job_id) for job_id in failed)
        return [r for r in found if r is not None and not r.lost and self.inflight.get(r.key) is r]

    def settle_call(self, settles: list[Settle], want: int) -> Call[_p.Settled]:
        """One ``settle`` script call: the completions, the retries (and deaths), a claim."""
        # A task that keeps results sends its result and TTL (D17); the others send pairs.
        completed = [
            Completed(s.job_id, s.token, s.result, s.keep_ms)
            for s in settles
            if s.kind == "completed"
        ]
        retried = [
            Retried(s.job_id, s.token, s.delay_ms, s.max_attempts, s.error, s.keep_ms)
            for s in settles
            if s.kind != "completed"
        ]
        return _p.settle(self.keys, completed, retried, want, self.lease_ms)

    def checked_call(
        self, settles: list[Settle], want: int
    ) -> tuple[list[Settle], Call[_p.Settled]]:
        """The turn's ``settle`` call, built once, and the settles it carries. One the protocol
        refuses before any I/O (an id or token a malformed row produced) is dropped with an
        error — its job's lease lapses and the stall sweep takes it — instead of failing, and
        so blocking, every batch it rides in."""
        try:
            return settles, self.settle_call(settles, want)
        except (InvalidArgument, InvalidId):
            pass
        good = self.valid(settles)
        return good, self.settle_call(good, want)

    def valid(self, settles: list[Settle]) -> list[Settle]:
        """The settles the protocol accepts, each checked on its own (see checked_call)."""
        good = []
        for s in settles:
            try:
                self.settle_call([s], 0)
                good.append(s)
            except (InvalidArgument, InvalidId) as exc:
                log.error("job %r: cannot settle it (%s); its lease will lapse", s.job_id, exc)
        return good

    async def sweep(self, x: AsyncExecutor, max_stalled: int) -> tuple[int, int]:
        """The beat's work for this queue: promote due jobs, recover lapsed leases (the
        counted stall sweep, or reap when ``max_stalled`` is 0), page by page, and fire due
        repeats / deliver the flow outbox (D18, D19). The first page sends all of it in one
        pipelined round trip, so an idle queue costs one server call per beat; the repeat
        plan continues only when it has work. ``(recovered, dead)``."""
        limit, recovered, dead = 1000, 0, 0
        beat: _p.Plan[int] | None = _compose.beat(self.keys)
        while True:
            calls: list[Call[Any]] = [_p.promote(self.keys, limit)]
            if max_stalled:
                calls.append(_p.sweep_stalled(self.keys, max_stalled, limit))
            else:
                calls.append(_p.reap(self.keys, limit))
            first = next(beat) if beat is not None else None
            if isinstance(first, Call):
                calls.append(first)
            results = await x.pipeline(calls)
            promoted, swept = results[0], results[1]
            for result in results:
                if isinstance(result, BaseException):
                    raise result
            if beat is not None:
                await _finish_plan(x, beat, results[2])
                beat = None
            back, died = (len(swept[0]), len(swept[1])) if max_stalled else (swept, 0)
            recovered, dead = recovered + back, dead + died
            if promoted < limit and back + died < limit:
                return recovered, dead

    async def hand_back_at_exit(self, x: AsyncExecutor) -> int:
        """:meth:`hand_back`, logged; a failure leaves the leases to lapse (the stall sweep
        of any worker recovers them)."""
        try:
            back = await self.hand_back(x)
        except Exception as exc:
            log.warning("could not hand jobs back (%s); their leases will lapse", exc)
            return 0
        if back:
            log.info("handed %d unfinished jobs of %s back to pending", back, self.keys.name)
        return back

    async def hand_back(self, x: AsyncExecutor) -> int:
        """At shutdown: every run still held goes back to pending now, its handler's result
        dropped; returns how many went back. The run spends no attempt (issue 36): it is a
        ``push_back`` with no delay, fenced on its token, which raises the row's ``floor``
        instead of lowering ``attempts`` — the next claim still mints a new token, so a stale
        holder of this run stays refused, while ``max_attempts``, the retry backoff and
        ``Job.attempt`` count ``token - floor`` and so skip the handed-back run."""
        left = [r for r in self.inflight.values() if not r.lost]
        for r in left:
            r.lose()
        if not left:
            return 0
        calls = [_ctl.push_back(self.keys, r.job.id, r.job.token, 0) for r in left]
        results = await x.pipeline(calls)
        # Not acknowledged by enough replicas (durable mode) is still applied: handed back.
        return sum(
            1 for x in results if isinstance(x, DurabilityError) or not isinstance(x, Exception)
        )


def applied(exc: DurabilityError, call: Call[_p.Settled]) -> _p.Settled | None:
    """The reply of a settle that applied but was not acknowledged by enough replicas, when
    the error carries it (decoded, or raw from an older executor), else None."""
    reply = getattr(exc, "reply", None)
    if reply is None or isinstance(reply, _p.Settled):
        return reply
    try:
        return call.decode(reply)
    except Exception:
        return None


async def _finish_plan(x: AsyncExecutor, plan: _p.Plan[Any], reply: Any) -> Any:
    """Feed ``reply`` (the result of the plan's first call, already sent) into ``plan`` and
    run whatever it still asks for on ``x``; the plan's result."""
    return await x.run(Drive(plan, Budget(x.retry_for), reply))


async def first_fence(x: AsyncExecutor, stopping: Callable[[], bool]) -> None:
    """The version fence (D1) before a worker's first claim. A server that is unreachable for
    a moment at startup (restarting, a dropped connection) is asked again with backoff for
    DEFAULT_RETRY_FOR seconds, as any call would be, before the worker gives up."""
    budget = Budget(DEFAULT_RETRY_FOR)
    while True:
        try:
            return await x.fence()
        except (*TRANSIENT, OSError) as exc:
            delay = None if stopping() else budget.next_delay()
            if delay is None:
                raise
            log.warning("server unreachable at startup (%s); retrying", exc)
            await asyncio.sleep(delay)


async def quiet(aw: Awaitable[Any]) -> None:
    """Await a best-effort call (an early promote): the beat does the same work anyway."""
    with contextlib.suppress(Exception):
        await aw


async def cancel_tasks(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Cancel the worker's background loops and wait for them to end."""
    for t in tasks:
        t.cancel()
    # Python 3.11's asyncio.wait_for (inside redis-py) can swallow a cancel that races a
    # reply; a loop that lost its cancel would wait forever: cancel it again.
    while pending := [t for t in tasks if not t.done()]:
        await asyncio.wait(pending, timeout=0.1)
        for t in pending:
            t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
