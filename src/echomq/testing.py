"""Helpers for testing code that uses echomq: private servers and an in-process drain.

- :class:`EmbeddedCluster`: a Redis Cluster of private server processes on loopback, for
  tests, benchmarks and trying cluster mode locally (one server alone is
  :class:`echomq.server.EmbeddedServer`).
- :func:`drain` / :func:`adrain`: run a :class:`~echomq.Worker` in this process until the
  queues hold no pending, active or due scheduled job, and report what ran, failed and died.
- :func:`obliterate_queues`: delete every key of some queues (a test's cleanup).
- The pytest plugin (``echomq.pytest_plugin``, registered through the ``pytest11`` entry
  point, inert until a test asks for one of its fixtures) gives a test suite one private
  server per session and a fresh queue name per test: ``echomq_server``, ``echomq_url``,
  ``echomq_queue_name``, ``echomq_app``. See ``docs/API.md`` ("Testing").

Nothing here runs at import time: no process starts until asked.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from echomq import keyspace
from echomq.errors import EchoMQError, InvalidArgument
from echomq.queue import AsyncQueue, Queue
from echomq.server import EmbeddedServer, free_port
from echomq.worker import Worker

if TYPE_CHECKING:
    from echomq.app import App

__all__ = ["Drained", "EmbeddedCluster", "adrain", "drain", "obliterate_queues"]


# --------------------------------------------------------------------------- drain


@dataclass(frozen=True, slots=True)
class Drained:
    """What one :func:`drain` saw its worker do, and where the queues stand after it.

    Attributes:
        ran: handler runs started (a job that failed twice and then passed counts 3).
        completed: runs settled as done.
        failed: runs that failed and were scheduled for another attempt (``retry``).
        dead: jobs dead-lettered: failures at ``max_attempts``, ``Discard``, stall deaths.
        lost: runs whose lease another run took over (nothing settled for them).
        counts: per queue, ``Queue.counts()`` once the queues were empty (``schedule``
            still holds jobs waiting on a backoff that was not yet due).
    """

    ran: int
    completed: int
    failed: int
    dead: int
    lost: int
    counts: dict[str, dict[str, int]]


def _check_drain_args(timeout_s: object, poll_s: object) -> None:
    for name, value in (("timeout_s", timeout_s), ("poll_s", poll_s)):
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value <= 0
        ):
            raise InvalidArgument(f"{name} must be a positive number of seconds, got {value!r}")


async def _settled(watchers: Sequence[AsyncQueue]) -> tuple[bool, dict[str, dict[str, int]]]:
    """Whether no queue holds a pending, active or due scheduled job (server clock), nor a
    cross-queue flow settle still in its outbox (its parent, held in no set, is released
    only when the pump delivers it)."""
    counts: dict[str, dict[str, int]] = {}
    empty = True
    for aq in watchers:
        # The due scheduled jobs are counted first, the sets after: a job the worker promotes
        # from the schedule to pending between the two reads is then seen in one of them
        # (read the other way round it was in neither, and a busy queue looked empty).
        sec, usec = await aq.client.execute_command("TIME")
        now_ms = int(sec) * 1000 + int(usec) // 1000
        key = keyspace.queue_key(aq.name, "schedule")
        due = await aq.client.execute_command("ZCOUNT", key, "-inf", now_ms)
        c = counts[aq.name] = await aq.counts()
        outbox = keyspace.queue_key(aq.name, "flow:outbox")
        if c["pending"] or c["active"] or await aq.client.execute_command("LLEN", outbox):
            empty = False
        elif due:
            # A scheduled job counts once it is due: the worker's beat promotes it and runs
            # it. One not yet due (a long backoff) is left where it is.
            empty = False
    return empty, counts


async def adrain(
    app: App,
    queues: Iterable[str] | None = None,
    *,
    timeout_s: float = 10.0,
    concurrency: int = 10,
    beat_ms: int = 100,
    poll_s: float = 0.02,
    url: str | None = None,
) -> Drained:
    """Run a worker for ``app`` on the current event loop until ``queues`` (default: every
    queue of the app's tasks) hold no pending, active or due scheduled job; then stop it
    gracefully and return what it did.

    The empty state must be seen on two polls in a row, so a job moving between sets while
    the counts are read is not mistaken for an empty queue. ``beat_ms`` is the worker's
    sweep rhythm: it bounds how long a due retry waits to be promoted (short by default, for
    tests).

    Raises:
        TimeoutError: the queues were not empty after ``timeout_s`` (a paused queue or lane,
            a handler that never returns ...); the worker is stopped first.
        InvalidArgument: a bad argument, before anything runs.
        Anything the worker's run raised (e.g. ``VersionFenceError``).
    """
    _check_drain_args(timeout_s, poll_s)
    names = list(queues) if queues is not None else app.queues()
    if not names:
        raise InvalidArgument("no queues to drain: register a task or pass queues=[...]")
    for name in names:
        keyspace.check_queue(name)
    worker = Worker(app, queues=names, concurrency=concurrency, beat_ms=beat_ms, url=url)
    target = url or app.url
    watchers = [AsyncQueue(name, url=target) for name in names]
    loop = asyncio.get_running_loop()
    run = asyncio.ensure_future(worker.arun())
    deadline = loop.time() + timeout_s
    counts: dict[str, dict[str, int]] = {}
    timed_out = False
    try:
        # A sharded queue (issue 43): every shard is watched, its counts under its own name.
        for aq in list(watchers):
            watchers += [AsyncQueue(s, url=target) for s in (await aq.shards())[1:]]
        seen_empty = 0
        while not run.done():
            empty, counts = await _settled(watchers)
            seen_empty = seen_empty + 1 if empty else 0
            if seen_empty >= 2:
                break
            if loop.time() > deadline:
                timed_out = True
                break
            await asyncio.sleep(poll_s)
    finally:
        worker.stop()
        try:
            await run  # a graceful stop: the last settles are sent before it returns
        finally:
            try:
                _, counts = await _settled(watchers)
            finally:
                for aq in watchers:
                    await aq.aclose()
    stats = worker.stats
    if timed_out:
        raise TimeoutError(
            f"queues {names} not drained in {timeout_s}s (ran {stats.claimed}, completed "
            f"{stats.completed}); counts now {counts}"
        )
    return Drained(
        ran=stats.claimed,
        completed=stats.completed,
        failed=stats.retried,
        dead=stats.dead + stats.swept_dead,
        lost=stats.lost,
        counts=counts,
    )


def drain(
    app: App,
    queues: Iterable[str] | None = None,
    *,
    timeout_s: float = 10.0,
    concurrency: int = 10,
    beat_ms: int = 100,
    poll_s: float = 0.02,
    url: str | None = None,
) -> Drained:
    """:func:`adrain` on a private event loop, for synchronous tests. Inside a running
    event loop (an ``async def`` test) use ``await adrain(...)`` instead."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise EchoMQError("drain() was called inside a running event loop: await adrain(...)")

    async def run() -> Drained:
        try:
            return await adrain(
                app,
                queues,
                timeout_s=timeout_s,
                concurrency=concurrency,
                beat_ms=beat_ms,
                poll_s=poll_s,
                url=url,
            )
        finally:
            await _close_loop_client(app)

    return asyncio.run(run())


async def _close_loop_client(app: App) -> None:
    """Close the asyncio client the app opened on this (private, about to end) loop: handlers
    that enqueue with ``aenqueue`` open one, and it cannot outlive its loop. The app's sync
    client and the clients of other loops are left alone."""
    names = app.queues()
    if names:
        client: Any = app.aqueue(names[0]).client  # the loop's one client (made if absent)
        await client.aclose()


def obliterate_queues(url: str, names: Iterable[str]) -> None:
    """Pause each queue and delete every key of it (jobs in flight included): a test's
    cleanup, never for a queue in production use."""
    for name in names:
        with Queue(name, url=url) as q:
            q.pause()  # obliterate refuses a queue that is not paused
            q.obliterate(force=True)


# --------------------------------------------------------------------------- cluster


class EmbeddedCluster:
    """A Redis Cluster of private servers on loopback: ``masters`` primaries with
    ``replicas`` replicas each, built with CLUSTER ADDSLOTSRANGE / MEET / REPLICATE (no
    redis-cli needed). For tests, benchmarks and trying cluster mode locally.
    """

    def __init__(
        self,
        dir: str | os.PathLike[str],
        *,
        masters: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = 2000,
        appendonly: bool = False,
        args: Sequence[str] = (),
    ) -> None:
        self.dir = Path(dir).resolve()
        self.masters = masters
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.appendonly = appendonly
        self.args = list(args)
        self.nodes: list[EmbeddedServer] = []

    @property
    def url(self) -> str:
        """A cluster-mode URL naming the first live node."""
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                return f"redis+cluster://127.0.0.1:{node.port}/0"
        raise RuntimeError("no live cluster node")

    def start(self, timeout: float = 30.0) -> EmbeddedCluster:
        import redis

        total = self.masters * (1 + self.replicas)
        for i in range(total):
            node = EmbeddedServer(
                self.dir / f"node{i}",
                port=free_port(cluster=True),
                appendonly=self.appendonly,
                unix_socket=False,
                args=[
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", str(self.node_timeout_ms),
                    # Replicas sync at once (the default waits 5 s for more replicas): a
                    # replica that never synced cannot be promoted.
                    "--repl-diskless-sync-delay", "0",
                    *self.args,
                ],
            )  # fmt: skip
            self.nodes.append(node.start())
        clients: list[Any] = [redis.Redis(port=n.port) for n in self.nodes]
        try:
            span = 16384 // self.masters
            for i in range(self.masters):
                lo, hi = i * span, 16383 if i == self.masters - 1 else (i + 1) * span - 1
                clients[i].execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
            for c in clients[1:]:
                c.execute_command("CLUSTER", "MEET", "127.0.0.1", self.nodes[0].port)
            ids = [c.execute_command("CLUSTER", "MYID").decode() for c in clients]
            deadline = time.monotonic() + timeout
            self._wait(lambda: all(len(_known(c)) == total for c in clients), deadline)
            for i in range(self.masters, total):
                master = (i - self.masters) % self.masters
                clients[i].execute_command("CLUSTER", "REPLICATE", ids[master])
            self._wait(lambda: all(_state_ok(c) for c in clients), deadline)
            # Ready means failover-ready: every replica has synced with its primary.
            self._wait(lambda: all(_synced(c) for c in clients[self.masters :]), deadline)
        except BaseException:
            self.stop()
            raise
        finally:
            for c in clients:
                c.close()
        return self

    @staticmethod
    def _wait(pred: Any, deadline: float) -> None:
        while not pred():
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not converge in time")
            time.sleep(0.05)

    def primaries(self) -> list[EmbeddedServer]:
        """The nodes that currently serve slots as primaries."""
        import redis

        out = []
        for node in self.nodes:
            if node.proc is None or node.proc.poll() is not None:
                continue
            with redis.Redis(port=node.port) as c:
                if c.info("replication").get("role") == "master":
                    out.append(node)
        return out

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> EmbeddedCluster:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _known(client: Any) -> list[str]:
    """The nodes a cluster node knows, handshakes still in progress left out."""
    raw = client.execute_command("CLUSTER", "NODES")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return [line for line in text.splitlines() if line.strip() and "handshake" not in line]


def _synced(client: Any) -> bool:
    """Whether a replica's link to its primary is up (it can be promoted)."""
    info = client.info("replication")
    return bool(info.get("role") == "slave" and info.get("master_link_status") == "up")


def _state_ok(client: Any) -> bool:
    """Whether a node sees the cluster healthy with every slot served."""
    info = client.execute_command("CLUSTER", "INFO")
    text = info.decode() if isinstance(info, bytes) else str(info)
    return "cluster_state:ok" in text and "cluster_slots_ok:16384" in text
