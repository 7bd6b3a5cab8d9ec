"""The only lines that do I/O: run a :class:`~echomq._protocol.Call` or drive a plan.

Scripts run EVALSHA first and fall back to EVAL on ``NOSCRIPT`` (EVAL also caches the
script). Every error reply, on either path and in pipelines, goes through the one mapper
:func:`echomq.errors.from_reply`, so a refusal is the same exception however it arrived.

The version fence (D1) runs before the first call and again on every (re)connect: a hook on
the connection pool fences each new connection on the connection itself, before the command
that caused the connect is sent. On a cluster node that does not own ``{emq}:version`` the
hook cannot read it there, so it marks the executor to fence through the cluster client
before the next call.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import threading
import time
import weakref
from collections.abc import Awaitable, Sequence
from typing import Any, Protocol, TypeVar, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
import redis.asyncio
from hiredis import pack_command
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    NoScriptError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)
from redis.retry import Retry

from echomq._protocol import WIRE_VERSION, Call, Plan, Replay
from echomq.errors import (
    DurabilityError,
    EchoMQError,
    InvalidArgument,
    VersionFenceError,
    from_reply,
)
from echomq.keyspace import VERSION_KEY

__all__ = [
    "AsyncExecutor",
    "SyncExecutor",
    "async_client",
    "cluster_url",
    "default_url",
    "parse_url",
    "sync_client",
]

T = TypeVar("T")
log = logging.getLogger("echomq")

# Errors after which the server is worth asking again: the connection dropped or timed out,
# the server is loading its data, or a cluster is failing over. Only calls marked
# ``replay`` (or plans that catch ``Replay``) are sent again.
TRANSIENT = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    ClusterDownError,
    TryAgainError,
    ReadOnlyError,
    redis.exceptions.RedisClusterException,  # "cannot be connected": every known node is down
)
DEFAULT_RETRY_FOR = 10.0


def _retry_for(value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise InvalidArgument(f"retry_for must be finite seconds >= 0, got {value!r}")
    return float(value)


def _backoff(attempt: int) -> float:
    """Capped, jittered exponential backoff: 50 ms, 100 ms ... 1 s."""
    return float(min(1.0, 0.05 * 2 ** min(attempt - 1, 6)) * (0.5 + random.random() / 2))


class _Budget:
    """How long a call may keep retrying transient errors."""

    __slots__ = ("attempt", "retry_for", "start")

    def __init__(self, retry_for: float) -> None:
        self.retry_for = retry_for
        self.attempt = 0
        self.start = 0.0

    def next_delay(self) -> float | None:
        """The sleep before the next try, or None when the budget is spent."""
        now = time.monotonic()
        if self.attempt == 0:
            self.start = now
        self.attempt += 1
        if now - self.start >= self.retry_for:
            return None
        return _backoff(self.attempt)


class SyncClient(Protocol):
    """What echomq needs of a redis-py client (``redis.Redis`` or ``RedisCluster``)."""

    def execute_command(self, *args: Any, **options: Any) -> Any: ...
    def pipeline(self, transaction: bool = ...) -> Any: ...
    def close(self) -> None: ...


class AsyncClient(Protocol):
    """What echomq needs of an asyncio redis-py client."""

    def execute_command(self, *args: Any, **options: Any) -> Awaitable[Any]: ...
    def pipeline(self, transaction: bool = ...) -> Any: ...


def default_url() -> str:
    """``ECHOMQ_URL`` when set, else a local server on the default port."""
    return os.environ.get("ECHOMQ_URL") or "redis://127.0.0.1:6379/0"


def _client_options() -> dict[str, Any]:
    # No blind replays: redis-py would resend a command whose reply was lost, which can
    # double-apply a non-idempotent verb (a log line) or misreport a settle. The executor
    # replays only calls that are safe to send twice. A socket timeout well above any blocking
    # wait (the worker's BLPOP is one beat) turns a silently dead peer into an error.
    return {
        "retry": Retry(NoBackoff(), 0),
        "socket_keepalive": True,
        "socket_connect_timeout": 5,
        "socket_timeout": 30,
        "health_check_interval": 30,
    }


_TRUE = ("1", "true", "yes", "on")


def parse_url(url: str) -> tuple[str, bool, int]:
    """Split echomq's own options off a server URL: ``(plain_url, cluster, durable)``.

    - cluster mode: the scheme ``redis+cluster://`` (``rediss+cluster://`` for TLS) or the
      query option ``cluster=true``; the host is any node of the cluster;
    - durable mode: ``durable=true`` (one replica) or ``durable=N`` (N replicas) — every write
      waits for N replica acknowledgements (see :class:`SyncExecutor`).
    """
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    options = {k: v.lower() for k, v in query if k in ("cluster", "durable")}
    scheme = parts.scheme
    cluster = options.get("cluster", "") in _TRUE
    if scheme.endswith("+cluster"):
        scheme, cluster = scheme[: -len("+cluster")], True
    flag = options.get("durable", "0")
    durable = 1 if flag in _TRUE else int(flag) if flag.isdigit() else 0
    rest = urlencode([(k, v) for k, v in query if k not in ("cluster", "durable")])
    return urlunsplit((scheme, parts.netloc, parts.path, rest, parts.fragment)), cluster, durable


def cluster_url(url: str) -> str | None:
    """The plain URL when ``url`` selects cluster mode, else None (see :func:`parse_url`)."""
    plain, cluster, _ = parse_url(url)
    return plain if cluster else None


def sync_client(url: str | None = None) -> redis.Redis | RedisCluster:
    """A client for ``url`` (default :func:`default_url`), bytes in and out: ``redis.Redis``,
    or ``RedisCluster`` when the URL selects cluster mode (see :func:`parse_url`)."""
    plain, cluster, _ = parse_url(url or default_url())
    if cluster:
        return RedisCluster.from_url(plain, **_client_options())
    return redis.Redis.from_url(plain, **_client_options())


def async_client(url: str | None = None) -> redis.asyncio.Redis | AsyncRedisCluster:
    """The asyncio twin of :func:`sync_client`."""
    plain, cluster, _ = parse_url(url or default_url())
    if cluster:
        return AsyncRedisCluster.from_url(plain, **_client_options())
    return redis.asyncio.Redis.from_url(plain, **_client_options())


def _is_write(call: Call[Any]) -> bool:
    # Scripts that only read (``Flags: reads`` in their header) are never waited on.
    return call.script is not None and call.script.writes


def _durable_waits(pipe: Any, durable: int, timeout_ms: int, aof: bool) -> None:
    pipe.execute_command("WAIT", durable, timeout_ms)
    if aof:
        pipe.execute_command("WAITAOF", 0, durable, timeout_ms)


def _check_acks(replies: Sequence[Any], durable: int) -> None:
    """WAIT answers the replicas that acknowledged; WAITAOF [local, replicas] that fsynced."""
    for reply in replies:
        if isinstance(reply, BaseException):
            raise reply
        acked = int(reply[1]) if isinstance(reply, (list, tuple)) else int(reply)
        if acked < durable:
            raise DurabilityError(acked, durable)


def _check_bytes_client(client: Any) -> None:
    get = getattr(client, "get_connection_kwargs", None)
    kwargs = (
        get()
        if callable(get)
        else getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    )
    if isinstance(kwargs, dict) and kwargs.get("decode_responses"):
        raise InvalidArgument(
            "echomq needs a client with decode_responses=False: payloads are bytes"
        )


def _mapped(exc: ResponseError) -> Exception:
    if isinstance(exc, TRANSIENT):
        return exc
    err = from_reply(str(exc))
    return err if err is not None else exc


def _version_text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _is_redirect(exc: ResponseError) -> bool:
    # redis-py parses MOVED/ASK into their own classes and strips the word from the text.
    return isinstance(exc, AskError) or str(exc).startswith(("MOVED", "ASK"))


def _script_args(call: Call[Any], use_eval: bool) -> tuple[Any, ...]:
    script = call.script
    assert script is not None
    head = ("EVAL", script.source) if use_eval else ("EVALSHA", script.sha)
    return (*head, len(call.keys), *call.keys, *call.args)


def _warn_eviction(reply: Any) -> None:
    """Warn (once per executor) when the server may evict keys: a queue whose rows or sets
    are evicted loses jobs silently. echomq requires maxmemory-policy noeviction."""
    if isinstance(reply, dict):
        values = list(reply.values())
    elif isinstance(reply, (list, tuple)):
        values = list(reply[1::2])
    else:
        return
    texts = [_version_text(v) for v in values]
    bad = [t for t in texts if t and t != "noeviction"]
    if bad:
        log.warning(
            "the server's maxmemory-policy is %s: under memory pressure it may evict queue "
            "keys and lose jobs; echomq requires maxmemory-policy noeviction",
            ", ".join(sorted(set(bad))),
        )


def _fence_value(found: str | None) -> None:
    if found != WIRE_VERSION:
        raise VersionFenceError(str(found), WIRE_VERSION)


class _Direct:
    """The direct connections of one pool: one per thread, shared by every executor on it."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.lock = threading.Lock()
        self.conns: list[Any] = []


