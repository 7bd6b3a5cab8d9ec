"""Read-only snapshots of queues for the operator views: the dashboard, Prometheus, ``top``.

Everything here reads; nothing writes. A snapshot of many queues is built from one or two
pipelined round trips (the ``counts`` script plus plain reads per queue), so an overview of
hundreds of queues costs a few milliseconds of server time and no call lands on a worker's
hot path. Lane figures come from the lane keys themselves (PROTOCOL §1.3): the registry
``lanes`` (lanes with waiting jobs) joined with every lane that has a limit, a weight, jobs
in flight or a pause, so an idle paused lane is listed too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from echomq import ids, keyspace
from echomq.client.connect import TRANSIENT, Budget, never_reached
from echomq.client.executor import SyncExecutor
from echomq.errors import InvalidArgument
from echomq.protocol import calls as _p
from echomq.protocol import kernel as _k
from echomq.protocol import observe as _observe
from echomq.protocol import reads as _reads
from echomq.protocol.kernel import Call, Keys, _cmd, _s

__all__ = [
    "JobView",
    "LaneView",
    "QueueView",
    "discover",
    "job_view",
    "page",
    "riding_out",
    "snapshot",
]

T = TypeVar("T")

SET_STATES = ("pending", "active", "schedule", "dead")


@dataclass
class LaneView:
    name: str
    depth: int = 0
    active: int = 0
    limit: int | None = None
    weight: int = 1
    paused: bool = False
    oldest_ms: int | None = None  # mint time of the lane's oldest waiting job


@dataclass
class QueueView:
    name: str
    counts: dict[str, int]
    paused: bool
    events: int  # the stream bound when events are on, else 0
    now_ms: int  # the server clock when read
    oldest_waiting_ms: int | None  # mint time of the oldest waiting job (flat or lane)
    lease_deadline_ms: int | None  # the earliest lease deadline among active jobs
    completed: list[int] = field(default_factory=list)  # per minute, current first (D16)
    failed: list[int] = field(default_factory=list)
    lanes: list[LaneView] = field(default_factory=list)
    limit: int | None = None  # the queue-wide concurrency limit (PROTOCOL D24), None: none
    # A sharded queue's view (echomq.ops.sharded): the sums, and here each shard's own view.
    shards: list[QueueView] = field(default_factory=list)

    @property
    def oldest_waiting_age_s(self) -> float | None:
        if self.oldest_waiting_ms is None:
            return None
        return max(0.0, (self.now_ms - self.oldest_waiting_ms) / 1000)

    @property
    def lease_headroom_s(self) -> float | None:
        """Seconds until the earliest lease lapses; negative: a lapsed lease awaits reap."""
        if self.lease_deadline_ms is None:
            return None
        return (self.lease_deadline_ms - self.now_ms) / 1000

    def as_dict(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "counts": self.counts,
            "paused": self.paused,
            "events": self.events,
            "now_ms": self.now_ms,
            "oldest_waiting_age_s": self.oldest_waiting_age_s,
            "lease_headroom_s": self.lease_headroom_s,
            "completed_per_minute": self.completed,
            "failed_per_minute": self.failed,
            "lanes": [vars(lane) for lane in self.lanes],
        }
        if self.shards:  # a sharded queue's breakdown; absent for a plain queue
            out["shards"] = [v.as_dict() for v in self.shards]
        return out


def riding_out(
    x: SyncExecutor, read: Callable[[], T], within_s: float, *, fail_fast: bool = False
) -> T:
    """``read()``, asked again after a transient error for up to ``within_s`` seconds, the
    cluster's slot map re-read before each try: an operator view rides out a failover
    instead of failing on the dead primary's address. Only for reads (they are safe to
    repeat); past the budget the last error is raised (a lost connection as
    ``ServerUnreachable``). ``fail_fast``: a first try that never reached the server (the
    connection refused, the host name unknown) raises at once (a CLI command's first
    connect: a wrong address is said in a second, not after the whole budget)."""
    budget = Budget(within_s)
    first = True
    while True:
        try:
            return read()
        except TRANSIENT as exc:
            if fail_fast and first and never_reached(exc):
                raise
            first = False
            x.follow()
            delay = budget.next_delay()
            if delay is None:
                budget.give_up(exc, x.client)
            time.sleep(delay)


def typed_keys_exist(client: Any, name: str) -> bool:
    """Whether a key of queue ``name`` of a registered type exists (PROTOCOL §1.3): one
    EXISTS, never a SCAN."""
    keys = [keyspace.queue_key(name, t) for t in sorted(keyspace.QUEUE_TYPES)]
    return bool(int(client.execute_command("EXISTS", *keys)))


def queue_exists(client: Any, name: str) -> bool:
    """Whether any key of queue ``name`` exists: :func:`typed_keys_exist`, then a SCAN for
    the rest (job rows, lane sets) when none does."""
    if typed_keys_exist(client, name):
        return True
    # A queue name matches [A-Za-z0-9._-]: nothing in it is a glob character.
    return any(True for _ in client.scan_iter(match=f"emq:{{{name}}}:*", count=1000))


def discover(client: Any) -> list[str]:
    """Every queue with at least one key on the server (SCAN; never KEYS)."""
    names: set[str] = set()
    for key in client.scan_iter(match="emq:{*", count=1000):
        text = key.decode(errors="replace") if isinstance(key, bytes) else str(key)
        end = text.find("}")
        if end > 5:
            name = text[5:end]
            try:
                names.add(keyspace.check_queue(name))
            except ValueError:
                continue  # not a name echomq could have written: not a queue of ours
    return sorted(names)


def _oldest_id(reply: Any) -> int | None:
    if not reply:
        return None
    try:
        return ids.decode_time_ms(_s(reply[0]))
    except ValueError:
        return None


def _member_score(reply: Any) -> tuple[str, float] | None:
    """The one member of a ``ZRANGE ... WITHSCORES`` of one element, with its score."""
    if not reply:
        return None
    first = reply[0]
    # RESP2: [member, score]; RESP3: [[member, score]]
    member, score = first if isinstance(first, (list, tuple)) else (reply[0], reply[1])
    return _s(member), float(score)


# How many priority bands of one waiting set the oldest-job search walks (a ZRANGE each).
_BANDS = 32


def _oldest_waiting(x: SyncExecutor, key: str, head: Any, tail: Any) -> int | None:
    """The mint time of the oldest job of a waiting set. Its sets are scored by priority (PROTOCOL
    D23), so the head is the next job to run, not always the oldest: with one score (every
    priority 0, the common case) it is; else the oldest is the first of some band, and the
    bands are walked, at most _BANDS of them (past that the figure is the oldest seen)."""
    first, last = _member_score(head), _member_score(tail)
    if first is None:
        return None
    best, score = first
    if last is not None and last[1] != score:
        for _ in range(_BANDS):
            found = _member_score(
                x.call(
                    _cmd(
                        (
                            "ZRANGE",
                            key,
                            f"({score}",
                            "+inf",
                            "BYSCORE",
                            "LIMIT",
                            0,
                            1,
                            "WITHSCORES",
                        ),
                        lambda r: r,
                    )
                )
            )
            if found is None:
                break
            best, score = min(best, found[0]), found[1]
    return _oldest_id([best])


def _first_score(reply: Any) -> int | None:
    if not reply:
        return None
    first = reply[0]
    # RESP2: [member, score]; RESP3: [[member, score]]
    score = first[1] if isinstance(first, (list, tuple)) else reply[1]
    return int(float(score))


def _hash(reply: Any) -> dict[str, str]:
    if isinstance(reply, dict):
        return {_s(k): _s(v) for k, v in reply.items()}
    return {_s(k): _s(v) for k, v in zip(reply[::2], reply[1::2], strict=True)}


def _raise(reply: Any) -> Any:
    if isinstance(reply, BaseException):
        raise reply
    return reply


def _to_int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


def snapshot(
    x: SyncExecutor, names: Iterable[str], *, lanes: bool = True, minutes: int = 30
) -> list[QueueView]:
    """Views of the queues ``names``: one pipeline for all of them, one more for lane depths
    when ``lanes``. ``minutes`` of D16 history per kind (0: none)."""
    keys = [Keys(n) for n in names]
    per = 11 + (2 if minutes else 0)
    calls: list[Call[Any]] = [_cmd(("TIME",), lambda r: int(r[0]) * 1000 + int(r[1]) // 1000)]
    for k in keys:
        calls += [
            _p.counts(k),
            _cmd(
                ("HMGET", k.meta, "paused", "events", "limit"),
                lambda r: [_s(v) if v else None for v in r],
            ),
            _cmd(("ZRANGE", k.pending, 0, 0, "WITHSCORES"), lambda r: r),
            _cmd(("ZRANGE", k.active, 0, 0, "WITHSCORES"), lambda r: r),
            _cmd(("SMEMBERS", k.lanes), lambda r: sorted(_s(m) for m in r)),
            _cmd(("HGETALL", k.gactive), _hash),
            _cmd(("HGETALL", k.glimit), _hash),
            _cmd(("HGETALL", k.gweight), _hash),
            _cmd(("SMEMBERS", k.paused), lambda r: {_s(m) for m in r}),
            _cmd(("ZCARD", k.pending), int),
            _cmd(("ZRANGE", k.pending, -1, -1, "WITHSCORES"), lambda r: r),
        ]
        if minutes:
            calls += [
                _cmd(("LRANGE", _observe.metrics_key(k, kind), 0, minutes - 1), list)
                for kind in _observe.METRICS_KINDS
            ]
    replies: list[Any] = [_raise(r) for r in x.pipeline(calls)] if keys else [0]
    now = int(replies[0]) if keys else int(time.time() * 1000)
    views: list[QueueView] = []
    lane_calls: list[Call[Any]] = []
    lane_owner: list[tuple[LaneView, str]] = []
    for i, k in enumerate(keys):
        part = replies[1 + i * per : 1 + (i + 1) * per]
        counts, meta, pend, act, waiting, gactive, glimit, gweight, gpaused, _flat, tail = part[:11]
        names_all = set(waiting) | set(gactive) | set(glimit) | set(gweight) | set(gpaused)
        lane_views = [
            LaneView(
                g,
                active=_to_int(gactive.get(g), 0),
                limit=_to_int(glimit[g], 0) if g in glimit else None,
                weight=_to_int(gweight.get(g), 1),
                paused=g in gpaused,
            )
            for g in sorted(names_all)
            if g != "*"
        ]
        view = QueueView(
            k.name,
            counts,
            paused=meta[0] is not None,
            events=_to_int(meta[1], 0),
            now_ms=now,
            oldest_waiting_ms=_oldest_waiting(x, k.pending, pend, tail),
            lease_deadline_ms=_first_score(act),
            lanes=lane_views,
            limit=_to_int(meta[2], 0) or None,
        )
        if minutes:
            view.completed = _observe.decode_metrics(now // 1000, part[11], minutes)
            view.failed = _observe.decode_metrics(now // 1000, part[12], minutes)
        views.append(view)
        if lanes:
            for lane in lane_views:
                try:
                    lane_key = k.lane(lane.name)
                except ValueError:
                    continue  # a field no echomq script could have written: shown, not read
                lane_calls += [
                    _cmd(("ZCARD", lane_key), int),
                    _cmd(("ZRANGE", lane_key, 0, 0, "WITHSCORES"), list),
                    _cmd(("ZRANGE", lane_key, -1, -1, "WITHSCORES"), list),
                ]
                lane_owner.append((lane, lane_key))
    if lane_calls:
        lane_replies = [_raise(r) for r in x.pipeline(lane_calls)]
        for j, (lane, lane_key) in enumerate(lane_owner):
            lane.depth = int(lane_replies[3 * j])
            head, tail = lane_replies[3 * j + 1], lane_replies[3 * j + 2]
            lane.oldest_ms = _oldest_waiting(x, lane_key, head, tail)
    for view in views:
        for lane in view.lanes:
            if lane.oldest_ms is not None and (
                view.oldest_waiting_ms is None or lane.oldest_ms < view.oldest_waiting_ms
            ):
                view.oldest_waiting_ms = lane.oldest_ms
    return views


@dataclass
class PageView:
    state: str
    total: int
    offset: int
    limit: int
    items: list[tuple[str, int | None]]  # (id, score: lease deadline / run-at ms, or None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "total": self.total,
            "offset": self.offset,
            "limit": self.limit,
            "items": [{"id": i, "score_ms": s} for i, s in self.items],
        }


def page(
    x: SyncExecutor, k: Keys, state: str, offset: int = 0, limit: int = 50, group: str | None = None
) -> PageView:
    """One page of a state's set, newest first (as ``browse``), with its total size."""
    key, lexical = _reads._state_key(k, state)
    off = _k._int("offset", offset, 0, 10**9)
    n = _k._int("limit", limit, 1, 1000)
    if group is not None:
        if key != k.pending:
            raise InvalidArgument("a lane can only be browsed in the pending state")
        key = k.lane(group)
    # By rank, never by LIMIT offset: a skiplist finds a rank in O(log N), so the last page
    # of a 1M-job set costs what the first does (BYLEX/BYSCORE LIMIT walks the offset).
    args = ("ZRANGE", key, off, off + n - 1, "REV", "WITHSCORES")
    total, items = (_raise(r) for r in x.pipeline([_cmd(("ZCARD", key), int), _cmd(args, list)]))
    out: list[tuple[str, int | None]]
    if items and isinstance(items[0], (list, tuple)):
        pairs = [(_s(m), int(float(s))) for m, s in items]
    else:
        pairs = [(_s(m), int(float(s))) for m, s in zip(items[::2], items[1::2], strict=True)]
    # A waiting set is scored by priority: no time in its scores. The dead set is scored by
    # the time of death, 0 for a job dead-lettered before D25 (no time known).
    out = [(m, None if lexical or (key == k.dead and sc == 0) else sc) for m, sc in pairs]
    return PageView("schedule" if state == "scheduled" else state, total, off, n, out)


