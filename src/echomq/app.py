"""App: the tasks, their queues and server, @app.task, @app.periodic.

The application layer: ``App`` (the tasks, their queues and the server they run on),
``@app.task`` and ``@app.periodic``, flows of tasks, and kept-history settings for an app's
queues.

The task objects live in ``echomq.tasks.task`` (``Task``, ``Signature``, ``TaskEnqueued``), the
argument binding in ``echomq.tasks.binding``, the handler's outcomes (``Retry``, ``Discard``,
``RateLimit``) in ``echomq.outcomes``, and ``current_job``/``JobContext`` in
``echomq.context``; this module re-exports them. A task call travels as one payload, the
task envelope (``echomq.protocol.envelope``), encoded by the app's serializer
(JSON by default, never pickle): the queue below sees only opaque bytes.
"""

from __future__ import annotations

import asyncio
import re
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, overload

from echomq import keyspace
from echomq.backoff import BackoffLike, exponential, resolve_backoff
from echomq.client import native as _native
from echomq.client.connect import (
    AsyncClient,
    Resolved,
    SyncClient,
    async_client,
    parse_url,
    resolve_url,
    sync_client,
)
from echomq.client.shardkit import app_shards, task_rate
from echomq.context import JobContext, current_job
from echomq.errors import (
    EchoMQError,
    InvalidArgument,
    JobFailed,
    ResultNotKept,
    ResultNotReady,
)
from echomq.outcomes import Discard, RateLimit, Retry
from echomq.protocol import calls as _p
from echomq.protocol import compose as _compose
from echomq.protocol import control as _ctl
from echomq.protocol import repeats as _repeats
from echomq.protocol.kernel import Keys, Plan
from echomq.queue import AsyncQueue, AsyncShardedQueue, Queue, ShardedQueue
from echomq.serializers import Serializer, resolve_serializer
from echomq.tasks import batches as _batches
from echomq.tasks.batches import Batch
from echomq.tasks.task import P, R, Task, TaskEnqueued, TaskFlow
from echomq.tasks.workflows import DEFAULT_KEEP_MS, Chain, Chord, Group, Signature

__all__ = [
    "App",
    "Discard",
    "JobContext",
    "RateLimit",
    "Retry",
    "Task",
    "TaskEnqueued",
    "current_job",
]


@dataclass(frozen=True, slots=True)
class Periodic:
    """A task that runs on a schedule (``@app.periodic``): the repeat ``name`` on the task's
    queue, and the call (``args``/``kwargs``) each occurrence makes."""

    task: Task[Any, Any]
    name: str
    every_ms: int | None
    cron: str | None
    tz: str
    group: str | None
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    limit: int | None = None  # issue 24: at most that many fires
    until_ms: int | None = None  # issue 24: no fire due after it


_NOT_NAME = re.compile(r"[^A-Za-z0-9._-]")


def _keep_pair(
    name: str,
    keep: int | tuple[int | None, int | None] | None,
) -> tuple[int | None, int | None] | None:
    """App(keep_completed=... / keep_dead=...) as (count, age_ms), checked now (a bad value
    is refused when the app is built, not when a worker starts)."""
    if keep is None:
        return None
    pair = keep if isinstance(keep, tuple) else (keep, None)
    if len(pair) != 2:
        raise InvalidArgument(f"{name} is a count or (count, age_ms), got {keep!r}")
    (_p.keep_completed if name == "keep_completed" else _p.keep_dead)(Keys("x"), *pair)
    return pair


