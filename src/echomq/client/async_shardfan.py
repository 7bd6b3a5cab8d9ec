"""AsyncShardFanout, by hand: a sharded queue's layout, lane, fan-out and refused verbs.

The base class of ``AsyncShardedQueue`` (``client/async_sharded.py``, which adds the verbs
that find a job: producers, claims, settles, by id). Its shards are plain ``AsyncQueue``s on
the one client and executor (``client/shards.py``: the layout; shard 0 is the queue's own
name); the list is the one stored on the server (the base queue's meta field ``shards``),
read and, when shorter than N, grown at first use, then cached. ``client/shardkit.VERBS``
says how each verb is served. The source ``scripts/gen-sync`` derives ``ShardFanout``
(``client/sync_shardfan.py``) from.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from echomq import keyspace
from echomq.client.async_queue import AsyncQueue
from echomq.client.autopipe import AutoPipe  # async-only
from echomq.client.renamed import renamed, respelled
from echomq.client.shardkit import (
    as_limited,
    merge_ranked,
    order,
    ranked,
    refused,
    serving,
    shrink,
    slot_range,
    sum_counts,
    union_lanes,
    union_repeats,
    union_workers,
)
from echomq.client.shards import _check, grow, shard_of
from echomq.errors import InvalidArgument, ShardsError, StateError
from echomq.protocol import calls as _p
from echomq.protocol import compose as _c
from echomq.protocol import control as _ctl
from echomq.protocol import observe as _o
from echomq.protocol import registry as _reg
from echomq.protocol import repeats as _repeats
from echomq.protocol.kernel import _cmd

__all__ = ["REFRESH_S", "AsyncShardFanout"]

REFRESH_S = 5.0  # a sharded queue reads the stored list again at most this often


class AsyncShardFanout(AsyncQueue):
    """A sharded queue's layout and the verbs that need no job's shard (see
    ``AsyncShardedQueue``, the class to use)."""

    def __init__(self, name: str, *, shards: int | None = None, **options: Any) -> None:
        self._want = _check(name, 1 if shards is None else shards)
        super().__init__(name, **options)
        self._subs: list[AsyncQueue] | None = None
        self._next = 0  # the shard the next claim starts at
        self._fresh_until = 0.0  # monotonic: the cached list is read again after it
        self._held: dict[str, int] = {}  # ids claimed here -> their shard

    # -- the layout

    def _sub(self, name: str) -> AsyncQueue:
        """Shard ``name`` as a plain queue on this queue's client and executor."""
        q = object.__new__(AsyncQueue)
        q._k = _p.Keys(name, self._k.max_payload)
        q._x = self._x
        q._pipe = AutoPipe(self._x)  # async-only
        q._waiters = None  # async-only
        return q

    def _adopt(self, names: list[str]) -> list[AsyncQueue]:
        self._fresh_until = time.monotonic() + REFRESH_S
        old = {q.name: q for q in self._subs or ()}
        subs = self._subs = [old.get(s) or self._sub(s) for s in names]
        return subs

    async def _resolve(self, fresh: bool = False) -> list[AsyncQueue]:
        """The shards: the cached list, read again once it is REFRESH_S old (another client
        may have grown it) or when ``fresh``, else the stored one (grown to N when shorter)."""
        if not fresh and self._subs is not None and time.monotonic() < self._fresh_until:
            return self._subs
        stored = await AsyncQueue.shards(self)
        if len(stored) < self._want:
            serving(self.name, await AsyncQueue.workers(self))
            stored = await self._propose(grow(self.name, stored, self._want))
        return self._adopt(stored)

    async def _propose(self, names: Sequence[str]) -> list[str]:
        """Shard 0's ``propose_shards``, its refusal of a queue with a queue-wide limit or
        rate limit (``EMQSTATE limited``) raised as the ShardsError that says what to do."""
        try:
            return await AsyncQueue.propose_shards(self, names)
        except StateError as exc:
            if (refusal := as_limited(self.name, exc)) is not None:
                raise refusal from exc
            raise

    async def shards(self) -> list[str]:
        """The stored list of shard names (shard 0 first), read again (the cache follows it:
        another client may have grown it)."""
        return [q.name for q in await self._resolve(fresh=True)]

    async def propose_shards(self, names: Sequence[str]) -> list[str]:
        """Shard 0's ``propose_shards``; the cache follows the stored list it returns."""
        return [q.name for q in self._adopt(await self._propose(names))]

    async def reshard(self, n: int) -> list[str]:
        """Grow to ``n`` shards (decision 9): new jobs follow the new layout, queued ones stay
        where they are (served there), so nothing moves. ``n`` below the stored count raises
        ShardsError (with the procedure to shrink); the stored list after the call."""
        n = _check(self.name, n)
        stored = await self.shards()
        if n < len(stored):
            raise shrink(self.name, len(stored), n)
        self._want = max(self._want, n)
        if n == len(stored):
            return stored
        serving(self.name, await AsyncQueue.workers(self))
        return await self.propose_shards(grow(self.name, stored, n))

    async def _shard(self, key: str) -> AsyncQueue:
        """The shard a lane belongs to (a bad lane refused before the layout is read)."""
        keyspace.check_lane(key)
        subs = await self._resolve()
        return subs[shard_of(key, len(subs))]

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
        """Register ``name`` on the lane's shard (its jobs join the lane there), else on the
        name's. A repeat registered on another shard (another lane) is refused, ShardsError:
        moving it would lose its pause and its fired count; unrepeat it first. Each shard
        mints its repeats' slots from its own range (``shardkit.REPEAT_SLOTS_PER_SHARD``), so
        two repeats on two shards never fire one occurrence id."""
        n = _repeats._name(name)
        subs = await self._resolve()
        s = shard_of(group or n, len(subs))
        home = subs[s]
        for q in subs:
            if q is not home and await q._x.run(_cmd(("EXISTS", q._k.base + "repeat:" + n), bool)):
                raise ShardsError(
                    f"repeat {n!r} is registered on shard {q.name!r}; with lane {group!r} it "
                    f"would move to {home.name!r} and lose its pause and fired count: "
                    "unrepeat it first"
                )
        if s:
            await home._x.run(slot_range(home._k, s))
        return await home.repeat(
            name, payload, every_ms=every_ms, cron=cron, tz=tz, group=group, owner=owner,
            limit=limit, until_ms=until_ms,
        )  # fmt: skip

    # -- lanes (decision 6): a lane lives on its shard

    @renamed(g="lane")
    async def pause_lane(self, lane: str) -> None:
        """``pause_lane`` on the lane's shard."""
        return await (await self._shard(lane)).pause_lane(lane)

    @renamed(g="lane")
    async def resume_lane(self, lane: str) -> None:
        """``resume_lane`` on the lane's shard."""
        return await (await self._shard(lane)).resume_lane(lane)

    @renamed(g="lane")
    async def limit_lane(self, lane: str, n: int | None) -> None:
        """``limit_lane`` on the lane's shard (exact: the lane's jobs are all there)."""
        return await (await self._shard(lane)).limit_lane(lane, n)

    @renamed(g="lane")
    async def weight_lane(self, lane: str, w: int) -> None:
        """``weight_lane`` on the lane's shard."""
        return await (await self._shard(lane)).weight_lane(lane, w)

    @renamed(g="lane")
    async def rate_limit_lane(self, lane: str, max: int, window_ms: int) -> None:
        """``rate_limit_lane`` on the lane's shard."""
        return await (await self._shard(lane)).rate_limit_lane(lane, max, window_ms)

    @renamed(g="lane")
    async def lane_depth(self, lane: str) -> int:
        """``lane_depth`` on the lane's shard."""
        return await (await self._shard(lane)).lane_depth(lane)

    @renamed(g="lane")
    async def clear_rate_limit(self, lane: str | None = None) -> None:
        """The lane's limit on its shard; without a lane every shard's queue-wide one."""
        if lane is not None:
            return await (await self._shard(lane)).clear_rate_limit(lane)
        for q in await self._resolve():
            await q.clear_rate_limit()
        return None

    @renamed(g="lane")
    async def rate_limit_ttl(self, lane: str | None = None) -> int:
        """The lane's on its shard; without a lane the longest over the shards."""
        if lane is not None:
            return await (await self._shard(lane)).rate_limit_ttl(lane)
        return max([await q.rate_limit_ttl() for q in await self._resolve()])

    async def dedup_holder(self, dedup: str) -> str | None:
        """The holder of ``dedup``: its shard first, then the others (a job with a lane and a
        dedup id lives on its lane's shard)."""
        _ctl.dedup_holder(self._k, dedup)  # a bad dedup id refused before any I/O
        subs = await self._resolve()
        for i in order(shard_of(dedup, len(subs)), len(subs)):
            holder = await subs[i].dedup_holder(dedup)
            if holder is not None:
                return holder
        return None

    # -- fan-out (decision 7)

    async def counts(self) -> dict[str, int]:
        """Every shard's counts, summed per field."""
        return sum_counts([await q.counts() for q in await self._resolve()])

    async def pending_size(self) -> int:
        """The flat pending sets' sizes, summed."""
        return sum([await q.pending_size() for q in await self._resolve()])

    async def check(self) -> list[str]:
        """Every shard's violations, each prefixed with its shard's name."""
        return [f"{q.name}: {v}" for q in await self._resolve() for v in await q.check()]

    async def browse(
        self, state: str = "pending", n: int = 50, *, group: str | None = None
    ) -> list[str]:
        """Up to ``n`` ids in ``state`` over every shard, merged by rank (newest first, as
        one queue's); with ``group``: that lane's shard."""
        if group is not None:
            return await (await self._shard(group)).browse(state, n, group=group)
        state = respelled("browse", "state", state, "schedule", "scheduled")
        ranked(self._k, state, n, None)
        subs = await self._resolve()
        return merge_ranked([await q._x.run(ranked(q._k, state, n, None)) for q in subs], n)

    async def lanes(self) -> list[str]:
        """Every shard's lanes (each lane is on one shard but for a reshard's transition)."""
        return union_lanes([await q.lanes() for q in await self._resolve()])

    async def workers(self) -> list[_reg.WorkerInfo]:
        """The live workers of every shard, each once."""
        return union_workers([await q.workers() for q in await self._resolve()])

    async def metrics(self, kind: str = "completed", *, minutes: int = 60) -> list[int]:
        """Every shard's settles per minute, summed minute by minute."""
        rows = [await q.metrics(kind, minutes=minutes) for q in await self._resolve()]
        return [sum(col) for col in zip(*rows, strict=True)]

    async def repeats(self) -> list[_c.Repeat]:
        """Every shard's repeats, soonest first."""
        return union_repeats([await q.repeats() for q in await self._resolve()])

    async def unrepeat(self, name: str) -> bool:
        """Unregister ``name`` wherever it is; True when a shard had it."""
        return True in [await q.unrepeat(name) for q in await self._resolve()]

    async def pause_repeat(self, name: str) -> bool:
        """Pause ``name`` wherever it is; True when a shard has it."""
        return True in [await q.pause_repeat(name) for q in await self._resolve()]

    async def resume_repeat(self, name: str) -> bool:
        """Resume ``name`` wherever it is; True when a shard has it."""
        return True in [await q.resume_repeat(name) for q in await self._resolve()]

    @renamed(include_schedule="include_scheduled")
    async def drain(self, *, include_scheduled: bool = False) -> int:
        """Every shard drained; how many jobs went, summed."""
        subs = await self._resolve()
        return sum([await q.drain(include_scheduled=include_scheduled) for q in subs])

    async def cancel_all(self) -> dict[str, int]:
        """Every shard's ``cancel_all``, summed per field."""
        return sum_counts([await q.cancel_all() for q in await self._resolve()])

    async def promote(self, limit: int = 100) -> int:
        """Every shard's ``promote``, summed."""
        _p.promote(self._k, limit)
        return sum([await q.promote(limit) for q in await self._resolve()])

    async def reap(self, limit: int = 100) -> int:
        """Every shard's ``reap``, summed."""
        _p.reap(self._k, limit)
        return sum([await q.reap(limit) for q in await self._resolve()])

    async def sweep_stalled(
        self, *, max_stalled: int = 1, limit: int = 100
    ) -> tuple[list[str], list[str]]:
        """Every shard's stall sweep: ``(recovered, dead)`` ids, concatenated."""
        _p.sweep_stalled(self._k, max_stalled, limit)
        recovered: list[str] = []
        dead: list[str] = []
        for q in await self._resolve():
            r, d = await q.sweep_stalled(max_stalled=max_stalled, limit=limit)
            recovered += r
            dead += d
        return recovered, dead

    async def fire_due(self, limit: int = 100) -> int:
        """Every shard's due repeats fired; how many, summed."""
        return sum([await q.fire_due(limit) for q in await self._resolve()])

    async def pump(self, limit: int = 100) -> int:
        """One pump beat on every shard; how many became runnable, summed."""
        return sum([await q.pump(limit) for q in await self._resolve()])

    async def reprocess_all(
        self, state: str = "dead", *, delay_ms: int | None = None, at_ms: int | None = None
    ) -> int:
        """Every shard's ``reprocess_all``, summed."""
        if state not in ("dead", "completed"):
            raise InvalidArgument(f"reprocess_all takes dead or completed, got {state!r}")
        subs = await self._resolve()
        return sum([await q.reprocess_all(state, delay_ms=delay_ms, at_ms=at_ms) for q in subs])

    async def pause(self) -> None:
        """Pause every shard."""
        for q in await self._resolve():
            await q.pause()

    async def resume(self) -> None:
        """Resume every shard."""
        for q in await self._resolve():
            await q.resume()

    async def is_paused(self) -> bool:
        """True iff every shard is paused (a half-paused queue still serves: False)."""
        return False not in [await q.is_paused() for q in await self._resolve()]

    async def keep_completed(self, count: int | None, age_ms: int | None = None) -> None:
        """``keep_completed`` on every shard (so ``count`` bounds each shard's kept rows)."""
        _p.keep_completed(self._k, count, age_ms)
        for q in await self._resolve():
            await q.keep_completed(count, age_ms)

    async def keep_dead(self, count: int | None, age_ms: int | None = None) -> None:
        """``keep_dead`` on every shard (so ``count`` bounds each shard's dead set)."""
        _p.keep_dead(self._k, count, age_ms)
        for q in await self._resolve():
            await q.keep_dead(count, age_ms)

    async def enable_events(self, maxlen: int = 10_000) -> None:
        """Record events on every shard (one stream each, ``maxlen`` each)."""
        _o.enable_events(self._k, maxlen)
        for q in await self._resolve():
            await q.enable_events(maxlen)

    async def disable_events(self) -> None:
        """Stop recording events on every shard."""
        for q in await self._resolve():
            await q.disable_events()

    async def get_limit(self) -> int | None:
        """The shards' limits (set by hand) summed when every shard has one, else None."""
        limits = [await q.get_limit() for q in await self._resolve()]
        return None if None in limits else sum(n for n in limits if n is not None)

    async def obliterate(self, *, force: bool = False) -> None:
        """Obliterate every shard, shard 0 (which holds the stored list) last. Without
        ``force`` an unpaused shard refuses first, before any shard is touched."""
        subs = await self._resolve()
        if not force:
            for q in subs:
                if not await q.is_paused():
                    return await q.obliterate()  # raises as a plain queue's does
        for q in reversed(subs):
            await q.obliterate(force=force)
        self._subs = None
        self._held.clear()
        return None

    # -- refused for N > 1 (decision 8)

    async def limit(self, n: int | None) -> None:
        """Refused (ShardsError) for a number: no exact queue-wide limit over shards; use
        ``limit_lane``. ``limit(None)`` clears every shard's."""
        if n is not None:
            raise refused("limit")
        for q in await self._resolve():
            await q.limit(None)

    async def rate_limit(self, max: int, window_ms: int) -> None:
        """Refused (ShardsError): use ``rate_limit_lane``."""
        raise refused("rate_limit")

    async def events(
        self, *, after: str = "0", count: int = 100, block_ms: int | None = None
    ) -> list[_o.Event]:
        """Refused (ShardsError): each shard has its own stream; read each shard's queue."""
        raise refused("events")
