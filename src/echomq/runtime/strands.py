"""Stranded threads: sync handlers still running after their run ended.

A thread cannot be stopped. When a sync handler outlives its run (its timeout passed, its
lease was lost, or the worker handed the job back), the worker frees the run's slot at once
and counts the thread here until it returns; its late result is ignored (the run already
ended and settled once). While ``limit`` threads are stranded the worker claims nothing
more, so hung handlers cannot pile up without bound (``Worker(max_stranded=...)``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from echomq.errors import InvalidArgument

__all__ = ["Strands", "check_limit"]

log = logging.getLogger("echomq.worker")


def check_limit(limit: object) -> int:
    """``max_stranded`` as given: an int in [0, 1e6]; InvalidArgument otherwise."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise InvalidArgument(f"max_stranded must be an int >= 0, got {limit!r}")
    if not 0 <= limit <= 1_000_000:
        raise InvalidArgument(f"max_stranded must be in [0, 1000000], got {limit}")
    return limit


class Strands:
    """The count of stranded threads (kept in the worker's stats) and the cap on them.
    ``stats`` is the worker's WorkerStats (its ``stranded_threads`` is this count);
    ``kick`` wakes the worker's pumps when a thread returns (claims may resume)."""

    def __init__(self, limit: int, stats: Any, kick: Callable[[], None]) -> None:
        self.limit = limit
        self._stats = stats
        self._kick = kick
        self._cap_logged = False

    def strand(self, thread: Future[Any], task: str, job_id: str, started: float) -> None:
        """Count ``thread`` until it returns (called on the worker's loop)."""
        self._stats.stranded_threads += 1
        log.warning(
            "task %s job %s: sync handler still running after %.1fs; its thread is stranded "
            "(%d stranded, max_stranded %d)",
            task, job_id, time.monotonic() - started, self._stats.stranded_threads, self.limit,
        )  # fmt: skip
        loop = asyncio.get_running_loop()

        def returned(_: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the worker stopped
                loop.call_soon_threadsafe(self._returned)

        thread.add_done_callback(returned)

    def _returned(self) -> None:
        self._stats.stranded_threads -= 1
        if not self.at_cap():
            self._cap_logged = False
        self._kick()

    def at_cap(self) -> bool:
        """True while ``limit`` threads are stranded: the worker claims nothing."""
        n = self._stats.stranded_threads
        if n == 0 or n < self.limit:
            return False
        if not self._cap_logged:
            self._cap_logged = True
            log.error(
                "%d sync handler threads are stranded (max_stranded %d): claiming nothing "
                "until one returns",
                n, self.limit,
            )  # fmt: skip
        return True
