"""The worker: the loop that owns the rhythm — claim, heartbeat, settle, sweep, shutdown.

One asyncio loop per process. For each queue a *pump* turns finished jobs into settles and
free slots into one ``claim_batch``, both in one ``settle`` script call (a *turn*); when the
queue runs dry it parks on a blocking pop of its ``wake`` list (an idle worker only speaks on
its beat). A *heartbeat* extends every held lease in one ``extend_many`` every lease/3; a run
whose extend fails was recovered by someone else and is cancelled, never settled. The *beat*
runs the idempotent sweeps. Running one job is the runner's (``runtime.runner``), one queue's
bookkeeping ``runtime.queueloop``'s (runs keyed by ``(id, token)``), capacity one ``Slots``.

Every turn that fails — a dropped connection or any error reply (BUSY, OOM, NOPERM, MISCONF,
a script error) — returns the slots it reserved and re-queues its settles (fenced: resending
is safe), then backs off. In durable mode a settle that applied but too few replicas
acknowledged (``DurabilityError``) still runs what it claimed.

Each worker process registers itself on its beat (``runtime.worker_registry``: who it is,
what it holds), never per job. Several processes run under ``echomq worker -p N``
(``runtime.supervisor``).

Async handlers run as tasks on the loop; sync handlers in a thread pool, or for
``@app.task(pool="process")`` in the worker's process pool (``runtime.pool``). SIGTERM/SIGINT stop
claiming, let in-flight jobs finish within ``grace_s``, then hand the rest back to pending at
once (``push_back(id, token, 0)``: no attempt spent, the fence still moves); a second
signal exits immediately.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from echomq._appface import AppFace
from echomq.client.connect import (
    DEFAULT_RETRY_FOR,
    TRANSIENT,
    async_client,
    backoff_delay,
    parse_url,
)
from echomq.client.executor import AsyncExecutor
from echomq.client.locate import _redacted_text
from echomq.client.native import resolve_executor
from echomq.errors import (
    DurabilityError,
    InvalidArgument,
    VersionFenceError,
)
from echomq.hooks import Hooks
from echomq.protocol import calls as _p
from echomq.protocol import control as _ctl
from echomq.protocol.kernel import MAX_ARG, Job
from echomq.runtime import gcpolicy as _gcpolicy
from echomq.runtime.logfmt import log_startup, repeats_reset, stop_line, warn_repeated
from echomq.runtime.pool import ProcessPool, default_size
from echomq.runtime.queueloop import (
    QueueLoop,
    WorkerStats,
    applied,
    cancel_tasks,
    first_fence,
    quiet,
)
from echomq.runtime.runner import Runner, Running, Settle
from echomq.runtime.shardset import ShardSet, kick_order, take_turn
from echomq.runtime.signals import run_with_signals
from echomq.runtime.slots import Slots
from echomq.runtime.strands import Strands, check_limit
from echomq.runtime.worker_registry import Registry, client_name, name_connections

if TYPE_CHECKING:
    from echomq.runtime.health import WorkerHealth

__all__ = ["Hooks", "Worker", "WorkerStats"]

log = logging.getLogger("echomq.worker")

# Errors after which the worker backs off and tries again (the executor's transient set).
_NETWORK_ERRORS = (*TRANSIENT, OSError)


# Settle calls a queue keeps in flight: while the server runs one turn's settle-and-claim,
# the worker runs the jobs the other turn brought, so neither side waits for the other.
_TURNS_IN_FLIGHT = 2

# How often a worker holding jobs reads its queue's cancel count (D22): a cancel reaches a
# running handler within about this long, whatever the lease (extends come every lease/3).
_CANCEL_POLL_S = 0.5


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
        hooks: lifecycle hooks, :class:`~echomq.hooks.Hooks` (``on_startup``,
            ``on_shutdown``, ``before_job``, ``after_job``; sync or async; one that raises is
            logged and ignored).
        max_stranded: sync handler threads still running past their run's end (a timeout,
            a lost lease, a hand-back) the worker tolerates: each frees its slot at once
            and is counted in ``stats.stranded_threads``; while that many are stranded the
            worker claims nothing more. Default: ``concurrency``.
        pool_size: the children of the worker's process pool, started with it when a task
            it serves has ``pool="process"`` (``echomq.runtime.pool``). Default: one per CPU.
        max_jobs: claim at most this many jobs, then stop gracefully (``echomq worker
            --max-jobs-per-child``: the supervisor starts a fresh process). Default: no limit.
    """

    def __init__(
        self,
        app: AppFace,
        queues: list[str] | None = None,
        concurrency: int = 10,
        *,
        beat_ms: int = 1000,
        grace_s: float = 10.0,
        max_stalled: int = 5,
        url: str | None = None,
        hooks: Hooks | None = None,
        max_stranded: int | None = None,
        pool_size: int | None = None,
        max_jobs: int | None = None,
    ) -> None:
        self._slots = Slots(concurrency, self._kick_all)  # checks concurrency
        self.max_stranded = check_limit(concurrency if max_stranded is None else max_stranded)
        # An upper bound: beyond what the protocol carries every sweep call would be refused.
        if isinstance(beat_ms, bool) or not isinstance(beat_ms, int) or beat_ms < 10:
            raise InvalidArgument(f"beat_ms must be an int >= 10, got {beat_ms!r}")
        if isinstance(max_stalled, bool) or not isinstance(max_stalled, int):
            raise InvalidArgument(f"max_stalled must be an int >= 0, got {max_stalled!r}")
        if not 0 <= max_stalled <= MAX_ARG:
            raise InvalidArgument(f"max_stalled must be in [0, {MAX_ARG}], got {max_stalled}")
        if hooks is not None and not isinstance(hooks, Hooks):
            raise InvalidArgument(f"hooks must be an echomq.hooks.Hooks, got {hooks!r}")
        self.app = app
        self.queue_names = list(queues) if queues else app.queues()
        if not self.queue_names:
            raise InvalidArgument("no queues to serve: register a task or pass queues=[...]")
        self.concurrency = concurrency
        self.beat_ms = beat_ms
        self.grace_s = grace_s
        self.max_stalled = max_stalled
        self.url = url
        self.hooks = hooks or Hooks()
        otel = getattr(app, "_otel", None)
        if otel is not None:  # echomq.otel.instrument(app): spans around each run
            self.hooks = otel.hooks().around(self.hooks)
        self.stats = WorkerStats()
        self._strands = Strands(self.max_stranded, self.stats, self._kick_all)
        self._shards = ShardSet(self.queue_names)
        self._loops: list[QueueLoop] = self._shards.loops  # one a shard (runtime.shardset)
        self._background: list[asyncio.Future[Any]] = []
        self._runner = Runner(app, self.hooks, beat_ms)
        self._stopping = False
        self._stop_event: asyncio.Event | None = None
        self._drained: asyncio.Event | None = None
        self._x: AsyncExecutor | None = None
        self._side_tasks: set[asyncio.Future[Any]] = set()
        size = default_size() if pool_size is None else pool_size
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 1024:
            raise InvalidArgument(f"pool_size must be an int in [1, 1024], got {pool_size!r}")
        self.pool_size = size
        self.pool: ProcessPool | None = None
        if max_jobs is not None and (
            isinstance(max_jobs, bool) or not isinstance(max_jobs, int) or max_jobs < 1
        ):
            raise InvalidArgument(f"max_jobs must be an int >= 1, got {max_jobs!r}")
        self.max_jobs = max_jobs
        self._budget = max_jobs  # claims left (None: no limit); turns in flight hold theirs
        pooled = any(t.pool for t in app.tasks.values() if t.queue in self.queue_names)
        # The registry entry (echomq.runtime.worker_registry): written on the beat, never per job.
        self.registry = Registry(
            self.queue_names, concurrency, beat_ms, self.pool_size if pooled else 0
        )
        self.id = self.registry.id
        self._down_since: float | None = None  # the first failed call of an outage
        self.fenced = False  # the version fence passed (a readiness condition)
        # Health probes (echomq.runtime.health.WorkerHealth, --health-port): attached on the loop.
        self.health: WorkerHealth | None = None

    # ------------------------------------------------------------------ entry points

    def run(self) -> WorkerStats:
        """Run until SIGTERM/SIGINT (installs the signal handlers, ``echomq.runtime.signals``);
        returns the stats. The process is the worker's: its garbage collector runs the
        worker's policy meanwhile (``echomq.runtime.gcpolicy``)."""
        with _gcpolicy.serving():
            return asyncio.run(run_with_signals(self))

    def stop(self) -> None:
        """Ask the worker to stop gracefully (safe to call from the loop's thread)."""
        self._stopping = self._runner.stopping = True
        if self._stop_event is not None:
            self._stop_event.set()
        for ql in self._loops:
            ql.idle.set()
        self._kick_all()

    def _kick_all(self) -> None:
        for ql in kick_order(self._loops, self._shards):  # pumps take turns: none starves
            ql.kick.set()

    async def arun(self) -> WorkerStats:
        """Run on the current event loop until :meth:`stop`; returns the stats."""
        began = time.monotonic()
        self._stop_event = asyncio.Event()
        self._drained = asyncio.Event()
        if self._stopping:
            self._stop_event.set()
        if self.health is not None:
            self.health.attach(self)  # stamps from the start: a fence wait is no stall
        url = self.url or self.app.url
        durable = self.app.durable if self.app.durable is not None else parse_url(url)[2]
        executor = resolve_executor(None, url)  # the URL's executor=, else ECHOMQ_EXECUTOR
        client = async_client(url)
        x = self._x = AsyncExecutor(client, owned=True, durable=durable, executor=executor)
        # Room for every slot's thread and every stranded one: a run never waits in the pool
        # behind a hung thread (its timeout and lease would run while it waits).
        threads = ThreadPoolExecutor(
            max_workers=self.concurrency + max(1, self.max_stranded),
            thread_name_prefix="echomq-job",
        )
        try:  # a refused start leaves no connection, thread or child behind either
            fresh = await self._start_up(x, client, threads)
            log_startup(
                log, self.app, self.queue_names, self.concurrency, _redacted_text(url),
                x.executor or "lua",
            )  # fmt: skip
            announce = asyncio.ensure_future(self._supervised(self._announce))
            self._background += [asyncio.ensure_future(self._supervised(self._beat)), announce]
            self._start_loops(fresh)
            await self._stop_event.wait()
            await self._shutdown()
            await cancel_tasks([announce])
            await self._unregister()
            await self.hooks.call("on_shutdown", self)
        finally:
            await cancel_tasks(self._background)
            if self.pool is not None:
                self.pool.close()
            threads.shutdown(wait=False, cancel_futures=True)
            await x.close()
        log.info(
            "%s", stop_line(os.getpid(), self.stats, time.monotonic() - began),
            extra=dataclasses.asdict(self.stats),
        )  # fmt: skip
        return self.stats

    async def _start_up(
        self, x: AsyncExecutor, client: Any, threads: ThreadPoolExecutor
    ) -> list[QueueLoop]:
        """Start-up before the first claim: the fence, the pool, a loop for every shard of
        every queue served, the on_startup hooks. Returns the loops to start."""
        # Refuse a foreign deployment before taking any job.
        await first_fence(x, lambda: self._stopping)
        self.fenced = True
        await name_connections(client, client_name(self.id))  # CLIENT LIST shows them
        self._runner.threads = threads
        self._runner.reads = x  # a workflow step's read of its children's values
        if self.registry.pool:
            self.pool = self._runner.pool = ProcessPool(self.pool_size)
            await self.pool.start(threads)
        fresh = await self._shards.new_loops(x, self.app, self._finish)  # every shard
        await self.hooks.call("on_startup", self)
        return fresh

    def _start_loops(self, loops: list[QueueLoop]) -> None:
        for ql in loops:
            ql.kick.set()
            for fn in (self._pump, self._waker, self._heartbeat):
                self._background.append(asyncio.ensure_future(self._supervised(fn, ql)))

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
                self._kick_all()

    # ------------------------------------------------------------------ the pump

    async def _pump(self, ql: QueueLoop) -> None:
        """Turn finished jobs into settles and free slots into claims: one ``settle`` script
        call per turn, up to two turns in flight, each claiming at most half the slots."""
        while True:
            await ql.kick.wait()
            ql.kick.clear()
            self._fill(ql)

    def _fill(self, ql: QueueLoop) -> None:
        """Send turns while there is something to settle or slots to fill (at most two)."""
        share = max(1, self.concurrency // _TURNS_IN_FLIGHT)
        while len(ql.turns) < _TURNS_IN_FLIGHT:
            want = 0
            # A second claim goes out while one is in flight only when the last claim came
            # back full: an emptying or idle queue gets one claim at a time. A queue held at
            # its queue-wide limit (issue 41) claims with every settle, parked or not, as many
            # jobs as the settle frees room for: the same call takes that room (one round trip
            # a job, as without the limit), and with nothing to settle it claims nothing (no
            # spin at the limit; room others free reaches the parked waker as a wake token).
            ask = 0
            if not self._stopping and not self._strands.at_cap():
                if not ql.idle.is_set() and (ql.full or not ql.turns):
                    ask = share
                elif ql.at_limit and ql.settles:
                    ask = len(ql.settles)
            if ask and (len(self._loops) == 1 or take_turn(ql, self._loops, self._slots.free)):
                if self._budget is None:
                    want = self._slots.acquire(ask)
                else:  # --max-jobs-per-child: never claim past the limit
                    want = self._slots.acquire(min(ask, self._budget))
                    self._budget -= want
            if not ql.settles and want == 0:
                return
            settles, ql.settles = ql.settles, []
            turn = asyncio.ensure_future(self._turn(ql, settles, want))
            ql.turns.add(turn)
            turn.add_done_callback(ql.turn_done)

    async def _turn(self, ql: QueueLoop, settles: list[Settle], want: int) -> None:
        """One settle-and-claim call. It owns ``want`` slots and ``settles`` until it ends:
        on any failure both go back (slots freed, settles re-queued), then it backs off."""
        assert self._x is not None
        if any(s.kind == "pushed" for s in settles):
            # D21 RateLimit: not a settle the batch script knows; each goes on its own call.
            self._push_back(ql, [s for s in settles if s.kind == "pushed"])
            settles = [s for s in settles if s.kind != "pushed"]
        settles, call = ql.checked_call(settles, want)
        try:
            try:
                result = await self._x.call(call)
            except DurabilityError as exc:
                # The write applied (claims included) but too few replicas acknowledged it:
                # run what it claimed rather than let the leases lapse into "stalled".
                if (reply := applied(exc, call)) is None:
                    raise
                result = reply
                log.warning("settle on %s not acknowledged by replicas: %s", ql.keys.name, exc)
        except BaseException as exc:
            self._slots.release(want)
            if self._budget is not None:
                self._budget += want
            ql.settles[:0] = settles
            if isinstance(exc, asyncio.CancelledError):
                raise
            ql.failures += 1
            delay = backoff_delay(ql.failures, base=0.1, cap=2.0)
            if isinstance(exc, _NETWORK_ERRORS):
                self._down()
                warn_repeated(
                    log, f"turn:{ql.keys.name}", "server unreachable (%s); retrying in %.2fs",
                    exc, delay,
                )  # fmt: skip
            else:
                self._fatal_or_log(exc, f"settle/claim failed; retrying in {delay:.2f}s")
            await asyncio.sleep(delay)
            return
        ql.failures = 0
        if self._down_since is not None:
            self._up()
        if want:
            jobs = result.jobs
            ql.full = len(jobs) == want
            ql.at_limit = result.at_limit
            self.stats.claimed += len(jobs)
            for job in jobs:
                self._start(ql, job)
            if self._budget is not None:
                self._budget += want - len(jobs)
                if self._budget == 0 and not self._stopping:
                    log.info("worker %d: claimed its %d jobs; stopping", os.getpid(), self.max_jobs)
                    self.stop()
            if len(jobs) < want:
                ql.idle.set()  # nothing more to claim: park on the wake list
                # The slots this queue did not use go to the other queues' pumps (the release
                # kicks them), which may have found none free while this claim was in flight.
                self._slots.release(want - len(jobs))
        for ms in self.stats.count_call(settles, result, ql.keys.name):
            # A short retry: promoted this long after the reply, when it is due (server clock).
            asyncio.get_running_loop().call_later(ms / 1000, self._promote_soon, ql)

    def _down(self) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()

    def _up(self) -> None:
        """A call went through after an outage: say so once, with how long it lasted."""
        since, self._down_since = self._down_since, None
        if since is not None:
            repeats_reset()  # the next outage's first warnings are written at once
            log.info("server reachable again: reconnected after %.1f s", time.monotonic() - since)

    def _fatal_or_log(self, exc: BaseException, what: str = "claim failed") -> None:
        if isinstance(exc, VersionFenceError):
            log.error("%s", exc)
            self.stop()
        else:
            log.error("%s: %s: %s", what, type(exc).__name__, exc)  # redis-py's repr drops the text

    async def _waker(self, ql: QueueLoop) -> None:
        """Park on the wake list while the queue is empty; claim on a token or a beat."""
        assert self._x is not None
        while True:
            await ql.idle.wait()
            if self._stopping:
                return
            await ql.park(self._x, self.beat_ms)
            ql.idle.clear()
            # Claim from here rather than waking the pump: one event-loop hop less between
            # a producer's wake token and the claim (the enqueue -> start latency).
            self._fill(ql)

    # ------------------------------------------------------------------ one job's bookkeeping

    def _start(self, ql: QueueLoop, job: Job) -> None:
        r = Running(job)
        older = ql.track(r)
        if older is not None:
            # Claimed again while an older run still goes: that run's lease lapsed and was
            # recovered, so its token is stale. It ends without a settle.
            self.stats.lost += 1
            log.warning("job %s: claimed again (token %d); older run lost", job.id, job.token)
            older.lose()
        self._runner.start(ql.keys.name, r, ql.finish)

    def _finish(self, ql: QueueLoop, r: Running, settle: Settle | None) -> None:
        """A run ended (``settle`` None: nothing to settle). Frees its slot at once — even
        for a sync handler still running in its thread (past a timeout, or handed back): that
        thread is stranded (:meth:`_strand`); the pool has room for ``max_stranded`` of them."""
        ql.untrack(r)
        if settle is not None and not r.lost:
            ql.settles.append(settle)
        if r.thread is not None and not r.thread.done():
            task = r.ctx.task if r.ctx is not None else "?"
            self._strands.strand(r.thread, task, r.job.id, r.started)
        self._slots.release()  # kicks every pump: a claim, or this settle, may go out
        if not self._stopping and not ql.inflight and all(t.done() for t in ql.turns):
            # The queue's last run ended and no call is in flight: send its settle (and the
            # next claim) now rather than on the pump's next turn of the event loop. Nothing
            # else of this queue can finish in the meantime to join the call, so this saves
            # a turn of the loop per job at low concurrency and costs no batching. (A run
            # that ends inside a turn, inline, finds that turn not done: the pump sends it.
            # At shutdown the pump alone sends, as it always did.)
            self._fill(ql)
        # At shutdown, the wait for in-flight runs ends with the last of them.
        if self._stopping and not any(q.inflight for q in self._loops) and self._drained:
            self._drained.set()

    def _push_back(self, ql: QueueLoop, pushed: list[Settle]) -> None:
        assert self._x is not None
        fut = asyncio.ensure_future(ql.push_back(self._x, pushed, self.stats))
        self._side_tasks.add(fut)
        fut.add_done_callback(self._side_tasks.discard)

    def _promote_soon(self, ql: QueueLoop) -> None:
        if self._x is not None and not self._stopping:  # best effort: the beat promotes too
            fut = asyncio.ensure_future(quiet(self._x.call(_p.promote(ql.keys, 1000))))
            self._side_tasks.add(fut)
            fut.add_done_callback(self._side_tasks.discard)

    # ------------------------------------------------------------------ heartbeat and beat

    async def _heartbeat(self, ql: QueueLoop) -> None:
        """Extend every in-flight lease of the queue in one call, every lease/3 — and at
        once when the queue's count of signalled cancels moves (D22), polled every
        _CANCEL_POLL_S while the queue holds jobs (an idle worker does not poll)."""
        assert self._x is not None
        loop = asyncio.get_running_loop()
        every = ql.lease_ms / 3000
        step = min(every, _CANCEL_POLL_S)
        seen: int | None = None  # the count at the last poll; None: never read
        due = loop.time() + every
        while True:
            await asyncio.sleep(step)
            # Half a step of slack: a sleep may end a hair early, and an extend a little
            # early is harmless while one a whole step late eats into the lease.
            if loop.time() < due - step / 2:
                if not ql.inflight:
                    continue
                try:
                    count = await self._x.call(_ctl.cancels_signalled(ql.keys))
                except Exception:  # the extend at `due` reports the failure
                    continue
                moved, seen = count != seen, count
                if not moved:
                    continue
            due = loop.time() + every
            try:
                lost = await ql.extend(self._x)
            except Exception as exc:
                warn_repeated(
                    log, f"heartbeat:{ql.keys.name}", "heartbeat failed (%s); leases may lapse",
                    exc,
                )  # fmt: skip
                continue
            for r in lost:
                # Someone else owns the job now (our lease lapsed and was recovered):
                # cancel cooperatively and never settle it.
                self.stats.lost += 1
                r.lose()
                log.warning("job %s: lease lost; cancelled without settling", r.job.id)

    async def _beat(self) -> None:
        """The sweeps any worker may run: promote due jobs, recover lapsed leases."""
        assert self._x is not None
        while not self._stopping:
            if self._shards.due():  # a shard added since (growth): served from now on
                with contextlib.suppress(Exception):  # logged: read again on a later beat
                    self._start_loops(await self._shards.new_loops(self._x, self.app, self._finish))
            for ql in list(self._loops):
                try:
                    # Promote, the stall sweep, due repeats (D19) and the flow outbox (D18):
                    # one round trip when there is nothing to do; each occurrence is enqueued
                    # once, each outbox entry applied once, however many workers beat.
                    recovered, dead = await ql.sweep(self._x, self.max_stalled)
                    if self._down_since is not None:
                        self._up()
                    self.stats.recovered += recovered
                    self.stats.swept_dead += dead
                    if recovered or dead:
                        log.info(
                            "sweep of %s: %d recovered, %d dead", ql.keys.name, recovered, dead
                        )
                except _NETWORK_ERRORS as exc:
                    self._down()
                    warn_repeated(log, f"sweep:{ql.keys.name}", "sweep failed (%s)", exc)
                except Exception as exc:
                    self._fatal_or_log(exc, "sweep failed")
            await asyncio.sleep(self.beat_ms / 1000)

    async def _announce(self) -> None:
        """The worker's registry entries, renewed every beat
        (``echomq.runtime.worker_registry``)."""
        assert self._x is not None
        while True:
            try:
                await self.registry.beat(self._x, self._loops)
            except _NETWORK_ERRORS as exc:
                # An outage: one warning, then the rate-limited repeats (as the sweep's).
                self._down()
                warn_repeated(log, "registry", "registry beat failed (%s)", exc)
            except Exception as exc:
                log.warning("registry beat failed (%s)", exc)
            await asyncio.sleep(self.beat_ms / 1000)

    async def _unregister(self) -> None:
        assert self._x is not None
        try:
            await self.registry.gone(self._x, self._loops)
        except Exception as exc:
            log.warning("could not remove the registry entries (%s); they will lapse", exc)

    # ------------------------------------------------------------------ shutdown

    async def _shutdown(self) -> None:
        assert self._x is not None and self._drained is not None
        for ql in self._loops:
            ql.idle.set()
        self._kick_all()
        # Claims already in flight may still bring jobs: they must be in inflight before we
        # decide what to wait for and what to hand back.
        await self._await_turns()
        if any(ql.inflight for ql in self._loops):
            self._drained.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._drained.wait(), self.grace_s)
        for ql in self._loops:
            self.stats.handed_back += await ql.hand_back_at_exit(self._x)
        await self._flush_settles()

    async def _await_turns(self) -> None:
        turns = [t for ql in self._loops for t in ql.turns]
        if turns:
            await asyncio.gather(*turns, return_exceptions=True)

    async def _flush_settles(self) -> None:
        """The last settles, with no claim; a failed turn re-queues them, for ~10 s at most."""
        deadline = asyncio.get_running_loop().time() + DEFAULT_RETRY_FOR
        while asyncio.get_running_loop().time() < deadline:
            await self._await_turns()
            if not any(ql.settles for ql in self._loops):
                return
            for ql in self._loops:
                settles, ql.settles = ql.settles, []
                if settles:
                    await self._turn(ql, settles, 0)
