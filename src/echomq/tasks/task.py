"""Task, a call with its options (Signature), what an enqueue answers.

Tasks: ``@app.task`` handlers as enqueueable objects (``Task``), a call with its options
(``Signature``, ``BoundTask``), and what an enqueue or a flow of tasks answers
(``TaskEnqueued``, ``TaskFlow``). ``App`` (``echomq.app``) registers them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, ParamSpec, TypeVar

from echomq import keyspace
from echomq._appface import HostApp, SignedTask
from echomq.backoff import Backoff
from echomq.errors import BadArguments, EchoMQError, InvalidArgument
from echomq.protocol import compose as _compose
from echomq.protocol import envelope as _envelope
from echomq.protocol.joboptions import NO_OPTIONS, JobOptions
from echomq.protocol.joboptions import budget as _budget
from echomq.protocol.kernel import MAX_ARG, MAX_MS, Enqueued, Keys, _priority
from echomq.tasks.binding import _UNSUPPORTED, _Params
from echomq.tasks.isolatable import check_isolatable
from echomq.tasks.workflows import Signature

P = ParamSpec("P")
R = TypeVar("R")


class Task(Generic[P, R]):
    """A registered handler. Call it to run it in-process; ``enqueue`` it to run it later."""

    def __init__(
        self,
        app: HostApp,
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
        if not 1 <= max_attempts <= MAX_ARG:
            raise InvalidArgument(f"max_attempts must be in [1, {MAX_ARG}], got {max_attempts}")
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
        if isolate:  # run in a child process that a timeout kills (echomq.runtime.isolate)
            if self.is_async or inline:
                raise InvalidArgument("isolate=True is for sync handlers that are not inline")
            if (why := check_isolatable(fn)) is not None:
                raise InvalidArgument(f"isolate=True: {why}")
        self.isolate = isolate
        if pool is not None:  # the worker's persistent process pool (echomq.runtime.pool)
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
            from echomq.protocol.control import rate_limit as _check_rate

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
        plain = NO_OPTIONS if not self.priority else JobOptions(priority=self.priority)
        self._plain: BoundTask[P, R] = BoundTask(self, plain)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.queue}>"

    def payload(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], opts: dict[str, Any] | None = None
    ) -> bytes:
        """The wire payload of one call of this task (``opts``: the job's options, see
        ``echomq.protocol.envelope``); :class:`BadArguments` when the call does not bind to the
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
        serializer encodes (``echomq.protocol.envelope.to_wire``)."""
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
        keep_logs: int | None = None,
    ) -> BoundTask[P, R]:
        """This task with job options: a delay, an absolute run time, a lane, an id, a dedup
        key (D20: ``dedup_mode`` simple, throttle or debounce, the last two with a TTL), a
        priority (0..2**21, lower runs first; None: the task's), this job's own attempt
        budget (``max_attempts``, overriding the task's) and its expiry (``ttl_ms``: not
        claimed within that long, it is dead-lettered ``expired``) and its log bound
        (``keep_logs``: ``add_log`` keeps its newest N lines)."""
        # The record checks every option here (a bad one fails now, not at enqueue).
        return BoundTask(
            self,
            JobOptions(
                delay_ms,
                at_ms,
                group,
                id,
                dedup,
                dedup_ttl_ms,
                dedup_mode,
                self.priority if priority is None else priority,
                max_attempts,
                ttl_ms,
                keep_logs,
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
        keep_logs: int | None = None,
    ) -> list[Enqueued | EchoMQError]:
        """Enqueue many calls, each ``(args, kwargs)``, in few round trips (``priority``:
        for every call, None: the task's; ``max_attempts``, ``ttl_ms`` and ``keep_logs``:
        every job's, as ``options``)."""
        job = JobOptions(
            group=group,
            priority=self.priority if priority is None else priority,
            max_attempts=max_attempts,
            ttl_ms=ttl_ms,
            keep_logs=keep_logs,
        )
        opts = _budget(job.max_attempts)
        otel = self.app._otel
        if otel is not None:
            span, payloads = otel.start_send(self, self._wire_calls(calls), opts, batch=True)
            try:
                found = self.app.queue(self.queue)._enqueue_many_job(payloads, job)
            except BaseException as exc:
                otel.end_send(span, None, exc)
                raise
            otel.end_send(span, None, None)
            return found
        payloads = _each_call(calls, lambda a, k: self.payload(a, k, opts))
        return self.app.queue(self.queue)._enqueue_many_job(payloads, job)

    def _wire_calls(
        self, calls: Iterable[tuple[tuple[Any, ...], dict[str, Any]]]
    ) -> list[tuple[Any, dict[str, Any]]]:
        """Each call checked and in builtins, for ``echomq.otel``'s payload builder."""
        return _each_call(calls, self.to_wire)

    def s(self, *args: P.args, **kwargs: P.kwargs) -> Signature:
        """A signature: this task with its call's arguments, for ``app.flow`` and
        ``app.chain`` (:class:`BadArguments` here when they do not bind to the handler). A
        call missing only its first positional argument is accepted: in a chain the previous
        step's value fills it; anywhere else it is refused when it is sent."""
        try:
            self.check_call(args, kwargs)
        except BadArguments:
            try:  # a chain step's call: the previous value comes first (echomq.tasks.workflows)
                self.check_call((None, *args), kwargs)
            except BadArguments:
                pass
            else:
                return Signature(self, tuple(args), dict(kwargs))
            raise
        return Signature(self, tuple(args), dict(kwargs))

    def si(self, *args: P.args, **kwargs: P.kwargs) -> Signature:
        """An immutable signature: in a chain, this step ignores the previous step's value
        and runs with exactly these arguments (Celery's ``.si()``)."""
        self.check_call(args, kwargs)
        return Signature(self, tuple(args), dict(kwargs), immutable=True)


@dataclass(frozen=True, slots=True)
class BoundTask(Generic[P, R]):
    """A task with job options bound; made by ``Task.options``."""

    task: Task[P, R]
    opts: JobOptions = NO_OPTIONS

    def _wire(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[bytes, Any]:
        """The call's payload and, when the app traces (echomq.otel), its "<task> send" span,
        whose context the envelope carries (None otherwise)."""
        opts = _budget(self.opts.max_attempts)
        otel = self.task.app._otel
        if otel is None:
            return self.task.payload(args, kwargs, opts), None
        span, (payload,) = otel.start_send(self.task, [self.task.to_wire(args, kwargs)], opts)
        return payload, span

    def _sent(self, span: Any, e: Enqueued | None, exc: BaseException | None) -> None:
        otel = self.task.app._otel
        if otel is not None:
            otel.end_send(span, e, exc)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> TaskEnqueued:
        payload, span = self._wire(args, kwargs)
        try:
            e = self.task.app.queue(self.task.queue)._enqueue_job(payload, self.opts)
        except BaseException as exc:
            self._sent(span, None, exc)
            raise
        self._sent(span, e, None)
        return TaskEnqueued(e.id, e.status, self.task)

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> TaskEnqueued:
        payload, span = self._wire(args, kwargs)
        try:
            e = await self.task.app.aqueue(self.task.queue)._enqueue_job(payload, self.opts)
        except BaseException as exc:
            self._sent(span, None, exc)
            raise
        self._sent(span, e, None)
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

    task: SignedTask = field(repr=False, compare=False)

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

    task: SignedTask = field(repr=False, compare=False)

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
