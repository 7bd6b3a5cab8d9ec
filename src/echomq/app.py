"""The application layer: ``App``, ``@app.task``, enqueueing handler calls, and the signals a
handler raises (``Retry``, ``Discard``).

A task call travels as one payload, the task envelope (``echomq._envelope``: built and
parsed there only), encoded by the app's serializer (JSON by default, never pickle). The
queue below sees only opaque bytes. ``current_job`` and ``JobContext`` live in
``echomq.context`` and are re-exported here.

Arguments are checked where the call is made: a call that does not bind to the handler's
signature, or an argument with no serializable form, raises :class:`BadArguments` before
anything is written. They travel as builtins (``msgspec.to_builtins``: a datetime as ISO
text, a UUID or Decimal as text, a tuple or set as a list, a dataclass as a map, an enum as
its value) and the worker converts each one back by the handler's annotation
(``msgspec.convert``, lax: ``"1"`` is an int where an int is expected). An argument without
an annotation, or annotated ``Any``, ``object`` or a type msgspec cannot build (a plain
class), arrives as it was decoded.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import typing
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, ParamSpec, TypeVar, overload

import msgspec
import msgspec.inspect

from echomq import _compose, _envelope, _native, keyspace
from echomq import _protocol as _p
from echomq._connect import (
    AsyncClient,
    Resolved,
    SyncClient,
    async_client,
    parse_url,
    resolve_url,
    sync_client,
)
from echomq._kernel import MAX_INT, MAX_MS, Enqueued, Keys, Plan, _priority
from echomq.backoff import Backoff, BackoffLike, exponential, resolve_backoff
from echomq.context import JobContext, current_job
from echomq.errors import BadArguments, EchoMQError, InvalidArgument
from echomq.outcomes import Discard, RateLimit, Retry
from echomq.queue import AsyncQueue, Queue
from echomq.serializers import Serializer, resolve_serializer

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

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Options:
    """Job options for one enqueue: ``task.options(delay_ms=..., group=..., id=...)``."""

    delay_ms: int | None = None
    at_ms: int | None = None
    group: str | None = None
    id: str | None = None
    dedup: str | None = None  # D20: see Queue.enqueue
    dedup_ttl_ms: int | None = None
    dedup_mode: str = "simple"
    priority: int | None = None  # None: the task's own (``@app.task(priority=)``)
    # Issue 24: this job's attempt budget (in its envelope) and its expiry (Queue.enqueue).
    max_attempts: int | None = None
    ttl_ms: int | None = None


def _budget(max_attempts: object) -> dict[str, Any] | None:
    """The envelope's ``opts`` for a per-job attempt budget (None: the task's), checked as
    ``@app.task(max_attempts=)`` is, before anything is sent."""
    if max_attempts is None:
        return None
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
        raise InvalidArgument(f"max_attempts must be an int >= 1, got {max_attempts!r}")
    if not 1 <= max_attempts <= MAX_INT:
        raise InvalidArgument(f"max_attempts must be in [1, {MAX_INT}], got {max_attempts}")
    return {"max_attempts": max_attempts}


class Task(Generic[P, R]):
    """A registered handler. Call it to run it in-process; ``enqueue`` it to run it later."""

    def __init__(
        self,
        app: App,
        fn: Callable[P, R],
        *,
        name: str,
        queue: str,
        max_attempts: int,
        backoff: Backoff,
        lease_ms: int,
        timeout: float | None,
        inline: bool = False,
        keep_result_ms: int = 0,
        rate_limit: tuple[int, int] | None = None,
        isolate: bool = False,
        pool: str | None = None,
        priority: int = 0,
    ) -> None:
        self.app = app
        self.fn = fn
        self.name = name
        self.queue = keyspace.check_queue(queue)
        # Upper bounds too: the worker sends both in every settle call, and a value the
        # protocol refuses there would fail the whole batch, every turn.
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
            raise InvalidArgument(f"max_attempts must be an int >= 1, got {max_attempts!r}")
        if not 1 <= max_attempts <= MAX_INT:
            raise InvalidArgument(f"max_attempts must be in [1, {MAX_INT}], got {max_attempts}")
        if isinstance(lease_ms, bool) or not isinstance(lease_ms, int):
            raise InvalidArgument(f"lease_ms must be an int >= 100, got {lease_ms!r}")
        if not 100 <= lease_ms <= MAX_MS:
            raise InvalidArgument(f"lease_ms must be in [100, {MAX_MS}], got {lease_ms}")
        if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
            raise InvalidArgument(f"timeout must be positive seconds, got {timeout!r}")
        self.max_attempts = max_attempts
        self.backoff = backoff
        self.lease_ms = lease_ms
        self.timeout = timeout
        self.is_async = inspect.iscoroutinefunction(fn)
        if inline and (self.is_async or timeout is not None):
            raise InvalidArgument("inline=True is for sync handlers without a timeout")
        self.inline = bool(inline)
        if not isinstance(isolate, bool):
            raise InvalidArgument(f"isolate must be a bool, got {isolate!r}")
        if isolate:  # run in a child process that a timeout kills (echomq._isolate)
            from echomq._isolate import check_isolatable

            if self.is_async or inline:
                raise InvalidArgument("isolate=True is for sync handlers that are not inline")
            if (why := check_isolatable(fn)) is not None:
                raise InvalidArgument(f"isolate=True: {why}")
        self.isolate = isolate
        if pool is not None:  # the worker's persistent process pool (echomq._pool)
            from echomq._isolate import check_isolatable

            if pool != "process":
                raise InvalidArgument(f"pool must be None or 'process', got {pool!r}")
            if self.is_async or inline or isolate:
                raise InvalidArgument(
                    "pool='process' is for sync handlers that are not inline nor isolate=True"
                )
            if (why := check_isolatable(fn)) is not None:
                raise InvalidArgument(f"pool='process': {why}")
        self.pool = pool
        # D17: > 0 keeps each run's return value (through the app's serializer) that long.
        if isinstance(keep_result_ms, bool) or not isinstance(keep_result_ms, int):
            raise InvalidArgument(f"keep_result_ms must be an int >= 0, got {keep_result_ms!r}")
        if not 0 <= keep_result_ms <= MAX_MS:
            raise InvalidArgument(f"keep_result_ms must be in [0, {MAX_MS}], got {keep_result_ms}")
        self.keep_result_ms = keep_result_ms
        # D21: (max, window_ms) for the task's queue, set by every worker that serves it.
        if rate_limit is not None:
            from echomq._control import rate_limit as _check_rate

            if not isinstance(rate_limit, tuple) or len(rate_limit) != 2:
                raise InvalidArgument(f"rate_limit is (max, window_ms), got {rate_limit!r}")
            _check_rate(Keys(self.queue), *rate_limit)
        self.rate_limit = rate_limit
        # Every job of the task gets this priority unless its enqueue names one (0..2**21,
        # lower runs first).
        self.priority = _priority(priority)
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", name)
        self.__wrapped__ = fn
        self._params: _Params | None = None  # the handler's signature, compiled on first use
        # The task without options, built once: enqueue is the producer's hot path.
        self._plain: BoundTask[P, R] = BoundTask(self, Options())

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.queue}>"

    def payload(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], opts: dict[str, Any] | None = None
    ) -> bytes:
        """The wire payload of one call of this task (``opts``: the job's options, see
        ``echomq._envelope``); :class:`BadArguments` when the call does not bind to the
        handler or an argument cannot be serialized."""
        p = self._params or self.params()
        if kwargs or not p.min_pos <= len(args) <= p.max_pos:  # else it binds (the fast check)
            p.check(self.name, args, kwargs)
        try:
            return _envelope.encode(self.app.serializer, self.name, args, kwargs, opts)
        except Exception as exc:
            raise self._unserializable(args, kwargs, exc) from exc

    def params(self) -> _Params:
        """The handler's parameters (compiled once, on first use)."""
        p = self._params
        if p is None:
            p = self._params = _Params(self.fn)
        return p

    def check_call(self, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> None:
        """:class:`BadArguments` unless ``args``/``kwargs`` bind to the handler's signature."""
        self.params().check(self.name, args, kwargs)

    def to_wire(
        self, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]
    ) -> tuple[Any, dict[str, Any]]:
        """The call's arguments checked against the handler and turned into builtins the
        serializer encodes (``echomq._envelope.to_wire``)."""
        self.params().check(self.name, args, kwargs)
        serializer = self.app.serializer
        try:
            if kwargs:
                a, k = _envelope.to_wire(serializer, (args, kwargs))
                return a, k
            return _envelope.to_wire(serializer, args), {}
        except Exception as exc:
            raise self._unserializable(args, kwargs, exc) from exc

    def from_wire(
        self, args: list[Any], kwargs: dict[str, Any]
    ) -> tuple[list[Any], dict[str, Any]]:
        """The decoded arguments of a job, checked against the handler and converted to its
        annotations (the worker's side of :meth:`to_wire`); :class:`BadArguments` names the
        argument that does not fit."""
        p = self._params or self.params()
        if kwargs or not p.min_pos <= len(args) <= p.max_pos:  # else it binds (the fast check)
            p.check(self.name, args, kwargs)
        elif tuple(map(type, args)) in p.as_is:  # the worker's hot path: nothing to convert
            return args, kwargs
        return p.convert(self.name, args, kwargs)

    def _unserializable(
        self, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any], exc: Exception
    ) -> BadArguments:
        """The error naming the first argument that cannot be serialized."""
        serializer = self.app.serializer
        for name, value in self.params().named(args, kwargs):
            try:
                serializer.dumps(_envelope.to_wire(serializer, value))
            except Exception as found:
                what = _UNSUPPORTED.search(str(found))
                kind = what.group(1) if what else type(value).__name__
                return BadArguments(
                    f"argument {name!r} of task {self.name!r}: cannot serialize a {kind} "
                    f"({type(found).__name__}: {found})"
                )
        return BadArguments(f"task {self.name!r}: cannot serialize the call: {exc}")

    def options(
        self,
        *,
        delay_ms: int | None = None,
        at_ms: int | None = None,
        group: str | None = None,
        id: str | None = None,
        dedup: str | None = None,
        dedup_ttl_ms: int | None = None,
        dedup_mode: str = "simple",
        priority: int | None = None,
        max_attempts: int | None = None,
        ttl_ms: int | None = None,
    ) -> BoundTask[P, R]:
        """This task with job options: a delay, an absolute run time, a lane, an id, a dedup
        key (D20: ``dedup_mode`` simple, throttle or debounce, the last two with a TTL), a
        priority (0..2**21, lower runs first; None: the task's), this job's own attempt
        budget (``max_attempts``, overriding the task's) and its expiry (``ttl_ms``: not
        claimed within that long, it is dead-lettered ``expired``)."""
        from echomq._control import dedup_args
        from echomq._kernel import _ttl

        dedup_args(dedup, dedup_ttl_ms, dedup_mode)  # bad options fail here, not at enqueue
        if priority is not None:
            _priority(priority)
        _budget(max_attempts)
        _ttl(ttl_ms)
        return BoundTask(
            self,
            Options(
                delay_ms,
                at_ms,
                group,
                id,
                dedup,
                dedup_ttl_ms,
                dedup_mode,
                priority=priority,
                max_attempts=max_attempts,
                ttl_ms=ttl_ms,
            ),
        )

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> TaskEnqueued:
        """Enqueue a call of this task with the handler's arguments; the receipt's
        ``wait(timeout_s)`` gives the return value when the task keeps results."""
        return self._plain.enqueue(*args, **kwargs)

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> TaskEnqueued:
        """``enqueue`` for asyncio code."""
        return await self._plain.aenqueue(*args, **kwargs)

    def enqueue_many(
        self,
        calls: Iterable[tuple[tuple[Any, ...], dict[str, Any]]],
        *,
        group: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        ttl_ms: int | None = None,
    ) -> list[Enqueued | EchoMQError]:
        """Enqueue many calls, each ``(args, kwargs)``, in few round trips (``priority``:
        for every call, None: the task's; ``max_attempts`` and ``ttl_ms``: every job's, as
        ``options``)."""
        pri = self.priority if priority is None else _priority(priority)
        opts = _budget(max_attempts)
        otel = self.app._otel
        if otel is not None:
            span, payloads = otel.start_send(self, self._wire_calls(calls), opts)
            try:
                found = self.app.queue(self.queue).enqueue_many(
                    payloads, group=group, priority=pri, ttl_ms=ttl_ms
                )
            except BaseException as exc:
                otel.end_send(span, None, exc)
                raise
            otel.end_send(span, None, None)
            return found
        payloads = _each_call(calls, lambda a, k: self.payload(a, k, opts))
        return self.app.queue(self.queue).enqueue_many(
            payloads, group=group, priority=pri, ttl_ms=ttl_ms
        )

    def _wire_calls(
        self, calls: Iterable[tuple[tuple[Any, ...], dict[str, Any]]]
    ) -> list[tuple[Any, dict[str, Any]]]:
        """Each call checked and in builtins, for ``echomq.otel``'s payload builder."""
        return _each_call(calls, self.to_wire)

    def s(self, *args: P.args, **kwargs: P.kwargs) -> Signature:
        """A signature: this task with its call's arguments, for ``app.flow``
        (:class:`BadArguments` here when they do not bind to the handler)."""
        self.check_call(args, kwargs)
        return Signature(self, tuple(args), dict(kwargs))


