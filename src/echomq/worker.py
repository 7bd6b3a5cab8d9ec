"""The worker: the loop that owns the rhythm — claim, heartbeat, settle, sweep.

One asyncio loop per process. For each queue a *pump* turns finished jobs into settle
calls and free slots into one ``claim_batch``, and sends both in a single pipelined round
trip; when the queue runs dry it parks on a blocking pop of the queue's ``wake`` list (no
polling: an idle worker only speaks on its beat). A *heartbeat* extends every in-flight
lease in one ``extend_many`` every lease/3, so a job that runs far longer than its lease is
never re-delivered while its worker lives; a job whose extend fails was recovered by someone
else and is cancelled, never settled. The *beat* runs the idempotent sweeps (promote, and
the counted stall sweep) that any worker may run.

Async handlers run as tasks on the loop; sync handlers run in a thread pool. SIGTERM/SIGINT
stop claiming, let in-flight jobs finish within ``grace_s``, then hand the rest back to
pending at once (``delay(id, token, 0)``); a second signal exits immediately.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import random
import signal
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from echomq import _protocol as _p
from echomq._executor import (
    DEFAULT_RETRY_FOR,
    TRANSIENT,
    AsyncExecutor,
    async_client,
    parse_url,
)
from echomq._protocol import Call, Job, Keys
from echomq.app import Discard, JobContext, Retry, _current
from echomq.backoff import exponential
from echomq.errors import (
    EchoMQError,
    InvalidArgument,
    InvalidId,
    JobGone,
    StaleToken,
    VersionFenceError,
)

if TYPE_CHECKING:
    from echomq.app import App, Task

__all__ = ["Worker", "WorkerStats"]

log = logging.getLogger("echomq.worker")

# Errors after which the worker backs off and tries again (the executor's transient set).
_NETWORK_ERRORS = (*TRANSIENT, OSError)
_MAX_ERROR_TEXT = 8192
_DEFAULT_BACKOFF = exponential(1_000, 60_000)  # the fallback when a task's own policy fails


@dataclass
class WorkerStats:
    """Counters of one worker process (settles this worker made and saw accepted)."""

    claimed: int = 0
    completed: int = 0
    retried: int = 0
    dead: int = 0
    lost: int = 0  # leases lost (extend or settle refused): another worker owns the job
    handed_back: int = 0  # returned to pending at shutdown
    recovered: int = 0  # stalled jobs this worker's sweeps returned to pending
    swept_dead: int = 0  # stalled jobs this worker's sweeps dead-lettered


@dataclass(eq=False)
class _Running:
    job: Job
    ctx: JobContext | None = None
    fut: asyncio.Future[Any] | None = None
    lost: bool = False
    thread: Future[Any] | None = None  # a sync handler's run in the pool


@dataclass(eq=False, slots=True)
class _Settle:
    """A finished job waiting for the pump's next ``settle`` call."""

    job_id: str
    token: int
    kind: str  # completed | retried | dead
    delay_ms: int = 0
    max_attempts: int = 1
    error: str = ""
    promote_ms: int = 0  # a short retry: promote its queue this long after the settle lands


@dataclass(eq=False)
class _QueueLoop:
    """One queue's state inside the worker."""

    keys: Keys
    lease_ms: int
    inflight: dict[str, _Running] = field(default_factory=dict)
    settles: list[_Settle] = field(default_factory=list)
    kick: asyncio.Event = field(default_factory=asyncio.Event)
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    turns: set[asyncio.Future[None]] = field(default_factory=set)  # settle calls in flight
    full: bool = False  # the last claim got all it asked for: the queue has a backlog
    failures: int = 0


# Settle calls a queue keeps in flight: while the server runs one turn's settle-and-claim,
# the worker runs the jobs the other turn brought, so neither side waits for the other.
_TURNS_IN_FLIGHT = 2


