"""Retry, RateLimit, Discard: what a handler raises to steer its job.

The outcomes a handler raises to steer its job: :class:`Retry`, :class:`RateLimit` and
:class:`Discard`. They live apart from ``echomq.app`` so that the code that runs handlers (the
worker's runner, an isolated child, the process pool) can read them without importing the
application layer. ``echomq.app`` and ``echomq`` re-export them."""

from __future__ import annotations

from echomq.errors import InvalidArgument

__all__ = ["Discard", "RateLimit", "Retry"]


class Retry(Exception):
    """Raise inside a handler to retry the job after ``delay_ms`` (the task's backoff when
    None). The attempt ceiling still applies: at ``max_attempts`` the job is dead."""

    def __init__(self, delay_ms: int | None = None, reason: str = "retry requested") -> None:
        super().__init__(reason)
        self.delay_ms = delay_ms
        self.reason = reason


class RateLimit(Exception):
    """Raise inside a handler when an outside limit refused the work (HTTP 429, a quota): the
    job runs again after ``delay_ms`` and this run does not count against ``max_attempts``."""

    def __init__(self, delay_ms: int = 1_000) -> None:
        if isinstance(delay_ms, bool) or not isinstance(delay_ms, int) or delay_ms < 0:
            raise InvalidArgument(f"delay_ms must be an int >= 0, got {delay_ms!r}")
        super().__init__(f"rate limited for {delay_ms} ms")
        self.delay_ms = delay_ms


class Discard(Exception):
    """Raise inside a handler to dead-letter the job now, with ``reason`` as last_error."""

    def __init__(self, reason: str = "discarded") -> None:
        super().__init__(reason)
        self.reason = reason
