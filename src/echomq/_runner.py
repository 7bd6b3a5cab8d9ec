"""Running one job: one claimed job in, one settle out.

The runner decodes the task envelope, runs the handler (inline, as a loop task, or in the
worker's thread pool), turns what happened into a :class:`Settle` — completed, retried after
the task's backoff, or dead — and hands it to the worker's ``done`` callback, which returns
the job's slot and queues the settle for the next turn. It never does I/O of its own.

Whatever a handler raises is a failure of that run, settled by the task's policy:

- ``Retry``/``Discard`` are the handler's signals; a timeout is reported as one;
- any other exception, including one whose ``str()`` raises, is retried with its text;
- a ``BaseException`` that is not an ``Exception`` — ``SystemExit``, ``KeyboardInterrupt``
  (raised by the handler itself, even in a sync handler's thread), ``GeneratorExit`` or a
  custom one — is a handler failure too: the job is retried (or dead at ``max_attempts``),
  and the worker keeps running. A signal sent to the worker process never arrives as one of
  these: the worker handles SIGTERM/SIGINT itself.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from echomq import _envelope
from echomq import _protocol as _p
from echomq._protocol import Job
from echomq.app import Discard, RateLimit, Retry
from echomq.backoff import exponential
from echomq.context import JobContext, _current
from echomq.hooks import Hooks

if TYPE_CHECKING:
    from echomq.app import App, Task

__all__ = ["Runner", "Running", "Settle"]

log = logging.getLogger("echomq.worker")
T = TypeVar("T")

_MAX_ERROR_TEXT = 8192
_DEFAULT_BACKOFF = exponential(1_000, 60_000)  # the fallback when a task's own policy fails


@dataclass(eq=False)
class Running:
    """One run of a claimed job: the worker keys it by ``(id, token)``."""

    job: Job
    ctx: JobContext | None = None
    fut: asyncio.Future[Any] | None = None
    lost: bool = False  # the lease was lost, or the job handed back: never settle this run
    thread: Future[Any] | None = None  # a sync handler's run in the pool
    cancelled: bool = False  # D22: the job was cancelled; its settle dead-letters it

    @property
    def key(self) -> tuple[str, int]:
        return (self.job.id, self.job.token)

    def lose(self) -> None:
        """Another run owns the job now (or it was handed back): cancel, never settle."""
        self.lost = True
        if self.ctx is not None:
            self.ctx.lost = True
        if self.fut is not None:
            self.fut.cancel()

    def cancel(self) -> None:
        """The job was cancelled (D22): an async handler is cancelled at its next await, a
        sync one sees ``current_job().cancelled``; either way the run settles as dead."""
        if self.cancelled:
            return
        self.cancelled = True
        if self.ctx is not None:
            self.ctx.cancelled = True
        if self.fut is not None and self.thread is None:
            self.fut.cancel()


@dataclass(eq=False, slots=True)
class Settle:
    """A finished job waiting for the pump's next ``settle`` call."""

    job_id: str
    token: int
    kind: str  # completed | retried | dead | pushed (RateLimit: delay_ms, no attempt spent)
    delay_ms: int = 0
    max_attempts: int = 1
    error: str = ""
    promote_ms: int = 0  # a short retry: promote its queue this long after the settle lands
    result: bytes = b""  # D17: the serialized return value, kept when keep_ms > 0
    keep_ms: int = 0  # D17: the task keeps results (and a dead job's error) this long
    floor: int = 0  # the job's floor (Job.floor): the ceiling counts token - floor

    @property
    def outcome(self) -> str:
        """What the settle will do: a retry at the attempt ceiling dead-letters."""
        if self.kind == "retried" and self.token - self.floor >= self.max_attempts:
            return "dead"
        return self.kind


Done = Callable[[Running, "Settle | None"], None]


