"""What both sharded queue classes share: the verb table, the merges and the pre-minted ids.

``AsyncShardedQueue`` (``client/async_sharded.py``) and its generated twin ``ShardedQueue``
route, fan out or refuse every verb of ``AsyncQueue``; ``VERBS`` says which, one line per
verb, and a test fails on a verb of ``AsyncQueue`` it does not name (docs/API.md, "Sharded
queues", is this table in prose). The helpers here do no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

from echomq import ids, keyspace
from echomq.client.shards import _check
from echomq.errors import InvalidArgument, ShardsError, StateError
from echomq.protocol.compose import FlowJob, Repeat
from echomq.protocol.kernel import Call, Keys, _cmd, _payload
from echomq.protocol.reads import _state_key
from echomq.protocol.registry import WorkerInfo

__all__ = [
    "SHARDED",
    "VERBS",
    "Minted",
    "app_shards",
    "check_items",
    "merge_ranked",
    "onto",
    "order",
    "per_pair",
    "ranked",
    "REPEAT_SLOTS_PER_SHARD",
    "refused",
    "serving",
    "shrink",
    "slot_range",
    "sum_counts",
    "union_lanes",
    "union_repeats",
    "union_workers",
]


# A queue class -> its sharded twin (AsyncQueue -> AsyncShardedQueue, Queue -> ShardedQueue):
# filled by client/async_sharded.py and sync_sharded.py, read by the queues' __new__.
SHARDED: dict[type, type] = {}

# Every public member of AsyncQueue (and AsyncFlowVerbs): how the sharded queue serves it.
# "inherited" members are not overridden (they hold for the logical queue as they are).
VERBS: dict[str, str] = {
    # inherited as they are
    "name": "inherited: the logical name, shard 0's",
    "client": "inherited: every shard runs on the one client",
    "executor": "inherited: every shard runs on the one executor",
    # producers (decision 4)
    "enqueue": "inherited: its _enqueue_job routes (the lane's shard, else the dedup id's, "
    "else the job id's, minted first)",
    "enqueue_many": "inherited: its _enqueue_many_job splits by shard as enqueue routes, one "
    "call per shard, the verdicts in input order",
    "add_flow": "routed: the whole flow on its root's lane's shard, else its id's, else rotating",
    "repeat": "routed: the lane's shard, else the name's (any copy on another shard removed)",
    # workers
    "claim": "rotating: each call starts one shard later, the first job found",
    "claim_batch": "rotating: fills from as many shards as it takes",
    "settle": "by id per shard (claims, n > 0, rotate as claim_batch)",
    "complete": "by id: the shard that handed the job out, else located",
    "complete_many": "by id, grouped per shard",
    "retry": "by id",
    "delay": "by id",
    "extend": "by id",
    "extend_many": "by id, grouped per shard",
    "extend_leases": "by id, grouped per shard",
    # by id (decision 5): the id's own shard first, then the others
    "cancel": "by id",
    "remove": "by id",
    "get_job": "by id",
    "job_state": "by id ('absent' when no shard has it)",
    "change_priority": "by id",
    "run_now": "by id",
    "reschedule": "by id",
    "update_payload": "by id",
    "reprocess": "by id",
    "update_progress": "by id",
    "add_log": "by id",
    "clear_logs": "by id",
    "logs": "by id",
    "errors": "by id",
    "result": "by id (the shard keeping the outcome)",
    "wait": "by id (the shard holding the job or its outcome, else the id's)",
    "children_values": "by id (the parent's shard)",
    "dependencies": "by id (the parent's shard)",
    "ignored_failures": "by id (the parent's shard)",
    "reassign": "the lane's shard, when the job is there (else ShardsError)",
    # lanes (decision 6)
    "pause_lane": "the lane's shard",
    "resume_lane": "the lane's shard",
    "limit_lane": "the lane's shard",
    "weight_lane": "the lane's shard",
    "rate_limit_lane": "the lane's shard",
    "lane_depth": "the lane's shard",
    "clear_rate_limit": "the lane's shard; without a lane every shard",
    "rate_limit_ttl": "the lane's shard; without a lane the longest over the shards",
    "dedup_holder": "the dedup id's shard first, then the others",
    # fan-out (decision 7)
    "counts": "fan-out: summed per field",
    "pending_size": "fan-out: summed",
    "check": "fan-out: concatenated, each line prefixed with its shard",
    "browse": "fan-out: merged by rank (score) across shards; with a lane its shard",
    "lanes": "fan-out: union",
    "workers": "fan-out: union (a worker once)",
    "metrics": "fan-out: summed per minute",
    "repeats": "fan-out: union, soonest first",
    "drain": "fan-out: summed",
    "cancel_all": "fan-out: summed per field",
    "promote": "fan-out: summed",
    "reap": "fan-out: summed",
    "sweep_stalled": "fan-out: concatenated",
    "fire_due": "fan-out: summed",
    "pump": "fan-out: summed",
    "reprocess_all": "fan-out: summed",
    "unrepeat": "fan-out: True when any shard had it",
    "pause_repeat": "fan-out: True when any shard has it",
    "resume_repeat": "fan-out: True when any shard has it",
    "pause": "fan-out: every shard",
    "resume": "fan-out: every shard",
    "is_paused": "fan-out: True iff every shard is paused",
    "keep_completed": "fan-out: every shard (the bound is per shard)",
    "keep_dead": "fan-out: every shard (the bound is per shard)",
    "enable_events": "fan-out: every shard",
    "disable_events": "fan-out: every shard",
    "get_limit": "fan-out: the shards' limits summed when every shard has one, else None",
    "obliterate": "fan-out: every shard, shard 0 (holding the list) last",
    "aclose": "every shard's waiters, then the one client",
    # the layout
    "shards": "the stored list (read again, the cache refreshed)",
    "propose_shards": "shard 0's, the cache refreshed",
    # refused for N > 1 (decision 8)
    "limit": "refused (ShardsError) but limit(None), which clears every shard",
    "rate_limit": "refused (ShardsError): use rate_limit_lane",
    "events": "refused (ShardsError): one stream per shard, read each shard's queue",
}

_LIMIT = (
    "a sharded queue has no exact queue-wide {what}: each shard would enforce its own. "
    "Use lane {alt} (exact per lane, each lane lives on one shard), or set one per shard "
    "by hand on Queue(name) (or AsyncQueue(name)) for each name of shards()"
)


def refused(verb: str) -> ShardsError:
    """The ShardsError a refused verb raises (see VERBS)."""
    if verb == "limit":
        return ShardsError(_LIMIT.format(what="limit(n)", alt="limits (limit_lane)"))
    if verb == "rate_limit":
        return ShardsError(_LIMIT.format(what="rate_limit", alt="rate limits (rate_limit_lane)"))
    return ShardsError(
        "a sharded queue has one event stream per shard (stream ids do not compare across "
        "them): read each with Queue(name).events() for each name of shards()"
    )


def limited(name: str) -> ShardsError:
    """The ShardsError of sharding ``name`` while it has a queue-wide limit or rate limit
    (``propose_shards`` refuses it, ``EMQSTATE limited``): a sharded queue has none, and the
    one stored on the queue would bind shard 0 alone."""
    return ShardsError(
        f"{name!r} has a queue-wide limit or rate limit, which a sharded queue cannot keep "
        "exact (it would bind shard 0 alone): clear it first (limit(None), "
        "clear_rate_limit()), then shard the queue; use lane limits (limit_lane, "
        "rate_limit_lane), or set one per shard by hand, after"
    )


def as_limited(name: str, exc: StateError) -> ShardsError | None:
    """:func:`limited` when ``exc`` is ``propose_shards``'s ``EMQSTATE limited``, else None."""
    return limited(name) if exc.reason.split(" ", 1)[0] == "limited" else None


