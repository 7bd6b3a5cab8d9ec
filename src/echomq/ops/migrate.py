"""``echomq migrate``: the data migrations, in the manner of Oban's (issue 39).

A migration takes a deployment from one data layout (echomq.client.layout) to the next. Each is
run by command only, never by a client's connect: it walks every queue (SCAN), and a
producer's first call must not wait for that. It is

- *idempotent*: it changes only what is still in the old form, so a second run finds nothing;
- *resumable*: its progress per queue is kept on the server, in the HASH
  ``{emq}:migrations`` (field ``<migration>:<queue>`` = ``done:<server ms>`` or
  ``running:<members migrated so far>``), and the step's own selection is the cursor (a
  member migrated leaves it), so a run stopped anywhere goes on where it stopped;
- *safe beside running workers of the previous release*: each step is one atomic script on
  one queue's keys, for at most ``batch`` members.

When every queue found is done (a run over all queues, not ``--queue``), the run records the
new layout in ``{emq}:layout``; a client of a release that does not serve it refuses from its
next connect on, with one line saying what to upgrade.

The migrations:

``dead-scores`` (from layout 1): echomq <= 0.3 scored a dead-letter 0 in ``emq:{q}:dead``;
0.4 scores it by the time of death (D25), so the first ``keep_dead(age_ms=...)`` deleted
every old dead-letter at once. The zeros are rescored to the migration's time (a <= 0.3 row
records no time of death).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from echomq import keyspace
from echomq.client import layout as _layout
from echomq.client.executor import SyncExecutor
from echomq.keyspace import LAYOUT_KEY, MIGRATIONS_KEY
from echomq.ops import snapshots as _inspect
from echomq.protocol.kernel import Call, _call, _cmd, _int, _s

__all__ = [
    "DEFAULT_BATCH",
    "MIGRATIONS",
    "Progress",
    "dead_scores_step",
    "migrate",
    "raise_layout",
    "recorded_layout",
]

DEFAULT_BATCH = 500
MIGRATIONS = ("dead-scores",)  # in order; the last one leaves a deployment at LAYOUT


@dataclass
class Progress:
    """One queue's part of one migration in a run (or a dry run)."""

    migration: str
    queue: str
    # A dry run: the members in the old form. A run: 0 when none is left after it, else 1.
    left: int
    migrated: int = 0  # members this run migrated
    batches: int = 0  # scripts this run called
    was_done: bool = False  # recorded done before this run

    @property
    def done(self) -> bool:
        return self.left == 0


def _field(migration: str, queue: str) -> str:
    return f"{migration}:{queue}"


def dead_scores_step(queue: str, batch: int) -> Call[tuple[int, int]]:
    dead = keyspace.base(queue) + "dead"
    return _call(
        "migrate_dead_scores",
        (dead,),
        (_int("batch", batch, 1, 100_000),),
        lambda r: (int(r[0]), int(r[1])),
    )


_PAGE = 10_000


def _zeros(x: SyncExecutor, queue: str, most: int) -> int:
    """How many members of ``dead`` are at score 0, counted up to ``most`` (ZRANGEBYSCORE
    pages: the least-privilege ACL grants it, not ZCOUNT)."""
    dead = keyspace.base(queue) + "dead"
    found = 0
    while found < most:
        page = min(_PAGE, most - found)
        got = x.run(_cmd(("ZRANGEBYSCORE", dead, 0, 0, "LIMIT", found, page), len))
        found += got
        if got < page:
            break
    return found


def migrate(
    x: SyncExecutor,
    client: Any,
    *,
    queues: Iterable[str] | None = None,
    dry_run: bool = False,
    batch: int = DEFAULT_BATCH,
    max_batches: int | None = None,
    told: Callable[[Progress], None] | None = None,
) -> list[Progress]:
    """Run the migrations (every queue found by SCAN, or ``queues``); ``dry_run`` counts what
    is left and writes nothing; ``max_batches`` stops the run after that many scripts (a
    resumable stop). ``told`` is called with each queue's progress as it finishes."""
    _int("batch", batch, 1, 100_000)
    if max_batches is not None:
        _int("max_batches", max_batches, 1)
    names = [keyspace.check_queue(q) for q in queues] if queues is not None else None
    found = names if names is not None else _inspect.discover(client)
    x.run(_cmd(("PING",), lambda r: r))  # fence first: a layout this release cannot serve
    out: list[Progress] = []
    spent = 0
    stopped = False
    for q in found:
        field = _field("dead-scores", q)
        mark = x.run(_cmd(("HGET", MIGRATIONS_KEY, field), lambda r: _s(r) if r else ""))
        # A dry run counts them all; a run only needs to know whether any are left.
        left = _zeros(x, q, 2**62 if dry_run else 1)
        p = Progress("dead-scores", q, left=left, was_done=mark.startswith("done"))
        while p.left and not dry_run and not stopped:
            if max_batches is not None and spent >= max_batches:
                stopped = True
                break
            rescored, p.left = x.run(dead_scores_step(q, batch))
            p.migrated += rescored
            p.batches += 1
            spent += 1
            so_far = int(mark.split(":")[1]) if mark.startswith("running:") else 0
            mark = f"running:{so_far + rescored}"
            x.run(_cmd(("HSET", MIGRATIONS_KEY, field, mark), int))
        if not dry_run and p.left == 0 and (p.migrated or not p.was_done):
            stamp = x.run(_cmd(("TIME",), lambda r: int(r[0]) * 1000 + int(r[1]) // 1000))
            x.run(_cmd(("HSET", MIGRATIONS_KEY, field, f"done:{stamp}"), int))
        out.append(p)
        if told is not None:
            told(p)
    if names is None and not dry_run and not stopped and all(p.done for p in out):
        raise_layout(x, _layout.LAYOUT)
    return out


def recorded_layout(x: SyncExecutor) -> int | None:
    """The layout ``{emq}:layout`` records (None: not recorded)."""
    return _layout.parse(x.run(_cmd(("GET", LAYOUT_KEY), lambda r: r)))


def raise_layout(x: SyncExecutor, layout: int) -> None:
    """Record ``layout`` unless a higher one is recorded (a layout never goes down)."""
    current = recorded_layout(x)
    if current is None or current < layout:
        x.run(_cmd(("SET", LAYOUT_KEY, str(layout)), lambda r: r))