@dataclass
class JobView:
    queue: str
    id: str
    place: str
    row: dict[str, str | bytes] | None
    logs: list[bytes]
    events: list[_observe.Event]
    minted_ms: int | None
    errors: list[str] = field(default_factory=list)  # of its failed attempts, the last 10

    def as_dict(self, payload: Any = None) -> dict[str, Any]:
        row = None
        if self.row is not None:
            row = {
                k: (v.decode("utf-8", "replace") if isinstance(v, bytes) else v)
                for k, v in self.row.items()
            }
        return {
            "queue": self.queue,
            "id": self.id,
            "place": self.place,
            "row": row,
            "payload": payload,
            "logs": [line.decode("utf-8", "replace") for line in self.logs],
            "events": [
                {"stream_id": e.stream_id, "event": e.event, "fields": e.fields}
                for e in self.events
            ],
            "minted_ms": self.minted_ms,
            "errors": list(self.errors),
        }


def job_view(x: SyncExecutor, k: Keys, job_id: str, *, scan_events: int = 1000) -> JobView:
    """The job's place, row, logs and its events among the newest ``scan_events`` of the
    stream (the stream is per queue, so a job's events are found by filtering)."""
    jk = k.job(job_id)  # gates the id before any I/O
    calls: list[Call[Any]] = [
        _p.job_state(k, job_id),
        _p.get_job(k, job_id),
        _cmd(("LRANGE", jk + ":logs", 0, -1), list),
        _cmd(("XREVRANGE", _observe.events_key(k), "+", "-", "COUNT", scan_events), list),
        _cmd(("LRANGE", jk + ":errors", 0, -1), list),
    ]
    place, row, logs, raw, errs = (_raise(r) for r in x.pipeline(calls))
    evs = [e for e in (_observe._entry(entry) for entry in reversed(raw or [])) if e.id == job_id]
    try:
        minted: int | None = ids.decode_time_ms(job_id)
    except ValueError:
        minted = None
    errors = [e.decode("utf-8", "replace") if isinstance(e, bytes) else str(e) for e in errs]
    return JobView(k.name, job_id, place, row, list(logs), evs, minted, errors)