@dataclass(frozen=True, slots=True)
class Signature:
    """One call of a task, not yet sent (``task.s(...)``): a node of ``app.flow``. ``id``
    and ``group`` are the job's options; ``fail_parent=False`` makes its death an ignored
    failure of its parent instead of the parent's death."""

    task: Task[Any, Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    id: str | None = None
    group: str | None = None
    fail_parent: bool = True
    priority: int | None = None  # None: the task's

    def options(
        self,
        *,
        id: str | None = None,
        group: str | None = None,
        fail_parent: bool = True,
        priority: int | None = None,
    ) -> Signature:
        """This signature with job options."""
        if priority is not None:
            _priority(priority)
        return Signature(self.task, self.args, self.kwargs, id, group, fail_parent, priority)


@dataclass(frozen=True, slots=True)
class BoundTask(Generic[P, R]):
    """A task with job options bound; made by ``Task.options``."""

    task: Task[P, R]
    opts: Options = field(default_factory=Options)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> TaskEnqueued:
        o = self.opts
        otel = self.task.app._otel
        opts = _budget(o.max_attempts)
        if otel is None:
            payload = self.task.payload(args, kwargs, opts)
        else:  # echomq.otel: a "<task> send" span whose context the envelope carries
            calls = [self.task.to_wire(args, kwargs)]
            span, (payload,) = otel.start_send(self.task, calls, opts)
        try:
            e = self.task.app.queue(self.task.queue).enqueue(
                payload,
                id=o.id,
                group=o.group,
                delay_ms=o.delay_ms,
                at_ms=o.at_ms,
                dedup=o.dedup,
                dedup_ttl_ms=o.dedup_ttl_ms,
                dedup_mode=o.dedup_mode,
                priority=self.task.priority if o.priority is None else o.priority,
                ttl_ms=o.ttl_ms,
            )
        except BaseException as exc:
            if otel is not None:
                otel.end_send(span, None, exc)
            raise
        if otel is not None:
            otel.end_send(span, e, None)
        return TaskEnqueued(e.id, e.status, self.task)

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> TaskEnqueued:
        o = self.opts
        otel = self.task.app._otel
        opts = _budget(o.max_attempts)
        if otel is None:
            payload = self.task.payload(args, kwargs, opts)
        else:  # echomq.otel: a "<task> send" span whose context the envelope carries
            calls = [self.task.to_wire(args, kwargs)]
            span, (payload,) = otel.start_send(self.task, calls, opts)
        try:
            e = await self.task.app.aqueue(self.task.queue).enqueue(
                payload,
                id=o.id,
                group=o.group,
                delay_ms=o.delay_ms,
                at_ms=o.at_ms,
                dedup=o.dedup,
                dedup_ttl_ms=o.dedup_ttl_ms,
                dedup_mode=o.dedup_mode,
                priority=self.task.priority if o.priority is None else o.priority,
                ttl_ms=o.ttl_ms,
            )
        except BaseException as exc:
            if otel is not None:
                otel.end_send(span, None, exc)
            raise
        if otel is not None:
            otel.end_send(span, e, None)
        return TaskEnqueued(e.id, e.status, self.task)


def _each_call(
    calls: Iterable[tuple[tuple[Any, ...], dict[str, Any]]],
    convert: Callable[[tuple[Any, ...], dict[str, Any]], R],
) -> list[R]:
    """``convert(args, kwargs)`` of each call of an ``enqueue_many``; a call that does not
    bind names its index in the :class:`BadArguments` it raises."""
    out = []
    for i, (a, k) in enumerate(calls):
        try:
            out.append(convert(tuple(a), dict(k)))
        except BadArguments as exc:
            raise BadArguments(f"call {i}: {exc}") from exc
    return out


@dataclass(frozen=True, slots=True, eq=False)
class TaskEnqueued(Enqueued):
    """The receipt of ``task.enqueue``: an :class:`Enqueued` (equal to the plain one with the
    same id and status) that can wait for the handler's return value (D17), deserialized by
    the app's serializer. The task must keep results (``@app.task(keep_result_ms=...)``);
    ``JobFailed`` when the job died, ``TimeoutError`` at the deadline."""

    task: Task[Any, Any] = field(repr=False, compare=False)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Enqueued):
            return NotImplemented
        return (self.id, self.status) == (other.id, other.status)

    def __hash__(self) -> int:
        return hash((self.id, self.status))

    def wait(self, timeout_s: float) -> Any:
        """Block until the job's result is kept; return it deserialized. A task that keeps no
        results raises :class:`InvalidArgument` at once (its wait could only time out)."""
        self._check_kept()
        res = self.task.app.queue(self.task.queue).wait(self.id, timeout_s=timeout_s)
        return self.task.app.serializer.loads(res.value)

    async def await_result(self, timeout_s: float) -> Any:
        """``wait`` for asyncio code (many waiters share one connection)."""
        self._check_kept()
        res = await self.task.app.aqueue(self.task.queue).wait(self.id, timeout_s=timeout_s)
        return self.task.app.serializer.loads(res.value)

    def _check_kept(self) -> None:
        if not self.task.keep_result_ms:
            raise InvalidArgument(
                f"task {self.task.name!r} keeps no results, so waiting for one could only time "
                f"out: keep them with @app.task(..., keep_result_ms=60_000) (how long each "
                "return value is kept, in ms)"
            )


