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
import concurrent.futures
import logging
import os
import time
import traceback
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from echomq._appface import AppFace, TaskFace
from echomq.backoff import exponential
from echomq.context import JobContext, _current
from echomq.hooks import Hooks
from echomq.outcomes import Discard, RateLimit, Retry
from echomq.protocol import compose as _compose
from echomq.protocol import envelope as _envelope
from echomq.protocol import kernel as _k
from echomq.protocol.kernel import Job, Keys
from echomq.runtime.isolate import Child, ChildTimeout
from echomq.runtime.pool import PoolRun, ProcessPool
from echomq.runtime.runs import Done, Running, Settle

__all__ = ["Runner", "Running", "Settle"]

log = logging.getLogger("echomq.worker")
# One line per job's end (docs/API.md, "Logs"): failures, retries, dead-letters, timeouts,
# unknown tasks, cancels; completions at DEBUG only.
jlog = logging.getLogger("echomq.worker.jobs")
_TIMEOUT_TEXT = "TimeoutError: the run took longer than"
T = TypeVar("T")

_MAX_ERROR_TEXT = 8192
_DEFAULT_BACKOFF = exponential(1_000, 60_000)  # the fallback when a task's own policy fails


class _HandlerExit(Exception):
    """Carries a handler's non-Exception ``BaseException`` out of a task that asyncio would
    otherwise let escape to the event loop (it re-raises SystemExit/KeyboardInterrupt)."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(type(exc).__name__)
        self.exc = exc


class Runner:
    """Runs the jobs of one worker. ``threads`` is the worker's pool (set when it starts);
    ``stopping`` is set at shutdown, when a cancelled run is a hand-back, not a failure."""

    def __init__(self, app: AppFace, hooks: Hooks, beat_ms: int) -> None:
        self.app = app
        self.hooks = hooks
        self.beat_ms = beat_ms
        self.threads: ThreadPoolExecutor | None = None
        self.pool: ProcessPool | None = None  # set by the worker when a task uses it
        # The worker's own executor (set when it starts): a workflow step reads its
        # children's values through it (the app's asyncio clients are the caller's to close).
        self.reads: Any = None
        self.stopping = False
        # Inline handlers run inside the pump's turn; async job hooks need a loop task.
        self._inline_ok = not hooks.job_hooks_async
        # Hooks are frozen: a worker without job hooks skips both awaits on every job.
        self._job_hooks = bool(hooks.fns("before_job") or hooks.fns("after_job"))

    def start(self, queue: str, r: Running, done: Done) -> None:
        """Start one run; ``done(r, settle)`` is called exactly once when it ends (settle None:
        nothing to settle — the lease was lost or the job handed back)."""
        job = r.job
        prepared = self.prepare(job)
        if isinstance(prepared, Settle):  # undecodable or unknown: dead-lettered, never run
            self._log_refused(queue, job, prepared)
            done(r, prepared)
            return
        task, args, kwargs, r.max_attempts, opts = prepared
        if opts:
            r.keep_ms, r.prev = _workflow_opts(opts)
            arg = opts.get("arg")
            r.prev_arg = arg if isinstance(arg, str) and arg.isidentifier() else None
        # Positional (queue, id, token, group, task, lost, cancelled, app, floor, payload):
        # keyword arguments cost a dataclass __init__ half as much again, once a job.
        r.ctx = JobContext(
            queue, job.id, job.token, job.group, task.name, False, False, self.app, job.floor,
            job.payload,
        )  # fmt: skip
        if jlog.isEnabledFor(logging.DEBUG):
            r.begun = time.monotonic()
            # The start line: a run that hangs is seen in the log (its end line never comes).
            # DEBUG, as the completion line: at INFO the two cost 35-40 us of worker CPU a
            # job, twice all else the worker spends on a no-op job (issue 41).
            where, fields = _job_line(r, task)
            jlog.debug("%s started", where, extra=fields)
        if r.prev is not None:
            # A workflow step: its first argument is read from its children's values first
            # (one server read, on the loop), then the run goes on as any other.
            r.fut = asyncio.ensure_future(self._chained(r, task, args, kwargs, done))
        elif task.inline and self._inline_ok:
            # A trivial sync handler runs right here in the pump's turn: no thread handoff
            # and no event-loop task per job.
            done(r, self._run_inline(r, task, args, kwargs))
        else:
            # The loop's own create_task: asyncio.ensure_future's checks cost as much again.
            r.fut = asyncio.get_running_loop().create_task(
                self._execute(r, task, args, kwargs, done)
            )

    def prepare(
        self, job: Job
    ) -> tuple[TaskFace, list[Any], dict[str, Any], int, dict[str, Any]] | Settle:
        """The task, arguments, own attempt budget (0: the task's) and options of a job, or the
        dead-letter settle of a job no handler can run: an undecodable payload or an unknown
        task is never silently dropped."""
        try:
            name, args, kwargs, opts = _envelope.parse_full(self.app.serializer, job.payload)
        except Exception as exc:
            return self.dead(job, f"undecodable payload: {_safe_str(exc)}")
        task = self.app.tasks.get(name) if isinstance(name, str) else None
        if task is None:
            return self.dead(job, f"unknown task {_safe_repr(name)}: no handler is registered")
        try:  # a call that does not fit the handler never will: dead at once, not retried
            if not opts or _workflow_opts(opts)[1] is None:  # a step's binds with its value
                args, kwargs = task.from_wire(args, kwargs)
        except Exception as exc:
            return self.dead(job, f"{type(exc).__name__}: {_safe_str(exc)}", task.keep_result_ms)
        return task, args, kwargs, _envelope.attempt_budget(opts) if opts else 0, opts

    async def _chained(
        self, r: Running, task: TaskFace, args: list[Any], kwargs: dict[str, Any], done: Done
    ) -> None:
        """A workflow step (echomq.tasks.workflows): prepend the value(s) its envelope's ``prev``
        names, read from the job's ``processed`` hash, then run it. A call that still does
        not bind is dead at once; a failed read is a failed run (retried)."""
        assert r.ctx is not None
        try:
            read = _compose.children_values(Keys(r.ctx.queue), r.job.id)
            if self.reads is not None:
                raw = await self.reads.run(read)
            else:  # a runner driven without a worker (tests): the app's asyncio client
                raw = await self.app.aqueue(r.ctx.queue).children_values(r.job.id)
            loads = self.app.serializer.loads
            values = {k: loads(v) if v else None for k, v in raw.items()}
            if isinstance(r.prev, list):  # a chord's callback: the members' values, in order
                first: Any = [values.get(str(i)) for i in r.prev]
            else:  # a chain step: its one child's value
                first = next(iter(values.values()), None)
        except asyncio.CancelledError:
            # Cancelled during the read (D22: dead "cancelled"), or lost, handed back, the
            # worker torn down (nothing to settle): done exactly once, as _execute does.
            if r.cancelled and not r.lost:
                getattr(asyncio.current_task(), "uncancel", lambda: 0)()
                done(r, self.dead(r.job, "cancelled", r.keep_ms))
                return
            done(r, None)
            raise
        except Exception as exc:
            settle = self.outcome(r.job, task, exc, r.max_attempts)
            self._log_end(r, task, settle, exc)
            done(r, self._kept(r, settle))
            return
        try:
            if r.prev_arg is None:
                args, kwargs = task.from_wire([first, *args], kwargs)
            else:
                args, kwargs = task.from_wire(args, {**kwargs, r.prev_arg: first})
        except Exception as exc:
            settle = self.dead(r.job, f"{type(exc).__name__}: {_safe_str(exc)}", r.keep_ms)
            self._log_end(r, task, settle, exc)
            done(r, settle)
            return
        await self._execute(r, task, args, kwargs, done)

    def _kept(self, r: Running, settle: Settle | None) -> Settle | None:
        """A workflow step's failure keeps its error as long as the step keeps its value."""
        if settle is not None and r.keep_ms > settle.keep_ms and settle.kind != "pushed":
            settle.keep_ms = r.keep_ms
        return settle

    def _run_inline(
        self, r: Running, task: TaskFace, args: list[Any], kwargs: dict[str, Any]
    ) -> Settle:
        token = _current.set(r.ctx)
        error: BaseException | None = None
        try:
            if self._job_hooks:
                self.hooks.call_sync("before_job", r.ctx)
            value = task.fn(*args, **kwargs)
        except BaseException as exc:  # any failure is the run's, never the worker's
            error = exc
        finally:
            _current.reset(token)
        if error is None:
            settle = self._completed(r.job, task, value, r.max_attempts, r.keep_ms)
        else:
            settle = self.outcome(r.job, task, error, r.max_attempts)
            if r.keep_ms:
                self._kept(r, settle)
        if self._job_hooks:
            self.hooks.call_sync("after_job", r.ctx, settle.outcome, error)
        self._log_end(r, task, settle, error)
        return settle

    async def _execute(
        self,
        r: Running,
        task: TaskFace,
        args: list[Any],
        kwargs: dict[str, Any],
        done: Done,
    ) -> None:
        settle: Settle | None = None
        error: BaseException | None = None
        token = _current.set(r.ctx)
        try:
            if self._job_hooks:
                await self.hooks.call("before_job", r.ctx)
            if task.is_async and not task.timeout:
                # Awaited right in this run's task (no wrapper coroutine, the common case): a
                # BaseException of the handler lands in the except clauses below.
                value = await task.fn(*args, **kwargs)
            else:
                value = await self._invoke(task, r, args, kwargs)
            if task.keep_result_ms or r.keep_ms:
                settle = self._completed(r.job, task, value, r.max_attempts, r.keep_ms)
            else:  # the common case, inline: nothing to serialize
                settle = Settle(r.job.id, r.job.token, "completed")
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
                settle = self.outcome(r.job, task, exc, r.max_attempts)
        except BaseException as exc:
            error = exc.exc if isinstance(exc, _HandlerExit) else exc
            settle = self.outcome(r.job, task, error, r.max_attempts)
        finally:
            try:
                if r.cancelled and settle is not None and settle.error != "cancelled":
                    # A sync handler that saw current_job().cancelled, or one that finished
                    # before the cancel reached it: the job was cancelled, it dies as such.
                    settle = self.dead(r.job, "cancelled", task.keep_result_ms)
                if r.lost:
                    settle = None
                if settle is not None:
                    self._log_end(r, task, settle, error)
                if self._job_hooks:
                    kind = settle.outcome if settle is not None else "lost"
                    await self.hooks.call("after_job", r.ctx, kind, error)
            finally:
                _current.reset(token)
                done(r, self._kept(r, settle) if r.keep_ms else settle)

    async def _invoke(
        self, task: TaskFace, r: Running, args: list[Any], kwargs: dict[str, Any]
    ) -> Any:
        if task.is_async:
            # wait_for runs it in a task of its own, where asyncio would re-raise a handler's
            # SystemExit or KeyboardInterrupt into the event loop: _guard wraps them.
            run: Awaitable[Any] = _guard(task.fn(*args, **kwargs))
        elif task.inline:  # inline, but a job hook is async: a loop task, still no thread
            return task.fn(*args, **kwargs)
        elif task.pool is not None:
            # One of the worker's persistent children (echomq.runtime.pool); it enforces the timeout
            # itself (ChildTimeout) and kills the child on any other end of the run.
            assert self.pool is not None and self.threads is not None and r.ctx is not None
            claim = r.child = PoolRun()
            return await self.pool.run(task, args, kwargs, r.ctx, claim, self.threads)
        elif task.isolate:
            # A child process per run, waited on in a pool thread; the child enforces the
            # timeout itself (ChildTimeout) and is killed on any other end of the run.
            assert self.threads is not None and r.ctx is not None
            r.child = Child(task, args, kwargs, r.ctx)
            try:
                return await asyncio.wrap_future(self.threads.submit(r.child.run, task.timeout))
            finally:
                r.child.kill()  # a cancelled await (lost, cancelled, shutdown) kills it too
        else:
            assert self.threads is not None and r.ctx is not None
            thread = self.threads.submit(_run_in_context, r.ctx, task.fn, args, kwargs)
            # Past a timeout (or a hand-back) the run settles and its slot is freed while the
            # thread still runs: a stranded thread, counted by the worker (Worker._finish).
            r.thread, r.started = thread, time.monotonic()
            run = asyncio.wrap_future(thread)
        if not task.timeout:
            return await run
        try:
            return await asyncio.wait_for(run, task.timeout)
        except asyncio.TimeoutError:
            if r.thread is not None and not r.thread.done() and r.ctx is not None:
                # The run is settled as failed while the thread runs on: whatever it returns
                # is never settled, so its current_job().lost / .should_stop turn true.
                r.ctx.lost = True
            raise

    def _log_end(
        self, r: Running, task: TaskFace, settle: Settle, error: BaseException | None
    ) -> None:
        """The run's one log line (a completion only at DEBUG: nothing is built otherwise)."""
        settle.task, settle.floor = task.name, r.job.floor  # for a refused settle's line
        kind = settle.kind
        # Completions are logged only for runs that began with DEBUG on (r.begun set): one
        # level check a job, in start(); at INFO (the default) nothing is built.
        if kind == "completed" and not r.begun:
            return
        if kind == "pushed" and not jlog.isEnabledFor(logging.DEBUG):
            return
        where, fields = _job_line(r, task)
        if kind == "completed":
            ms = round((time.monotonic() - r.begun) * 1000, 3) if r.begun else None
            fields["duration_ms"] = ms
            jlog.debug("%s completed in %s ms", where, ms, extra=fields)
            return
        if kind == "pushed":
            fields["delay_ms"] = settle.delay_ms
            jlog.debug("%s rate-limited: back in %d ms", where, settle.delay_ms, extra=fields)
            return
        text = settle.error.partition("\n")[0]
        fields["error"] = text
        if r.cancelled and settle.error == "cancelled":
            jlog.info("%s cancelled: dead-lettered", where, extra=fields)
            return
        # A traceback is the handler's own: not for a signal, a timeout or a cancel.
        exc = (
            error
            if error is not None
            and not isinstance(error, (Retry, Discard, asyncio.CancelledError))
            and not text.startswith(_TIMEOUT_TEXT)
            else None
        )
        if settle.outcome == "dead":
            jlog.error("%s dead-lettered: %s", where, text, exc_info=exc, extra=fields)
            return
        fields["delay_ms"] = delay = settle.delay_ms
        if text.startswith(_TIMEOUT_TEXT):
            what, level = "timed out", logging.WARNING
        elif isinstance(error, Retry):
            what, level = "retry requested", logging.INFO
        else:
            what, level = "failed", logging.WARNING
        jlog.log(
            level, "%s %s: %s; retrying in %d ms", where, what, text, delay,
            exc_info=exc, extra=fields,
        )  # fmt: skip

    def _log_refused(self, queue: str, job: Job, settle: Settle) -> None:
        """The ERROR line of a job dead-lettered before any run: an unknown task, an
        undecodable payload, arguments that do not fit the handler."""
        try:
            name = _envelope.parse(self.app.serializer, job.payload)[0]
        except Exception:
            name = None
        task = name if isinstance(name, str) else "?"
        settle.task, settle.floor = task, job.floor
        text = settle.error.partition("\n")[0]
        fields = {
            "queue": queue, "job_id": job.id, "task": task, "attempt": job.attempt,
            "error": text,
        }  # fmt: skip
        jlog.error(
            "job %s (task %s, queue %s, attempt %d) %s: dead-lettered",
            job.id, task, queue, job.attempt, text, extra=fields,
        )  # fmt: skip

    def outcome(self, job: Job, task: TaskFace, exc: BaseException, budget: int = 0) -> Settle:
        """The settle of a failed run: a Retry or Discard signal, a timeout, or an error.
        ``budget``: the job's own attempt budget (issue 24), 0 for the task's."""
        if isinstance(exc, Retry):
            delay = self.backoff(task, job.attempt, exc.delay_ms)
            return self.retry(job, task, delay, f"Retry: {_safe_str(exc.reason)}", budget)
        if isinstance(exc, RateLimit):  # D21: back to the queue, no attempt spent
            return Settle(job.id, job.token, "pushed", exc.delay_ms)
        if isinstance(exc, Discard):
            return self.dead(job, f"Discard: {_safe_str(exc.reason)}", task.keep_result_ms)
        if isinstance(exc, ChildTimeout) or (
            isinstance(exc, asyncio.TimeoutError)
            and isinstance(exc.__cause__, asyncio.CancelledError)
        ):
            text = f"TimeoutError: the run took longer than {task.timeout}s"  # the task's timeout
        else:  # any other error, the handler's own TimeoutError (a socket, a client) included
            _trim_traceback(exc)  # before the log line reads it too
            text = error_text(exc)
        return self.retry(job, task, self.backoff(task, job.attempt), text, budget)

    def backoff(self, task: TaskFace, attempt: int, requested: Any = None) -> int:
        """The delay before the next attempt: ``requested`` (a Retry's), else the task's policy.
        A broken policy must not strand the job unsettled in active: log it, use the default.
        A delay past the protocol's longest (MAX_MS, ~69 years) is that longest: refused by
        the settle call, it would fail the whole batch, every turn."""
        try:
            delay = requested if requested is not None else task.backoff.delay_ms(attempt)
            return min(max(0, int(delay)), _k.MAX_MS)
        except Exception as exc:
            log.error(
                "task %s: bad backoff delay (%s); using the default policy",
                task.name,
                _safe_str(exc),
            )
            return _DEFAULT_BACKOFF.delay_ms(attempt)

    def retry(self, job: Job, task: TaskFace, delay: int, error: str, budget: int = 0) -> Settle:
        ceiling = budget or task.max_attempts  # issue 24: the job's own budget first
        # Promote our own short retries on time instead of at the next beat (once the settle
        # has landed: timed from here, the promote would run before the job is due).
        soon = 0 < delay < self.beat_ms and job.attempt < ceiling
        return Settle(
            job.id, job.token, "retried", max(0, int(delay)), ceiling,
            clip(error), int(delay) if soon else 0, keep_ms=task.keep_result_ms,
            floor=job.floor,
        )  # fmt: skip

    def dead(self, job: Job, reason: str, keep_ms: int = 0) -> Settle:
        # A retry with max_attempts=1 dead-letters at once (attempts >= 1 after any claim).
        return Settle(job.id, job.token, "dead", 0, 1, clip(reason), keep_ms=keep_ms)

    def _completed(
        self, job: Job, task: TaskFace, value: Any, budget: int = 0, keep_ms: int = 0
    ) -> Settle:
        keep = max(task.keep_result_ms, keep_ms)  # keep_ms: a workflow step's own (issue 42)
        if not keep:
            return Settle(job.id, job.token, "completed")  # no result: nothing more to do
        try:
            data = self.app.serializer.dumps(value)
        except Exception as exc:  # an unserializable return value fails the run
            return self.outcome(job, task, exc, budget)
        return Settle(job.id, job.token, "completed", result=data, keep_ms=keep)


def _workflow_opts(opts: dict[str, Any]) -> tuple[int, Any]:
    """A workflow step's ``keep_ms`` and ``prev`` (echomq.tasks.workflows) from its envelope's
    opts; an unusable value is ignored, as any unknown option is."""
    keep = opts.get("keep_ms")
    if isinstance(keep, bool) or not isinstance(keep, int) or not 0 < keep <= _k.MAX_MS:
        keep = 0
    prev = opts.get("prev")
    if not (prev == 1 or (isinstance(prev, list) and all(isinstance(i, str) for i in prev))):
        prev = None
    return keep, prev


def _job_line(r: Running, task: TaskFace) -> tuple[str, dict[str, Any]]:
    """The head of a job's log lines (``job <id> (task <t>, queue <q>, attempt n/max)``)
    and their structured fields."""
    job = r.job
    queue = r.ctx.queue if r.ctx is not None else ""
    most = r.max_attempts or task.max_attempts
    fields: dict[str, Any] = {
        "queue": queue,
        "job_id": job.id,
        "task": task.name,
        "attempt": job.attempt,
        "max_attempts": most,
    }
    return f"job {job.id} (task {task.name}, queue {queue}, attempt {job.attempt}/{most})", fields


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


# The frames a handler's traceback starts with that are the worker's, not the user's: this
# runner, the thread pool that ran a sync handler, asyncio awaiting it.
_OWN_FRAMES = (
    __file__,
    str(Path(asyncio.__file__).parent) + os.sep,
    str(Path(concurrent.futures.__file__).parent) + os.sep,
)


def _trim_traceback(exc: BaseException) -> None:
    """Start ``exc``'s traceback at the user's handler: drop the leading frames of echomq's
    own runner and of the thread pool and event loop that ran the handler, so the log line
    and ``last_error`` open with the user's code. A traceback with no user frame at all (a
    failure inside echomq itself) is kept whole."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_OWN_FRAMES):
        tb = tb.tb_next
    if tb is not None:
        exc.__traceback__ = tb


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