def task_rate(task: str, queue: str) -> ShardsError:
    """The ShardsError of a task's ``rate_limit=`` on a sharded queue (the worker would set
    it on shard 0 alone)."""
    return ShardsError(
        f"task {task!r}: rate_limit= on {queue!r}, a sharded queue, is refused: "
        + _LIMIT.format(what="rate_limit", alt="rate limits (rate_limit_lane)")
    )


def shrink(name: str, stored: int, n: int) -> ShardsError:
    """The ShardsError of ``reshard(n)`` below the stored count."""
    return ShardsError(
        f"{name!r} has {stored} shards; shrinking to {n} is refused (jobs would have to move). "
        f"To shrink: stop its producers, let the workers drain every shard (counts() all 0), "
        f"obliterate it, and recreate it with shards={n}"
    )


def serving(name: str, workers: Sequence[WorkerInfo]) -> None:
    """Refuse to shard ``name`` while it has live workers and none of them serves shards
    (workers of a release before sharded queues serve shard 0 only: the jobs routed to the
    other shards would wait for a worker that never comes). No live worker: allowed (the
    workers that start later serve every shard)."""
    if workers and not any(w.shards for w in workers):
        versions = ", ".join(sorted({w.version for w in workers}))
        raise ShardsError(
            f"{name!r} has {len(workers)} live worker(s) ({versions}) that serve shard 0 "
            "only: upgrade them to a release that serves every shard (their `echomq workers` "
            "entry shows shards) before sharding the queue"
        )