class Worker:
    """Runs an app's tasks from its queues.

    Args:
        app: the :class:`~echomq.App` whose tasks this worker runs.
        queues: the queues to serve (default: every queue the app's tasks use).
        concurrency: jobs in flight at once (shared across queues).
        beat_ms: the rhythm of sweeps and of an idle worker's blocking wait.
        grace_s: how long in-flight jobs may finish after SIGTERM before they are handed back.
        max_stalled: stalls (lapsed leases) after which the stall sweep dead-letters a job;
            ``0`` disables counting (lapsed leases are always returned to pending, via reap).
        url: the server, overriding the app's.
    """

    def __init__(
        self,
        app: App,
        queues: list[str] | None = None,
        concurrency: int = 10,
        *,
        beat_ms: int = 1000,
        grace_s: float = 10.0,
        max_stalled: int = 5,
        url: str | None = None,
    ) -> None:
        # Upper bounds: a claim takes at most 1,000,000 jobs and the sweep a max_stalled the
        # protocol can carry; beyond them every settle (or sweep) call would be refused.
        if isinstance(concurrency, bool) or not isinstance(concurrency, int):
            raise InvalidArgument(f"concurrency must be an int >= 1, got {concurrency!r}")
        if not 1 <= concurrency <= 1_000_000:
            raise InvalidArgument(f"concurrency must be in [1, 1000000], got {concurrency}")
        if isinstance(beat_ms, bool) or not isinstance(beat_ms, int) or beat_ms < 10:
            raise InvalidArgument(f"beat_ms must be an int >= 10, got {beat_ms!r}")
        if isinstance(max_stalled, bool) or not isinstance(max_stalled, int):
            raise InvalidArgument(f"max_stalled must be an int >= 0, got {max_stalled!r}")
        if not 0 <= max_stalled <= _p.MAX_INT:
            raise InvalidArgument(f"max_stalled must be in [0, {_p.MAX_INT}], got {max_stalled}")
        self.app = app
        self.queue_names = list(queues) if queues else app.queues()
        if not self.queue_names:
            raise InvalidArgument("no queues to serve: register a task or pass queues=[...]")
        self.concurrency = concurrency
        self.beat_ms = beat_ms
        self.grace_s = grace_s
        self.max_stalled = max_stalled
        self.url = url
        self.stats = WorkerStats()
        self._loops: list[_QueueLoop] = []
        self._free = concurrency
        self._stopping = False
        self._stop_event: asyncio.Event | None = None
        self._drained: asyncio.Event | None = None
        self._x: AsyncExecutor | None = None
        self._client: Any = None
        self._threads: ThreadPoolExecutor | None = None
        self._signals = 0
        self._side_tasks: set[asyncio.Future[Any]] = set()

    # ------------------------------------------------------------------ entry points

    def run(self) -> WorkerStats:
        """Run until SIGTERM/SIGINT (installs the signal handlers); returns the stats."""
        return asyncio.run(self._run_with_signals())

    async def _run_with_signals(self) -> WorkerStats:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            return await self.arun()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    def _on_signal(self, sig: int) -> None:
        self._signals += 1
        if self._signals == 1:
            log.info(
                "received %s: finishing in-flight jobs (grace %.1fs)",
                signal.Signals(sig).name,
                self.grace_s,
            )
            self.stop()
        else:
            # Immediately, as promised: leases lapse and the stall sweep of any worker
            # recovers the jobs this process held.
            log.warning("second signal: exiting now; held leases will lapse and be swept")
            logging.shutdown()
            os._exit(128 + sig)

    def stop(self) -> None:
        """Ask the worker to stop gracefully (safe to call from the loop's thread)."""
        self._stopping = True
        if self._stop_event is not None:
            self._stop_event.set()
        for ql in self._loops:
            ql.kick.set()
            ql.idle.set()

    async def arun(self) -> WorkerStats:
        """Run on the current event loop until :meth:`stop`; returns the stats."""
        self._stop_event = asyncio.Event()
        self._drained = asyncio.Event()
        if self._stopping:
            self._stop_event.set()
        url = self.url or self.app.url
        self._client = async_client(url)
        durable = self.app.durable if self.app.durable is not None else parse_url(url)[2]
        self._x = AsyncExecutor(self._client, owned=True, durable=durable)
        await self._first_fence()  # refuse a foreign deployment before taking any job
        self._threads = ThreadPoolExecutor(
            max_workers=self.concurrency, thread_name_prefix="echomq-job"
        )
        kw = {} if self.app.max_payload is None else {"max_payload": self.app.max_payload}
        for name in self.queue_names:
            leases = [t.lease_ms for t in self.app.tasks.values() if t.queue == name]
            self._loops.append(_QueueLoop(Keys(name, **kw), max(leases, default=30_000)))
        log.info(
            "worker %d serving %s with concurrency %d on %s",
            os.getpid(), ", ".join(self.queue_names), self.concurrency, url,
        )  # fmt: skip
        background = []
        for ql in self._loops:
            ql.kick.set()
            background += [
                asyncio.ensure_future(self._supervised(self._pump, ql)),
                asyncio.ensure_future(self._supervised(self._waker, ql)),
                asyncio.ensure_future(self._supervised(self._heartbeat, ql)),
            ]
        background.append(asyncio.ensure_future(self._supervised(self._beat)))
        try:
            await self._stop_event.wait()
            await self._shutdown()
        finally:
            for t in background:
                t.cancel()
            # Python 3.11's asyncio.wait_for (inside redis-py) can swallow a cancel that races
            # a reply; a loop that lost its cancel would wait forever: cancel it again.
            while pending := [t for t in background if not t.done()]:
                await asyncio.wait(pending, timeout=0.1)
                for t in pending:
                    t.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            self._threads.shutdown(wait=False, cancel_futures=True)
            await self._x.close()
        log.info("worker %d stopped: %s", os.getpid(), self.stats)
        return self.stats

    async def _first_fence(self) -> None:
        """The version fence (D1) before the first claim. A server that is unreachable for a
        moment at startup (restarting, a dropped connection) is asked again with backoff for
        DEFAULT_RETRY_FOR seconds, as any call would be, before the worker gives up."""
        assert self._x is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEFAULT_RETRY_FOR
        failures = 0
        while True:
            try:
                await self._x.fence()
                return
            except _NETWORK_ERRORS as exc:
                failures += 1
                if self._stopping or loop.time() >= deadline:
                    raise
                log.warning("server unreachable at startup (%s); retrying", exc)
                await asyncio.sleep(min(1.0, 0.05 * 2**failures))

    async def _supervised(self, loop_fn: Callable[..., Any], *args: Any) -> None:
        """Run one of the worker's loops; a bug in it is logged and the loop restarted,
        never silently lost (a dead pump would strand its queue)."""
        while True:
            try:
                await loop_fn(*args)
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s crashed; restarting it", loop_fn.__name__)
                await asyncio.sleep(0.5)
                for ql in self._loops:
                    ql.kick.set()

    # ------------------------------------------------------------------ the pump

    async def _pump(self, ql: _QueueLoop) -> None:
        """Turn finished jobs into settles and free slots into claims: one ``settle`` script
        call per turn, up to two turns in flight, each claiming at most half the slots."""
        while True:
            await ql.kick.wait()
            ql.kick.clear()
            self._fill(ql)

    def _fill(self, ql: _QueueLoop) -> None:
        """Send turns while there is something to settle or slots to fill (at most two)."""
        share = max(1, self.concurrency // _TURNS_IN_FLIGHT)
        while len(ql.turns) < _TURNS_IN_FLIGHT:
            want = 0
            # A second claim goes out while one is in flight only when the last claim came
            # back full: an emptying or idle queue gets one claim at a time.
            if not self._stopping and not ql.idle.is_set() and (ql.full or not ql.turns):
                want = min(self._free, share)
            if not ql.settles and want == 0:
                return
            settles, ql.settles = ql.settles, []
            self._free -= want
            turn = asyncio.ensure_future(self._turn(ql, settles, want))
            ql.turns.add(turn)
            turn.add_done_callback(functools.partial(_turn_done, ql))

    async def _turn(self, ql: _QueueLoop, settles: list[_Settle], want: int) -> None:
        assert self._x is not None
        settles = self._valid(ql, settles)
        try:
            result = await self._x.call(_settle_call(ql, settles, want))
        except _NETWORK_ERRORS as exc:
            # Settles are fenced, so sending them again is safe: one that already applied
            # answers gone/stale and is counted as lost, never applied twice.
            self._free += want
            ql.settles[:0] = settles
            ql.failures += 1
            delay = min(2.0, 0.1 * 2 ** min(ql.failures, 5)) * (0.5 + random.random() / 2)
            log.warning("server unreachable (%s); retrying in %.2fs", exc, delay)
            await asyncio.sleep(delay)
            return
        except EchoMQError as exc:
            self._free += want
            ql.settles[:0] = settles
            self._fatal_or_log(exc)
            await asyncio.sleep(0.5)
            return
        ql.failures = 0
        self._count_settled(ql, settles, result)
        jobs = result.jobs
        if want:
            ql.full = len(jobs) == want
            self._free += want - len(jobs)
            self.stats.claimed += len(jobs)
            for job in jobs:
                self._start(ql, job)
            if len(jobs) < want:
                ql.idle.set()  # nothing more to claim: park on the wake list
                # The slots this queue did not use go to the other queues' pumps, which may
                # have found none free while this claim was in flight.
                for other in self._loops:
                    if other is not ql and not other.idle.is_set():
                        other.kick.set()

    def _valid(self, ql: _QueueLoop, settles: list[_Settle]) -> list[_Settle]:
        """The settles the protocol accepts. One it refuses before any I/O (an id or token a
        malformed row produced) is dropped with an error — its job's lease lapses and the
        stall sweep takes it — instead of failing, and so blocking, every batch it rides in."""
        try:
            _settle_call(ql, settles, 0)
            return settles
        except (InvalidArgument, InvalidId):
            pass
        good = []
        for s in settles:
            try:
                _settle_call(ql, [s], 0)
                good.append(s)
            except (InvalidArgument, InvalidId) as exc:
                log.error("job %r: cannot settle it (%s); its lease will lapse", s.job_id, exc)
        return good

    def _count_settled(self, ql: _QueueLoop, settles: list[_Settle], result: _p.Settled) -> None:
        """Account for one settle call's verdicts, in the order _settle_call sent them."""
        done = iter(result.completed)
        again = iter(result.retried)
        for s in settles:
            verdict = next(done) if s.kind == "completed" else next(again)
            self._count_settle(s, verdict, ql)

    def _count_settle(self, s: _Settle, result: Any, ql: _QueueLoop | None = None) -> None:
        if isinstance(result, (StaleToken, JobGone)):
            self.stats.lost += 1
            log.warning("job %s: settle refused (%s); another worker owns it now", s.job_id, result)
        elif isinstance(result, BaseException):
            log.error("job %s: settle failed: %r", s.job_id, result)
        elif s.kind == "completed":
            self.stats.completed += 1
        elif result == "dead":
            self.stats.dead += 1
        else:
            self.stats.retried += 1
            if ql is not None and s.promote_ms:
                # Timed from the reply, so the job is due (server clock) when the promote runs.
                asyncio.get_running_loop().call_later(s.promote_ms / 1000, self._promote_soon, ql)

    def _fatal_or_log(self, exc: BaseException) -> None:
        if isinstance(exc, VersionFenceError):
            log.error("%s", exc)
            self.stop()
        else:
            log.error("claim failed: %r", exc)

    async def _waker(self, ql: _QueueLoop) -> None:
        """Park on the wake list while the queue is empty; kick the pump on a token or a beat."""
        failures = 0
        while True:
            await ql.idle.wait()
            if self._stopping:
                return
            try:
                await self._client.blpop([ql.keys.wake], timeout=self.beat_ms / 1000)
                failures = 0
            except _NETWORK_ERRORS as exc:
                failures += 1
                log.warning("wake wait failed (%s)", exc)
                await asyncio.sleep(min(2.0, 0.1 * 2 ** min(failures, 5)))
            ql.idle.clear()
            # Claim from here rather than waking the pump: one event-loop hop less between
            # a producer's wake token and the claim (the enqueue -> start latency).
            self._fill(ql)

    # ------------------------------------------------------------------ running jobs

    def _start(self, ql: _QueueLoop, job: Job) -> None:
        r = _Running(job)
        ql.inflight[job.id] = r
        prepared = self._prepare(ql, job)
        if isinstance(prepared, _Settle):  # undecodable or unknown: dead-lettered, never run
            self._finish(ql, r, prepared)
            return
        task, args, kwargs = prepared
        r.ctx = JobContext(ql.keys.name, job.id, job.token, job.group, task.name)
        if task.inline:
            # A trivial sync handler runs right here in the pump's turn: no thread handoff
            # and no event-loop task per job.
            self._finish(ql, r, self._run_inline(ql, r, task, args, kwargs))
        else:
            r.fut = asyncio.ensure_future(self._execute(ql, r, task, args, kwargs))

    def _prepare(
        self, ql: _QueueLoop, job: Job
    ) -> tuple[Task[Any, Any], list[Any], dict[str, Any]] | _Settle:
        """The task and arguments of a job, or the dead-letter settle of a job no handler can
        run: an undecodable payload or an unknown task is never silently dropped."""
        try:
            envelope = self.app.serializer.loads(job.payload)
            name = envelope["task"]
            args, kwargs = list(envelope.get("args", ())), dict(envelope.get("kwargs", {}))
        except Exception as exc:
            return self._dead(ql, job, f"undecodable payload: {type(exc).__name__}: {exc}")
        task = self.app.tasks.get(name) if isinstance(name, str) else None
        if task is None:
            return self._dead(ql, job, f"unknown task {name!r}: no handler is registered")
        return task, args, kwargs

    def _run_inline(
        self,
        ql: _QueueLoop,
        r: _Running,
        task: Task[Any, Any],
        args: list[Any],
        kwargs: dict[str, Any],
    ) -> _Settle:
        assert r.ctx is not None
        token = _current.set(r.ctx)
        try:
            task.fn(*args, **kwargs)
        except Exception as exc:
            return self._outcome(ql, r.job, task, exc)
        finally:
            _current.reset(token)
        return _Settle(r.job.id, r.job.token, "completed")

    async def _execute(
        self,
        ql: _QueueLoop,
        r: _Running,
        task: Task[Any, Any],
        args: list[Any],
        kwargs: dict[str, Any],
    ) -> None:
        settle: _Settle | None = None
        try:
            assert r.ctx is not None
            await self._invoke(task, r.ctx, args, kwargs, r)
            settle = _Settle(r.job.id, r.job.token, "completed")
        except asyncio.CancelledError:
            if not r.lost and not self._stopping:
                raise
            # Cancelled because the lease was lost or at shutdown: never settle.
        except Exception as exc:
            settle = self._outcome(ql, r.job, task, exc)
        finally:
            self._finish(ql, r, settle)

    def _outcome(self, ql: _QueueLoop, job: Job, task: Task[Any, Any], exc: Exception) -> _Settle:
        """The settle of a failed run: a Retry or Discard signal, a timeout, or an error."""
        if isinstance(exc, Retry):
            return self._retry(
                ql, job, task, self._backoff(task, job.token, exc.delay_ms), f"Retry: {exc.reason}"
            )
        if isinstance(exc, Discard):
            return self._dead(ql, job, f"Discard: {exc.reason}")
        if isinstance(exc, asyncio.TimeoutError) and isinstance(
            exc.__cause__, asyncio.CancelledError
        ):
            text = f"TimeoutError: the run took longer than {task.timeout}s"  # the task's timeout
        else:  # any other error, the handler's own TimeoutError (a socket, a client) included
            text = _error_text(exc)
        return self._retry(ql, job, task, self._backoff(task, job.token), text)

    async def _invoke(
        self,
        task: Task[Any, Any],
        ctx: JobContext,
        args: list[Any],
        kwargs: dict[str, Any],
        r: _Running | None = None,
    ) -> None:
        token = _current.set(ctx)
        try:
            if task.is_async:
                coro = task.fn(*args, **kwargs)
                await (asyncio.wait_for(coro, task.timeout) if task.timeout else coro)
            else:
                assert self._threads is not None
                thread = self._threads.submit(_run_in_context, ctx, task.fn, args, kwargs)
                if r is not None:
                    r.thread = thread  # its slot stays taken while the thread runs (_finish)
                fut = asyncio.wrap_future(thread)
                await (asyncio.wait_for(fut, task.timeout) if task.timeout else fut)
        finally:
            _current.reset(token)

    def _backoff(self, task: Task[Any, Any], attempt: int, requested: Any = None) -> int:
        """The delay before the next attempt: ``requested`` (a Retry's), else the task's policy.
        A broken policy must not strand the job unsettled in active: log it, use the default.
        A delay past the protocol's longest (MAX_MS, ~69 years) is that longest: refused by
        the settle call, it would fail the whole batch, every turn."""
        try:
            delay = requested if requested is not None else task.backoff.delay_ms(attempt)
            return min(max(0, int(delay)), _p.MAX_MS)
        except Exception as exc:
            log.error("task %s: bad backoff delay (%r); using the default policy", task.name, exc)
            return _DEFAULT_BACKOFF.delay_ms(attempt)

    def _retry(
        self, ql: _QueueLoop, job: Job, task: Task[Any, Any], delay: int, error: str
    ) -> _Settle:
        # Promote our own short retries on time instead of at the next beat (once the settle
        # has landed: timed from here, the promote would run before the job is due).
        soon = 0 < delay < self.beat_ms and job.token < task.max_attempts
        return _Settle(
            job.id, job.token, "retried", max(0, int(delay)), task.max_attempts,
            _clip(error), int(delay) if soon else 0,
        )  # fmt: skip

    def _dead(self, ql: _QueueLoop, job: Job, reason: str) -> _Settle:
        # A retry with max_attempts=1 dead-letters at once (attempts >= 1 after any claim).
        return _Settle(job.id, job.token, "dead", 0, 1, _clip(reason))

    def _finish(self, ql: _QueueLoop, r: _Running, settle: _Settle | None) -> None:
        ql.inflight.pop(r.job.id, None)
        if r.thread is not None and not r.thread.done():
            # A sync handler past its timeout (or handed back) still runs: a thread cannot be
            # stopped. Its slot stays taken until it returns, or the next claimed job would
            # wait in the pool (its lease and timeout running) behind it, never started.
            loop = asyncio.get_running_loop()
            r.thread.add_done_callback(lambda _: _call_soon(loop, self._release_slot))
        else:
            self._free += 1
        if settle is not None and not r.lost:
            ql.settles.append(settle)
        for other in self._loops:
            other.kick.set()
        if self._drained is not None and not any(q.inflight for q in self._loops):
            self._drained.set()

    def _release_slot(self) -> None:
        self._free += 1
        for ql in self._loops:
            ql.kick.set()

    def _promote_soon(self, ql: _QueueLoop) -> None:
        if self._x is not None and not self._stopping:
            fut = asyncio.ensure_future(self._quiet(self._x.call(_p.promote(ql.keys, 1000))))
            self._side_tasks.add(fut)
            fut.add_done_callback(self._side_tasks.discard)

    async def _quiet(self, aw: Any) -> None:
        with contextlib.suppress(*_NETWORK_ERRORS, EchoMQError):
            await aw

    # ------------------------------------------------------------------ heartbeat and beat

    async def _heartbeat(self, ql: _QueueLoop) -> None:
        """Extend every in-flight lease of the queue in one call, every lease/3."""
        assert self._x is not None
        while True:
            await asyncio.sleep(ql.lease_ms / 3000)
            held = [r for r in ql.inflight.values() if not r.lost]
            if not held:
                continue
            try:
                failed = await self._x.run(
                    _p.extend_many(ql.keys, [(r.job.id, r.job.token) for r in held], ql.lease_ms)
                )
            except _NETWORK_ERRORS as exc:
                log.warning("heartbeat failed (%s); leases may lapse", exc)
                continue
            for job_id in failed:
                r = ql.inflight.get(job_id)
                if r is not None and not r.lost:
                    # Someone else owns the job now (our lease lapsed and was recovered):
                    # cancel cooperatively and never settle it.
                    r.lost = True
                    self.stats.lost += 1
                    if r.ctx is not None:
                        r.ctx.lost = True
                    if r.fut is not None:
                        r.fut.cancel()
                    log.warning("job %s: lease lost; cancelled without settling", job_id)

    async def _beat(self) -> None:
        """The sweeps any worker may run: promote due jobs, recover lapsed leases."""
        assert self._x is not None
        while not self._stopping:
            for ql in self._loops:
                try:
                    await self._sweep(ql)
                except _NETWORK_ERRORS as exc:
                    log.warning("sweep failed (%s)", exc)
                except EchoMQError as exc:
                    self._fatal_or_log(exc)
            await asyncio.sleep(self.beat_ms / 1000)

    async def _sweep(self, ql: _QueueLoop) -> None:
        assert self._x is not None
        limit = 1000
        while True:
            calls: list[Call[Any]] = [_p.promote(ql.keys, limit)]
            if self.max_stalled:
                calls.append(_p.sweep_stalled(ql.keys, self.max_stalled, limit))
            else:
                calls.append(_p.reap(ql.keys, limit))
            promoted, swept = await self._x.pipeline(calls)
            for result in (promoted, swept):
                if isinstance(result, BaseException):
                    raise result
            if self.max_stalled:
                recovered, dead = swept
                self.stats.recovered += len(recovered)
                self.stats.swept_dead += len(dead)
                if recovered or dead:
                    log.info(
                        "stall sweep on %s: %d recovered, %d dead",
                        ql.keys.name,
                        len(recovered),
                        len(dead),
                    )
                moved = len(recovered) + len(dead)
            else:
                moved = swept
                self.stats.recovered += swept
            if promoted < limit and moved < limit:
                return

    # ------------------------------------------------------------------ shutdown

    async def _shutdown(self) -> None:
        assert self._x is not None and self._drained is not None
        for ql in self._loops:
            ql.kick.set()
            ql.idle.set()
        # Claims already in flight may still bring jobs: they must be in inflight before we
        # decide what to wait for and what to hand back.
        await self._await_turns()
        if any(ql.inflight for ql in self._loops):
            self._drained.clear()
            if any(ql.inflight for ql in self._loops):
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._drained.wait(), self.grace_s)
        for ql in self._loops:
            left = list(ql.inflight.values())
            for r in left:
                r.lost = True  # the hand-back below is the settle; the handler's result is dropped
                if r.ctx is not None:
                    r.ctx.lost = True
                if r.fut is not None:
                    r.fut.cancel()
            if left:
                calls = [_p.delay(ql.keys, r.job.id, r.job.token, 0) for r in left]
                try:
                    results = await self._x.pipeline(calls)
                    back = sum(1 for res in results if not isinstance(res, BaseException))
                    self.stats.handed_back += back
                    log.info("handed %d unfinished jobs of %s back to pending", back, ql.keys.name)
                except _NETWORK_ERRORS as exc:
                    log.warning("could not hand jobs back (%s); their leases will lapse", exc)
        await self._flush_settles()

    async def _await_turns(self) -> None:
        turns = [t for ql in self._loops for t in ql.turns]
        if turns:
            await asyncio.gather(*turns, return_exceptions=True)

    async def _flush_settles(self) -> None:
        assert self._x is not None
        for _ in range(20):
            await self._await_turns()
            if not any(ql.settles for ql in self._loops):
                return
            for ql in self._loops:
                settles, ql.settles = ql.settles, []
                if not settles:
                    continue
                try:
                    result = await self._x.call(_settle_call(ql, settles, 0))
                except _NETWORK_ERRORS as exc:
                    ql.settles[:0] = settles
                    log.warning("final settle failed (%s); retrying", exc)
                    await asyncio.sleep(0.2)
                    continue
                self._count_settled(ql, settles, result)