_DIRECT: weakref.WeakKeyDictionary[Any, _Direct] = weakref.WeakKeyDictionary()


def _thread_connection(pool: Any) -> Any:
    """This thread's connection made by ``pool`` (so it carries the pool's connect hook)."""
    direct = _DIRECT.get(pool)
    if direct is None:
        direct = _DIRECT.setdefault(pool, _Direct())
    held = getattr(direct.local, "conn", None)
    if held is None or held[0] != os.getpid():  # a forked child never shares a socket
        conn = pool.make_connection()
        with direct.lock:
            direct.conns.append(conn)
        held = direct.local.conn = (os.getpid(), conn)
    return held[1]


def _close_thread_connections(pool: Any) -> None:
    direct = _DIRECT.pop(pool, None)
    if direct is not None:
        for conn in direct.conns:
            conn.disconnect()


def _get_hook(target: Any) -> Any:
    if isinstance(target, dict):
        return target.get("redis_connect_func")
    return getattr(target, "redis_connect_func", None)


def _set_hook(target: Any, hook: Any) -> None:
    hook._echomq_fence = True
    if isinstance(target, dict):
        target["redis_connect_func"] = hook
    else:
        target.redis_connect_func = hook


def _pool_targets(client: Any) -> list[Any]:
    """The connection kwargs dict and the live connections of a standalone client's pool."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return []
    conns = list(getattr(pool, "_available_connections", []) or [])
    conns += list(getattr(pool, "_in_use_connections", []) or [])
    return [pool.connection_kwargs, *conns]


class _Fence:
    """Shared state of the fence: whether the next call must fence through the client."""

    def __init__(self) -> None:
        self.pending = True
        self.checked = False  # the server's eviction policy was looked at

    def mark(self) -> None:
        self.pending = True


class _Executor:
    """What both executors hold: the client, the replay budget, durable mode, the fence."""

    def __init__(
        self,
        client: Any,
        *,
        owned: bool = False,
        retry_for: float = DEFAULT_RETRY_FOR,
        durable: int = 0,
        durable_timeout_ms: int = 2000,
        durable_aof: bool = False,
    ) -> None:
        _check_bytes_client(client)
        self.client = client
        self.owned = owned
        self.retry_for = _retry_for(retry_for)
        # Durable mode: every write waits for `durable` replica acknowledgements (WAIT, and
        # WAITAOF with durable_aof) on the connection that made it, so an acknowledged
        # enqueue or settle survives the loss of the primary.
        self.durable = durable
        self.durable_timeout_ms = durable_timeout_ms
        self.durable_aof = durable_aof
        self._fence = _Fence()
        self._cluster = hasattr(client, "get_nodes") and not hasattr(client, "connection_pool")


class SyncExecutor(_Executor):
    """Runs calls on a synchronous redis-py client."""

    client: SyncClient

    def __init__(self, client: SyncClient, **options: Any) -> None:
        super().__init__(client, **options)
        # On a standalone server each thread talks over a connection of its own, straight
        # through send/read: redis-py's execute_command wrapper (pool lock, retry, metrics)
        # costs more than the loopback round trip. The connection comes from the pool's
        # factory, so the version-fence hook runs on every (re)connect all the same.
        self._direct = not self._cluster and hasattr(client, "connection_pool")
        self._install_hook()

    def _command(self, *args: Any) -> Any:
        """One command and its reply: on the thread's own connection when direct."""
        if not self._direct:
            return self.client.execute_command(*args)
        conn = _thread_connection(self.client.connection_pool)  # type: ignore[attr-defined]
        try:
            # hiredis packs the command in C; no health-check PING in front of it (the
            # socket keepalive and the timeout cover a dead peer).
            conn.send_packed_command([pack_command(args)], check_health=False)
            return conn.read_response()
        except ResponseError:
            raise
        except BaseException:
            conn.disconnect()  # the next command reconnects (and fences) from scratch
            raise

    # -- the version fence
    def _install_hook(self) -> None:
        fence = self._fence
        if hasattr(self.client, "user_on_connect_func"):  # RedisCluster
            prev_cluster = getattr(self.client, "user_on_connect_func", None)

            def on_cluster_connect(conn: Any) -> None:
                if prev_cluster is not None:
                    prev_cluster(conn)
                _fence_connection(conn, fence)

            self.client.user_on_connect_func = on_cluster_connect
            return
        for target in _pool_targets(self.client):
            prev = _get_hook(target)
            if getattr(prev, "_echomq_fence", False):
                continue

            def on_connect(conn: Any, prev: Any = prev) -> None:
                if prev is None:
                    conn.on_connect()
                else:
                    prev(conn)
                _fence_connection(conn, fence)

            _set_hook(target, on_connect)

    def fence(self) -> None:
        """Read ``{emq}:version``; claim it when absent; refuse a foreign value (D1)."""
        found = self._command("GET", VERSION_KEY)
        if found is None:
            self._command("SET", VERSION_KEY, WIRE_VERSION, "NX")
            found = self._command("GET", VERSION_KEY)
        _fence_value(_version_text(found))
        if not self._fence.checked:
            self._fence.checked = True
            try:
                policy = self.client.execute_command("CONFIG", "GET", "maxmemory-policy")
            except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException):
                policy = None  # CONFIG may be denied (ACL), renamed, or not routable
            _warn_eviction(policy)
        self._fence.pending = False

    # -- running calls
    def call(self, call: Call[T]) -> T:
        """Run one call; a replay-safe call rides out transient errors for ``retry_for`` s."""
        budget = _Budget(self.retry_for)
        while True:
            try:
                return self._call_once(call)
            except TRANSIENT:
                delay = budget.next_delay() if call.replay else None
                if delay is None:
                    raise
                time.sleep(delay)

    def _call_once(self, call: Call[T]) -> T:
        if self._fence.pending:
            self.fence()
        if call.script is None:
            return call.decode(self._command(*call.args))
        if self.durable and _is_write(call):
            return call.decode(self._durable_once(call))
        try:
            reply = self._command(*_script_args(call, False))
        except NoScriptError:
            try:
                reply = self._command(*_script_args(call, True))
            except ResponseError as exc:
                raise _mapped(exc) from None
        except ResponseError as exc:
            raise _mapped(exc) from None
        return call.decode(reply)

    def _durable_once(self, call: Call[Any]) -> Any:
        """The script and its WAIT in one pipeline on one connection (WAIT counts only the
        writes of its own connection); on a cluster, on the node that owns the slot."""
        for _ in range(5):
            target = self.client
            if self._cluster:
                node = self.client.get_node_from_key(call.keys[0])  # type: ignore[attr-defined]
                target = self.client.get_redis_connection(node)  # type: ignore[attr-defined]
            replies: list[Any] = []
            for use_eval in (False, True):
                pipe = target.pipeline(transaction=False)
                pipe.execute_command(*_script_args(call, use_eval))
                _durable_waits(pipe, self.durable, self.durable_timeout_ms, self.durable_aof)
                replies = list(pipe.execute(raise_on_error=False))
                if not isinstance(replies[0], NoScriptError):
                    break
            if isinstance(replies[0], AskError):
                # The slot moved (a failover): the script did not run; learn the new map.
                self.client.nodes_manager.initialize()  # type: ignore[attr-defined]
                continue
            if isinstance(replies[0], ResponseError):
                raise _mapped(replies[0])
            _check_acks(replies[1:], self.durable)
            return replies[0]
        raise TryAgainError("the queue's slot kept moving")

    def pipeline(self, calls: Sequence[Call[Any]]) -> list[Any]:
        """Run calls in one round trip; each result is decoded or is the exception it raised."""
        if self._fence.pending:
            self.fence()
        if self.durable and any(_is_write(c) for c in calls):
            # Durable: one call at a time, each with its acknowledgement.
            return [self._durable_decode(c) for c in calls]
        replies = self._send(calls, use_eval=False)
        missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
        if missing:
            again = self._send([calls[i] for i in missing], use_eval=True)
            for i, r in zip(missing, again, strict=True):
                replies[i] = r
        return [_decode_one(c, r) for c, r in zip(calls, replies, strict=True)]

    def _durable_decode(self, call: Call[Any]) -> Any:
        try:
            return self._call_once(call)
        except EchoMQError as exc:
            return exc

    def _send(self, calls: Sequence[Call[Any]], use_eval: bool) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for args in _pipeline_args(calls, use_eval, self._cluster):
            pipe.execute_command(*args)
        return list(pipe.execute(raise_on_error=False))

    def run(self, work: Call[T] | Plan[T]) -> T:
        """Run one call, or drive a plan to its result. A plan step whose reply was lost is
        answered by throwing ``Replay`` into the plan, which resends it only if it is safe."""
        if isinstance(work, Call):
            return self.call(work)
        budget = _Budget(self.retry_for)
        try:
            step = next(work)
            while True:
                try:
                    result = self.pipeline(step) if isinstance(step, list) else self.call(step)
                except TRANSIENT as exc:
                    delay = budget.next_delay()
                    if delay is None:
                        raise
                    time.sleep(delay)
                    try:
                        step = work.throw(Replay(exc))
                    except Replay:
                        raise exc from None
                    continue
                step = work.send(result)
        except StopIteration as stop:
            return cast(T, stop.value)

    def close(self) -> None:
        if self.owned:
            if self._direct:
                _close_thread_connections(self.client.connection_pool)  # type: ignore[attr-defined]
            self.client.close()