# Shard i mints its repeats' slots from i * REPEAT_SLOTS_PER_SHARD (meta ``repeat_slots``
# seeded once, HSETNX): an occurrence's id is its slot and fire time (lua compose.lua), so
# two repeats of one logical queue on two shards never share one (2^21 slots / 256 shards).
REPEAT_SLOTS_PER_SHARD = 2_097_152 // 256


def slot_range(k: Keys, shard: int) -> Call[int]:
    """Seed shard ``shard``'s repeat slot counter at the start of its range (a no-op once
    the shard minted any)."""
    start = str(shard * REPEAT_SLOTS_PER_SHARD)
    return _cmd(("HSETNX", k.meta, "repeat_slots", start), int)


def onto(node: Any, logical: str, shard: str) -> Any:
    """A flow's tree with every node that names the logical queue moved onto ``shard`` (a
    node built from a task names its queue: without this, every such flow would land on
    shard 0). Anything that is not a FlowJob is passed on for add_flow to refuse."""
    if not isinstance(node, FlowJob):
        return node
    children = node.children
    if isinstance(children, tuple):
        children = tuple(onto(c, logical, shard) for c in children)
    queue = shard if node.queue == logical else node.queue
    if queue == node.queue and children == node.children:
        return node
    return FlowJob(
        node.payload, id=node.id, queue=queue, group=node.group, fail_parent=node.fail_parent,
        children=children, priority=node.priority,
    )  # fmt: skip


def per_pair(pairs: Sequence[tuple[str, Any]], idx: Sequence[int], ids: Sequence[str]) -> list[int]:
    """The indices (into ``pairs``) of one shard's verdicts: ``ids`` are the ids its call
    answered for its pairs ``idx``, in their order, so each matches the next pair with that
    id. A batch naming one id twice (a stale and a current token) then answers per pair, as
    a plain queue does, not once per id."""
    out, j = [], 0
    for i in idx:
        if j < len(ids) and pairs[i][0] == ids[j]:
            out.append(i)
            j += 1
    return out


def order(first: int, n: int) -> Iterator[int]:
    """The shard indices ``first``, ``first + 1``, ... wrapping, each once."""
    return ((first + i) % n for i in range(n))


class Minted:
    """A minter whose first ids are ones minted already (routing needs a job's id before its
    call is made), then the real minter's: ``enqueue`` keeps treating them as minted here
    (a collision with another process's id is minted again, never taken for a replay)."""

    def __init__(self, first: Iterable[str], minter: ids.Minter | None) -> None:
        self._first = deque(first)
        self._minter = minter or ids.Minter()

    def try_mint(self, ns: str = "JOB") -> str | None:
        return self._first.popleft() if self._first else self._minter.try_mint(ns)

    def lease_request(self, anywhere: bool = False) -> tuple[str, int, int, int, float, int]:
        return self._minter.lease_request(anywhere)

    def granted(self, token: str, hw: int, sent: float, node: int, floor: int) -> None:
        self._minter.granted(token, hw, sent, node, floor)

    def as_minter(self) -> ids.Minter:
        """This object where a plan takes an ``ids.Minter`` (it has the three methods)."""
        return cast(ids.Minter, self)


