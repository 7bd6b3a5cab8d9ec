"""A run and its settle: the records the runner, a queue's loop and the worker pass around.

:class:`Running` is one run of a claimed job (the worker keys it by ``(id, token)``; losing
the lease or a cancel reaches the handler through it); :class:`Settle` is what the run ended
as, waiting for the pump's next ``settle`` call; :data:`Done` is the callback the runner
hands them to. ``runtime.runner`` makes them and re-exports them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from echomq.context import JobContext
from echomq.protocol.kernel import Job
from echomq.runtime.isolate import Child
from echomq.runtime.pool import PoolRun

__all__ = ["Done", "Running", "Settle"]


class Running:
    """One run of a claimed job: the worker keys it by ``(id, token)``. A plain class with
    slots (a claim makes one per job: a dataclass's __init__ and __post_init__ cost ~2x)."""

    __slots__ = (
        "begun", "cancelled", "child", "ctx", "fut", "job", "keep_ms", "key", "lost",
        "max_attempts", "prev", "prev_arg", "started", "thread",
    )  # fmt: skip

    def __init__(self, job: Job, ctx: JobContext | None = None) -> None:
        self.job = job
        self.ctx = ctx
        self.fut: asyncio.Future[Any] | None = None
        # The lease was lost, or the job handed back: never settle this run.
        self.lost = False
        self.thread: Future[Any] | None = None  # a sync handler's run in the pool
        self.started = 0.0  # time.monotonic() when the sync handler's thread was submitted
        # An isolated run's child process (@app.task(isolate=True)), or a pool run's claim on
        # the worker's process pool (@app.task(pool="process")): kill() stops either.
        self.child: Child | PoolRun | None = None
        self.cancelled = False  # D22: the job was cancelled; its settle dead-letters it
        self.begun = 0.0  # time.monotonic() at the start, only while DEBUG logs are on
        # Issue 24: this job's own attempt budget (its envelope's opts), 0 for its task's.
        self.max_attempts = 0
        # Issue 42 (echomq.tasks.workflows): a workflow step keeps its value (and error) this
        # long whatever its task keeps, and ``prev`` says which children's values it
        # receives first; ``prev_arg``: the keyword the value goes in (chain_arg), or first.
        self.keep_ms = 0
        self.prev: Any = None
        self.prev_arg: str | None = None
        self.key = (job.id, job.token)  # how the worker tracks the run

    def __repr__(self) -> str:
        return f"Running(job={self.job!r}, lost={self.lost}, cancelled={self.cancelled})"

    def lose(self) -> None:
        """Another run owns the job now (or it was handed back): cancel, never settle."""
        self.lost = True
        if self.ctx is not None:
            self.ctx.lost = True
        if self.fut is not None:
            self.fut.cancel()
        if self.child is not None:
            self.child.kill()

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
        if self.child is not None:
            self.child.kill()


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
    task: str = ""  # the task's name, for the worker's log lines (a refused settle's)

    @property
    def outcome(self) -> str:
        """What the settle will do: a retry at the attempt ceiling dead-letters."""
        if self.kind == "retried" and self.token - self.floor >= self.max_attempts:
            return "dead"
        return self.kind


Done = Callable[[Running, "Settle | None"], None]
