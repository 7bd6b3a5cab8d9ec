"""What a running handler may know about its job: :func:`current_job` and :class:`JobContext`.

The worker sets the context around every handler run (on the event loop for ``async def`` and
inline handlers, inside the pool thread for sync ones), so ``echomq.current_job()`` works the
same in both. Outside a handler it is ``None``.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import Any

__all__ = ["JobContext", "current_job"]


@dataclass(slots=True)
class JobContext:
    """What a running handler may know about its job (``echomq.current_job()``)."""

    queue: str
    id: str
    token: int
    group: str | None
    task: str
    lost: bool = False  # set when the lease was lost: the result will not be settled
    # Set when the job was cancelled (D22, Queue.cancel): a sync handler polls it and returns;
    # the run is dead-lettered "cancelled" whatever it returns.
    cancelled: bool = False
    # The app whose worker runs the job: children_values reads through its client (D18).
    app: Any = field(default=None, repr=False, compare=False)
    floor: int = 0  # Job.floor: a re-admitted id's count continues from it
    # The job's raw payload (its task envelope): echomq.otel reads the trace context from it.
    payload: bytes = field(default=b"", repr=False, compare=False)

    def children_values(self) -> dict[str, Any]:
        """In a flow parent's handler: its children's return values (deserialized), by
        child id. A child's value is recorded when its task keeps results
        (``@app.task(keep_result_ms=...)``); otherwise it is ``None``."""
        if self.app is None:
            return {}
        raw = self.app.queue(self.queue).children_values(self.id)
        return {k: self.app.serializer.loads(v) if v else None for k, v in raw.items()}

    async def achildren_values(self) -> dict[str, Any]:
        """:meth:`children_values` for ``async def`` handlers (does not block the loop)."""
        if self.app is None:
            return {}
        raw = await self.app.aqueue(self.queue).children_values(self.id)
        return {k: self.app.serializer.loads(v) if v else None for k, v in raw.items()}

    @property
    def batch(self) -> Any:
        """The :class:`~echomq.Batch` this job belongs to (a member, or one of the batch's
        callbacks), else None: a member may ``add`` siblings even after ``close``. One
        server read on each access."""
        if self.app is None:
            return None
        return self.app.batch_of_job(self.id, queue=self.queue)

    @property
    def should_stop(self) -> bool:
        """The one flag a long sync handler polls to know it should return now: True once
        the lease was lost (another run owns the job, or a shutdown handed it back) or the
        job was cancelled. Either way whatever the handler returns is not settled as a
        success, so finishing the work only wastes it; ``lost`` and ``cancelled`` say which."""
        return self.lost or self.cancelled

    @property
    def attempt(self) -> int:
        """This incarnation's attempt number (1 for the first run): the token less the
        count a re-admitted id came back with (the number ``max_attempts`` counts)."""
        return self.token - self.floor


# Private: only the worker's runner sets it (and resets it after the run).
_current: contextvars.ContextVar[JobContext | None] = contextvars.ContextVar(
    "echomq_job", default=None
)


def current_job() -> JobContext | None:
    """The job the calling handler runs, or None outside a handler."""
    return _current.get()
