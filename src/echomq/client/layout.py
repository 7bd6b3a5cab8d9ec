"""The data-layout version (issue 39): which shape of queue data a client can serve.

``{emq}:version`` holds the *wire* version, ``echomq:3.0.0`` since 0.1.0, and a client
refuses any other value (D1). It never moved, so it lets every release connect to every
other. ``{emq}:layout`` holds the *data layout*: an integer, raised by any change an older
client would misread, and only by ``echomq migrate`` once the change's migration ran. It is a
key of its own so that the fence of a release older than 0.6 (which reads ``{emq}:version``
alone and compares it for equality) keeps connecting to a deployment a newer one touched.

A client serves the layouts ``MIN_LAYOUT..LAYOUT``; an absent key is layout 1 (every
deployment written before 0.6 records none), except on a fresh deployment, whose first client
records its own. On a layout outside its range a client refuses with one line saying what to
upgrade (:class:`~echomq.errors.LayoutFenceError`).

The layouts (docs/PROTOCOL.md §5.1 and docs/guides/upgrading.md keep this table too); no
release before 0.6 recorded its layout:

1. 0.1.0 - 0.3.x: a dead-letter is scored 0 in ``emq:{q}:dead``.
2. 0.4.x: ``dead`` is scored by the time of death (D25).
3. 0.5.0 on: the retired record keeps every retirement of the last 70 s and records every
   deleted row (a 0.4 process rotates it by count alone and records no never-claimed row,
   so a 0.5 producer's resend could be admitted twice beside it). 0.6 writes layout 3.

``echomq migrate`` takes a deployment from any of them to 3: the only step is
``dead-scores`` (the zeros of layout 1); 2 -> 3 needs no data change (0.5 reads 0.4's
record).
"""

from __future__ import annotations

from typing import Any

from echomq.errors import LayoutFenceError
from echomq.keyspace import LAYOUT_KEY

__all__ = ["LAYOUT", "LAYOUT_KEY", "MIN_LAYOUT", "check", "parse"]

LAYOUT = 3  # the layout this release writes (and `echomq migrate` raises a deployment to)
MIN_LAYOUT = 1  # the oldest layout it still serves: N-1's (the contract, upgrading.md)
UNRECORDED = 1  # what an absent key means: a deployment written before 0.6


def parse(raw: Any) -> int | None:
    """The recorded layout (None: not recorded); :class:`LayoutFenceError` for a value that
    is no layout number."""
    if raw is None:
        return None
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    if not text.isdigit() or len(text) > 9:
        raise LayoutFenceError(text, LAYOUT, MIN_LAYOUT)
    return int(text)


def check(raw: Any) -> int:
    """The layout this client serves the deployment in, or :class:`LayoutFenceError`."""
    found = parse(raw)
    layout = UNRECORDED if found is None else found
    if not MIN_LAYOUT <= layout <= LAYOUT:
        raise LayoutFenceError(str(layout), LAYOUT, MIN_LAYOUT)
    return layout
