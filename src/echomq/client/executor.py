"""The only lines that do I/O: run a :class:`~echomq.protocol.calls.Call` or drive a plan.

Scripts run EVALSHA first and fall back to EVAL on ``NOSCRIPT`` (EVAL also caches the
script). Every error reply, on either path and in pipelines, goes through the one mapper
:func:`echomq.errors.from_reply`, so a refusal is the same exception however it arrived.

The policies around the calls live in their own modules: where the server is, the clients,
the transient errors and the replay budget in :mod:`echomq.client.connect`; the version fence in
:mod:`echomq.client.fence`; durable mode (WAIT/WAITAOF) in :mod:`echomq.client.durable`; every
access to redis-py internals in :mod:`echomq.client.redispy`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

import redis.asyncio
from hiredis import pack_command
from redis.exceptions import NoScriptError, ResponseError

from echomq import ids
from echomq.client import durable as _durable
from echomq.client import native as _native
from echomq.client import redispy as _redispy
from echomq.client.connect import (
    DEFAULT_RETRY_FOR,
    TRANSIENT,
    AsyncClient,
    Budget,
    SyncClient,
    async_client,
    check_bytes_client,
    check_retry_for,
    close_thread_connections,
    cluster_url,
    default_url,
    map_error,
    parse_url,
    script_args,
    server_of,
    sync_client,
    thread_connection,
)
from echomq.client.drive import Drive
from echomq.client.fence import Fence
from echomq.errors import DurabilityError, EchoMQError, ExecutorUnavailable
from echomq.protocol.kernel import Call, Plan

# The connection names stay importable from here for code written against this module.
__all__ = [
    "DEFAULT_RETRY_FOR",
    "TRANSIENT",
    "AsyncClient",
    "AsyncExecutor",
    "SyncClient",
    "SyncExecutor",
    "async_client",
    "cluster_url",
    "default_url",
    "parse_url",
    "sync_client",
]

T = TypeVar("T")

log = logging.getLogger("echomq")


def _is_write(call: Call[Any]) -> bool:
    # Scripts that only read (``Flags: reads`` in their header) are never waited on, nor the
    # mint node's lease (node_lease): it is the client's own bookkeeping, not a job's write,
    # and a lease lost in a failover is the window D2 documents, not a lost acknowledgement.
    return call.script is not None and call.script.writes and call.script.name != "node_lease"


def _decoded_durability(call: Call[Any], exc: DurabilityError) -> DurabilityError:
    """The error with the applied reply decoded as the verb returns it. A reply that
    decodes to a refusal wrote nothing worth acknowledging: the refusal is raised."""
    return DurabilityError(exc.acked, exc.wanted, reply=call.decode(exc.reply), job_id=exc.job_id)


def _target(client: Any) -> tuple[object, ...] | None:
    """What a minter is shared by: a standalone client's server and database (host, port,
    db, unix path). None (a minter per executor) for anything else, a cluster included: two
    targets are never taken for one, which would mint one node's ids on two servers."""
    pool = getattr(client, "connection_pool", None)
    kw = getattr(pool, "connection_kwargs", None)
    if not isinstance(kw, dict):
        return None
    return ("redis", kw.get("host"), kw.get("port"), kw.get("db", 0), kw.get("path"))


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
        executor: str | None = None,
    ) -> None:
        check_bytes_client(client)
        # Which executor runs the scripts that have a native twin: asked for here (None:
        # ECHOMQ_EXECUTOR, else "auto"), decided at the first fence (MODULE LIST).
        self.mode = _native.resolve_executor(executor)
        self.native: bool | None = False if self.mode == "lua" else None
        self.client = client
        self.owned = owned
        self.retry_for = check_retry_for(retry_for)
        # Durable mode: every write waits for `durable` replica acknowledgements (WAIT, and
        # WAITAOF with durable_aof) on the connection that made it, so an acknowledged
        # enqueue or settle survives the loss of the primary.
        self.durable = durable
        self.durable_timeout_ms = durable_timeout_ms
        self.durable_aof = durable_aof
        self._fence = Fence()
        self._cluster = hasattr(client, "get_nodes") and not hasattr(client, "connection_pool")
        if self._cluster:
            _redispy.route_module_commands(client)
        # The minter of this connection target (D2): its node is leased from the server the
        # ids are minted for, shared by every queue of this process on the same target.
        self.minter = ids.minter_for(_target(client))

    @property
    def executor(self) -> str | None:
        """``"lua"`` or ``"native"`` once decided (at the first call); None before."""
        return None if self.native is None else "native" if self.native else "lua"

    def _durable_steps(self, call: Call[Any]) -> _durable.Steps:
        return _durable.steps(call, self.durable, self.durable_timeout_ms, self.durable_aof)

    def _where(self, call: Call[Any]) -> str:
        """The server a call goes to, for messages: its slot's primary on a cluster."""
        if self._cluster and call.keys:
            try:
                node = self.client.get_node_from_key(call.keys[0])
                return f"{node.host}:{node.port}"
            except Exception:  # best effort: a message must not fail
                pass
        return server_of(self.client)

    def _module_missing(self, call: Call[Any], exc: BaseException) -> ExecutorUnavailable | None:
        """A server answered an ``EMQ.*`` command with "unknown command": it runs without
        trafikey (on a cluster: a replica without the module was promoted, or a node was
        replaced). Nothing ran. ``auto`` goes on with Lua everywhere, as it would have chosen
        with this primary at the start, with one WARNING (None: send the call again as its
        script); ``native`` gets the :class:`ExecutorUnavailable` naming the server that the
        call raises."""
        where = self._where(call)
        said = str(exc).split(", with args", 1)[0]  # the args are the queue's keys: noise
        if self.mode == "native":
            return ExecutorUnavailable(
                f"executor='native' but the {'primary' if self._cluster else 'server'} "
                f"{where} does not load the trafikey module (it answered: {said}); load it "
                "on every node that can become a primary (replicas too), or use "
                "executor='auto'"
            )
        if self.native:
            self.native = False
            log.warning(
                "echomq: %s does not load the trafikey module (it answered: %s): the "
                "executor falls back to lua on every queue of this client",
                where,
                said,
            )
        return None

    def _resend(self, calls: Sequence[Call[Any]], replies: list[Any], native: bool) -> list[int]:
        """The calls of a pipeline to send again as EVAL: those that met NOSCRIPT, and those
        sent as EMQ.* to a server without the module (which first decides the executor;
        under ``native`` their replies become its ``ExecutorUnavailable``, and the others'
        stand: they ran)."""
        unknown = {
            i
            for i, r in enumerate(replies)
            if native and isinstance(r, ResponseError) and _native.unknown_command(r)
        }
        if unknown:
            first = min(unknown)
            refused = self._module_missing(calls[first], replies[first])
            if refused is not None:
                for i in unknown:
                    replies[i] = refused
                unknown = set()
        return [i for i, r in enumerate(replies) if i in unknown or isinstance(r, NoScriptError)]


