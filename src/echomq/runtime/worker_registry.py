"""A worker's own registry entries, written on its beat.

One worker process's registry entries (``protocol.registry`` holds the keys, calls and parsers):
built on its beat from what its queues hold, removed at a graceful stop.

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
from typing import Any

from echomq import ids
from echomq.client import layout as _layout
from echomq.client.executor import AsyncExecutor
from echomq.errors import DurabilityError
from echomq.protocol.registry import MAX_LISTED, SUPERVISOR_ENV, beat, gone, ttl_for
from echomq.runtime.queueloop import QueueLoop

__all__ = ["Registry", "client_name", "name_client", "name_connections"]

log = logging.getLogger("echomq.worker")


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
            # Issue 43: this worker serves every shard of a sharded queue it serves (a
            # producer refuses to shard a queue whose live workers all lack it).
            "shards": 1,
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
