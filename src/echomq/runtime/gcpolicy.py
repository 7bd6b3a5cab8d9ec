"""The garbage collector while a worker process serves (issue 41).

A worker allocates a few containers per job, so with the default thresholds (700 new
containers) the cyclic collector runs every few dozen jobs, and each of its full passes walks
every object the imports made. Two changes, made by :meth:`Worker.run` only (it owns the
process; ``Worker.arun`` leaves the caller's collector alone):

- ``gc.freeze()`` once start-up is done: the modules, the app, its tasks move to the
  permanent generation, which no collection walks again;
- a first-generation threshold of ``_GEN0`` containers instead of 700: a collection every
  few hundred jobs. Nothing a job leaves behind depends on the collector but reference
  cycles (a traceback, a failed run), and those are still collected, a little later.

Both are undone when the worker returns.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["serving"]

_GEN0 = 50_000


@contextmanager
def serving() -> Iterator[None]:
    """Freeze what start-up made and collect less often, until the block ends."""
    before = gc.get_threshold()
    # No gc.collect() first: a full pass costs start-up ~25 ms, for what little cyclic
    # garbage the imports left (frozen with the rest; collectable again after the worker).
    gc.freeze()
    gc.set_threshold(max(before[0], _GEN0), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