class AsyncExecutor(_Executor):
    """Runs calls on an asyncio redis-py client; the twin of :class:`SyncExecutor`."""

    client: AsyncClient

    def __init__(self, client: AsyncClient, **options: Any) -> None:
        super().__init__(client, **options)
        self._node_clients: dict[str, Any] = {}
        self._install_hook()

    def _install_hook(self) -> None:
        fence = self._fence
        for target in _pool_targets(self.client):
            prev = _get_hook(target)
            if getattr(prev, "_echomq_fence", False):
                continue

            async def on_connect(conn: Any, prev: Any = prev) -> None:
                if prev is None:
                    await conn.on_connect()
                else:
                    result = prev(conn)
                    if hasattr(result, "__await__"):
                        await result
                await _afence_connection(conn, fence)

            _set_hook(target, on_connect)

    async def fence(self) -> None:
        found = await self.client.execute_command("GET", VERSION_KEY)
        if found is None:
            await self.client.execute_command("SET", VERSION_KEY, WIRE_VERSION, "NX")
            found = await self.client.execute_command("GET", VERSION_KEY)
        _fence_value(_version_text(found))
        if not self._fence.checked:
            self._fence.checked = True
            try:
                policy = await self.client.execute_command("CONFIG", "GET", "maxmemory-policy")
            except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException):
                policy = None  # CONFIG may be denied (ACL), renamed, or not routable
            _warn_eviction(policy)
        self._fence.pending = False

    async def call(self, call: Call[T]) -> T:
        """Run one call; a replay-safe call rides out transient errors for ``retry_for`` s."""
        budget = _Budget(self.retry_for)
        while True:
            try:
                return await self._call_once(call)
            except TRANSIENT:
                delay = budget.next_delay() if call.replay else None
                if delay is None:
                    raise
                await asyncio.sleep(delay)

    async def _call_once(self, call: Call[T]) -> T:
        if self._fence.pending:
            await self.fence()
        client = self.client
        if call.script is None:
            return call.decode(await client.execute_command(*call.args))
        if self.durable and _is_write(call):
            return call.decode(await self._durable_once(call))
        try:
            reply = await client.execute_command(*_script_args(call, False))
        except NoScriptError:
            try:
                reply = await client.execute_command(*_script_args(call, True))
            except ResponseError as exc:
                raise _mapped(exc) from None
        except ResponseError as exc:
            raise _mapped(exc) from None
        return call.decode(reply)

    def _node_client(self, key: str) -> Any:
        """A plain client of the cluster node that owns ``key`` (asyncio cluster nodes have no
        client of their own, and WAIT needs the connection that made the write)."""
        node = self.client.get_node_from_key(key)  # type: ignore[attr-defined]
        found = self._node_clients.get(node.name)
        if found is None:
            kwargs = dict(node.connection_kwargs)
            kwargs.pop("redis_connect_func", None)
            pool = redis.asyncio.ConnectionPool(connection_class=node.connection_class, **kwargs)
            found = self._node_clients[node.name] = redis.asyncio.Redis(connection_pool=pool)
        return found

    async def _durable_once(self, call: Call[Any]) -> Any:
        for _ in range(5):
            target = self._node_client(call.keys[0]) if self._cluster else self.client
            replies: list[Any] = []
            for use_eval in (False, True):
                pipe = target.pipeline(transaction=False)
                pipe.execute_command(*_script_args(call, use_eval))
                _durable_waits(pipe, self.durable, self.durable_timeout_ms, self.durable_aof)
                replies = list(await pipe.execute(raise_on_error=False))
                if not isinstance(replies[0], NoScriptError):
                    break
            if isinstance(replies[0], AskError):
                await self.client.nodes_manager.initialize()  # type: ignore[attr-defined]
                continue
            if isinstance(replies[0], ResponseError):
                raise _mapped(replies[0])
            _check_acks(replies[1:], self.durable)
            return replies[0]
        raise TryAgainError("the queue's slot kept moving")

    async def _durable_decode(self, call: Call[Any]) -> Any:
        try:
            return await self._call_once(call)
        except EchoMQError as exc:
            return exc

    async def pipeline(self, calls: Sequence[Call[Any]]) -> list[Any]:
        if self._fence.pending:
            await self.fence()
        if self.durable and any(_is_write(c) for c in calls):
            return [await self._durable_decode(c) for c in calls]
        replies = await self._send(calls, use_eval=False)
        missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
        if missing:
            again = await self._send([calls[i] for i in missing], use_eval=True)
            for i, r in zip(missing, again, strict=True):
                replies[i] = r
        return [_decode_one(c, r) for c, r in zip(calls, replies, strict=True)]

    async def _send(self, calls: Sequence[Call[Any]], use_eval: bool) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for args in _pipeline_args(calls, use_eval, self._cluster):
            pipe.execute_command(*args)
        return list(await pipe.execute(raise_on_error=False))

    async def run(self, work: Call[T] | Plan[T]) -> T:
        if isinstance(work, Call):
            return await self.call(work)
        budget = _Budget(self.retry_for)
        try:
            step = next(work)
            while True:
                try:
                    result = await (
                        self.pipeline(step) if isinstance(step, list) else self.call(step)
                    )
                except TRANSIENT as exc:
                    delay = budget.next_delay()
                    if delay is None:
                        raise
                    await asyncio.sleep(delay)
                    try:
                        step = work.throw(Replay(exc))
                    except Replay:
                        raise exc from None
                    continue
                step = work.send(result)
        except StopIteration as stop:
            return cast(T, stop.value)

    async def close(self) -> None:
        for node_client in self._node_clients.values():
            await node_client.aclose()
        self._node_clients.clear()
        if self.owned:
            await cast(Any, self.client).aclose()