class App:
    """Tasks, their queues, and the server they run on.

    Args:
        url: the server; when None, ``ECHOMQ_URL``, then an ``echomq server`` recorded in
            the nearest ``.echomq/`` at or above the current directory, then
            ``redis://127.0.0.1:6379/0``.
        client: a ready sync client instead of a URL (not closed by the app).
        serializer: "json" (default), "msgpack", or an object with dumps/loads.
        max_payload: the largest payload in bytes (default 16 MiB).
        durable: replicas that must acknowledge every write (default: the URL's
            ``durable=`` option, else 0); see :class:`~echomq.Queue`.
        name: the app's name, which owns its ``@app.periodic`` registrations: a worker
            removes the repeats this name registered that the app no longer declares
            (give apps that share a queue different names).
        keep_completed: kept history for every queue of the app's tasks, set when a worker
            starts: a count (``10_000``: keep the last 10,000 completed jobs), or
            ``(count, age_ms)`` (either may be None); ``0`` turns it off. None (the default)
            leaves each queue's own setting alone (``Queue.keep_completed``).
        keep_dead: the same for the dead set's bound: a count, or ``(count, age_ms)`` (how
            long a dead job is kept, from its death); None leaves it alone.
        shards: sharded queues by name (``{"orders": 4}``): the app's ``queue("orders")``
            is ``Queue("orders", shards=4)``, so its tasks' jobs spread over the shards
            (docs/API.md, "Sharded queues").
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        client: SyncClient | None = None,
        serializer: str | Serializer = "json",
        max_payload: int | None = None,
        durable: int | None = None,
        name: str = "app",
        keep_completed: int | tuple[int | None, int | None] | None = None,
        keep_dead: int | tuple[int | None, int | None] | None = None,
        shards: Mapping[str, int] | None = None,
    ) -> None:
        self.name = keyspace.check_lane(name)
        self.keep_completed = _keep_pair("keep_completed", keep_completed)
        self.keep_dead = _keep_pair("keep_dead", keep_dead)
        self.shards = app_shards(shards)
        self.periodics: dict[tuple[str, str], Periodic] = {}
        self._url = url  # App(url=...): step 2 of echomq.client.connect.resolve_url
        self._resolved: Resolved | None = None
        self._client = client
        self._owns_client = False
        self.serializer = resolve_serializer(serializer)
        self.max_payload = max_payload
        self.durable = durable
        self.tasks: dict[str, Task[Any, Any]] = {}
        self._queues: dict[str, Queue] = {}
        # echomq.otel.instrument(app) sets it; None (the default) means no tracing at all.
        self._otel: Any = None
        # An asyncio client belongs to the loop that opened its connections: one per loop.
        self._aclients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncClient] = (
            weakref.WeakKeyDictionary()
        )
        self._aqueues: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[str, AsyncQueue]
        ] = weakref.WeakKeyDictionary()

    @property
    def url(self) -> str:
        """The server URL, resolved once on first use as :func:`echomq.client.connect.resolve_url`
        does for every entry point: ``App(url=...)``, ``ECHOMQ_URL``, a live recorded
        ``echomq server``, the local default. No network I/O."""
        if self._resolved is None:
            self._resolved = resolve_url(None, self._url)
        return self._resolved.url

    @url.setter
    def url(self, value: str) -> None:
        if self._queues or self._owns_client:
            raise EchoMQError("the app already has open queues; set url before first use")
        self._url = value
        self._resolved = None

    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        max_attempts: int = 3,
        backoff: BackoffLike | None = None,
        lease_ms: int = 30_000,
        timeout: float | None = None,
        inline: bool = False,
        keep_result_ms: int = 0,
        rate_limit: tuple[int, int] | None = None,
        isolate: bool = False,
        pool: str | None = None,
        priority: int = 0,
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    def task(
        self,
        fn: Callable[P, R] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        max_attempts: int = 3,
        backoff: BackoffLike | None = None,
        lease_ms: int = 30_000,
        timeout: float | None = None,
        inline: bool = False,
        keep_result_ms: int = 0,
        rate_limit: tuple[int, int] | None = None,
        isolate: bool = False,
        pool: str | None = None,
        priority: int = 0,
    ) -> Any:
        """Register a handler (sync or ``async def``) as a task; usable bare or with options.

        Args:
            name: the task name on the wire (default ``module.qualname``).
            queue: the queue its jobs go to.
            max_attempts: attempts before the job is dead (cumulative, as the protocol counts).
            backoff: a policy (``fixed``/``exponential``/``jitter``), a callable
                ``attempt -> ms``, or ms; default ``exponential(1_000, 60_000)``.
            lease_ms: how long a claim owns the job before it may be recovered; the worker
                heartbeats every lease/3, so a long job is never re-delivered while it lives.
            timeout: seconds a run may take before it fails (and is retried).
            inline: run a sync handler directly on the worker's event loop, with no thread
                handoff and no task per job — for trivial, CPU-light handlers only: a handler
                that blocks stalls the whole worker (and its heartbeats) while it runs.
            keep_result_ms: keep each run's return value (and a dead job's error) that long,
                for ``task.enqueue(...).wait(timeout_s)``; 0 (default) keeps nothing.
            rate_limit: ``(max, window_ms)``: at most ``max`` jobs of the task's queue start
                per window (queue-wide, set by every worker that serves the queue).
            isolate: run each job of a sync handler in a child process that the worker
                kills at ``timeout`` (a hard timeout; nothing keeps running). The handler
                must be a module-level function of an importable module; arguments and
                return value are pickled (see docs/API.md, "Hung handlers").
            pool: ``"process"``: run each job of a sync, CPU-bound handler in the worker's
                pool of persistent child processes (``Worker(pool_size=...)``, default one
                per CPU), so it uses other cores than the worker's own; a ``timeout`` kills
                and replaces the child, and a cancel reaches it. Same constraints as
                ``isolate`` (see docs/API.md, "Process pool").
            priority: its jobs' priority, 0..2**21, lower runs first (0, the default);
                ``task.options(priority=)`` overrides it per job.
        """

        def register(f: Callable[P, R]) -> Task[P, R]:
            task_name = name or f"{f.__module__}.{f.__qualname__}"
            if task_name in self.tasks:
                raise InvalidArgument(f"task {task_name!r} is already registered")
            t = Task(
                self,
                f,
                name=task_name,
                queue=queue,
                max_attempts=max_attempts,
                backoff=resolve_backoff(
                    backoff if backoff is not None else exponential(1_000, 60_000)
                ),
                lease_ms=lease_ms,
                timeout=timeout,
                inline=inline,
                keep_result_ms=keep_result_ms,
                rate_limit=rate_limit,
                isolate=isolate,
                pool=pool,
                priority=priority,
            )
            if t.rate_limit is not None and self.shards.get(t.queue, 1) > 1:
                raise task_rate(task_name, t.queue)  # the worker would set it on shard 0 alone
            self.tasks[task_name] = t
            return t

        return register(fn) if fn is not None else register

    def periodic(
        self,
        *,
        every_ms: int | None = None,
        cron: str | None = None,
        tz: str = "UTC",
        name: str | None = None,
        group: str | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        queue: str = "default",
        limit: int | None = None,
        until_ms: int | None = None,
        **task_options: Any,
    ) -> Callable[[Callable[P, R]], Task[P, R]]:
        """Register a task that runs every ``every_ms`` or on ``cron`` (5 fields, in ``tz``).

        Every worker of the app registers it at start (and removes the app's registrations it
        no longer declares) and fires it in its beat; each occurrence is enqueued exactly once
        however many workers run. ``name`` is the repeat's name (default: the task name);
        ``args``/``kwargs`` the call each occurrence makes; ``limit``: it fires at most that
        many times, ``until_ms``: none due after that ms (issue 24; the count survives worker
        restarts); other keywords go to ``task``.
        """
        _compose.schedule(every_ms, cron, tz)
        _repeats.repeat_limits(limit, until_ms)
        if group is not None:
            keyspace.check_lane(group)

        def register(f: Callable[P, R]) -> Task[P, R]:
            t: Task[P, R] = self.task(queue=queue, **task_options)(f)
            rname = name if name is not None else _NOT_NAME.sub("_", t.name)[-128:]
            _repeats._name(rname)
            if (t.queue, rname) in self.periodics:
                raise InvalidArgument(f"periodic {rname!r} is already registered")
            t.payload(tuple(args), dict(kwargs or {}))  # BadArguments here, not in the worker
            self.periodics[(t.queue, rname)] = Periodic(
                t,
                rname,
                every_ms,
                cron,
                tz,
                group,
                tuple(args),
                dict(kwargs or {}),
                limit,
                until_ms,
            )
            return t

        return register

    def flow_job(
        self, sig: Signature, children: Iterable[Signature | _compose.FlowJob] = ()
    ) -> _compose.FlowJob:
        """The flow node of a signature and its children (signatures or nodes): nest these
        to build a deeper tree for :meth:`flow`."""
        if not isinstance(sig, Signature):
            raise InvalidArgument(f"a flow node is a task signature (task.s(...)), got {sig!r}")
        kids = [c if isinstance(c, _compose.FlowJob) else self.flow_job(c) for c in children]
        return _compose.FlowJob(
            sig.task.payload(sig.args, sig.kwargs),
            id=sig.id,
            queue=sig.task.queue,
            group=sig.group,
            fail_parent=sig.fail_parent,
            children=kids,
            priority=sig.task.priority if sig.priority is None else sig.priority,
        )

    def flow(
        self, parent: Signature, children: Iterable[Signature | _compose.FlowJob] = ()
    ) -> TaskFlow:
        """Add a flow: ``parent`` runs once every child has completed (or died with
        ``fail_parent=False``); a child's death otherwise dead-letters the parent. Inside the
        parent's handler ``current_job().children_values()`` returns the children's values
        (recorded when the child task keeps results). The receipt's ``wait(timeout_s)``
        gives the root's return value (its task must keep results)."""
        node = self.flow_job(parent, children)
        added = self.queue(parent.task.queue).add_flow(node)
        return TaskFlow(added.parent_id, added.child_ids, parent.task)

    def chain(self, *steps: Signature | Chord, keep_result_ms: int = DEFAULT_KEEP_MS) -> Chain:
        """Steps that run one after another, each given the previous step's value as its
        first argument (``task.si(...)``: a step that takes none); a step that dies stops the
        chain. ``chain.enqueue()`` answers a :class:`ChainReceipt` whose ``wait`` gives the
        last value. Every step keeps its value (and error) ``keep_result_ms`` (its task's
        when longer). Same as ``a.s() | b.s() | c.s()``; see docs/guides/workflows.md."""
        return Chain(self, steps, keep_result_ms)

    def group(self, sigs: Iterable[Signature], *, keep_result_ms: int = DEFAULT_KEEP_MS) -> Group:
        """Calls that run in parallel: ``group.enqueue()`` answers a :class:`GroupReceipt`
        whose ``wait`` gives their values in order (``GroupFailed`` with every failure)."""
        return Group(self, tuple(sigs) if isinstance(sigs, Iterable) else sigs, keep_result_ms)

    def chord(self, group: Group, callback: Signature) -> Chord:
        """``group``, then ``callback`` given the list of its values (in order) as its first
        argument: a flow, the callback its parent. Same as ``group | callback``."""
        return Chord(group, callback)

    def batch(
        self,
        *,
        on_complete: Signature | None = None,
        on_success: Signature | None = None,
        on_death: Signature | None = None,
        description: str | None = None,
        queue: str | None = None,
    ) -> Batch:
        """Open a batch (issue 42, docs/guides/batches.md): members join with ``add`` /
        ``add_many`` until ``close``; ``on_complete`` fires once when it is closed and every
        member settled, ``on_success`` once when every member completed, ``on_death`` once
        at the first member's death. A batch, its members and its callbacks live on one
        queue: ``queue``, else the first callback's."""
        queue = _batch_queue(queue, on_complete, on_success, on_death)
        q = self.queue(queue)
        bid = q._x.run(
            _batches.open_batch(q._k, q._x.minter, on_complete, on_success, on_death, description)
        )
        return Batch(self, queue, bid)

    async def abatch(
        self,
        *,
        on_complete: Signature | None = None,
        on_success: Signature | None = None,
        on_death: Signature | None = None,
        description: str | None = None,
        queue: str | None = None,
    ) -> Batch:
        """:meth:`batch` for asyncio (does not block the loop); use the handle's ``aadd`` /
        ``aadd_many`` / ``aclose`` / ``astatus``."""
        queue = _batch_queue(queue, on_complete, on_success, on_death)
        q = self.aqueue(queue)
        bid = await q._x.run(
            _batches.open_batch(q._k, q._x.minter, on_complete, on_success, on_death, description)
        )
        return Batch(self, queue, bid)

    def batch_by_id(self, id: str, *, queue: str) -> Batch:
        """A handle on batch ``id`` of ``queue`` (another producer's, or one read from
        ``echomq batch``): nothing is read until it is used."""
        return Batch(self, queue, id)

    def batch_of_job(self, id: str, *, queue: str) -> Batch | None:
        """The batch job ``id`` of ``queue`` belongs to (a member, the anchor, or an
        on_success / on_death callback), else None: ``current_job().batch`` reads it."""
        return _batches.batch_of(self, queue, id)

    async def abatch_of_job(self, id: str, *, queue: str) -> Batch | None:
        """:meth:`batch_of_job` for asyncio: ``await current_job().abatch()`` reads it."""
        return await _batches.abatch_of(self, queue, id)

    def sync_periodic(self, keys: Keys) -> Plan[None]:
        """Register this app's periodic tasks of one queue and unregister the repeats this
        app (``name``) registered there before that it no longer declares."""
        mine = [p for (q, _), p in self.periodics.items() if q == keys.name]
        for p in mine:
            yield from _compose.repeat(
                keys,
                p.name,
                p.task.payload(p.args, p.kwargs),
                every_ms=p.every_ms,
                cron=p.cron,
                tz=p.tz,
                group=p.group,
                owner=self.name,
                limit=p.limit,
                until_ms=p.until_ms,
            )
        names = {p.name for p in mine}
        for rep in (yield from _compose.repeats(keys)):
            if rep.owner == self.name and rep.name not in names:
                yield _compose.unrepeat(keys, rep.name)

    def queues(self) -> list[str]:
        """Every queue a registered task uses, sorted."""
        return sorted({t.queue for t in self.tasks.values()})

    def _queue_kwargs(self, name: str) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"durable": self.durable, "shards": self.shards.get(name)}
        from_url = bool(self._url or not self._client)  # a client= passed in has no URL
        if self.durable is None:
            kwargs["durable"] = parse_url(self.url)[2] if from_url else 0
        if from_url:
            # The URL's executor= (None: ECHOMQ_EXECUTOR, else auto), as Queue(url=...) reads
            # it: the queues get the app's client, not its URL.
            kwargs["executor"] = _native.url_executor(self.url)
        if self.max_payload is not None:
            kwargs["max_payload"] = self.max_payload
        return kwargs

    def client(self) -> SyncClient:
        """The app's sync client (one connection pool shared by every queue)."""
        if self._client is None:
            self._client = sync_client(self.url)
            self._owns_client = True
        return self._client

    def queue(self, name: str) -> Queue:
        """The sync :class:`Queue` ``name`` on this app's server (cached)."""
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = Queue(name, client=self.client(), **self._queue_kwargs(name))
        return q

    def aqueue(self, name: str) -> AsyncQueue:
        """The :class:`AsyncQueue` ``name`` for the running event loop (cached per loop)."""
        loop = asyncio.get_running_loop()
        per_loop = self._aqueues.setdefault(loop, {})
        q = per_loop.get(name)
        if q is None:
            client = self._aclients.get(loop)
            if client is None:
                client = self._aclients[loop] = async_client(self.url)
            q = per_loop[name] = AsyncQueue(name, client=client, **self._queue_kwargs(name))
        return q

    # ------------------------------------------------------------------ results by id
    # A later request (a web app's) reads a job's outcome by id alone, as a receipt's wait
    # does: the kept value is decoded by the app's serializer, the one its worker encoded it
    # with (a task has no serializer of its own, and the kept outcome names no task).

    def result(self, id: str, *, queue: str | None = None) -> Any:
        """The job's return value, decoded, read once (no waiting): ``ResultNotReady`` when
        it has not finished (``.state`` says where it is), ``JobFailed`` when it died
        (``.error``), ``ResultNotKept`` when it finished with no kept value (its task keeps
        none, the value expired, or no such job). ``queue``: the job's queue; default the
        one queue of the app's tasks (``InvalidArgument`` when they use several)."""
        q = self.queue(self._result_queue(queue))
        q = q._holder(id) if isinstance(q, ShardedQueue) else q  # the job's shard
        return self._decoded(id, q._x.run(_ctl.outcome(q._k, id)))

    async def aresult(self, id: str, *, queue: str | None = None) -> Any:
        """:meth:`result` for asyncio code."""
        q = self.aqueue(self._result_queue(queue))
        q = await q._holder(id) if isinstance(q, AsyncShardedQueue) else q
        return self._decoded(id, await q._x.run(_ctl.outcome(q._k, id)))

    def wait_result(self, id: str, *, timeout_s: float, queue: str | None = None) -> Any:
        """Block until the job's outcome is kept, as a receipt's ``wait`` does, and return
        the value decoded: ``JobFailed`` when it died, ``TimeoutError`` at the deadline
        (also when its task keeps no results: nothing is ever kept)."""
        res = self.queue(self._result_queue(queue)).wait(id, timeout_s=timeout_s)
        return self.serializer.loads(res.value)

    async def await_result(self, id: str, *, timeout_s: float, queue: str | None = None) -> Any:
        """:meth:`wait_result` for asyncio code (many waiters share one connection)."""
        res = await self.aqueue(self._result_queue(queue)).wait(id, timeout_s=timeout_s)
        return self.serializer.loads(res.value)

    def _result_queue(self, queue: str | None) -> str:
        if queue is not None:
            return queue
        names = self.queues()
        if len(names) == 1:
            return names[0]
        raise InvalidArgument(
            "name the job's queue (queue=...): "
            + (f"this app's tasks use {', '.join(names)}" if names else "this app has no tasks")
        )

    def _decoded(self, id: str, found: tuple[_ctl.Result | None, str]) -> Any:
        kept, state = found
        if kept is not None:
            if kept.error is not None:
                raise JobFailed(id, kept.error)
            return self.serializer.loads(kept.value)
        if state in ("absent", "completed"):
            raise ResultNotKept(id)
        if state == "dead":  # a row that died, then went (trimmed) between the reads
            raise JobFailed(id, "dead")
        raise ResultNotReady(id, state)

    def close(self) -> None:
        """Close the sync client if the app opened it."""
        self._queues.clear()
        if self._owns_client and self._client is not None:
            self._client.close()
            self._client = None
            self._owns_client = False

    async def aclose(self) -> None:
        """Close the asyncio client of the running loop (and the sync one)."""
        loop = asyncio.get_running_loop()
        for q in self._aqueues.pop(loop, {}).values():
            await q.aclose()  # stops its result reader (D17); the client is closed below
        client = self._aclients.pop(loop, None)
        if client is not None:
            await client.aclose()  # type: ignore[attr-defined]
        self.close()


def _batch_queue(queue: str | None, *callbacks: Signature | None) -> str:
    """A batch's queue: ``queue``, else its first callback's (InvalidArgument when neither)."""
    if queue is None:
        first = next((s for s in callbacks if s is not None), None)
        if first is None or not isinstance(first, Signature):
            raise InvalidArgument(
                "a batch needs its queue: pass queue=, or a callback signature "
                "(task.s(...)) whose task's queue it takes"
            )
        queue = first.task.queue
    return keyspace.check_queue(queue)
