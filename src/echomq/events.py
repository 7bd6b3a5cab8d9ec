"""Listen to a queue's lifecycle events (PROTOCOL D15) and dispatch them to callbacks.

The queue's events must be on (``queue.enable_events(maxlen)``). A listener reads the
stream from its last id, so after a restart it resumes where it stopped and misses nothing
that the stream's bound kept::

    listener = EventListener(queue, store="/var/lib/app/orders.events-id")

    @listener.on("dead")
    def alert(event: Event) -> None: ...

    listener.run()            # or listener.poll() from your own loop

The last id is saved after each batch's callbacks ran (to ``store``, a file written
atomically, or through your ``save`` callable), so delivery to callbacks is at-least-once:
a crash between a callback and the save replays that batch. A callback that raises is
logged and the listener moves on: one bad event never wedges the stream.
``AsyncEventListener`` is the same over an :class:`~echomq.AsyncQueue`; its callbacks may
be ``async def``. ``EventListener`` is generated from it (``ops/async_events.py``, by
scripts/gen-sync).
"""

from __future__ import annotations

from echomq.ops.async_events import AsyncEventListener
from echomq.ops.sync_events import EventListener
from echomq.protocol.observe import Event

__all__ = ["AsyncEventListener", "Event", "EventListener"]
