"""The worker registry: which worker processes serve a queue, where they run, what they hold.

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

The worker's connections are named ``echomq-worker:<id>`` (``CLIENT SETNAME``) so that
``CLIENT LIST`` shows them too.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from echomq import _layout, ids
from echomq._kernel import Call, Keys, _call, _int, _s
from echomq.errors import DurabilityError

if TYPE_CHECKING:
    from echomq._executor import AsyncExecutor
    from echomq._queueloop import QueueLoop

__all__ = [
    "MAX_LISTED",
    "name_connections",
    "HeldJob",
    "Registry",
    "WorkerInfo",
    "beat",
    "client_name",
    "gone",
    "list_workers",
    "name_client",
    "ttl_for",
    "version_spread",
]

log = logging.getLogger("echomq.worker")

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
    # The data layouts it serves (echomq._layout); 0: not recorded (a worker before 0.6).
    layout: int = 0
    min_layout: int = 0

    @property
    def layouts(self) -> str:
        """The layouts it serves as shown: ``1..2``, ``2``, or ``?`` (a worker before 0.6)."""
        if not self.layout:
            return "?"
        low = self.min_layout or self.layout
        return f"{low}..{self.layout}" if low != self.layout else str(self.layout)


def client_name(worker_id: str) -> str:
    return f"echomq-worker:{worker_id}"


async def name_connections(client: Any, name: str) -> bool:
    """Name the worker's connections when the server lets it: ``CLIENT SETNAME`` once (on a
    connection of the pool, or every node of a cluster), then on every connection opened
    later. A refusal (an ACL user without ``client|setname``, a proxy that does not know the
    command) leaves them unnamed: logged, never fatal (True when named)."""
    try:
        await client.execute_command("CLIENT", "SETNAME", name)
    except Exception as exc:
        log.info("worker connections left unnamed (CLIENT SETNAME refused: %s)", exc)
        return False
    name_client(client, name)
    return True


def name_client(client: Any, name: str) -> None:
    """Name every connection ``client`` opens from now on (``CLIENT SETNAME`` on connect):
    a plain client's pool, or every node of a cluster client, known now or found later."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None and hasattr(pool, "connection_kwargs"):
        pool.connection_kwargs["client_name"] = name
    nodes = getattr(client, "nodes_manager", None)
    if nodes is not None:
        nodes.connection_kwargs["client_name"] = name
        for node in list(getattr(nodes, "nodes_cache", {}).values()):
            node.connection_kwargs["client_name"] = name


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


class Registry:
    """One worker process's entries: built on its beat from what its queues hold."""

    def __init__(self, queues: list[str], concurrency: int, beat_ms: int, pool: int = 0) -> None:
        from echomq import __version__

        self.id = ids.mint("WRK")
        self.ttl_ms = ttl_for(beat_ms)
        self.beat_ms = beat_ms
        self.pool = pool
        self._static: dict[str, Any] = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "supervisor": os.environ.get(SUPERVISOR_ENV) or None,
            "queues": list(queues),
            "concurrency": concurrency,
            "executor": "lua",
            "version": __version__,
            "started_ms": int(time.time() * 1000),
            "ttl_ms": self.ttl_ms,
            "pool": pool,
            # Added in 0.6 (issue 39): readers before it ignore fields they do not know.
            "layout": _layout.LAYOUT,
            "min_layout": _layout.MIN_LAYOUT,
        }
        self._seen: dict[tuple[str, int], int] = {}  # (id, token) -> server ms first seen
        self._server_ms = 0  # the last beat's server clock
        self._server_at = 0.0  # time.monotonic() when that beat's answer came

    def entry(self, loops: Iterable[QueueLoop], executor: str | None) -> str:
        """The JSON entry: the static fields and the jobs held now (the oldest first)."""
        # The server's clock now: the last beat's, moved on by the time since on this host's
        # monotonic clock. The last beat's alone is up to a beat old: a job claimed since
        # then would be "running" from before it was enqueued (running > age).
        if self._server_ms:
            now = self._server_ms + int((time.monotonic() - self._server_at) * 1000)
        else:
            now = int(time.time() * 1000)
        seen: dict[tuple[str, int], int] = {}
        jobs: list[tuple[int, str, str]] = []
        for ql in loops:
            for key, r in list(ql.inflight.items()):
                if r.lost:
                    continue
                since = seen[key] = self._seen.get(key, now)
                task = r.ctx.task if r.ctx is not None else "?"
                jobs.append((since, r.job.id, task))
        self._seen = seen
        jobs.sort()
        e = dict(self._static)
        e["executor"] = executor or "lua"
        e["held"] = len(jobs)
        e["jobs"] = [[job_id, task, since] for since, job_id, task in jobs[:MAX_LISTED]]
        return json.dumps(e, separators=(",", ":"))

    async def beat(self, x: AsyncExecutor, loops: list[QueueLoop]) -> None:
        """One beat: every queue's entry in one pipelined round trip."""
        entry = self.entry(loops, x.executor)
        results = await x.pipeline([beat(ql.keys, self.id, entry, self.ttl_ms) for ql in loops])
        for result in results:
            if isinstance(result, DurabilityError):
                continue  # applied; too few replicas acknowledged it: a visibility record only
            if isinstance(result, BaseException):
                raise result
            self._server_ms, self._server_at = int(result), time.monotonic()

    async def gone(self, x: AsyncExecutor, loops: list[QueueLoop]) -> None:
        """At a graceful stop: remove every entry now (a failure leaves them to lapse)."""
        calls = [c for ql in loops for c in gone(ql.keys, self.id)]
        if calls:
            await x.pipeline(calls)
