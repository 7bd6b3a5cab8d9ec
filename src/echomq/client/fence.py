"""The version fence (D1): a client serves only a deployment of its own wire version.

``{emq}:version`` is read before the first call and again on every (re)connect: a hook on
the connection pool fences each new connection on the connection itself, before the command
that caused the connect is sent. On a cluster node that does not own ``{emq}:version`` the
hook cannot read it there, so it marks the fence pending, and the executor fences through
the cluster client before its next call. The first fence through the client also warns
when the server may evict keys.

The policy is written once, as generators that yield commands and receive replies
(:func:`drive` and :func:`adrive` run them, sync or asyncio); only the hooks, which must
match redis-py's sync or async connect callback, are written twice.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Generator
from typing import Any

import redis
from redis.exceptions import AskError, ResponseError

from echomq.client import layout as _layout
from echomq.client import redispy as _redispy
from echomq.errors import VersionFenceError
from echomq.keyspace import LAYOUT_KEY, VERSION_KEY
from echomq.protocol.kernel import WIRE_VERSION

__all__ = ["Fence", "adrive", "drive"]

log = logging.getLogger("echomq")

# A sans-I/O exchange: yields a command tuple, receives its reply (or has the command's
# exception thrown in), returns its result.
Steps = Generator[tuple[Any, ...], Any, None]


def drive(steps: Steps, command: Callable[..., Any]) -> None:
    """Run ``steps`` with a sync ``command(*args) -> reply``."""
    reply: Any = None
    error: BaseException | None = None
    try:
        while True:
            args = steps.send(reply) if error is None else steps.throw(error)
            try:
                reply, error = command(*args), None
            except Exception as exc:  # handed to the steps, which re-raise it
                error = exc
    except StopIteration:
        return


async def adrive(steps: Steps, command: Callable[..., Awaitable[Any]]) -> None:
    """The asyncio twin of :func:`drive`."""
    reply: Any = None
    error: BaseException | None = None
    try:
        while True:
            args = steps.send(reply) if error is None else steps.throw(error)
            try:
                reply, error = await command(*args), None
            except Exception as exc:  # handed to the steps, which re-raise it
                error = exc
    except StopIteration:
        return


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _version() -> Steps:
    """Read ``{emq}:version``; claim it when absent (the client whose claim wins, on a fresh
    deployment, records its layout too); refuse a foreign version; then read ``{emq}:layout``
    and refuse a layout this client does not serve (echomq.client.layout).

    Two GETs, not one MGET: the least-privilege ACL of RELIABILITY.md grants ``get`` and not
    ``mget``, and a deployment must not have to change its ACL to upgrade."""
    found = yield ("GET", VERSION_KEY)
    if found is None:
        if (yield ("SET", VERSION_KEY, WIRE_VERSION, "NX")) is not None:
            # Nothing was written here before (no client ever fenced it), so the data is
            # this release's own from the start.
            yield ("SET", LAYOUT_KEY, str(_layout.LAYOUT), "NX")
        found = yield ("GET", VERSION_KEY)
    text = _text(found)
    if text != WIRE_VERSION:
        raise VersionFenceError(str(text), WIRE_VERSION)
    layout = _layout.check((yield ("GET", LAYOUT_KEY)))
    if layout < _layout.LAYOUT:
        _behind(layout)


_told_behind = False


def _behind(layout: int) -> None:
    """Say once per process that the deployment's layout is behind this release's."""
    global _told_behind
    if not _told_behind:
        _told_behind = True
        log.warning(
            "the deployment's data layout is %d and this echomq writes %d: run `echomq "
            "migrate` once every worker runs this release (docs/guides/upgrading.md)",
            layout, _layout.LAYOUT,
        )  # fmt: skip


def _is_redirect(exc: ResponseError) -> bool:
    # redis-py parses MOVED/ASK into their own classes and strips the word from the text.
    return isinstance(exc, AskError) or str(exc).startswith(("MOVED", "ASK"))


def warn_eviction(reply: Any) -> None:
    """Warn when the server may evict keys: a queue whose rows or sets are evicted loses
    jobs silently. echomq requires maxmemory-policy noeviction."""
    if isinstance(reply, dict):
        values = list(reply.values())
    elif isinstance(reply, (list, tuple)):
        values = list(reply[1::2])
    else:
        return
    bad = {t for t in (_text(v) for v in values) if t and t != "noeviction"}
    if bad:
        log.warning(
            "the server's maxmemory-policy is %s: under memory pressure it may evict queue "
            "keys and lose jobs; echomq requires maxmemory-policy noeviction",
            ", ".join(sorted(bad)),
        )


class Fence:
    """One executor's fence: whether the next call must fence through the client, and
    whether the eviction policy was looked at."""

    def __init__(self) -> None:
        self.pending = True
        self.checked = False

    # -- the policy, once
    def _on_connection(self) -> Steps:
        try:
            yield from _version()
        except ResponseError as exc:
            if not _is_redirect(exc):
                raise
            self.pending = True  # a cluster node that does not own {emq}: via the client

    def _through_client(self) -> Steps:
        yield from _version()
        if not self.checked:
            self.checked = True
            try:
                policy = yield ("CONFIG", "GET", "maxmemory-policy")
            except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException):
                policy = None  # CONFIG may be denied (ACL), renamed, or not routable
            warn_eviction(policy)
        self.pending = False

    # -- fencing through the client
    def through(self, command: Callable[..., Any]) -> None:
        drive(self._through_client(), command)

    async def athrough(self, command: Callable[..., Awaitable[Any]]) -> None:
        await adrive(self._through_client(), command)

    # -- fencing each new connection on itself
    def connection(self, conn: Any) -> None:
        """Fence one freshly connected connection before it serves any command."""

        def command(*args: Any) -> Any:
            conn.send_command(*args)
            return conn.read_response()

        try:
            drive(self._on_connection(), command)
        except BaseException:
            # A connection that failed its fence must not stay connected: the next command
            # would otherwise use it without connecting (and fencing) again.
            conn.disconnect()
            raise

    async def aconnection(self, conn: Any) -> None:
        async def command(*args: Any) -> Any:
            await conn.send_command(*args)
            return await conn.read_response()

        try:
            await adrive(self._on_connection(), command)
        except BaseException:
            await conn.disconnect()
            raise

    def install(self, client: Any) -> None:
        """Hook a sync client: every connection it makes is fenced on connect."""
        is_cluster, prev_cluster = _redispy.cluster_connect_hook(client)
        if is_cluster:

            def on_cluster_connect(conn: Any) -> None:
                if prev_cluster is not None:
                    prev_cluster(conn)
                self.connection(conn)

            _redispy.set_cluster_connect_hook(client, on_cluster_connect)
            return
        for target in _redispy.hook_targets(client):
            prev = _redispy.connect_hook(target)
            if getattr(prev, "_echomq_fence", False):
                continue  # another executor on this pool already fences its connections

            def on_connect(conn: Any, prev: Any = prev) -> None:
                if prev is None:
                    conn.on_connect()
                else:
                    prev(conn)
                self.connection(conn)

            on_connect._echomq_fence = True  # type: ignore[attr-defined]
            _redispy.set_connect_hook(target, on_connect)

    def ainstall(self, client: Any) -> None:
        """Hook an asyncio client (a standalone one: an asyncio cluster client fences
        through the client only)."""
        for target in _redispy.hook_targets(client):
            prev = _redispy.connect_hook(target)
            if getattr(prev, "_echomq_fence", False):
                continue

            async def on_connect(conn: Any, prev: Any = prev) -> None:
                if prev is None:
                    await conn.on_connect()
                else:
                    result = prev(conn)
                    if hasattr(result, "__await__"):
                        await result
                await self.aconnection(conn)

            on_connect._echomq_fence = True  # type: ignore[attr-defined]
            _redispy.set_connect_hook(target, on_connect)
