"""AsyncQueue's event, metric, repeat and flow verbs: a base class it inherits.

The verbs of the features composed over the core queue (D15 events, D16 metrics, D18 flows,
D19 repeats), each a one-line forwarder like ``AsyncQueue``'s own. Written by hand, and the
source ``scripts/gen-sync`` derives ``FlowVerbs`` (``client/sync_flows.py``) from, the base
class of ``Queue``.
"""

from __future__ import annotations

from collections.abc import Sequence

from echomq.client.executor import AsyncExecutor
from echomq.protocol import admin as _a
from echomq.protocol import compose as _c
from echomq.protocol import observe as _o
from echomq.protocol.kernel import Keys

__all__ = ["AsyncFlowVerbs"]


class AsyncFlowVerbs:
    """The event, metric, repeat and flow verbs of ``AsyncQueue`` (its ``_k`` and ``_x``)."""

    _k: Keys
    _x: AsyncExecutor

    # -- the layout of a sharded queue (issue 43): see echomq.client.shards

    async def shards(self) -> list[str]:
        """The queue's stored layout: its shards' queue names, this queue first; ``[name]``
        when it is not sharded."""
        return await self._x.run(_a.shards(self._k))

    async def propose_shards(self, names: Sequence[str]) -> list[str]:
        """Store ``names`` as the layout when it extends the stored one (a layout only
        grows); the stored layout after the call. ``Queue(name, shards=N)`` and ``reshard``
        call it with ``echomq.client.shards.layout``'s names."""
        return await self._x.run(_a.propose_shards(self._k, names))

    # -- events and metrics (D15, D16): see echomq.protocol.observe for the keys' layout

    async def enable_events(self, maxlen: int = 10_000) -> None:
        """Record every transition of this queue in its event stream (about ``maxlen`` kept)."""
        return await self._x.run(_o.enable_events(self._k, maxlen))

    async def disable_events(self) -> None:
        """Stop recording events (the stream already written is kept)."""
        return await self._x.run(_o.disable_events(self._k))

    async def events(
        self, *, after: str = "0", count: int = 100, block_ms: int | None = None
    ) -> list[_o.Event]:
        """Up to ``count`` events after the stream id ``after``, oldest first; ``block_ms``
        waits that long for one; ``after="$"`` sees only new ones."""
        return await self._x.run(_o.events(self._k, after, count, block_ms))

    async def metrics(self, kind: str = "completed", *, minutes: int = 60) -> list[int]:
        """Settles of ``kind`` (completed, failed) per minute, the current minute first."""
        return await self._x.run(_o.metrics(self._k, kind, minutes))

    # -- repeats (D19): see echomq.protocol.compose for the keys' layout

    async def repeat(
        self,
        name: str,
        payload: bytes | str,
        *,
        every_ms: int | None = None,
        cron: str | None = None,
        tz: str = "UTC",
        group: str | None = None,
        owner: str | None = None,
        limit: int | None = None,
        until_ms: int | None = None,
    ) -> str:
        """Register ``name`` to enqueue ``payload`` every ``every_ms`` or on ``cron`` (in
        ``tz``): ``"registered"`` or ``"updated"``. ``limit``: it fires at most that many times;
        ``until_ms``: no fire due after that ms (the caller's clock); ``repeats()`` shows a
        spent one with ``next_ms=None``."""
        return await self._x.run(
            _c.repeat(
                self._k,
                name,
                payload,
                every_ms=every_ms,
                cron=cron,
                tz=tz,
                group=group,
                owner=owner,
                limit=limit,
                until_ms=until_ms,
            )
        )

    async def unrepeat(self, name: str) -> bool:
        """Unregister ``name``; True when it was registered."""
        return await self._x.run(_c.unrepeat(self._k, name))

    async def pause_repeat(self, name: str) -> bool:
        """Pause ``name``: it fires no more until :meth:`resume_repeat`; registering it
        again (a worker start) keeps it paused. True when it is registered, False when no
        repeat has that name (nothing written)."""
        return await self._x.run(_c.pause_repeat(self._k, name))

    async def resume_repeat(self, name: str) -> bool:
        """Resume a paused ``name``: its next fire is computed from the server clock now
        (missed fires are not made up). True when it is registered (a repeat that is not
        paused is left as it is), False when no repeat has that name."""
        return await self._x.run(_c.resume_repeat(self._k, name))

    async def repeats(self) -> list[_c.Repeat]:
        """Every registered repeat, soonest first."""
        return await self._x.run(_c.repeats(self._k))

    async def fire_due(self, limit: int = 100) -> int:
        """Enqueue every due occurrence exactly once (safe from many processes at once)."""
        return await self._x.run(_c.fire_due(self._k, limit))

    # -- flows (D18): see echomq.protocol.compose

    async def add_flow(self, parent: _c.FlowJob) -> _c.FlowAdded:
        """Add a flow tree in one call: ``parent`` runs after all its children settled."""
        return await self._x.run(_c.add_flow(self._k, parent, self._x.minter))

    async def children_values(self, parent_id: str) -> dict[str, bytes]:
        """The results of ``parent_id``'s completed children, by child id."""
        return await self._x.run(_c.children_values(self._k, parent_id))

    async def dependencies(self, parent_id: str) -> int:
        """How many of ``parent_id``'s children have not settled yet."""
        return await self._x.run(_c.dependencies(self._k, parent_id))

    async def ignored_failures(self, parent_id: str) -> dict[str, str]:
        """The errors of ``parent_id``'s children that died with ``fail_parent=False``."""
        return await self._x.run(_c.ignored_failures(self._k, parent_id))

    async def pump(self, limit: int = 100) -> int:
        """One pump beat: promote due jobs and fire due repeats; how many became runnable."""
        return await self._x.run(_c.pump(self._k, limit))
