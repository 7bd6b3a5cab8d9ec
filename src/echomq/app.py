"""The application layer: ``App``, ``@app.task``, enqueueing handler calls, and the signals a
handler raises (``Retry``, ``Discard``).

A task call travels as one payload, the task envelope (``echomq._envelope``: built and
parsed there only), encoded by the app's serializer (JSON by default, never pickle). The
queue below sees only opaque bytes. ``current_job`` and ``JobContext`` live in
``echomq.context`` and are re-exported here.
"""

from __future__ import annotations

import asyncio
import inspect
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, ParamSpec, TypeVar, overload

from echomq import _envelope, keyspace
from echomq._connect import (
    AsyncClient,
    Resolved,
    SyncClient,
    async_client,
    parse_url,
    resolve_url,
    sync_client,
)
from echomq._protocol import MAX_INT, MAX_MS, Enqueued
from echomq.backoff import Backoff, BackoffLike, exponential, resolve_backoff
from echomq.context import JobContext, current_job
from echomq.errors import EchoMQError, InvalidArgument
from echomq.queue import AsyncQueue, Queue
from echomq.serializers import Serializer, resolve_serializer

__all__ = ["App", "Discard", "JobContext", "Retry", "Task", "current_job"]

P = ParamSpec("P")
R = TypeVar("R")


class Retry(Exception):
    """Raise inside a handler to retry the job after ``delay_ms`` (the task's backoff when
    None). The attempt ceiling still applies: at ``max_attempts`` the job is dead."""

    def __init__(self, delay_ms: int | None = None, reason: str = "retry requested") -> None:
        super().__init__(reason)
        self.delay_ms = delay_ms
        self.reason = reason


class Discard(Exception):
    """Raise inside a handler to dead-letter the job now, with ``reason`` as last_error."""

    def __init__(self, reason: str = "discarded") -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Options:
    """Job options for one enqueue: ``task.options(delay_ms=..., group=..., id=...)``."""

    delay_ms: int | None = None
    at_ms: int | None = None
    group: str | None = None
    id: str | None = None


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
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", name)
        self.__wrapped__ = fn

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.queue}>"

    def payload(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
        """The wire payload of one call of this task."""
        return _envelope.build(self.app.serializer, self.name, args, kwargs)

    def options(
        self,
        *,
        delay_ms: int | None = None,
        at_ms: int | None = None,
        group: str | None = None,
        id: str | None = None,
    ) -> BoundTask[P, R]:
        """This task with job options: a delay, an absolute run time, a lane, an id."""
        return BoundTask(self, Options(delay_ms, at_ms, group, id))

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Enqueued:
        """Enqueue a call of this task with the handler's arguments."""
        return BoundTask(self, Options()).enqueue(*args, **kwargs)

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> Enqueued:
        """``enqueue`` for asyncio code."""
        return await BoundTask(self, Options()).aenqueue(*args, **kwargs)

    def enqueue_many(
        self, calls: Iterable[tuple[tuple[Any, ...], dict[str, Any]]], *, group: str | None = None
    ) -> list[Enqueued | EchoMQError]:
        """Enqueue many calls, each ``(args, kwargs)``, in few round trips."""
        payloads = [self.payload(tuple(a), dict(k)) for a, k in calls]
        return self.app.queue(self.queue).enqueue_many(payloads, group=group)


@dataclass(frozen=True, slots=True)
class BoundTask(Generic[P, R]):
    """A task with job options bound; made by ``Task.options``."""

    task: Task[P, R]
    opts: Options = field(default_factory=Options)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Enqueued:
        o = self.opts
        return self.task.app.queue(self.task.queue).enqueue(
            self.task.payload(args, kwargs),
            id=o.id,
            group=o.group,
            delay_ms=o.delay_ms,
            at_ms=o.at_ms,
        )

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> Enqueued:
        o = self.opts
        return await self.task.app.aqueue(self.task.queue).enqueue(
            self.task.payload(args, kwargs),
            id=o.id,
            group=o.group,
            delay_ms=o.delay_ms,
            at_ms=o.at_ms,
        )


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
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        client: SyncClient | None = None,
        serializer: str | Serializer = "json",
        max_payload: int | None = None,
        durable: int | None = None,
    ) -> None:
        self._url = url  # App(url=...): step 2 of echomq._connect.resolve_url
        self._resolved: Resolved | None = None
        self._client = client
        self._owns_client = False
        self.serializer = resolve_serializer(serializer)
        self.max_payload = max_payload
        self.durable = durable
        self.tasks: dict[str, Task[Any, Any]] = {}
        self._queues: dict[str, Queue] = {}
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
            )
            self.tasks[task_name] = t
            return t

        return register(fn) if fn is not None else register

    def queues(self) -> list[str]:
        """Every queue a registered task uses, sorted."""
        return sorted({t.queue for t in self.tasks.values()})

    def _queue_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"durable": self.durable}
        if self.durable is None:
            kwargs["durable"] = parse_url(self.url)[2] if self._url or not self._client else 0
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
        self._aqueues.pop(loop, None)
        client = self._aclients.pop(loop, None)
        if client is not None:
            await client.aclose()  # type: ignore[attr-defined]
        self.close()
