"""Where the server is, how echomq talks to it, and how long it keeps trying.

One module owns these policies so that ``Queue``, ``AsyncQueue``, ``App``, ``Worker`` and
the CLI cannot disagree:

- :func:`resolve_url`: which server a process uses, and why (:mod:`echomq.client.locate`,
  re-exported here);
- :func:`sync_client` / :func:`async_client`: the redis-py clients echomq builds, with the
  options it needs (no blind replays, keepalive, timeouts);
- :data:`TRANSIENT`, :func:`check_retry_for`, :func:`backoff_delay` and :class:`Budget`:
  which errors are worth asking again, for how long, and how fast;
- :func:`thread_connection`: the sync executor's per-thread connection, given back to its
  pool when its thread ends, and checked for a server-side close before it is reused.
"""

from __future__ import annotations

import logging
import math
import os
import random
import re
import socket
import threading
import time
import weakref
from collections.abc import Awaitable
from typing import Any, NoReturn, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import ClusterDownError, ReadOnlyError, ResponseError, TryAgainError
from redis.retry import Retry

try:
    from redis.maint_notifications import MaintNotificationsConfig
except ImportError:  # redis-py < 7: no maintenance notifications, the pool always checks
    MaintNotificationsConfig = None  # type: ignore[assignment,misc]

from echomq.client import native as _native
from echomq.client import redispy as _redispy
from echomq.client.locate import (
    DEFAULT_URL,
    Resolved,
    _redacted,
    _redacted_text,
    configured,
    default_url,
    find_state_dir,
    named,
    pid_alive,
    pid_namespace,
    read_record,
    recorded_url,
    resolve_url,
    run_id,
    state_dir,
)
from echomq.errors import InvalidArgument, ServerUnreachable, from_reply
from echomq.protocol.kernel import Call

__all__ = [
    "DEFAULT_RETRY_FOR",
    "never_reached",
    "DEFAULT_URL",
    "TRANSIENT",
    "AsyncClient",
    "Budget",
    "Resolved",
    "SyncClient",
    "async_client",
    "backoff_delay",
    "check_bytes_client",
    "check_retry_for",
    "check_url",
    "close_thread_connections",
    "cluster_url",
    "configured",
    "default_url",
    "find_state_dir",
    "map_error",
    "named",
    "parse_url",
    "pid_alive",
    "pid_namespace",
    "read_record",
    "recorded_url",
    "resolve_url",
    "run_id",
    "script_args",
    "server_of",
    "state_dir",
    "sync_client",
    "thread_connection",
]

log = logging.getLogger("echomq")

# --------------------------------------------------------------------------- clients


class SyncClient(Protocol):
    """What echomq needs of a redis-py client (``redis.Redis`` or ``RedisCluster``)."""

    def execute_command(self, *args: Any, **options: Any) -> Any: ...
    def pipeline(self, transaction: bool = ...) -> Any: ...
    def close(self) -> None: ...


class AsyncClient(Protocol):
    """What echomq needs of an asyncio redis-py client."""

    def execute_command(self, *args: Any, **options: Any) -> Awaitable[Any]: ...
    def pipeline(self, transaction: bool = ...) -> Any: ...


def _client_options(url: str, asyncio: bool = False) -> dict[str, Any]:
    # No blind replays: redis-py would resend a command whose reply was lost, which can
    # double-apply a non-idempotent verb (a log line) or misreport a settle. The executor
    # replays only calls that are safe to send twice. A socket timeout well above any blocking
    # wait (the worker's BLPOP is one beat) turns a silently dead peer into an error.
    # An asyncio client takes the asyncio Retry: redis-py 8.2 warns (an error under our
    # tests' filters) when it is handed the sync one and converts it.
    options: dict[str, Any] = {
        "retry": AsyncRetry(NoBackoff(), 0) if asyncio else Retry(NoBackoff(), 0),
        "socket_keepalive": True,
        "socket_connect_timeout": 5,
        "socket_timeout": 30,
        "health_check_interval": 30,
    }
    if MaintNotificationsConfig is not None:
        # redis-py 7+ skips its check of a pooled connection before lending it (a close the
        # server already sent: its idle `timeout`, a CLIENT KILL) while maintenance
        # notifications are on, and they are on ("auto") by default. echomq speaks RESP2,
        # where those notifications never come: turn them off and keep the check, so a
        # command is never written to a connection the server has closed.
        options["maint_notifications_config"] = MaintNotificationsConfig(enabled=False)
    if url.startswith("unix:"):
        del options["socket_keepalive"]  # a TCP option: a unix socket connection refuses it
    return options