def _pipeline_args(
    calls: Sequence[Call[Any]], use_eval: bool, cluster: bool
) -> list[tuple[Any, ...]]:
    """Command tuples for a pipeline. After a NOSCRIPT, the first call of each script is
    sent as EVAL (which caches it) and the rest as EVALSHA behind it on the same connection;
    on a cluster the calls may go to several nodes, so each is sent as EVAL."""
    out = []
    loaded: set[str] = set()
    for call in calls:
        if call.script is None:
            out.append(call.args)
            continue
        first = call.script.sha not in loaded
        loaded.add(call.script.sha)
        out.append(_script_args(call, use_eval and (first or cluster)))
    return out


def _decode_one(call: Call[Any], reply: Any) -> Any:
    if isinstance(reply, ResponseError):
        return _mapped(reply)
    if isinstance(reply, Exception):
        return reply
    try:
        return call.decode(reply)
    except EchoMQError as exc:
        return exc


def _fence_connection(conn: Any, fence: _Fence) -> None:
    """Fence one freshly connected connection, on itself, before it serves any command."""
    try:
        conn.send_command("GET", VERSION_KEY)
        found = conn.read_response()
        if found is None:
            conn.send_command("SET", VERSION_KEY, WIRE_VERSION, "NX")
            conn.read_response()
            conn.send_command("GET", VERSION_KEY)
            found = conn.read_response()
        _fence_value(_version_text(found))
    except ResponseError as exc:
        if not _is_redirect(exc):
            conn.disconnect()
            raise
        fence.mark()  # a cluster node that does not own {emq}: fence via the client
    except BaseException:
        # A connection that failed its fence must not stay connected: the next command
        # would otherwise use it without connecting (and fencing) again.
        conn.disconnect()
        raise


async def _afence_connection(conn: Any, fence: _Fence) -> None:
    try:
        await conn.send_command("GET", VERSION_KEY)
        found = await conn.read_response()
        if found is None:
            await conn.send_command("SET", VERSION_KEY, WIRE_VERSION, "NX")
            await conn.read_response()
            await conn.send_command("GET", VERSION_KEY)
            found = await conn.read_response()
        _fence_value(_version_text(found))
    except ResponseError as exc:
        if not _is_redirect(exc):
            await conn.disconnect()
            raise
        fence.mark()
    except BaseException:
        await conn.disconnect()
        raise