class SyncExecutor(_Executor):
    """Runs calls on a synchronous redis-py client."""

    client: SyncClient

    def __init__(self, client: SyncClient, **options: Any) -> None:
        super().__init__(client, **options)
        # On a standalone server each thread talks over a connection of its own, straight
        # through send/read: redis-py's execute_command wrapper (pool lock, retry, metrics)
        # costs more than the loopback round trip. The connection comes from the pool, so
        # the version-fence hook runs on every (re)connect all the same, and it goes back
        # to the pool when its thread ends.
        self._direct = not self._cluster and hasattr(client, "connection_pool")
        self._fence.install(client)

    def _command(self, *args: Any, **options: Any) -> Any:
        """One command and its reply: on the thread's own connection when direct (and no
        redis-py option, such as a cluster's target_nodes, asks for its wrapper)."""
        if options or not self._direct:
            return self.client.execute_command(*args, **options)
        conn = thread_connection(self.client.connection_pool)  # type: ignore[attr-defined]
        try:
            # hiredis packs the command in C; no health-check PING in front of it (the
            # socket keepalive, the timeout and the idle check cover a dead peer).
            conn.send_packed_command([pack_command(args)], check_health=False)
            return conn.read_response()
        except ResponseError:
            raise
        except BaseException:
            conn.disconnect()  # the next command reconnects (and fences) from scratch
            raise

    def fence(self) -> None:
        """Read ``{emq}:version``; claim it when absent; refuse a foreign value (D1)."""
        self._fence.through(self._command)
        if self.native is None:
            self.select_executor()

    def select_executor(self) -> None:
        """Decide ``auto`` (or check ``native``): the module on every primary -> native."""
        nodes = _native.module_list_nodes(self.client, self._cluster)
        try:
            raw = self._command(*_native.MODULE_LIST, **nodes)
        except ResponseError as exc:  # refused (ACL) or renamed: no module for us
            raw = exc
        self.native = _native.decide_from(self.mode, raw)

    # -- running calls
    def call(self, call: Call[T], deadline: float | None = None) -> T:
        """Run one call; a replay-safe call rides out transient errors for ``retry_for`` s
        (and never past ``deadline``, a monotonic time)."""
        budget = Budget(self.retry_for, deadline)
        while True:
            try:
                return self._call_once(call)
            except TRANSIENT as exc:
                self.follow()
                if not call.replay:
                    raise
                delay = budget.next_delay()
                if delay is None:
                    budget.give_up(exc, self.client)
                time.sleep(delay)

    def follow(self) -> None:
        """After a transient error on a cluster: re-read the slot map (and with it the
        default node), so the next try goes to the slot's new primary. A refused or
        unreachable node is how a failover looks from here; a write made on a node's own
        connection (durable mode) is not one redis-py would refresh the map for."""
        if not self._cluster:
            return
        # Every node unreachable, for now: the next try finds out.
        with contextlib.suppress(Exception):
            _redispy.refresh_slots(self.client)

    def _call_once(self, call: Call[T]) -> T:
        if self._fence.pending:
            self.fence()
        if call.script is None:
            return call.decode(self._command(*call.args))
        if self.durable and _is_write(call):
            try:
                return call.decode(self._durable_once(call))
            except DurabilityError as exc:
                raise _decoded_durability(call, exc) from None
        native = bool(self.native)
        try:
            try:
                reply = self._command(*script_args(call, False, native))
            except NoScriptError:  # EVAL loads it; an error reply to that is mapped below
                reply = self._command(*script_args(call, True))
        except ResponseError as exc:
            if native and _native.unknown_command(exc):
                refused = self._module_missing(call, exc)
                if refused is not None:
                    raise refused from None
                return self._call_once(call)  # as its script: the command did not run
            raise map_error(exc) from None
        return call.decode(reply)

    def _durable_once(self, call: Call[Any]) -> Any:
        steps = self._durable_steps(call)
        reply: Any = None
        try:
            while True:
                op = steps.send(reply)
                if isinstance(op, _durable.Pipe):
                    target: Any = self.client
                    if self._cluster:
                        node = self.client.get_node_from_key(op.key)  # type: ignore[attr-defined]
                        target = self.client.get_redis_connection(node)  # type: ignore[attr-defined]
                    pipe = target.pipeline(transaction=False)
                    for args in op.commands:
                        pipe.execute_command(*args)
                    reply = list(pipe.execute(raise_on_error=False))
                else:
                    reply = _redispy.refresh_slots(self.client)
        except StopIteration as stop:
            return stop.value

    def pipeline(self, calls: Sequence[Call[Any]]) -> list[Any]:
        """Run calls in one round trip; each result is decoded or is the exception it raised."""
        if self._fence.pending:
            self.fence()
        if self.durable and any(_is_write(c) for c in calls):
            # Durable: one call at a time, each with its acknowledgement.
            return [self._durable_decode(c) for c in calls]
        native = bool(self.native)
        replies = self._send(calls, False, native)
        missing = self._resend(calls, replies, native)
        if missing:
            again = self._send([calls[i] for i in missing], True, False)
            for i, r in zip(missing, again, strict=True):
                replies[i] = r
        return [_decode_one(c, r) for c, r in zip(calls, replies, strict=True)]

    def _durable_decode(self, call: Call[Any]) -> Any:
        try:
            return self._call_once(call)
        except EchoMQError as exc:
            return exc

    def _send(self, calls: Sequence[Call[Any]], use_eval: bool, native: bool) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for args in _pipeline_args(calls, use_eval, self._cluster, native):
            pipe.execute_command(*args)
        return list(pipe.execute(raise_on_error=False))

    def run(self, work: Call[T] | Plan[T] | Drive[T], deadline: float | None = None) -> T:
        """Run one call, or drive a plan to its result (see :class:`Drive`; a ``Drive``: a
        plan already under way). With ``deadline`` (a monotonic time) no step is retried
        past it: the plan, thrown ``Replay``, decides what a lost step at its deadline means
        (``wait()``: a timeout)."""
        if isinstance(work, Call):
            return self.call(work, deadline)
        d = work if isinstance(work, Drive) else Drive(work, Budget(self.retry_for, deadline))
        while not d.done:
            step = d.step
            try:
                if isinstance(step, list):
                    result = self.pipeline(step)
                else:
                    result = self.call(step, deadline)
            except TRANSIENT as exc:
                if isinstance(step, list):
                    self.follow()  # (call() follows by itself)
                time.sleep(d.delay(exc, self.client))
                d.lost(exc)
            else:
                d.ok(result)
        return cast(T, d.value)

    def close(self) -> None:
        if self.owned:
            if self._direct:
                close_thread_connections(self.client.connection_pool)  # type: ignore[attr-defined]
            self.client.close()