def check_items(
    items: Iterable[bytes | str | tuple[str, bytes | str]], max_payload: int
) -> list[bytes | str | tuple[str, bytes | str]]:
    """``enqueue_many``'s items as a list, checked as its plan checks them (before any id is
    minted: minting may take a lease, a write)."""
    if isinstance(items, (str, bytes)):
        raise InvalidArgument("enqueue_many takes an iterable of payloads, not one payload")
    try:
        out = list(items)
    except TypeError:
        raise InvalidArgument(f"items must be iterable, got {type(items).__name__}") from None
    for item in out:
        if isinstance(item, tuple):
            if len(item) != 2:
                raise InvalidArgument(f"an (id, payload) item has 2 parts, got {len(item)}")
            keyspace.check_id(item[0])
            _payload(item[1], max_payload)
        else:
            _payload(item, max_payload)
    return out


def ranked(k: Keys, state: str, n: int, group: str | None) -> Call[list[tuple[Any, str]]]:
    """``browse`` with each id's rank: ``(score, id)``, newest first (as ``browse`` reads
    it: by rank for a waiting set, by time for the others), so the shards' pages merge into
    the logical queue's: score first, ties by id, as one sorted set orders them."""
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 1_000_000:
        raise InvalidArgument(f"n must be an int in 1..1000000, got {n!r}")
    key, by_rank = _state_key(k, state)
    if group is not None:
        raise InvalidArgument("ranked() browses a whole state; a lane lives on one shard")
    if by_rank:
        return _cmd(("ZRANGE", key, 0, n - 1, "REV", "WITHSCORES"), _pairs)
    args = ("ZRANGE", key, "+inf", "-inf", "BYSCORE", "REV", "LIMIT", 0, n, "WITHSCORES")
    return _cmd(args, _pairs)


def _strs(reply: Any) -> list[str]:
    return [x.decode() if isinstance(x, bytes) else str(x) for x in reply]


def _pairs(reply: Any) -> list[tuple[Any, str]]:
    """ZRANGE WITHSCORES: ``[member, score]`` pairs (RESP3, a parsed reply) or flat."""
    if reply and isinstance(reply[0], (list, tuple)):
        return [(float(score), _strs([member])[0]) for member, score in reply]
    flat = _strs(reply)
    return [(float(flat[i + 1]), flat[i]) for i in range(0, len(flat), 2)]


def merge_ranked(pages: Sequence[list[tuple[Any, str]]], n: int) -> list[str]:
    """The ``n`` newest (highest ranked) ids over every shard's page (ties: by id)."""
    merged = sorted((p for page in pages for p in page), reverse=True)
    return [jid for _, jid in merged[:n]]


def sum_counts(parts: Iterable[dict[str, int]]) -> dict[str, int]:
    """Per-field sums of dicts of counts (every key kept, in first-seen order)."""
    out: dict[str, int] = {}
    for part in parts:
        for key, value in part.items():
            out[key] = out.get(key, 0) + value
    return out


def union_lanes(parts: Iterable[list[str]]) -> list[str]:
    """Every lane once, in first-seen order."""
    return list(dict.fromkeys(lane for part in parts for lane in part))


def union_workers(parts: Iterable[list[WorkerInfo]]) -> list[WorkerInfo]:
    """Every worker once (by id): one serving several shards registers on each."""
    seen: dict[str, WorkerInfo] = {}
    for part in parts:
        for w in part:
            seen.setdefault(w.id, w)
    return list(seen.values())


def union_repeats(parts: Iterable[list[Repeat]]) -> list[Repeat]:
    """Every shard's repeats, soonest first (spent and paused ones, next_ms None, last)."""
    every = [r for part in parts for r in part]
    return sorted(every, key=lambda r: (r.next_ms is None, r.next_ms or 0, r.name))


def app_shards(shards: Mapping[str, int] | None) -> dict[str, int]:
    """``App(shards=...)`` checked: each queue name with its shard count (1..256)."""
    if shards is None:
        return {}
    if not isinstance(shards, Mapping):
        raise InvalidArgument(f"shards maps queue names to counts, got {type(shards).__name__}")
    return {keyspace.check_queue(name): _check(name, n) for name, n in shards.items()}