class _HandlerExit(Exception):
    """Carries a handler's non-Exception ``BaseException`` out of a task that asyncio would
    otherwise let escape to the event loop (it re-raises SystemExit/KeyboardInterrupt)."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(type(exc).__name__)
        self.exc = exc


class Runner:
    """Runs the jobs of one worker. ``threads`` is the worker's pool (set when it starts);
    ``stopping`` is set at shutdown, when a cancelled run is a hand-back, not a failure."""

    def __init__(self, app: App, hooks: Hooks, beat_ms: int) -> None:
        self.app = app
        self.hooks = hooks
        self.beat_ms = beat_ms
        self.threads: ThreadPoolExecutor | None = None
        self.stopping = False
        # Inline handlers run inside the pump's turn; async job hooks need a loop task.
        self._inline_ok = not hooks.job_hooks_async

    def start(self, queue: str, r: Running, done: Done) -> None:
        """Start one run; ``done(r, settle)`` is called exactly once when it ends (settle None:
        nothing to settle — the lease was lost or the job handed back)."""
        job = r.job
        prepared = self.prepare(job)
        if isinstance(prepared, Settle):  # undecodable or unknown: dead-lettered, never run
            done(r, prepared)
            return
        task, args, kwargs = prepared
        r.ctx = JobContext(
            queue,
            job.id,
            job.token,
            job.group,
            task.name,
            app=self.app,
            floor=job.floor,
            payload=job.payload,
        )
        if task.inline and self._inline_ok:
            # A trivial sync handler runs right here in the pump's turn: no thread handoff
            # and no event-loop task per job.
            done(r, self._run_inline(r, task, args, kwargs))
        else:
            r.fut = asyncio.ensure_future(self._execute(r, task, args, kwargs, done))

    def prepare(self, job: Job) -> tuple[Task[Any, Any], list[Any], dict[str, Any]] | Settle:
        """The task and arguments of a job, or the dead-letter settle of a job no handler can
        run: an undecodable payload or an unknown task is never silently dropped."""
        try:
            name, args, kwargs = _envelope.parse(self.app.serializer, job.payload)
        except Exception as exc:
            return self.dead(job, f"undecodable payload: {_safe_str(exc)}")
        task = self.app.tasks.get(name) if isinstance(name, str) else None
        if task is None:
            return self.dead(job, f"unknown task {_safe_repr(name)}: no handler is registered")
        return task, args, kwargs

    def _run_inline(
        self, r: Running, task: Task[Any, Any], args: list[Any], kwargs: dict[str, Any]
    ) -> Settle:
        token = _current.set(r.ctx)
        error: BaseException | None = None
        try:
            self.hooks.call_sync("before_job", r.ctx)
            value = task.fn(*args, **kwargs)
        except BaseException as exc:  # any failure is the run's, never the worker's
            error = exc
        finally:
            _current.reset(token)
        if error is None:
            settle = self._completed(r.job, task, value)
        else:
            settle = self.outcome(r.job, task, error)
        self.hooks.call_sync("after_job", r.ctx, settle.outcome, error)
        return settle

    async def _execute(
        self,
        r: Running,
        task: Task[Any, Any],
        args: list[Any],
        kwargs: dict[str, Any],
        done: Done,
    ) -> None:
        settle: Settle | None = None
        error: BaseException | None = None
        token = _current.set(r.ctx)
        try:
            await self.hooks.call("before_job", r.ctx)
            value = await self._invoke(task, r, args, kwargs)
            settle = self._completed(r.job, task, value)
        except asyncio.CancelledError as exc:
            if r.cancelled and not r.lost:
                # Our own cancel (D22), not the worker's teardown: the run ends here, dead.
                # Task.uncancel is 3.11+: on 3.10 the pending count is not tracked at all.
                getattr(asyncio.current_task(), "uncancel", lambda: 0)()
                settle = self.dead(r.job, "cancelled", task.keep_result_ms)
            elif not (r.lost or self.stopping):
                # Task.cancelling() is 3.11+; on 3.10 a cancel is always taken as the worker's.
                cancelling = getattr(asyncio.current_task(), "cancelling", lambda: 1)
                if cancelling():
                    raise  # the worker's own task is being torn down: nothing to settle
                error = exc  # the handler raised CancelledError itself: a failure
                settle = self.outcome(r.job, task, exc)
        except BaseException as exc:
            error = exc.exc if isinstance(exc, _HandlerExit) else exc
            settle = self.outcome(r.job, task, error)
        finally:
            try:
                if r.cancelled and settle is not None and settle.error != "cancelled":
                    # A sync handler that saw current_job().cancelled, or one that finished
                    # before the cancel reached it: the job was cancelled, it dies as such.
                    settle = self.dead(r.job, "cancelled", task.keep_result_ms)
                if r.lost:
                    settle = None
                kind = settle.outcome if settle is not None else "lost"
                await self.hooks.call("after_job", r.ctx, kind, error)
            finally:
                _current.reset(token)
                done(r, settle)

    async def _invoke(
        self, task: Task[Any, Any], r: Running, args: list[Any], kwargs: dict[str, Any]
    ) -> Any:
        if task.is_async:
            run: Awaitable[Any] = _guard(task.fn(*args, **kwargs))
        elif task.inline:  # inline, but a job hook is async: a loop task, still no thread
            return task.fn(*args, **kwargs)
        else:
            assert self.threads is not None and r.ctx is not None
            thread = self.threads.submit(_run_in_context, r.ctx, task.fn, args, kwargs)
            r.thread = thread  # its slot stays taken while the thread runs (Worker._finish)
            run = asyncio.wrap_future(thread)
        return await (asyncio.wait_for(run, task.timeout) if task.timeout else run)

    def outcome(self, job: Job, task: Task[Any, Any], exc: BaseException) -> Settle:
        """The settle of a failed run: a Retry or Discard signal, a timeout, or an error."""
        if isinstance(exc, Retry):
            delay = self.backoff(task, job.attempt, exc.delay_ms)
            return self.retry(job, task, delay, f"Retry: {_safe_str(exc.reason)}")
        if isinstance(exc, RateLimit):  # D21: back to the queue, no attempt spent
            return Settle(job.id, job.token, "pushed", exc.delay_ms)
        if isinstance(exc, Discard):
            return self.dead(job, f"Discard: {_safe_str(exc.reason)}", task.keep_result_ms)
        if isinstance(exc, asyncio.TimeoutError) and isinstance(
            exc.__cause__, asyncio.CancelledError
        ):
            text = f"TimeoutError: the run took longer than {task.timeout}s"  # the task's timeout
        else:  # any other error, the handler's own TimeoutError (a socket, a client) included
            text = error_text(exc)
        return self.retry(job, task, self.backoff(task, job.attempt), text)

    def backoff(self, task: Task[Any, Any], attempt: int, requested: Any = None) -> int:
        """The delay before the next attempt: ``requested`` (a Retry's), else the task's policy.
        A broken policy must not strand the job unsettled in active: log it, use the default.
        A delay past the protocol's longest (MAX_MS, ~69 years) is that longest: refused by
        the settle call, it would fail the whole batch, every turn."""
        try:
            delay = requested if requested is not None else task.backoff.delay_ms(attempt)
            return min(max(0, int(delay)), _p.MAX_MS)
        except Exception as exc:
            log.error(
                "task %s: bad backoff delay (%s); using the default policy",
                task.name,
                _safe_str(exc),
            )
            return _DEFAULT_BACKOFF.delay_ms(attempt)

    def retry(self, job: Job, task: Task[Any, Any], delay: int, error: str) -> Settle:
        # Promote our own short retries on time instead of at the next beat (once the settle
        # has landed: timed from here, the promote would run before the job is due).
        soon = 0 < delay < self.beat_ms and job.attempt < task.max_attempts
        return Settle(
            job.id, job.token, "retried", max(0, int(delay)), task.max_attempts,
            clip(error), int(delay) if soon else 0, keep_ms=task.keep_result_ms,
            floor=job.floor,
        )  # fmt: skip

    def dead(self, job: Job, reason: str, keep_ms: int = 0) -> Settle:
        # A retry with max_attempts=1 dead-letters at once (attempts >= 1 after any claim).
        return Settle(job.id, job.token, "dead", 0, 1, clip(reason), keep_ms=keep_ms)

    def _completed(self, job: Job, task: Task[Any, Any], value: Any) -> Settle:
        if not task.keep_result_ms:
            return Settle(job.id, job.token, "completed")  # no result: nothing more to do
        try:
            data = self.app.serializer.dumps(value)
        except Exception as exc:  # an unserializable return value fails the run
            return self.outcome(job, task, exc)
        return Settle(job.id, job.token, "completed", result=data, keep_ms=task.keep_result_ms)


async def _guard(aw: Awaitable[T]) -> T:
    try:
        return await aw
    except (Exception, asyncio.CancelledError):
        raise
    except BaseException as exc:
        raise _HandlerExit(exc) from exc


def _run_in_context(
    ctx: JobContext, fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]
) -> Any:
    token = _current.set(ctx)
    try:
        return fn(*args, **kwargs)
    finally:
        _current.reset(token)


def clip(text: str) -> str:
    """An error text fit for last_error: valid UTF-8 (an exception may carry lone
    surrogates), at most _MAX_ERROR_TEXT characters, keeping its head (type and message)."""
    text = text.encode("utf-8", "replace").decode("utf-8")
    if len(text) <= _MAX_ERROR_TEXT:
        return text
    half = (_MAX_ERROR_TEXT - 5) // 2
    return text[:half] + "\n...\n" + text[-half:]


def error_text(exc: BaseException) -> str:
    """``Type: message`` and the traceback; usable even when the exception's ``str()`` (or
    the formatting of its traceback) raises."""
    head = f"{type(exc).__name__}: {_safe_str(exc)}"
    try:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except BaseException as failure:
        tb = f"(traceback unavailable: {type(failure).__name__})"
    return f"{head}\n{tb}"


def _safe_str(value: object) -> str:
    try:
        return str(value)
    except BaseException as failure:
        return f"<str() raised {type(failure).__name__}>"


def _safe_repr(value: object) -> str:
    try:
        return repr(value)
    except BaseException as failure:
        return f"<repr() raised {type(failure).__name__}>"
