"""Process-isolated runs of sync handlers (``@app.task(isolate=True)``): a hard timeout.

A thread cannot be stopped, so a sync handler that hangs past its ``timeout`` keeps running
(a *stranded* thread, see ``Worker(max_stranded=...)``). An isolated task instead runs each
job in a child process of its own, started from a ``forkserver`` (``spawn`` where there is
none); at the timeout — or when the run is lost, cancelled or handed back — the child is
killed (SIGKILL), so nothing is left running.

The child finds the handler by reference: it imports the module that defines the task and
looks up its qualified name, so the task must be a module-level function of an importable
module (the app's module; not a ``<locals>`` function). Arguments and the return value cross
the process boundary through a multiprocessing pipe between the worker and its own child:
only objects the worker itself decoded from the payload (by the app's serializer) and the
child's own reply travel there; no payload bytes are ever unpickled. In the child,
``current_job()`` gives the job's id, queue, token, group and task, but
``cancelled``/``lost`` are never set there: the worker kills the child instead.

One :class:`Child` per run: :meth:`Child.run` blocks (the worker calls it in a pool thread)
and :meth:`Child.kill` may be called from any thread.
"""

from __future__ import annotations

import importlib
import multiprocessing
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from echomq.outcomes import Discard, RateLimit, Retry

if TYPE_CHECKING:
    from echomq._appface import TaskFace
    from echomq.context import JobContext

__all__ = ["Child", "ChildDied", "ChildTimeout", "run_call", "send_reply"]

_POLL_S = 0.05  # how often a waiting run looks for a kill request


class ChildTimeout(TimeoutError):
    """The isolated run took longer than the task's timeout; the child was killed."""


class ChildDied(RuntimeError):
    """The child process exited without a result (killed by a signal, or it crashed)."""


class _RemoteTraceback(Exception):
    """The child's traceback, chained as the cause of the error it raised."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


def _context() -> multiprocessing.context.BaseContext:
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


class Child:
    """One isolated run of ``task`` with ``args``/``kwargs``."""

    def __init__(
        self, task: TaskFace, args: list[Any], kwargs: dict[str, Any], ctx: JobContext
    ) -> None:
        self._ref = (task.fn.__module__, task.fn.__qualname__)
        self._args = args
        self._kwargs = kwargs
        self._job = (ctx.queue, ctx.id, ctx.token, ctx.group, ctx.task, ctx.floor)
        self._killed = threading.Event()
        self.pid: int | None = None

    def kill(self) -> None:
        """Ask the waiting run to kill its child now (thread-safe; idempotent)."""
        self._killed.set()

    def run(self, timeout: float | None) -> Any:
        """Start the child, wait for its result; kill it at ``timeout`` seconds (raising
        :class:`ChildTimeout`) or when :meth:`kill` is called (raising :class:`ChildDied`)."""
        mp = _context()
        recv, send = mp.Pipe(duplex=False)
        proc = mp.Process(  # type: ignore[attr-defined]
            target=_child_main,
            args=(send, self._ref, self._args, self._kwargs, self._job),
            name=f"echomq-isolated-{self._job[4]}",
            daemon=True,
        )
        try:
            proc.start()
            send.close()  # the child holds the only write end: EOF when it exits
            self.pid = proc.pid
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                if self._killed.is_set():
                    raise ChildDied("the run was stopped; the child was killed")
                wait = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
                if wait <= 0:
                    raise ChildTimeout(f"the run took longer than {timeout}s; the child was killed")
                if recv.poll(wait):
                    try:
                        reply = recv.recv()
                    except (EOFError, OSError):
                        proc.join(1.0)
                        raise ChildDied(
                            f"the child exited without a result (exit code {proc.exitcode})"
                        ) from None
                    except Exception as exc:  # a reply that does not rebuild here
                        raise ChildDied(f"unreadable reply: {type(exc).__name__}: {exc}") from None
                    return _unpack(reply)
        finally:
            if proc.is_alive():
                proc.kill()
            proc.join(5.0)
            recv.close()
            if proc.exitcode is not None:
                proc.close()


def _unpack(reply: tuple[Any, ...]) -> Any:
    kind = reply[0]
    if kind == "ok":
        return reply[1]
    if kind == "retry":
        raise Retry(reply[1], reply[2])
    if kind == "discard":
        raise Discard(reply[1])
    if kind == "ratelimit":
        raise RateLimit(reply[1])
    exc, text = reply[1], reply[2]
    if not isinstance(exc, BaseException):
        exc = ChildDied(reply[3])
    raise exc from _RemoteTraceback(text)


def _child_main(
    conn: Connection,
    ref: tuple[str, str],
    args: list[Any],
    kwargs: dict[str, Any],
    job: tuple[Any, ...],
) -> None:
    """The child: import the handler by reference, run it, send back what happened."""
    try:
        send_reply(conn, run_call(ref, args, kwargs, job))
    finally:
        conn.close()


def run_call(
    ref: tuple[str, str], args: list[Any], kwargs: dict[str, Any], job: tuple[Any, ...]
) -> tuple[Any, ...]:
    """In a child (isolated or a pool's): run one call of the handler found by reference;
    the reply that tells the worker what happened (see :func:`_unpack`)."""
    from echomq.context import JobContext, _current

    try:
        target: Any = importlib.import_module(ref[0])
        for part in ref[1].split("."):
            target = getattr(target, part)
        # A task (``@app.task``) carries its app and its function; anything else found by
        # the reference is the function itself. Read by attribute, not by class, so the child
        # needs no import of the application layer.
        is_task = callable(getattr(target, "fn", None)) and hasattr(target, "app")
        app = target.app if is_task else None
        fn = target.fn if is_task else target
        queue, job_id, token, group, task_name, floor = job
        token_ = _current.set(
            JobContext(queue, job_id, token, group, task_name, app=app, floor=floor)
        )
        try:
            return ("ok", fn(*args, **kwargs))
        finally:
            _current.reset(token_)
    except Retry as exc:
        return ("retry", exc.delay_ms, str(exc.reason))
    except Discard as exc:
        return ("discard", str(exc.reason))
    except RateLimit as exc:
        return ("ratelimit", exc.delay_ms)
    except BaseException as exc:  # any failure is the run's: send it back
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return ("error", exc, text, f"{type(exc).__name__}: {exc}")


def send_reply(conn: Connection, reply: tuple[Any, ...]) -> None:
    """Send a :func:`run_call` reply; one that cannot cross the pipe is sent as its text."""
    try:
        conn.send(reply)
    except Exception as exc:
        if reply[0] == "error":  # the exception itself does not cross: its text does
            conn.send(("error", None, reply[2], reply[3]))
        else:  # an unpicklable return value fails the run
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            conn.send(("error", None, text, f"unpicklable result: {type(exc).__name__}: {exc}"))
