"""The autoscaling signal: waiting and due jobs, the oldest wait.

The autoscaling signal: per queue, the work a new worker could take now and how long the
oldest of it has waited (``echomq backlog``, the ``echomq_backlog*`` gauges of
``echomq.prometheus``).

``backlog`` = the waiting jobs (flat and every lane: the ``counts`` script's ``pending``)
plus the delayed jobs already due (their time on the server clock has come; a worker's beat
promotes them within a beat). Jobs in flight are not backlog (a worker holds them), nor are
jobs still delayed (no worker could run them yet). A paused queue has a backlog of 0: no
worker may claim from it, so scaling out would not help; its ``waiting`` stays visible.
``oldest_wait_s``: the longest any of that work has waited — the oldest waiting job's age
(from its id's mint time) or the longest a due delayed job is past its time, whichever is
more; ``None`` with no backlog.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from echomq.client.executor import SyncExecutor
from echomq.ops import snapshots as _inspect
from echomq.protocol.kernel import Call, Keys, _cmd

__all__ = ["Backlog", "backlogs", "of_views"]


@dataclass(frozen=True)
class Backlog:
    queue: str
    backlog: int  # waiting + due (0 while paused)
    oldest_wait_s: float | None
    waiting: int  # flat and every lane
    due: int  # delayed jobs whose time has come, not yet promoted
    scheduled: int  # every delayed job, due or not
    active: int
    paused: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def backlogs(x: SyncExecutor, names: Sequence[str]) -> list[Backlog]:
    """The backlog of each queue of ``names`` (a sharded queue's summed over its shards,
    ``echomq.ops.sharded``), read in three pipelines (the shard lists, the snapshot, then
    the due delayed jobs at the snapshot's server time)."""
    from echomq.ops import sharded as _sharded

    return of_views(x, _sharded.snapshot(x, names, minutes=0))


def of_views(x: SyncExecutor, views: Sequence[_inspect.QueueView]) -> list[Backlog]:
    """The backlogs of snapshots already read (one more pipeline: the due delayed jobs)."""
    calls: list[Call[Any]] = []
    for v in views:
        for shard in v.shards or [v]:  # a sharded queue (ops.sharded): each shard's
            k = Keys(shard.name)
            calls.append(_cmd(("ZCOUNT", k.schedule, "-inf", v.now_ms), int))
            calls.append(
                _cmd(
                    ("ZRANGEBYSCORE", k.schedule, "-inf", v.now_ms, "WITHSCORES", "LIMIT", 0, 1),
                    list,
                )
            )
    replies = iter(x.pipeline(calls) if calls else [])
    out: list[Backlog] = []
    for v in views:
        due = 0
        waited = [v.oldest_waiting_age_s] if v.oldest_waiting_age_s is not None else []
        for _ in v.shards or [v]:
            due_reply, first_reply = next(replies), next(replies)
            for r in (due_reply, first_reply):
                if isinstance(r, Exception):
                    raise r
            due += int(due_reply)
            first = _inspect._member_score(first_reply)  # the earliest due: waited longest
            if first is not None:
                waited.append(max(0.0, (v.now_ms - first[1]) / 1000))
        waiting = v.counts.get("pending", 0)
        out.append(
            Backlog(
                queue=v.name,
                backlog=0 if v.paused else waiting + due,
                oldest_wait_s=round(max(waited), 3) if waited else None,
                waiting=waiting,
                due=due,
                scheduled=v.counts.get("schedule", 0),
                active=v.counts.get("active", 0),
                paused=v.paused,
            )
        )
    return out