_TRUE = ("1", "true", "yes", "on")


def parse_url(url: str) -> tuple[str, bool, int]:
    """Split echomq's own options off a server URL: ``(plain_url, cluster, durable)``.

    - cluster mode: the scheme ``redis+cluster://`` (``rediss+cluster://`` for TLS) or the
      query option ``cluster=true``; the host is any node of the cluster;
    - durable mode: ``durable=true`` (one replica) or ``durable=N`` (N replicas): every write
      waits for N replica acknowledgements (see :mod:`echomq.client.durable`);
    - the executor: ``executor=auto|lua|native`` (see :mod:`echomq.client.native`), taken off.
    """
    check_url(url)
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    options = {k: v.lower() for k, v in query if k in ("cluster", "durable")}
    scheme = parts.scheme
    cluster = options.get("cluster", "") in _TRUE
    if scheme.endswith("+cluster"):
        scheme, cluster = scheme[: -len("+cluster")], True
    flag = options.get("durable", "0")
    durable = 1 if flag in _TRUE else int(flag) if flag.isdigit() else 0
    # executor= is read by _native.url_executor (checked here so a bad value fails before
    # any I/O); redis-py would refuse it as an unknown connection option.
    _native.url_executor(url)
    rest = urlencode([(k, v) for k, v in query if k not in ("cluster", "durable", "executor")])
    # Built by hand: urlunsplit drops the "//" of a URL with no host, and redis-py then
    # refuses "unix:/path" (it wants "unix:///path").
    plain = f"{scheme}://{parts.netloc}{parts.path}"
    if rest:
        plain += "?" + rest
    if parts.fragment:
        plain += "#" + parts.fragment
    return plain, cluster, durable


_SCHEMES = ("redis", "rediss", "unix")


# A known scheme whose "://" lost its colon ("redis//host", "unix//tmp/s"): that scheme.
_MANGLED = re.compile(r"^((?:rediss?|unix)(?:\+cluster)?)/{2,}(.*)$", re.IGNORECASE)


def check_url(url: object) -> str:
    """``url`` if it names a scheme echomq speaks (``redis://``, ``rediss://``, ``unix://``,
    or one of the first two with ``+cluster``); ``InvalidArgument`` otherwise, before any I/O
    (a bare ``host:port`` would otherwise reach redis-py as an unknown scheme)."""
    if not isinstance(url, str):
        raise InvalidArgument(f"url must be a str, got {type(url).__name__}")
    try:
        scheme = urlsplit(url).scheme.lower()
    except ValueError as exc:  # e.g. an unclosed IPv6 bracket
        raise InvalidArgument(f"url {_redacted_text(url)!r} is not a valid URL: {exc}") from None
    if scheme.endswith("+cluster") and scheme != "unix+cluster":
        scheme = scheme[: -len("+cluster")]
    if scheme in _SCHEMES:
        return url
    shown = _redacted(url) if "://" in url else url
    if "://" not in url:
        # A scheme typed without its colon (redis//host) is that scheme: the fix mends its
        # separator rather than putting another scheme in front (redis://redis//host).
        mangled = _MANGLED.match(url)
        fixed = f"redis://{shown}"
        if mangled:  # a unix socket's path is absolute: unix:///tmp/s
            sep = ":///" if mangled[1].lower() == "unix" else "://"
            fixed = mangled[1] + sep + mangled[2]
        also = "" if mangled else " (or rediss://, unix://)"
        raise InvalidArgument(f"url {shown!r} has no scheme: write {fixed}{also}")
    raise InvalidArgument(
        f"url {shown!r} has the scheme {scheme!r}: echomq speaks redis://, rediss:// "
        "(either with +cluster) and unix://"
    )


def cluster_url(url: str) -> str | None:
    """The plain URL when ``url`` selects cluster mode, else None (see :func:`parse_url`)."""
    plain, cluster, _ = parse_url(url)
    return plain if cluster else None