@dataclass(frozen=True, slots=True, eq=False)
class TaskFlow(_compose.FlowAdded):
    """The receipt of ``app.flow`` (issue 24): a :class:`FlowAdded` (equal to the plain one)
    that can wait for the root's return value, as :class:`TaskEnqueued` waits for one job's:
    the root task must keep results; ``JobFailed`` when the root died (a ``fail_parent``
    child's death kills it), ``TimeoutError`` at the deadline."""

    task: Task[Any, Any] = field(repr=False, compare=False)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _compose.FlowAdded):
            return NotImplemented
        return (self.parent_id, self.child_ids) == (other.parent_id, other.child_ids)

    def __hash__(self) -> int:
        return hash(self.parent_id)

    def _root(self) -> TaskEnqueued:
        return TaskEnqueued(self.parent_id, "enqueued", self.task)

    def wait(self, timeout_s: float) -> Any:
        """Block until the root's result is kept; return it deserialized."""
        return self._root().wait(timeout_s)

    async def await_result(self, timeout_s: float) -> Any:
        """``wait`` for asyncio code."""
        return await self._root().await_result(timeout_s)


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
            ``./.echomq/``, then ``redis://127.0.0.1:6379/0``.
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
    ) -> None:
        self.name = keyspace.check_lane(name)
        self.keep_completed = _keep_pair("keep_completed", keep_completed)
        self.keep_dead = _keep_pair("keep_dead", keep_dead)
        self.periodics: dict[tuple[str, str], Periodic] = {}
        self._url = url  # App(url=...): step 2 of echomq._connect.resolve_url
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
        """The server URL, resolved once on first use as :func:`echomq._connect.resolve_url`
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
        _compose.repeat_limits(limit, until_ms)
        if group is not None:
            keyspace.check_lane(group)

        def register(f: Callable[P, R]) -> Task[P, R]:
            t: Task[P, R] = self.task(queue=queue, **task_options)(f)
            rname = name if name is not None else _NOT_NAME.sub("_", t.name)[-128:]
            _compose._name(rname)
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

    def _queue_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"durable": self.durable}
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
            q = self._queues[name] = Queue(name, client=self.client(), **self._queue_kwargs())
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
            q = per_loop[name] = AsyncQueue(name, client=client, **self._queue_kwargs())
        return q

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


_UNSUPPORTED = re.compile(r"objects of type (\S+) is unsupported")
_PASS = (inspect.Parameter.empty, Any, object)
_AS_IS = frozenset({int, str, float, bool, list, dict, bytes})


class _Params:
    """A handler's parameters, compiled once per task: what a call must bind to, and the
    annotation each argument is converted to in the worker (resolved on first use there, so
    a forward reference defined after the handler resolves)."""

    __slots__ = (
        "_hints",
        "_pos_hints",
        "_shapes",
        "as_is",
        "fn",
        "keywords",
        "max_pos",
        "min_pos",
        "positional",
        "required",
        "sig",
        "varargs",
    )

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self._hints: dict[str, Any] | None = None
        self._pos_hints: list[Any] = []  # the hint of each positional parameter, or None
        self._shapes: dict[tuple[int, tuple[str, ...]], bool] = {}  # call shapes that bind
        # The types of positional-only calls that convert leaves as they are (every argument
        # already its annotation's type, or not annotated): learnt by convert, so a worker
        # pays for the conversion loop once per call shape, not once per job.
        self.as_is: set[tuple[type, ...]] = set()
        try:
            sig: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):  # a builtin without one: calls are not checked
            sig = None
        self.sig = sig
        params = list(sig.parameters.values()) if sig is not None else []
        if sig is None:  # every call passes the fast check
            params = [inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL)]
        kinds = inspect.Parameter
        positional = [
            p for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
        ]
        self.positional = [p.name for p in positional]
        self.varargs = any(p.kind in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD) for p in params)
        # The fast check of a call without kwargs: a positional count in [min_pos, max_pos].
        self.max_pos = (
            1 << 30 if any(p.kind == kinds.VAR_POSITIONAL for p in params) else len(positional)
        )
        self.min_pos = sum(p.default is p.empty for p in positional)
        if any(p.kind == kinds.KEYWORD_ONLY and p.default is p.empty for p in params):
            self.min_pos = self.max_pos + 1  # a required keyword: never a positional-only call
        # The fast check of a call with kwargs (no *args/**kwargs): each parameter a keyword
        # may name, with its positional index (kw-only: past any), and the required ones.
        far = 1 << 30
        index = {n: i for i, n in enumerate(self.positional)}
        self.keywords = {
            p.name: index.get(p.name, far)
            for p in params
            if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)
        }
        self.required = [(index.get(p.name, far), p.name) for p in params if p.default is p.empty]

    def check(self, task: str, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> None:
        """:class:`BadArguments` unless the call binds to the signature."""
        if self.sig is None or (not kwargs and self.min_pos <= len(args) <= self.max_pos):
            return
        if not self.varargs:
            shape = (len(args), tuple(kwargs))
            ok = self._shapes.get(shape)
            if ok is None:
                ok = self._binds(len(args), kwargs)
                if len(self._shapes) < 256:
                    self._shapes[shape] = ok
            if ok:
                return
        try:
            self.sig.bind(*args, **kwargs)
        except TypeError as exc:
            raise BadArguments(f"task {task!r}: {exc}") from None

    def _binds(self, n: int, kwargs: dict[str, Any]) -> bool:
        """Whether ``n`` positional arguments and ``kwargs`` bind (no ``*``/``**`` here)."""
        if n > self.max_pos:
            return False
        keywords = self.keywords
        for k in kwargs:
            if keywords.get(k, -1) < n:  # unknown, positional-only, or given twice
                return False
        return all(i < n or name in kwargs for i, name in self.required)

    def named(
        self, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]
    ) -> Iterable[tuple[str, Any]]:
        """``(parameter name, value)`` of each argument of a call that binds; an extra
        positional one is ``*name[i]``."""
        star = next(
            (n for n, p in (self.sig.parameters.items() if self.sig else ())
             if p.kind == p.VAR_POSITIONAL),
            "args",
        )  # fmt: skip
        for i, value in enumerate(args):
            n = len(self.positional)
            yield (self.positional[i] if i < n else f"*{star}[{i - n}]"), value
        yield from kwargs.items()

    def hints(self) -> dict[str, Any]:
        """The annotation of each parameter whose arguments are converted."""
        if self._hints is None:
            hints = _hints(self.fn, self.sig)
            self._pos_hints = [hints.get(n) for n in self.positional]
            self._hints = hints
        return self._hints

    def convert(
        self, task: str, args: list[Any], kwargs: dict[str, Any]
    ) -> tuple[list[Any], dict[str, Any]]:
        """The arguments of a call that binds, converted to their annotations."""
        hints = self._hints if self._hints is not None else self.hints()
        if not hints:
            return args, kwargs
        if not self.varargs:  # each positional argument is the parameter at its index
            args = list(args)
            same = True
            for i, (v, h) in enumerate(zip(args, self._pos_hints, strict=False)):
                if h is not None and not (type(v) is h and h in _AS_IS):
                    args[i] = _convert(task, self.positional[i], v, h)
                    same = False
            if same and not kwargs and len(self.as_is) < 64:
                self.as_is.add(tuple(map(type, args)))
            if kwargs:
                kwargs = {
                    k: _convert(task, k, v, hints[k]) if k in hints else v
                    for k, v in kwargs.items()
                }
            return args, kwargs
        assert self.sig is not None
        bound = self.sig.bind(*args, **kwargs)
        for name, value in bound.arguments.items():
            hint = hints.get(name)
            if hint is None:
                continue
            kind = self.sig.parameters[name].kind
            if kind == inspect.Parameter.VAR_POSITIONAL:
                new: Any = tuple(
                    _convert(task, f"*{name}[{i}]", v, hint) for i, v in enumerate(value)
                )
            elif kind == inspect.Parameter.VAR_KEYWORD:
                new = {k: _convert(task, k, v, hint) for k, v in value.items()}
            else:
                new = _convert(task, name, value, hint)
            bound.arguments[name] = new
        return list(bound.args), dict(bound.kwargs)


def _convert(task: str, name: str, value: Any, hint: Any) -> Any:
    if type(value) is hint and hint in _AS_IS:  # already what the handler wants
        return value
    try:
        return msgspec.convert(value, hint, strict=False, str_keys=True)
    except (msgspec.ValidationError, TypeError, ValueError) as exc:
        raise BadArguments(
            f"argument {name!r} of task {task!r}: cannot convert to {_type_name(hint)}: {exc}"
        ) from None


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else repr(hint).replace("typing.", "")


def _hints(fn: Callable[..., Any], sig: inspect.Signature | None) -> dict[str, Any]:
    """The parameters to convert and their resolved annotations: not those without one,
    ``Any`` or ``object``, nor one msgspec cannot build (a plain class, anywhere in it)."""
    if sig is None:
        return {}
    try:
        found = typing.get_type_hints(inspect.unwrap(fn))
    except Exception:  # an unresolvable forward reference: what is not a string still counts
        found = {}
    hints = {}
    for name, p in sig.parameters.items():
        hint = found.get(name, p.annotation)
        if isinstance(hint, str) or any(hint is x for x in _PASS):
            continue
        try:
            if _buildable(msgspec.inspect.type_info(hint), set()):
                hints[name] = hint
        except Exception:  # msgspec does not know the annotation at all
            continue
    return hints


def _buildable(info: Any, seen: set[int]) -> bool:
    """No ``CustomType`` (a class msgspec cannot build from builtins) anywhere in ``info``."""
    if isinstance(info, msgspec.inspect.CustomType):
        return False
    if id(info) in seen:
        return True
    seen.add(id(info))
    for f in getattr(info, "__struct_fields__", ()):
        value = getattr(info, f)
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, (msgspec.inspect.Type, msgspec.inspect.Field)) and not _buildable(
                item, seen
            ):
                return False
    return True
