"""The shards a worker serves: each served queue's stored shard list, read at start and on the beat.

A worker started on ``orders`` serves every shard of ``orders`` (issue 43, decision 10): the
stored list (the ``shards`` verb; absent: the queue alone) names them, and each shard is an
ordinary queue served by its own queue loop (pump, waker, heartbeat), all sharing the
worker's slots. The list is read again every ``REREAD_S`` on the beat: a shard added since
(``reshard``, growth only) gets its loop without a restart, and nothing is ever dropped.

A loop knows its logical queue (``QueueLoop.logical``): the tasks bound to ``orders`` run the
jobs of every shard of it, with its leases, and the worker's metrics label a run with the
logical name (:func:`logical_of`), while the run's ``JobContext.queue`` stays the shard the
job lives in (its children, its batch and every by-id verb are there).
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import re
import time
from collections.abc import Callable, Sequence

from echomq._appface import AppFace
from echomq.client.executor import AsyncExecutor
from echomq.client.shardkit import task_rate
from echomq.protocol import calls as _p
from echomq.protocol.kernel import Keys
from echomq.runtime.logfmt import warn_repeated
from echomq.runtime.queueloop import QueueLoop

__all__ = [
    "REREAD_S",
    "ShardSet",
    "kick_order",
    "lease_of",
    "logical_of",
    "refuse_task_rates",
    "take_turn",
]

log = logging.getLogger("echomq.worker")

# How often a worker reads its queues' stored shard lists again (growth reaches it this late).
REREAD_S = 3.0

_tickets = itertools.count(1)  # take_turn's: the order pumps starved in
_SHARD_NAME = re.compile(r"^(?P<base>.+)\.shard[1-9][0-9]*\.[0-9]+$")


def logical_of(queue: str) -> str:
    """The logical queue of a shard name (``orders.shard2.17`` -> ``orders``); any other name
    is its own (shard 0 *is* the logical queue)."""
    m = _SHARD_NAME.match(queue)
    return m.group("base") if m else queue


class ShardSet:
    """The shards of the logical queues a worker serves, and which is whose."""

    def __init__(self, names: Sequence[str], reread_s: float = REREAD_S) -> None:
        self.names = list(names)
        self.logical: dict[str, str] = {}  # shard -> its logical queue (shard 0: itself)
        self.reread_s = reread_s
        self.rot = 0  # the rotating start of kick_order
        self.loops: list[QueueLoop] = []  # the worker's queue loops, one a shard
        self._read_at = 0.0

    def due(self) -> bool:
        """True when the lists are to be read again (every ``reread_s``)."""
        return time.monotonic() - self._read_at >= self.reread_s

    async def read(self, x: AsyncExecutor) -> list[tuple[str, str]]:
        """Read every served queue's stored list in one round trip; returns the shards not
        served yet as ``(shard, logical)`` pairs, in list order (shard 0 first at start). A
        list that failed to read leaves that queue's shards as they were (served: never
        dropped; at start the queue alone is served); the first failure is raised only
        when nothing new was found."""
        self._read_at = time.monotonic()
        replies = await x.pipeline([_p.shards(Keys(name)) for name in self.names])
        new: list[tuple[str, str]] = []
        failed: BaseException | None = None
        for name, reply in zip(self.names, replies, strict=True):
            if isinstance(reply, BaseException):
                warn_repeated(
                    log, f"shards:{name}", "could not read the shards of %s (%s)", name, reply
                )
                failed = failed or reply
                shards: list[str] = [] if name in self.logical else [name]
            else:
                shards = list(reply) or [name]
            for shard in shards:
                if shard not in self.logical:
                    self.logical[shard] = name
                    new.append((shard, name))
        if failed is not None and not new:
            raise failed
        return new

    async def new_loops(
        self, x: AsyncExecutor, app: AppFace, finish: Callable[..., None]
    ) -> list[QueueLoop]:
        """:meth:`read`, then a registered queue loop for each shard not served yet, added to
        :attr:`loops` (``finish`` bound to it: one callable for all its runs). At start a
        failure is raised (the worker's own error); on the beat it is logged, the loops set
        up before it are returned (to be started) and the other shards are read again on a
        later beat."""
        kw = {} if app.max_payload is None else {"max_payload": app.max_payload}
        starting = not self.logical
        fresh: list[QueueLoop] = []
        new: list[tuple[str, str]] = []
        try:
            new = await self.read(x)
            if starting:
                refuse_task_rates(app, self.logical)
            for shard, name in new:
                ql = QueueLoop(Keys(shard, **kw), lease_of(app, name), logical=name)
                ql.finish = functools.partial(finish, ql)
                await ql.register(x, app)
                fresh.append(ql)
                self.loops.append(ql)
                if shard != name:  # a shard > 0: say so once (at start, or on growth)
                    log.info(
                        "queue %s: serving its shard %s", name, shard,
                        extra={"queue": name, "shard": shard},
                    )  # fmt: skip
        except Exception as exc:
            if starting:
                raise
            warn_repeated(log, "shards", "could not serve new shards yet (%s); trying again", exc)
            for shard, _ in new[len(fresh) :]:
                self.logical.pop(shard, None)
        return fresh


def refuse_task_rates(app: AppFace, logical: dict[str, str]) -> None:
    """At start: a task's ``rate_limit=`` on a queue that has more than one shard is refused
    (ShardsError, the worker does not start). The worker sets it on its queue when it starts
    (``QueueLoop.register``), which on a sharded queue is shard 0 alone: the other shards
    would run unlimited. ``App(shards=...)`` refuses it when the task is declared; this is
    for a queue sharded on the server (``echomq reshard``) under an app that does not say so."""
    count = collections.Counter(logical.values())  # shards per logical queue
    for task in app.tasks.values():
        if task.rate_limit is not None and count.get(task.queue, 1) > 1:
            raise task_rate(task.name, task.queue)


def lease_of(app: AppFace, logical: str) -> int:
    """The lease of a queue's claims: the longest of its tasks' (default 30 s)."""
    return max((t.lease_ms for t in app.tasks.values() if t.queue == logical), default=30_000)


def kick_order(loops: list[QueueLoop], shards: ShardSet) -> list[QueueLoop]:
    """The order a release kicks the pumps in: rotating by one on every call, so no pump is
    always woken first (pumps run in the order they are kicked; :func:`take_turn` gives a
    free slot to the pump that waited longest). One pass, as a plain kick of every pump."""
    if len(loops) < 2:
        return loops
    shards.rot += 1
    r = shards.rot % len(loops)
    return loops[r:] + loops[:r]


def take_turn(ql: QueueLoop, loops: list[QueueLoop], free: int) -> bool:
    """Whether the pump of ``ql``, which asks for slots, takes the ``free`` ones now. A pump
    that asks and finds no free slot is *starved* and draws a ticket; while starved pumps
    that would ask wait, a free slot goes to the oldest ticket: any other pump kicks that one
    to go first and takes nothing (deferring draws no ticket, so two pumps never defer to each
    other). A pump whose handlers end fast is woken by its own turn's end before the others,
    and would otherwise take every slot its runs free, starving a shard with a backlog."""
    if free <= 0:
        if not ql.starved:
            ql.starved = next(_tickets)
        return False
    first: QueueLoop | None = None
    for q in loops:
        waits = q.starved and q is not ql and not q.idle.is_set() and (q.full or not q.turns)
        if waits and (first is None or q.starved < first.starved):
            first = q
    if first is not None and (not ql.starved or first.starved < ql.starved):
        first.kick.set()
        return False
    ql.starved = 0
    return True