def sync_client(
    url: str | None = None, retry_for: float | None = None
) -> redis.Redis | RedisCluster:
    """A client for ``url`` (default: :func:`resolve_url`), bytes in and out: ``redis.Redis``,
    or ``RedisCluster`` when the URL selects cluster mode (see :func:`parse_url`).

    A cluster client asks its first primary for the command table as it is made, so while
    that primary is failing over making one fails: it is tried again for ``retry_for``
    seconds (default :data:`DEFAULT_RETRY_FOR`), until the slot map names the new primary."""
    plain, cluster, _ = parse_url(url or default_url())
    if not cluster:
        return redis.Redis.from_url(plain, **_client_options(plain))
    budget = Budget(DEFAULT_RETRY_FOR if retry_for is None else check_retry_for(retry_for))
    while True:
        try:
            return RedisCluster.from_url(plain, **_client_options(plain))
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            # (Not RedisClusterException: "cluster mode is not enabled" is no failover.)
            delay = budget.next_delay()
            if delay is None:
                if not isinstance(exc, redis.exceptions.ConnectionError):
                    raise
                waited = time.monotonic() - budget.start
                raise ServerUnreachable(
                    f"redis+cluster://{_redacted_text(plain).split('://', 1)[-1]}",
                    waited,
                    budget.retry_for,
                    exc,
                ) from exc
            time.sleep(delay)


def async_client(url: str | None = None) -> redis.asyncio.Redis | AsyncRedisCluster:
    """The asyncio twin of :func:`sync_client`."""
    plain, cluster, _ = parse_url(url or default_url())
    if cluster:
        return AsyncRedisCluster.from_url(plain, **_client_options(plain, asyncio=True))
    client = redis.asyncio.Redis.from_url(plain, **_client_options(plain, asyncio=True))
    _redispy.pack_in_c(client.connection_pool)
    return client


def check_bytes_client(client: Any) -> None:
    """Refuse a client that decodes replies: payloads are bytes."""
    if _redispy.client_kwargs(client).get("decode_responses"):
        raise InvalidArgument(
            "echomq needs a client with decode_responses=False: payloads are bytes"
        )


# --------------------------------------------------------------------------- retrying

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


