"""The worker's capacity: one object, and acquire/release the only way in or out.

A slot is taken when a claim is sent (for every job it may bring), given back for each job the
claim did not bring, and given back when a job's run ends — at once, even for a sync handler
still running in its thread past a timeout or a hand-back: that thread is *stranded*, counted
by the worker apart from the slots (``Worker(max_stranded=...)``), so hung handlers cannot
freeze a worker by holding every slot.
"""

from __future__ import annotations

from collections.abc import Callable

from echomq.errors import InvalidArgument

__all__ = ["Slots"]


class Slots:
    """``total`` slots shared by every queue of a worker; ``on_release`` runs after every
    release (the worker kicks its pumps: a slot may let a claim go out)."""

    __slots__ = ("_free", "on_release", "total")

    def __init__(self, total: int, on_release: Callable[[], None] | None = None) -> None:
        # At most 1,000,000: a claim takes at most that many jobs.
        if isinstance(total, bool) or not isinstance(total, int):
            raise InvalidArgument(f"concurrency must be an int >= 1, got {total!r}")
        if not 1 <= total <= 1_000_000:
            raise InvalidArgument(f"concurrency must be in [1, 1000000], got {total}")
        self.total = total
        self._free = total
        self.on_release = on_release

    @property
    def free(self) -> int:
        return self._free

    @property
    def used(self) -> int:
        return self.total - self._free

    def acquire(self, want: int) -> int:
        """Take up to ``want`` free slots; returns how many were taken."""
        n = max(0, min(want, self._free))
        self._free -= n
        return n

    def release(self, n: int = 1) -> None:
        """Give back ``n`` slots."""
        if n <= 0:
            return
        if self._free + n > self.total:
            # A double release would let the worker run more jobs than its concurrency.
            raise RuntimeError(f"slot accounting: releasing {n} with {self._free} free")
        self._free += n
        if self.on_release is not None:
            self.on_release()
