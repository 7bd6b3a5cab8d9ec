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
be ``async def``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from echomq.errors import InvalidArgument
from echomq.protocol.observe import Event
from echomq.queue import AsyncQueue, Queue

__all__ = ["AsyncEventListener", "Event", "EventListener"]

log = logging.getLogger("echomq.events")
Callback = Callable[[Event], Any]


class _Base:
    def __init__(
        self,
        *,
        after: str | None,
        store: str | os.PathLike[str] | None,
        load: Callable[[], str | None] | None,
        save: Callable[[str], None] | None,
        count: int,
        block_ms: int,
    ) -> None:
        if store is not None and (load is not None or save is not None):
            raise InvalidArgument("pass store or load/save, not both")
        self._path = Path(store) if store is not None else None
        self._load = load
        self._save = save
        self.count = count
        self.block_ms = block_ms
        self._handlers: dict[str, list[Callback]] = {}
        saved = self._restore()
        # Resume from what was saved; else the caller's start; else from the oldest kept.
        self.last_id = saved or after or "0"

    def on(self, event: str, fn: Callback | None = None) -> Any:
        """Register ``fn`` for ``event`` (``"*"``: every event); usable as a decorator."""
        if not isinstance(event, str) or not event:
            raise InvalidArgument(f"event must be a non-empty str, got {event!r}")

        def register(f: Callback) -> Callback:
            if not callable(f):
                raise InvalidArgument("an event callback must be callable")
            self._handlers.setdefault(event, []).append(f)
            return f

        return register(fn) if fn is not None else register

    def _targets(self, event: Event) -> list[Callback]:
        return self._handlers.get(event.event, []) + self._handlers.get("*", [])

    def _restore(self) -> str | None:
        if self._load is not None:
            return self._load() or None
        if self._path is not None:
            try:
                return self._path.read_text().strip() or None
            except FileNotFoundError:
                return None
        return None

    def _persist(self, stream_id: str) -> None:
        self.last_id = stream_id
        if self._save is not None:
            self._save(stream_id)
        elif self._path is not None:
            # Write then rename: a crash leaves the old id or the new one, never half of one.
            tmp = self._path.with_name(self._path.name + ".tmp")
            tmp.write_text(stream_id)
            os.replace(tmp, self._path)


class EventListener(_Base):
    """Dispatches the events of a :class:`~echomq.Queue` to callbacks, resuming by id."""

    def __init__(
        self,
        queue: Queue,
        *,
        after: str | None = None,
        store: str | os.PathLike[str] | None = None,
        load: Callable[[], str | None] | None = None,
        save: Callable[[str], None] | None = None,
        count: int = 100,
        block_ms: int = 5_000,
    ) -> None:
        super().__init__(
            after=after, store=store, load=load, save=save, count=count, block_ms=block_ms
        )
        self.queue = queue
        self._stop = threading.Event()

    def poll(self, block_ms: int | None = None) -> int:
        """Read one batch (waiting up to ``block_ms``), dispatch it, save the last id;
        returns how many events it dispatched."""
        batch = self.queue.events(after=self.last_id, count=self.count, block_ms=block_ms)
        for event in batch:
            for fn in self._targets(event):
                try:
                    fn(event)
                except Exception:
                    log.exception("event callback %r failed on %s; moving on", fn, event)
        if batch:
            self._persist(batch[-1].stream_id)
        return len(batch)

    def run(self) -> None:
        """Poll until :meth:`stop` (from a callback or another thread)."""
        self._stop.clear()
        while not self._stop.is_set():
            self.poll(self.block_ms)

    def stop(self) -> None:
        self._stop.set()


class AsyncEventListener(_Base):
    """The asyncio twin of :class:`EventListener`; callbacks may be coroutines."""

    def __init__(
        self,
        queue: AsyncQueue,
        *,
        after: str | None = None,
        store: str | os.PathLike[str] | None = None,
        load: Callable[[], str | None] | None = None,
        save: Callable[[str], None] | None = None,
        count: int = 100,
        block_ms: int = 5_000,
    ) -> None:
        super().__init__(
            after=after, store=store, load=load, save=save, count=count, block_ms=block_ms
        )
        self.queue = queue
        self._stop = asyncio.Event()

    async def poll(self, block_ms: int | None = None) -> int:
        batch = await self.queue.events(after=self.last_id, count=self.count, block_ms=block_ms)
        for event in batch:
            for fn in self._targets(event):
                try:
                    result = fn(event)
                    if inspect.isawaitable(result):
                        await result
                except Exception:
                    log.exception("event callback %r failed on %s; moving on", fn, event)
        if batch:
            self._persist(batch[-1].stream_id)
        return len(batch)

    async def run(self) -> None:
        self._stop.clear()
        while not self._stop.is_set():
            await self.poll(self.block_ms)

    def stop(self) -> None:
        self._stop.set()