def _settle_call(ql: _QueueLoop, settles: list[_Settle], want: int) -> Call[_p.Settled]:
    """One ``settle`` script call: the completions, the retries (and deaths), and a claim."""
    completed = [(s.job_id, s.token) for s in settles if s.kind == "completed"]
    retried = [
        (s.job_id, s.token, s.delay_ms, s.max_attempts, s.error)
        for s in settles
        if s.kind != "completed"
    ]
    return _p.settle(ql.keys, completed, retried, want, ql.lease_ms)


def _clip(text: str) -> str:
    """An error text fit for last_error: valid UTF-8 (an exception may carry lone
    surrogates), at most _MAX_ERROR_TEXT characters, keeping its head (type and message)."""
    text = text.encode("utf-8", "replace").decode("utf-8")
    if len(text) <= _MAX_ERROR_TEXT:
        return text
    half = (_MAX_ERROR_TEXT - 5) // 2
    return text[:half] + "\n...\n" + text[-half:]


def _turn_done(ql: _QueueLoop, turn: asyncio.Future[None]) -> None:
    ql.turns.discard(turn)
    ql.kick.set()  # a turn slot is free: settles may be waiting for it


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[[], None]) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: the worker has stopped
        loop.call_soon_threadsafe(fn)


def _run_in_context(
    ctx: JobContext, fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]
) -> Any:
    token = _current.set(ctx)
    try:
        return fn(*args, **kwargs)
    finally:
        _current.reset(token)


def _error_text(exc: BaseException) -> str:
    head = f"{type(exc).__name__}: {exc}"
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return f"{head}\n{tb}"