class AsyncExecutor(_Executor):
    """Runs calls on an asyncio redis-py client; the twin of :class:`SyncExecutor`."""

    client: AsyncClient

    def __init__(self, client: AsyncClient, **options: Any) -> None:
        super().__init__(client, **options)
        self._node_clients: dict[str, Any] = {}
        self._refreshing: asyncio.Task[Any] | None = None
        self._fence.ainstall(client)

    async def fence(self) -> None:
        await self._fence.athrough(self.client.execute_command)
        if self.native is None:
            await self.select_executor()

    async def select_executor(self) -> None:
        """The asyncio twin of :meth:`SyncExecutor.select_executor`."""
        nodes = _native.module_list_nodes(self.client, self._cluster)
        try:
            raw = await self.client.execute_command(*_native.MODULE_LIST, **nodes)
        except ResponseError as exc:
            raw = exc
        self.native = _native.decide_from(self.mode, raw)

    async def call(self, call: Call[T], deadline: float | None = None) -> T:
        """Run one call; a replay-safe call rides out transient errors for ``retry_for`` s
        (and never past ``deadline``, a monotonic time)."""
        budget = Budget(self.retry_for, deadline)
        while True:
            try:
                return await self._call_once(call)
            except TRANSIENT as exc:
                await self.follow()
                if not call.replay:
                    raise
                delay = budget.next_delay()
                if delay is None:
                    budget.give_up(exc, self.client)
                await asyncio.sleep(delay)

    async def follow(self) -> None:
        """The asyncio twin of :meth:`SyncExecutor.follow`: one refresh at a time, which
        every task that failed meanwhile waits for instead of starting its own."""
        if not self._cluster:
            return
        task = self._refreshing
        if task is None or task.done():
            task = self._refreshing = asyncio.ensure_future(self._refresh())
        await asyncio.shield(task)

    async def _refresh(self) -> None:
        # Every node unreachable, for now: the next try finds out.
        with contextlib.suppress(Exception):
            await _redispy.refresh_slots(self.client)

    async def _call_once(self, call: Call[T]) -> T:
        if self._fence.pending:
            await self.fence()
        client = self.client
        if call.script is None:
            return call.decode(await client.execute_command(*call.args))
        if self.durable and _is_write(call):
            try:
                return call.decode(await self._durable_once(call))
            except DurabilityError as exc:
                raise _decoded_durability(call, exc) from None
        native = bool(self.native)
        try:
            try:
                reply = await client.execute_command(*script_args(call, False, native))
            except NoScriptError:  # EVAL loads it; an error reply to that is mapped below
                reply = await client.execute_command(*script_args(call, True))
        except ResponseError as exc:
            if native and _native.unknown_command(exc):
                refused = self._module_missing(call, exc)
                if refused is not None:
                    raise refused from None
                return await self._call_once(call)  # as its script: the command did not run
            raise map_error(exc) from None
        return call.decode(reply)

    def _node_client(self, key: str) -> Any:
        """A plain client of the cluster node that owns ``key`` (asyncio cluster nodes have no
        client of their own, and WAIT needs the connection that made the write)."""
        node = self.client.get_node_from_key(key)  # type: ignore[attr-defined]
        found = self._node_clients.get(node.name)
        if found is None:
            connection_class, kwargs = _redispy.node_pool_kwargs(node)
            pool = redis.asyncio.ConnectionPool(connection_class=connection_class, **kwargs)
            found = self._node_clients[node.name] = redis.asyncio.Redis(connection_pool=pool)
        return found

    async def _durable_once(self, call: Call[Any]) -> Any:
        steps = self._durable_steps(call)
        reply: Any = None
        try:
            while True:
                op = steps.send(reply)
                if isinstance(op, _durable.Pipe):
                    target = self._node_client(op.key) if self._cluster else self.client
                    pipe = target.pipeline(transaction=False)
                    for args in op.commands:
                        pipe.execute_command(*args)
                    reply = list(await pipe.execute(raise_on_error=False))
                else:
                    reply = await _redispy.refresh_slots(self.client)
        except StopIteration as stop:
            return stop.value

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
        native = bool(self.native)
        replies = await self._send(calls, False, native)
        missing = self._resend(calls, replies, native)
        if missing:
            again = await self._send([calls[i] for i in missing], True, False)
            for i, r in zip(missing, again, strict=True):
                replies[i] = r
        return [_decode_one(c, r) for c, r in zip(calls, replies, strict=True)]

    async def _send(self, calls: Sequence[Call[Any]], use_eval: bool, native: bool) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for args in _pipeline_args(calls, use_eval, self._cluster, native):
            pipe.execute_command(*args)
        return list(await pipe.execute(raise_on_error=False))

    async def run(
        self,
        work: Call[T] | Plan[T] | Drive[T],
        deadline: float | None = None,
        *,
        one: Callable[[Call[Any]], Awaitable[Any]] | None = None,
    ) -> T:
        """The asyncio twin of :meth:`SyncExecutor.run`; ``one`` sends a plan's single calls
        instead of :meth:`call` (the autopipe's batches, which do not follow a cluster's new
        topology by themselves: a lost step of any kind follows)."""
        if isinstance(work, Call):
            return await self.call(work, deadline)
        d = work if isinstance(work, Drive) else Drive(work, Budget(self.retry_for, deadline))
        while not d.done:
            step = d.step
            try:
                if isinstance(step, list):
                    result = await self.pipeline(step)
                else:
                    result = await (self.call(step, deadline) if one is None else one(step))
            except TRANSIENT as exc:
                if one is not None or isinstance(step, list):
                    await self.follow()  # (call() follows by itself)
                await asyncio.sleep(d.delay(exc, self.client))
                d.lost(exc)
            else:
                d.ok(result)
        return cast(T, d.value)

    async def close(self) -> None:
        if self._refreshing is not None and not self._refreshing.done():
            self._refreshing.cancel()
        for node_client in self._node_clients.values():
            # The node clients were built on pools of their own: close those too.
            await node_client.aclose(close_connection_pool=True)
        self._node_clients.clear()
        if self.owned:
            await cast(Any, self.client).aclose()


def _pipeline_args(
    calls: Sequence[Call[Any]], use_eval: bool, cluster: bool, native: bool = False
) -> list[tuple[Any, ...]]:
    """Command tuples for a pipeline. After a NOSCRIPT, the first call of each script is
    sent as EVAL (which caches it) and the rest as EVALSHA behind it on the same connection;
    on a cluster the calls may go to several nodes, so each is sent as EVAL. With
    ``native``, a script with a twin goes as its EMQ.* command (it never meets NOSCRIPT)."""
    out = []
    loaded: set[str] = set()
    for call in calls:
        if call.script is None:
            out.append(call.args)
            continue
        first = call.script.sha not in loaded
        loaded.add(call.script.sha)
        out.append(script_args(call, use_eval and (first or cluster), native))
    return out


def _decode_one(call: Call[Any], reply: Any) -> Any:
    if isinstance(reply, ResponseError):
        return map_error(reply)
    if isinstance(reply, Exception):
        return reply
    try:
        return call.decode(reply)
    except EchoMQError as exc:
        return exc
