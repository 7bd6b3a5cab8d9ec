"""What a running handler may know about its job: :func:`current_job` and :class:`JobContext`.

The worker sets the context around every handler run (on the event loop for ``async def`` and
inline handlers, inside the pool thread for sync ones), so ``echomq.current_job()`` works the
same in both. Outside a handler it is ``None``.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

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

    @property
    def attempt(self) -> int:
        """The attempt number (1 for the first run): the token is the attempt count."""
        return self.token


# Private: only the worker's runner sets it (and resets it after the run).
_current: contextvars.ContextVar[JobContext | None] = contextvars.ContextVar(
    "echomq_job", default=None
)


def current_job() -> JobContext | None:
    """The job the calling handler runs, or None outside a handler."""
    return _current.get()
