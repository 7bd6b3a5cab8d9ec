"""The worker registry's keys, calls and entries (Queue.workers).

The worker registry as it is read and written: which worker processes serve a queue,
where they run, what they hold.

Each worker process writes one entry per queue it serves on its beat (``worker_beat.lua``),
never per job: ``emq:{q}:workers`` (a HASH, worker id -> its JSON entry) and
``emq:{q}:workers:ttl`` (a ZSET, worker id -> the server ms its entry lapses at). Both keys
carry the queue's hash tag, so the registry lives in the queue's slot and works unchanged on
a Redis Cluster. An entry lapses ``ttl_ms`` after its last beat: a SIGKILLed worker is gone
from every listing within one TTL (and its entry pruned by the next beat of any worker of the
queue); a worker that stops gracefully removes its entries at once. The keys expire with the
last live entry, so a queue nobody serves keeps no registry.

An entry is bounded: at most :data:`MAX_LISTED` held jobs are listed (``held`` counts all).
A job's ``since`` is when the worker's beat first saw it running, so it is within one beat of
the run's start (timing each claim would put a clock read in the job's hot path).

This module is the read side and the calls (a queue lists workers from it); the worker's own
entries are built and beaten by ``runtime.worker_registry.Registry``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from echomq import ids
from echomq.protocol.kernel import Call, Keys, _call, _int, _s

__all__ = [
    "MAX_LISTED",
    "SUPERVISOR_ENV",
    "HeldJob",
    "WorkerInfo",
    "beat",
    "gone",
    "list_workers",
    "ttl_for",
    "version_spread",
]

MAX_LISTED = 100  # held jobs listed per entry; `held` counts them all
SUPERVISOR_ENV = "ECHOMQ_SUPERVISOR_ID"  # set by `echomq worker -p N` for its children


def ttl_for(beat_ms: int) -> int:
    """An entry's TTL: five beats (a slow beat or two does not drop a live worker), at
    least one second."""
    return max(1000, 5 * beat_ms)


@dataclass(frozen=True)
class HeldJob:
    """A job a worker runs now: its id, its task's name and since when (server ms, within a
    beat of its start)."""

    id: str
    task: str
    since_ms: int


@dataclass(frozen=True)
class WorkerInfo:
    """One live worker process of a queue, as its last beat wrote it."""

    id: str
    host: str
    pid: int
    supervisor: str | None  # the id of the `echomq worker -p N` that started it, if any
    queues: list[str]
    concurrency: int
    executor: str
    version: str
    started_ms: int  # when the worker started (its host's clock, ms)
    last_beat_ms: int  # server ms
    lapses_ms: int  # server ms: the entry is gone from listings after this
    held: int  # jobs in flight now (all queues)
    jobs: list[HeldJob] = field(default_factory=list)  # at most MAX_LISTED of them
    pool: int = 0  # the size of its process pool (@app.task(pool="process")), 0: none
    # The data layouts it serves (echomq.client.layout); 0: not recorded (a worker before 0.6).
    layout: int = 0
    min_layout: int = 0
    # Whether it serves every shard of a sharded queue (issue 43); False: shard 0 only.
    shards: bool = False

    @property
    def layouts(self) -> str:
        """The layouts it serves as shown: ``1..2``, ``2``, or ``?`` (a worker before 0.6)."""
        if not self.layout:
            return "?"
        low = self.min_layout or self.layout
        return f"{low}..{self.layout}" if low != self.layout else str(self.layout)


def _keys(k: Keys) -> tuple[str, str]:
    return k.base + "workers", k.base + "workers:ttl"


def beat(k: Keys, worker_id: str, entry: str, ttl_ms: int) -> Call[int]:
    """Write (or renew) one worker's entry; prunes lapsed ones. Returns the server ms."""
    if not ids.is_valid(worker_id):
        raise ValueError(f"bad worker id {worker_id!r}")
    return _call("worker_beat", _keys(k), (worker_id, entry, _int("ttl_ms", ttl_ms, 1)), int)


def gone(k: Keys, worker_id: str) -> list[Call[Any]]:
    """Remove one worker's entry (a graceful stop): two commands of the queue's slot."""
    workers, ttl = _keys(k)
    return [
        Call(None, (), ("HDEL", workers, worker_id), int, True),
        Call(None, (), ("ZREM", ttl, worker_id), int, True),
    ]


def list_workers(k: Keys) -> Call[list[WorkerInfo]]:
    """The queue's live workers (entries whose beat has not lapsed), oldest start first."""

    def decode(reply: Any) -> list[WorkerInfo]:
        flat = reply[1]
        out = []
        for i in range(0, len(flat), 3):
            info = _info(_s(flat[i]), flat[i + 1], int(float(flat[i + 2])))
            if info is not None:
                out.append(info)
        out.sort(key=lambda w: (w.started_ms, w.id))
        return out

    return _call("workers", _keys(k), (), decode)


def _info(worker_id: str, raw: bytes | str, lapses_ms: int) -> WorkerInfo | None:
    try:
        e = json.loads(raw)
        ttl = int(e["ttl_ms"])
        return WorkerInfo(
            id=worker_id,
            host=str(e["host"]),
            pid=int(e["pid"]),
            supervisor=e.get("supervisor") or None,
            queues=[str(q) for q in e["queues"]],
            concurrency=int(e["concurrency"]),
            executor=str(e["executor"]),
            version=str(e["version"]),
            started_ms=int(e["started_ms"]),
            last_beat_ms=lapses_ms - ttl,
            lapses_ms=lapses_ms,
            held=int(e["held"]),
            jobs=[HeldJob(str(j[0]), str(j[1]), int(j[2])) for j in e["jobs"]],
            pool=int(e.get("pool", 0)),
            layout=int(e.get("layout", 0)),
            min_layout=int(e.get("min_layout", 0)),
            shards=bool(e.get("shards", 0)),
        )
    except (ValueError, KeyError, TypeError, IndexError):
        return None  # an entry this version cannot read (a newer writer, a planted key)


def _minor(version: str) -> tuple[int, int] | None:
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        return None


def version_spread(workers: Iterable[WorkerInfo]) -> str | None:
    """A warning when the live workers span more releases than the upgrade contract covers
    (any mix of two consecutive minor releases, N-1 and N: docs/guides/upgrading.md); None
    when they do not."""
    found = sorted({m for w in workers if (m := _minor(w.version)) is not None})
    if len(found) < 2:
        return None
    (lo_major, lo), (hi_major, hi) = found[0], found[-1]
    if lo_major == hi_major and hi - lo <= 1:
        return None
    versions = sorted({w.version for w in workers}, key=lambda v: _minor(v) or (0, 0))
    return (
        f"warning: the fleet runs echomq {', '.join(versions)}: more than two consecutive "
        "releases at once, which the upgrade contract does not cover; finish the upgrade "
        "one release at a time (docs/guides/upgrading.md)"
    )
