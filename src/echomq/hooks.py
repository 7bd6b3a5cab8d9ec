"""Worker lifecycle hooks: the seam metrics, events and tracing plug into.

Pass them to the worker: ``Worker(app, hooks=Hooks(before_job=..., after_job=...))``. Each
field is one callable or a sequence of them, plain or ``async def``:

- ``on_startup(worker)``: once, after the version fence and before the first claim;
- ``on_shutdown(worker)``: once, after in-flight jobs finished or were handed back and the
  last settles were sent, before the connection closes (``worker.stats`` is final);
- ``before_job(job)``: before each handler run, with its :class:`~echomq.JobContext`, in the
  handler's context (``current_job()`` is the job);
- ``after_job(job, outcome, error)``: after each run, with the outcome the worker will settle
  (``"completed"``, ``"retried"``, ``"dead"`` — a failure at ``max_attempts`` is dead) or
  ``"lost"`` (the lease was lost or the job handed back at shutdown: nothing is settled),
  and the handler's exception or None. It runs before the settle is sent (settles go out
  in batches): a settle the server refuses (another run owns the job) is counted as lost
  in ``worker.stats``.

A hook that raises is logged and ignored: it never fails, delays past its own run, or wedges
a job. Hooks run on the worker's event loop, so a slow hook delays the worker: keep them
short (an async hook may await). A job of an ``inline`` task runs as a loop task instead of
inline when any job hook is async.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Union

__all__ = ["Hook", "Hooks"]

log = logging.getLogger("echomq.worker")

Hook = Union[Callable[..., Any], Sequence[Callable[..., Any]], None]  # noqa: UP007


def _as_list(value: Hook) -> tuple[Callable[..., Any], ...]:
    if value is None:
        return ()
    if callable(value):
        return (value,)
    return tuple(value)


@dataclass(frozen=True)
class Hooks:
    """The worker's lifecycle hooks (see the module docstring for when each runs)."""

    on_startup: Hook = None
    on_shutdown: Hook = None
    before_job: Hook = None
    after_job: Hook = None

    def __post_init__(self) -> None:
        for name in ("on_startup", "on_shutdown", "before_job", "after_job"):
            fns = _as_list(getattr(self, name))
            if not all(callable(f) for f in fns):
                raise TypeError(f"hooks.{name} must be a callable or a sequence of callables")
            object.__setattr__(self, name, fns)

    def fns(self, name: str) -> tuple[Callable[..., Any], ...]:
        """The callables of one hook (normalised to a tuple)."""
        found: tuple[Callable[..., Any], ...] = getattr(self, name)
        return found

    def around(self, inner: Hooks) -> Hooks:
        """``inner``'s hooks inside these (tracing's): this before_job runs first and this
        after_job last, so inner's per-job work happens inside them (a consumer span)."""
        return Hooks(
            on_startup=inner.fns("on_startup"),
            on_shutdown=inner.fns("on_shutdown"),
            before_job=self.fns("before_job") + inner.fns("before_job"),
            after_job=inner.fns("after_job") + self.fns("after_job"),
        )

    @property
    def job_hooks_async(self) -> bool:
        """Whether any per-job hook must be awaited."""
        fns = self.fns("before_job") + self.fns("after_job")
        return any(inspect.iscoroutinefunction(f) for f in fns)

    def call_sync(self, name: str, *args: Any) -> None:
        """Run a hook's sync callables now (an async one is a bug the caller avoids)."""
        for fn in self.fns(name):
            try:
                result = fn(*args)
                if inspect.isawaitable(result):
                    log.error("hook %s %r returned an awaitable where it runs inline", name, fn)
                    _close(result)
            except BaseException as exc:  # a hook never wedges a job, nor exits the worker
                _log(name, fn, exc)

    async def call(self, name: str, *args: Any) -> None:
        """Run a hook's callables, awaiting the async ones."""
        for fn in self.fns(name):
            try:
                result = fn(*args)
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:
                _log(name, fn, exc)
            except BaseException as exc:
                # CancelledError of the worker's own task propagates; a hook's SystemExit or
                # KeyboardInterrupt does not stop the worker.
                if isinstance(exc, asyncio.CancelledError):
                    raise
                _log(name, fn, exc)


def _close(aw: Any) -> None:
    close = getattr(aw, "close", None)
    if callable(close):
        close()


def _log(name: str, fn: Callable[..., Any], exc: BaseException) -> None:
    with contextlib.suppress(Exception):  # an exception that cannot even be logged
        log.error("hook %s %r raised %s; ignored", name, fn, type(exc).__name__, exc_info=exc)
