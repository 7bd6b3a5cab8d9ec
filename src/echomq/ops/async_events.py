"""``AsyncEventListener``, by hand: the source of the generated ``EventListener``.

The source scripts/gen-sync derives ``EventListener``
(``ops/sync_events.py``) from. The public module is :mod:`echomq.events`."""

from __future__ import annotations

import asyncio  # async-only
import inspect  # async-only
import logging
import os

# sync-only: import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from echomq.errors import InvalidArgument
from echomq.protocol.observe import Event
from echomq.queue import AsyncQueue

__all__ = ["AsyncEventListener"]

log = logging.getLogger("echomq.events")
Callback = Callable[[Event], Any]


class AsyncEventListener:
    """Dispatches the events of a queue (:class:`~echomq.AsyncQueue`) to callbacks, resuming
    by id; a callback may be ``async def``."""  # sync: by id."""

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
        self.queue = queue
        self._stop = asyncio.Event()  # sync: self._stop = threading.Event()

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

    async def poll(self, block_ms: int | None = None) -> int:
        """Read one batch (waiting up to ``block_ms``), dispatch it, save the last id;
        returns how many events it dispatched."""
        batch = await self.queue.events(after=self.last_id, count=self.count, block_ms=block_ms)
        for event in batch:
            for fn in self._targets(event):
                try:
                    result = fn(event)  # sync: fn(event)
                    if inspect.isawaitable(result):  # async-only
                        await result  # async-only
                except Exception:
                    log.exception("event callback %r failed on %s; moving on", fn, event)
        if batch:
            self._persist(batch[-1].stream_id)
        return len(batch)

    async def run(self) -> None:
        """Poll until :meth:`stop` (from a callback or elsewhere)."""
        self._stop.clear()
        while not self._stop.is_set():
            await self.poll(self.block_ms)

    def stop(self) -> None:
        self._stop.set()

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
