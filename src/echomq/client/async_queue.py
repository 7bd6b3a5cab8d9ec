"""AsyncQueue, by hand: the source scripts/gen-sync derives Queue from.

``AsyncQueue``: one-line forwarders over the sans-I/O core in ``protocol.calls``, and the
source ``scripts/gen-sync`` derives ``Queue`` (``client/sync_queue.py``) from.

Every verb validates, builds keys and decodes in ``protocol.calls``; this class only runs the
result with ``await``. The event, metric, repeat and flow verbs are its base class's
(``client/async_flows.py``, its twin generated the same way). What differs in the sync twin
is marked here (``# sync:``, ``# async-only``, ``# sync-only:``); a parity test checks both
classes expose the same verbs with the same signatures.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType
from typing import Any

from echomq import keyspace
from echomq.client.async_flows import AsyncFlowVerbs
from echomq.client.autopipe import AutoPipe  # async-only
from echomq.client.connect import (
    DEFAULT_RETRY_FOR,
    AsyncClient,
    async_client,
    resolve_url,
)
from echomq.client.executor import AsyncExecutor
from echomq.client.native import resolve_executor
from echomq.client.queueopts import durable_replicas, replay_ms
from echomq.client.renamed import renamed, respelled
from echomq.client.shardkit import SHARDED
from echomq.client.shards import _check
from echomq.client.waiters import ResultWaiters  # async-only
from echomq.errors import EchoMQError, InvalidArgument, JobGone, StateError
from echomq.protocol import calls as _p
from echomq.protocol import control as _ctl
from echomq.protocol import kernel as _k
from echomq.protocol import registry as _reg
from echomq.protocol.joboptions import JobOptions, job_options
from echomq.protocol.kernel import (
    DEFAULT_MAX_PAYLOAD,
    Completed,
    Enqueued,
    Job,
    Retried,
    Settled,
    _seen,
)

__all__ = ["AsyncQueue"]


class AsyncQueue(AsyncFlowVerbs):
    """A queue on an asyncio client: ``AsyncQueue("orders", url=...)`` or ``client=...``.

    Args:
        name: the queue name (``[A-Za-z0-9._-]{1,128}``, not ``emq``).
        url: a ``redis://``/``rediss://``/``unix://`` URL; default: ``ECHOMQ_URL``, else a
            live ``echomq server`` recorded in the nearest ``.echomq/`` at or above the current
            directory, else ``redis://127.0.0.1:6379/0``
            (the same resolution as ``App``).
        client: a redis-py client (``redis.Redis``/``RedisCluster``, or their ``redis.asyncio``
            forms on an asyncio client; bytes replies); not closed by ``aclose``.
        max_payload: the largest payload in bytes (default 16 MiB); larger raises
            ``PayloadTooLarge`` before any write.
        retry_for: seconds a call may ride out a lost connection (a restart, a failover):
            calls that are safe to send twice are resent with backoff, an enqueue resends its
            own id; settles, remove, reprocess and add_log are never resent.
        durable: replicas that must acknowledge every write (enqueue, settle, ...) before it
            returns (WAIT on the connection that wrote); ``DurabilityError`` when fewer do in
            time. Default: the URL's ``durable=`` option, else 0 (off).
        executor: ``"auto"``, ``"lua"`` or ``"native"``: who runs the transitions that have
            a twin in the trafikey server module. ``auto`` uses the module when every
            primary loads it (read once, at the first connect), else Lua; ``native``
            raises ``ExecutorUnavailable`` at the first call on a server without it.
            Default: the URL's ``executor=`` option, else ``ECHOMQ_EXECUTOR``, else auto.
        shards: N > 1 returns a sharded queue of at least N shards (API.md "Sharded queues").
    """

    def __new__(cls, name: str = "", *args: Any, shards: int | None = None, **kw: Any) -> Any:
        # shards=N > 1: the sharded twin, registered by client/async_sharded.py (no import
        # cycle: echomq.queue imports both before any queue is made).
        if shards is None or cls not in SHARDED or _check(name, shards) == 1:
            return super().__new__(cls)
        return super().__new__(SHARDED[cls])

    def __init__(
        self,
        name: str,
        *,
        url: str | None = None,
        client: AsyncClient | None = None,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        retry_for: float = DEFAULT_RETRY_FOR,
        durable: int | None = None,
        executor: str | None = None,
        shards: int | None = None,
    ) -> None:
        self._k = _p.Keys(name, max_payload)
        if client is not None and url is not None:
            raise InvalidArgument("pass url or client, not both")
        owned = client is None
        if client is None:
            # The one resolution every entry point shares (see echomq.client.connect.resolve_url).
            url = resolve_url(url).url
        replicas = durable_replicas(url, durable)
        mode = resolve_executor(executor, url)  # checked before any client exists
        if client is None:
            client = async_client(url)  # sync: client = sync_client(url, retry_for)
        self._x = AsyncExecutor(
            client,
            owned=owned,
            retry_for=retry_for,
            durable=replicas,
            executor=mode,
        )
        # One pipeline write per loop turn for concurrent enqueues (_autopipe).  # async-only
        self._pipe = AutoPipe(self._x)  # async-only
        self._waiters: ResultWaiters | None = None  # async-only

    @property
    def name(self) -> str:
        """The queue name."""
        return self._k.name

    @property
    def client(self) -> AsyncClient:
        """The redis-py client this queue runs on."""
        return self._x.client

    @property
    def executor(self) -> str | None:
        """``"lua"`` or ``"native"``: the executor serving this queue, decided at the first
        call (None before it)."""
        return self._x.executor

    async def aclose(self) -> None:
        """Close the client if this queue created it."""
        if self._waiters is not None:  # async-only
            await self._waiters.close()  # async-only
        await self._x.close()

    async def __aenter__(self) -> AsyncQueue:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncQueue({self.name!r})"

    async def enqueue(
        self,
        payload: bytes | str,
        *,
        id: str | None = None,
        group: str | None = None,
        delay_ms: int | None = None,
        at_ms: int | None = None,
        dedup: str | None = None,
        dedup_ttl_ms: int | None = None,
        dedup_mode: str = "simple",
        priority: int = 0,
        ttl_ms: int | None = None,
        keep_logs: int | None = None,
    ) -> Enqueued:
        """Enqueue one job: idempotent by ``id``; ``group`` is a lane; delay_ms/at_ms schedule.
        ``dedup``: a dedup id (D20; ``dedup_mode`` simple, throttle or debounce, the last two
        with ``dedup_ttl_ms``): a refused enqueue answers ``deduplicated`` with the holder's id.
        ``priority``: 0..2**21, lower runs first (FIFO within one priority).
        ``ttl_ms``: not claimed within that long (server clock), the job is dead-lettered
        ``expired`` by the claim that meets it. ``keep_logs``: the job keeps its newest
        ``keep_logs`` log lines (``add_log`` trims to it unless it names its own ``keep``)."""
        opts = job_options(
            delay_ms,
            at_ms,
            group,
            id,
            dedup,
            dedup_ttl_ms,
            dedup_mode,
            priority,
            ttl_ms,
            keep_logs=keep_logs,
        )
        return await self._enqueue_job(payload, opts)

    async def _enqueue_job(self, payload: bytes | str, opts: JobOptions) -> Enqueued:
        """``enqueue`` with the job's options as one checked record (``Task.options``)."""
        return await self._pipe.run(  # sync: return self._x.run(
            _p.enqueue(
                self._k,
                payload,
                opts,
                replay_ms=replay_ms(self._x.retry_for),
                minter=self._x.minter,
            )
        )

    async def enqueue_many(
        self,
        items: Iterable[bytes | str | tuple[str, bytes | str]],
        *,
        group: str | None = None,
        delay_ms: int | None = None,
        at_ms: int | None = None,
        priority: int = 0,
        ttl_ms: int | None = None,
        keep_logs: int | None = None,
    ) -> list[Enqueued | EchoMQError]:
        """Enqueue many jobs in few round trips; one verdict per item, in input order.
        ``priority``: one priority for every job (0..2**21, lower runs first); ``ttl_ms``
        and ``keep_logs``: every job's expiry and log bound, as ``enqueue``."""
        opts = job_options(
            delay_ms,
            at_ms,
            group,
            None,
            None,
            None,
            "simple",
            priority,
            ttl_ms,
            keep_logs=keep_logs,
        )
        return await self._enqueue_many_job(items, opts)

    async def _enqueue_many_job(
        self, items: Iterable[bytes | str | tuple[str, bytes | str]], opts: JobOptions
    ) -> list[Enqueued | EchoMQError]:
        """``enqueue_many`` with every job's options as one checked record (``Task``)."""
        return await self._x.run(
            _p.enqueue_many(
                self._k, items, opts, replay_ms=replay_ms(self._x.retry_for), minter=self._x.minter
            )
        )

    async def claim(self, *, lease_ms: int = 30_000) -> Job | None:
        """Lease the next job (flat set and lanes served fairly); None when none is claimable."""
        return await self._x.run(_p.claim(self._k, lease_ms))

    async def claim_batch(self, n: int, *, lease_ms: int = 30_000) -> list[Job]:
        """Lease up to ``n`` jobs on one shared lease, lanes served fairly."""
        return await self._x.run(_p.claim_batch(self._k, n, lease_ms))

    async def complete(
        self,
        id: str,
        token: int,
        *,
        result: bytes | str | None = None,
        keep_result_ms: int = 0,
    ) -> None:
        """Settle a held job as done (deletes its row); refuses a stale token.
        ``keep_result_ms > 0`` keeps ``result`` that long for ``result``/``wait`` (D17)."""
        return await self._x.run(_p.complete(self._k, id, token, result, keep_result_ms))

    async def complete_many(self, pairs: Iterable[tuple[str, int]]) -> list[str]:
        """Complete many held jobs in one call; returns the ids refused (gone or stale)."""
        return await self._x.run(_p.complete_many(self._k, pairs))

    async def settle(
        self,
        *,
        completed: Iterable[Completed | tuple[Any, ...]] = (),
        retried: Iterable[Retried | tuple[Any, ...]] = (),
        n: int = 0,
        lease_ms: int = 30_000,
    ) -> Settled:
        """Complete and retry finished jobs and claim up to ``n`` more in one round trip."""
        return await self._x.run(_p.settle(self._k, completed, retried, n, lease_ms))

    async def retry(
        self,
        id: str,
        token: int,
        *,
        delay_ms: int,
        max_attempts: int,
        error: str,
        keep_result_ms: int = 0,
    ) -> str:
        """Settle a failed attempt: ``'scheduled'`` for another try, ``'dead'`` at the ceiling
        (``keep_result_ms > 0``: the dead-letter keeps its error that long, D17)."""
        return await self._x.run(
            _p.retry(
                self._k,
                id,
                token,
                delay_ms=delay_ms,
                max_attempts=max_attempts,
                error=error,
                keep_result_ms=keep_result_ms,
            )
        )

    async def delay(self, id: str, token: int, delay_ms: int) -> None:
        """Release a held job without minting; ``delay_ms=0`` returns it to pending at once.
        The run still counts against ``max_attempts`` (a shutdown's hand-back and
        ``RateLimit`` use ``push_back``, which does not count it)."""
        return await self._x.run(_p.delay(self._k, id, token, delay_ms))

    async def extend(self, id: str, token: int, *, lease_ms: int) -> None:
        """Push a held lease to now + ``lease_ms`` (server clock)."""
        return await self._x.run(_p.extend(self._k, id, token, lease_ms))

    async def extend_many(self, pairs: Iterable[tuple[str, int]], *, lease_ms: int) -> list[str]:
        """Extend many leases in one call; returns the ids that failed (gone, stale or settled)."""
        return await self._x.run(_p.extend_many(self._k, pairs, lease_ms))

    async def promote(self, limit: int = 100) -> int:
        """Move due scheduled jobs to pending; returns how many."""
        return await self._x.run(_p.promote(self._k, limit))

    async def reap(self, limit: int = 100) -> int:
        """Return lapsed leases to pending; returns how many."""
        return await self._x.run(_p.reap(self._k, limit))

    async def sweep_stalled(
        self, *, max_stalled: int = 1, limit: int = 100
    ) -> tuple[list[str], list[str]]:
        """The counted stall sweep: ``(recovered, dead)`` ids."""
        return await self._x.run(_p.sweep_stalled(self._k, max_stalled, limit))

    async def reprocess(
        self, id: str, *, delay_ms: int | None = None, at_ms: int | None = None
    ) -> None:
        """Run a dead or kept completed job again (a new incarnation): waiting now (its lane
        when grouped), or scheduled after ``delay_ms`` / at ``at_ms``. A live job (pending,
        active, scheduled) raises StateError, a missing one JobGone; nothing is written."""
        return await self._x.run(_p.reprocess(self._k, id, delay_ms, at_ms))

    async def reprocess_all(
        self, state: str = "dead", *, delay_ms: int | None = None, at_ms: int | None = None
    ) -> int:
        """Reprocess every job of ``state`` (``dead`` or ``completed``), with the options of
        ``reprocess``; returns how many this call moved (each once: a job that dies again
        meanwhile is not taken a second time; one moved or removed by someone else is skipped)."""
        if state not in ("dead", "completed"):
            raise InvalidArgument(f"reprocess_all takes dead or completed, got {state!r}")
        _k._when(delay_ms, at_ms)  # the options are refused before any I/O
        seen: set[str] = set()
        moved = 0
        while batch := [j for j in await self.browse(state, 1000) if j not in seen]:
            for job_id in batch:
                seen.add(job_id)
                try:
                    await self.reprocess(job_id, delay_ms=delay_ms, at_ms=at_ms)
                except (JobGone, StateError):
                    continue
                moved += 1
        return moved

    async def keep_completed(self, count: int | None, age_ms: int | None = None) -> None:
        """Keep completed jobs' rows (state ``completed``), at most ``count`` and none older
        than ``age_ms`` (finish time, server clock), trimmed by the completing script.
        ``count=0`` or ``(None, None)`` turns it off (the default: completion deletes)."""
        return await self._x.run(_p.keep_completed(self._k, count, age_ms))

    async def keep_dead(self, count: int | None, age_ms: int | None = None) -> None:
        """Bound the dead set to ``count`` rows and none dead longer than ``age_ms`` (time of
        death, server clock), the longest dead going first, trimmed by every script that
        dead-letters; both None: unbounded (the default)."""
        return await self._x.run(_p.keep_dead(self._k, count, age_ms))

    async def remove(
        self,
        id: str,
        *,
        children: bool = True,
        if_state: str | None = None,
        if_attempts: int | None = None,
    ) -> None:
        """Delete a job wherever it is; a flow parent's waiting descendants go with it
        (``children=False``: the job alone). ``if_state`` (and ``if_attempts``): only while
        the job is still where the caller saw it; ``StateError`` ("moved") otherwise,
        nothing written."""
        seen = _seen(if_state, if_attempts)
        return await self._x.run(_p.remove(self._k, id, children, seen))

    async def change_priority(self, id: str, priority: int) -> None:
        """Set a waiting or scheduled job's priority (0..2**21, lower runs first). StateError
        for any other state (active, dead, a flow parent awaiting), JobGone with no row."""
        return await self._x.run(_p.change_priority(self._k, id, priority))

    async def run_now(self, id: str) -> None:
        """Make a scheduled job waiting now (its lane when grouped), whatever its run time.
        ``StateError`` when it is not scheduled, ``JobGone`` when there is no such job."""
        return await self._x.run(_p.run_now(self._k, id))

    async def reschedule(
        self, id: str, delay_ms: int | None = None, *, at_ms: int | None = None
    ) -> None:
        """Change a scheduled job's run time: now + ``delay_ms`` (server clock) or ``at_ms``;
        ``StateError`` when it is not scheduled, ``JobGone`` when there is no such job."""
        return await self._x.run(_p.reschedule(self._k, id, delay_ms, at_ms=at_ms))

    async def update_payload(self, id: str, payload: bytes | str) -> None:
        """Replace a waiting or scheduled job's payload (``PayloadTooLarge`` as enqueue);
        ``StateError`` for an active, dead or held job, ``JobGone`` when there is none."""
        return await self._x.run(_p.update_payload(self._k, id, payload))

    async def browse(
        self, state: str = "pending", n: int = 50, *, group: str | None = None
    ) -> list[str]:
        """Up to ``n`` ids in ``state``, newest first (``"schedule"``: deprecated, say
        ``"scheduled"``)."""
        state = respelled("browse", "state", state, "schedule", "scheduled")
        return await self._x.run(_p.browse(self._k, state, n, group))

    async def pending_size(self) -> int:
        """The size of the flat pending set (lanes not included)."""
        return await self._x.run(_p.pending_size(self._k))

    async def counts(self) -> dict[str, int]:
        """pending (flat + lanes), active, schedule, dead, completed, failed (the all-time
        counters), kept (kept completed rows, ``keep_completed``)."""
        return await self._x.run(_p.counts(self._k))

    async def check(self) -> list[str]:
        """The consistency checker (D6): one line per violation, ``[]`` when sound."""
        return await self._x.run(_p.check(self._k))

    async def get_job(self, id: str) -> dict[str, str | bytes] | None:
        """The job's row, or None when it does not exist."""
        return await self._x.run(_p.get_job(self._k, id))

    async def job_state(self, id: str) -> str:
        """Where the job is: pending, active, scheduled, dead, ... or absent."""
        return await self._x.run(_p.job_state(self._k, id))

    async def pause(self) -> None:
        """Stop all claims of this queue."""
        return await self._x.run(_p.pause(self._k))

    async def resume(self) -> None:
        """Let claims through again."""
        return await self._x.run(_p.resume(self._k))

    async def is_paused(self) -> bool:
        """Whether the queue is paused."""
        return await self._x.run(_p.is_paused(self._k))

    @renamed(g="lane")
    async def pause_lane(self, lane: str) -> None:
        """Stop serving the lane ``lane``."""
        return await self._x.run(_p.pause_lane(self._k, lane))

    @renamed(g="lane")
    async def resume_lane(self, lane: str) -> None:
        """Serve the lane ``lane`` again."""
        return await self._x.run(_p.resume_lane(self._k, lane))

    async def limit(self, n: int | None) -> None:
        """At most ``n`` jobs of the queue active at once across every worker, lanes included
        (None removes the limit); claims past it take nothing."""
        return await self._x.run(_p.limit(self._k, n))

    async def get_limit(self) -> int | None:
        """The queue-wide concurrency limit, or None."""
        return await self._x.run(_p.get_limit(self._k))

    @renamed(g="lane")
    async def limit_lane(self, lane: str, n: int | None) -> None:
        """Cap the lane ``lane``'s jobs in active at ``n`` (None removes the cap)."""
        return await self._x.run(_p.limit_lane(self._k, lane, n))

    @renamed(g="lane")
    async def weight_lane(self, lane: str, w: int) -> None:
        """The lane ``lane``'s fair share (default 1)."""
        return await self._x.run(_p.weight_lane(self._k, lane, w))

    @renamed(g="lane")
    async def reassign(self, id: str, lane: str) -> str:
        """Move a waiting job to the lane ``lane``: ``'reassigned'`` or ``'noop'``."""
        return await self._x.run(_p.reassign(self._k, id, lane))

    @renamed(g="lane")
    async def lane_depth(self, lane: str) -> int:
        """How many jobs wait in the lane ``lane``."""
        return await self._x.run(_p.lane_depth(self._k, lane))

    async def lanes(self) -> list[str]:
        """Every lane holding at least one waiting job."""
        return await self._x.run(_p.lanes(self._k))

    async def workers(self) -> list[_reg.WorkerInfo]:
        """The live worker processes serving this queue (the registry, renewed on their
        beat): host, pid, supervisor, concurrency, the jobs each holds now, ..."""
        return await self._x.run(_reg.list_workers(self._k))

    @renamed(include_schedule="include_scheduled")
    async def drain(self, *, include_scheduled: bool = False) -> int:
        """Delete the waiting jobs (flat and lanes), and the scheduled ones with
        ``include_scheduled``; returns how many."""
        return await self._x.run(_p.drain(self._k, include_scheduled))

    async def obliterate(self, *, force: bool = False) -> None:
        """Delete every key of this (paused) queue."""
        return await self._x.run(_p.obliterate(self._k, force))

    async def update_progress(self, id: str, value: str) -> None:
        """Set the job's progress and publish a progress event."""
        return await self._x.run(_p.update_progress(self._k, id, value))

    async def add_log(self, id: str, line: str, *, keep: int | None = None) -> int:
        """Append a log line; returns how many lines are kept. ``keep``: keep the newest
        ``keep`` lines (0: all); None: the job's ``keep_logs`` (all when it has none)."""
        return await self._x.run(_p.add_log(self._k, id, line, keep))

    async def clear_logs(self, id: str, *, keep: int = 0) -> int:
        """Drop the job's log lines, keeping the newest ``keep`` (0: all go); returns how
        many were removed."""
        return await self._x.run(_p.clear_logs(self._k, id, keep))

    async def logs(self, id: str) -> list[bytes]:
        """The job's log lines, oldest first."""
        return await self._x.run(_p.logs(self._k, id))

    async def errors(self, id: str) -> list[str]:
        """The errors of the job's failed attempts, oldest first (the last 10)."""
        return await self._x.run(_p.errors(self._k, id))

    # -- results, dedup, cancel (D17, D20, D22): see echomq.protocol.control for the keys' layout

    async def result(self, id: str) -> _ctl.Result | None:
        """The job's kept outcome (``complete(..., keep_result_ms=)``), or None."""
        return await self._x.run(_ctl.result(self._k, id))

    async def wait(self, id: str, *, timeout_s: float) -> _ctl.Result:
        """Block until the job's kept outcome exists (woken by the settle, never polling);
        ``JobFailed`` for a kept dead-letter, ``TimeoutError`` at the deadline."""
        # One reader multiplexes this queue's waiters (_waiters).  # async-only
        if self._waiters is None:  # async-only
            self._waiters = ResultWaiters(self._x, self._k)  # async-only
        return await self._waiters.wait(id, timeout_s)  # async-only
        # sync-only: deadline = _ctl.wait_deadline(timeout_s)
        # sync-only: return self._x.run(_ctl.wait(self._k, id, timeout_s), deadline=deadline)

    async def dedup_holder(self, dedup: str) -> str | None:
        """The id of the job holding the dedup id, or None when it is free."""
        return await self._x.run(_ctl.dedup_holder(self._k, dedup))

    async def cancel(
        self,
        id: str,
        *,
        remove: bool = False,
        if_state: str | None = None,
        if_attempts: int | None = None,
    ) -> str:
        """``"removed"`` (it was waiting or scheduled), ``"signalled"`` (active: its holder's
        next heartbeat stops it and dead-letters it as "cancelled", or removes it with
        ``remove=True``) or ``"absent"``. ``if_state`` (and ``if_attempts``): only while the
        job is still where the caller saw it; ``StateError`` ("moved") otherwise."""
        seen = _seen(if_state, if_attempts)
        return await self._x.run(_ctl.cancel(self._k, id, remove, seen))

    async def cancel_all(self) -> dict[str, int]:
        """Cancel every waiting and scheduled job (removed) and signal every active one, as
        ``cancel`` does per job, in bounded script calls; ``{"removed", "signalled"}``."""
        return await self._x.run(_ctl.cancel_all(self._k))

    async def extend_leases(
        self, pairs: Iterable[tuple[str, int]], *, lease_ms: int
    ) -> tuple[list[str], list[str]]:
        """``extend_many`` that also reports the extended jobs whose cancel flag is set:
        ``(failed ids, cancelled ids)``."""
        return await self._x.run(_ctl.extend_leases(self._k, pairs, lease_ms))

    async def rate_limit(self, max: int, window_ms: int) -> None:
        """At most ``max`` claims per ``window_ms`` for the whole queue (lanes included)."""
        return await self._x.run(_ctl.rate_limit(self._k, max, window_ms))

    @renamed(g="lane")
    async def rate_limit_lane(self, lane: str, max: int, window_ms: int) -> None:
        """At most ``max`` claims per ``window_ms`` from the lane ``lane``; a spent lane leaves
        the ring until its window reopens, so the other lanes keep being served."""
        # A lane verb: None is a bad lane here, not "the whole queue" (that is rate_limit).
        return await self._x.run(
            _ctl.rate_limit(self._k, max, window_ms, keyspace.check_lane(lane))
        )

    @renamed(g="lane")
    async def clear_rate_limit(self, lane: str | None = None) -> None:
        """Remove the queue-wide limit, or the lane ``lane``'s."""
        return await self._x.run(_ctl.clear_rate_limit(self._k, lane))

    @renamed(g="lane")
    async def rate_limit_ttl(self, lane: str | None = None) -> int:
        """The ms until the spent window (queue-wide, or the lane ``lane``'s) reopens; 0 = open."""
        return await self._x.run(_ctl.rate_limit_ttl(self._k, lane))
