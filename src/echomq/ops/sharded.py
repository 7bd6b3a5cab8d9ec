"""Operator reads of sharded queues: a logical queue's shards, their snapshots summed.

A logical queue's shards are named by its stored list (the ``shards`` verb, issue 43;
absent: the queue alone). The operator views (``echomq stats``, ``check``, ``browse``, the
dashboard, the Prometheus collector, ``top``) show a sharded queue once, under its logical
name, with the sums of its shards and the per-shard views kept in ``QueueView.shards`` for a
breakdown. Discovery (a SCAN) finds the shard queues too: a name that the stored list of
another listed queue names as one of its shards is folded under that queue.

The sums: counts, lane depths and lane actives add up; the oldest waiting job is the oldest
of any shard; the earliest lease deadline the earliest; the per-minute series add up
minute by minute; ``paused`` is true only when every shard is paused (a half-paused queue
still runs jobs); a lane's limit, weight and pause are those of the shard that holds it (a
lane lives on one shard; during a growth transition, the first shard listing it); the
queue-wide ``limit`` is shard 0's (a queue-wide limit is refused for a sharded queue).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

from echomq.client.executor import SyncExecutor
from echomq.ops import snapshots as _inspect
from echomq.ops.console import JobRow
from echomq.ops.snapshots import LaneView, QueueView
from echomq.protocol import calls as _p
from echomq.protocol.kernel import Keys

__all__ = ["check", "fold", "layouts", "merge", "merged_rows", "snapshot"]


def layouts(x: SyncExecutor, names: Sequence[str]) -> dict[str, list[str]]:
    """Each queue's stored shard list (``[name]`` when it is not sharded), one pipeline."""
    replies = x.pipeline([_p.shards(Keys(n)) for n in names]) if names else []
    out: dict[str, list[str]] = {}
    for name, reply in zip(names, replies, strict=True):
        if isinstance(reply, BaseException):
            raise reply
        out[name] = list(reply) or [name]
    return out


def fold(x: SyncExecutor, names: Iterable[str]) -> list[tuple[str, list[str]]]:
    """The logical queues among ``names`` with their shards (shard 0, the name, first): a
    name that another one's stored list names as a shard is folded under it."""
    listed = list(dict.fromkeys(names))
    lists = layouts(x, listed)
    inner = {s for name, shards in lists.items() for s in shards[1:] if s != name}
    return [(name, lists[name]) for name in listed if name not in inner]


def _min(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def _series(parts: Iterable[list[int]]) -> list[int]:
    return [sum(m) for m in itertools.zip_longest(*parts, fillvalue=0)]


def merge(name: str, views: Sequence[QueueView]) -> QueueView:
    """One view of a logical queue from its shards' views (shard 0 first); the shards' own
    views are kept in ``shards``. One view is returned as it is."""
    if len(views) == 1:
        return views[0]
    counts: dict[str, int] = {}
    for v in views:
        for k, n in v.counts.items():
            counts[k] = counts.get(k, 0) + n
    lanes: dict[str, LaneView] = {}
    for v in views:
        for lane in v.lanes:
            have = lanes.get(lane.name)
            if have is None:
                lanes[lane.name] = LaneView(**vars(lane))
                continue
            have.depth += lane.depth
            have.active += lane.active
            have.oldest_ms = _min((have.oldest_ms, lane.oldest_ms))
    return QueueView(
        name,
        counts,
        paused=all(v.paused for v in views),
        events=max(v.events for v in views),
        now_ms=max(v.now_ms for v in views),
        oldest_waiting_ms=_min(v.oldest_waiting_ms for v in views),
        lease_deadline_ms=_min(v.lease_deadline_ms for v in views),
        completed=_series(v.completed for v in views),
        failed=_series(v.failed for v in views),
        lanes=[lanes[g] for g in sorted(lanes)],
        limit=views[0].limit,
        shards=list(views),
    )


def snapshot(x: SyncExecutor, names: Iterable[str], **kw: Any) -> list[QueueView]:
    """:func:`echomq.ops.snapshots.snapshot` of ``names`` with every sharded queue folded
    into one view of its logical name (:func:`fold`, :func:`merge`); same pipelines, plus
    one for the stored lists."""
    groups = fold(x, names)
    flat = [s for _, shards in groups for s in shards]
    views = iter(_inspect.snapshot(x, flat, **kw))
    return [merge(name, [next(views) for _ in shards]) for name, shards in groups]


def check(x: SyncExecutor, name: str) -> list[str]:
    """The consistency checker (D6) of a queue, shard by shard when it is sharded: each
    violation of a shard > 0 prefixed with ``<shard>: ``; ``[]`` when every shard is sound."""
    (shards,) = layouts(x, [name]).values()
    out: list[str] = []
    for shard in shards:
        found = x.run(_p.check(Keys(shard)))
        out += found if shard == name else [f"{shard}: {line}" for line in found]
    return out


def merged_rows(parts: Sequence[Sequence[JobRow]], n: int) -> list[JobRow]:
    """The first ``n`` rows of the shards' lists (each newest first) as one list: by time
    (``score_ms``, the newest first) where the rows have one, else taking turns shard by
    shard (a waiting set is ordered by priority, which has no time to compare)."""
    if len(parts) == 1:
        return list(parts[0][:n])
    rows = [r for part in parts for r in part]
    if rows and all(r.score_ms is not None for r in rows):
        return sorted(rows, key=lambda r: -(r.score_ms or 0))[:n]
    turns = itertools.zip_longest(*parts)
    return [r for turn in turns for r in turn if r is not None][:n]