def never_reached(exc: BaseException) -> bool:
    """Whether ``exc`` says the server was not reached at all: the connection refused or
    the host name not resolved (the error redis-py raises carries the socket's as its
    context). A first connect failing so is a wrong address or a server that is not up:
    waiting for it to come back is what a worker does, not an operator command."""
    seen: BaseException | None = exc
    for _ in range(8):  # a short, cycle-proof walk of the chain
        if seen is None:
            return False
        if isinstance(seen, (ConnectionRefusedError, socket.gaierror)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def map_error(exc: ResponseError) -> Exception:
    """An error reply as echomq raises it: transient errors unchanged, an echomq refusal as
    its typed error (:func:`echomq.errors.from_reply`), anything else unchanged."""
    if isinstance(exc, TRANSIENT):
        return exc
    err = from_reply(str(exc))
    return err if err is not None else exc


def script_args(call: Call[Any], use_eval: bool, native: bool = False) -> tuple[Any, ...]:
    """A script call on the wire: EVALSHA, or EVAL with the source (which caches it); with
    ``native``, a script that has a twin in the trafikey module goes as its command, with
    the same numkeys, keys and args (``client.native.TWINS``)."""
    script = call.script
    assert script is not None
    twin = _native.TWINS.get(script.name) if native else None
    if twin is not None:
        head: tuple[Any, ...] = (twin,)
    elif use_eval:
        head = ("EVAL", script.source)
    else:
        head = ("EVALSHA", script.sha)
    return (*head, len(call.keys), *call.keys, *call.args)


def check_retry_for(value: object) -> float:
    """``retry_for`` as float seconds; ``InvalidArgument`` unless finite and >= 0."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise InvalidArgument(f"retry_for must be finite seconds >= 0, got {value!r}")
    return float(value)


def backoff_delay(attempt: int, *, base: float = 0.05, cap: float = 1.0) -> float:
    """The transport backoff, in seconds, before try ``attempt + 1`` (``attempt`` >= 1):
    exponential from ``base``, capped at ``cap``, with jitter in [50%, 100%] so that many
    clients cut off together do not come back together."""
    step = base * 2 ** min(max(attempt, 1) - 1, 30)
    return float(min(cap, step) * (0.5 + random.random() / 2))


class Budget:
    """How long one call may keep retrying transient errors: ``retry_for`` seconds from its
    first failure, and never past ``deadline`` (a monotonic time, e.g. a ``wait()``'s)."""

    __slots__ = ("attempt", "deadline", "retry_for", "start")

    def __init__(self, retry_for: float, deadline: float | None = None) -> None:
        self.retry_for = retry_for
        self.deadline = deadline
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
        delay = backoff_delay(self.attempt)
        if self.deadline is not None:
            if now >= self.deadline:
                return None
            delay = min(delay, self.deadline - now)
        return delay

    def give_up(self, exc: BaseException, client: Any) -> NoReturn:
        """Raise once the budget is spent on ``exc``: a lost connection as
        :class:`~echomq.errors.ServerUnreachable` (naming the server and the time waited,
        ``exc`` as its cause); any other error as it is."""
        if not isinstance(exc, redis.exceptions.ConnectionError) or isinstance(
            exc, ServerUnreachable
        ):
            raise exc
        waited = time.monotonic() - self.start if self.attempt else 0.0
        raise ServerUnreachable(server_of(client), waited, self.retry_for, exc) from exc


def server_of(client: Any) -> str:
    """The server a redis-py client talks to, as a URL with any password masked (for error
    messages; ``<unknown address>`` when the client does not say)."""
    try:
        if not hasattr(client, "connection_pool"):  # a cluster client: name one known node
            node = client.get_default_node()
            return f"redis+cluster://{node.host}:{node.port}"
        pool = client.connection_pool
        kw = _redispy.client_kwargs(client)
        db = kw.get("db", 0) or 0
        if kw.get("path"):
            return f"unix://{kw['path']}" + (f"?db={db}" if db else "")
        tls = "SSL" in getattr(pool, "connection_class", type(None)).__name__
        user, password = kw.get("username"), kw.get("password")
        auth = ""
        if user or password:
            auth = (user or "") + (":***" if password else "") + "@"
        host = kw.get("host", "localhost")
        return f"{'rediss' if tls else 'redis'}://{auth}{host}:{kw.get('port', 6379)}/{db}"
    except Exception:  # best effort: a message must not fail
        return "<unknown address>"


# --------------------------------------------------------------------------- direct connections

# A connection unused this long is checked for a close the server already sent (its idle
# ``timeout``, a CLIENT KILL) before a command goes out on it. The server's smallest idle
# timeout is 1 s; the check is one non-blocking read, skipped on a busy connection.
IDLE_CHECK_S = 0.25


class _Held:
    """One thread's connection. The thread's ``threading.local`` storage is the only strong
    reference: when the thread ends the storage goes, this object with it, and its finalizer
    gives the connection back to the pool for the next thread."""

    __slots__ = ("__weakref__", "conn", "pid", "used")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.pid = os.getpid()
        self.used = time.monotonic()


def _give_back(pool_ref: weakref.ref[Any], conn: Any) -> None:
    pool = pool_ref()
    if pool is None:
        conn.disconnect()
        return
    try:
        pool.release(conn)
    except Exception:  # a finalizer must not raise: drop the socket instead
        conn.disconnect()


_DIRECT: weakref.WeakKeyDictionary[Any, threading.local] = weakref.WeakKeyDictionary()
_DIRECT_LOCK = threading.Lock()


def thread_connection(pool: Any) -> Any:
    """This thread's connection from ``pool``, shared by every executor on the pool.

    Drawn with the pool's own ``get_connection`` (so the pool's connect hook, the version
    fence, runs on every connect, and the pool's limit counts it) and released back to the
    pool when the thread ends: short-lived threads never exhaust the pool. A forked child
    never uses its parent's socket.
    """
    local = _DIRECT.get(pool)
    if local is None:
        with _DIRECT_LOCK:
            local = _DIRECT.setdefault(pool, threading.local())
    held: _Held | None = getattr(local, "held", None)
    if held is None or held.pid != os.getpid():
        held = _Held(_redispy.pool_connection(pool))
        finalizer = weakref.finalize(held, _give_back, weakref.ref(pool), held.conn)
        finalizer.atexit = False  # at exit the pool is torn down anyway
        local.held = held
        return held.conn
    now = time.monotonic()
    if now - held.used > IDLE_CHECK_S:
        _drop_if_closed(held.conn)
    held.used = now
    return held.conn


def _drop_if_closed(conn: Any) -> None:
    """Disconnect an idle connection the server has closed (or that holds stray bytes), so
    the next command reconnects first instead of failing after it was written. Nothing was
    sent on it, so nothing is lost or replayed."""
    try:
        stray = conn.can_read(timeout=0)
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
        stray = True  # EOF already pending: the server closed it
    if stray:
        conn.disconnect()


def close_thread_connections(pool: Any) -> None:
    """Forget the pool's per-thread connections (closing the pool disconnects them)."""
    with _DIRECT_LOCK:
        _DIRECT.pop(pool, None)
