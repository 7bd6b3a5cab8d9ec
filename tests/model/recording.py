"""Which verbs of ``echomq.Queue`` the model drives, recorded as it runs (issue 38 item 5).

The machine of tests/model/test_model.py holds its queues through ``Recorded``: every public
method called on a handle is noted in a set the machine owns, so the verbs the model drives
are read from a run, not listed by hand. tests/model/test_model_coverage.py compares them
with ``public_verbs()``.
"""

from __future__ import annotations

import inspect
from typing import Any

import echomq


def public_verbs() -> set[str]:
    """Every public method of ``echomq.Queue`` (its properties are not verbs)."""
    return {
        name
        for name, value in inspect.getmembers(echomq.Queue)
        if not name.startswith("_") and callable(value)
    }


class Recorded:
    """A ``Queue`` that notes the name of each public method called on it in ``calls``;
    everything else (``_k``, ``_x``, ``name``) is the queue's own attribute."""

    def __init__(self, queue: echomq.Queue, calls: set[str]) -> None:
        self._queue = queue
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        got = getattr(self._queue, name)
        if name.startswith("_") or not callable(got):
            return got
        calls = self._calls

        def call(*args: Any, **kwargs: Any) -> Any:
            calls.add(name)  # noted before the call: a refused call drove the verb too
            return got(*args, **kwargs)

        return call


def recording(queue: echomq.Queue, calls: set[str]) -> Any:
    """``queue`` behind a recorder (typed Any: it answers every ``Queue`` method)."""
    return Recorded(queue, calls)
