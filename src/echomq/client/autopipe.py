"""Auto-pipelining: concurrent asyncio enqueues coalesced into one write.

Auto-pipelining for asyncio producers: the single calls that concurrent coroutines make on
one :class:`~echomq.client.executor.AsyncExecutor` in the same event-loop turn go out as one
pipeline write, each caller still getting its own reply or its own typed error.

A web app enqueuing from many requests at once would otherwise wait one round trip per
enqueue, each on a connection of its own; coalesced, a hundred enqueues in flight cost one
write and one read of the socket. How a batch forms: a call made while nothing is in flight
goes at once, on its own, as before (no pipeline, no task, no loop turn waited: a producer
awaiting one enqueue at a time pays nothing). A call made while others are in flight leads
a batch: it yields once to the loop (``asyncio.sleep(0)``), every caller that runs in that
turn joins, and the batch goes out in one write; each caller is answered as soon as its own
reply is read.

The exactly-once rule is the executor's own: a batch whose connection fails gives every
caller the transient error, and each caller's plan resends its call flagged as a resend with
its own nonce (``protocol.calls.enqueue``), so a call whose first copy landed answers
``replayed`` and is never admitted twice, and one that did not land is admitted now.
Durable mode keeps one call at a time (each write waits for its replicas on the connection
that made it), so there the executor runs the plan itself.
"""

from __future__ import annotations

import asyncio
import math
import sys
from typing import TYPE_CHECKING, Any, TypeVar, cast

from hiredis import pack_command
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeout

if sys.version_info >= (3, 11):
    from asyncio import timeout as _timeout
else:  # redis-py depends on async-timeout there
    from async_timeout import timeout as _timeout  # type: ignore[import-not-found,no-redef,unused-ignore]

from echomq.client.executor import _decode_one, _pipeline_args
from echomq.client.native import unknown_command
from echomq.protocol.kernel import Call, Plan

if TYPE_CHECKING:
    from echomq.client.executor import AsyncExecutor

__all__ = ["AutoPipe"]

T = TypeVar("T")

# One entry of a forming batch: the call, and the future its caller waits on (None for the
# leader until the batch is sent: a leader alone needs none).
_Entry = tuple[Call[Any], "asyncio.Future[Any] | None"]


class AutoPipe:
    """Drives plans on ``executor``, coalescing their single calls across coroutines."""

    __slots__ = ("_alone", "_batch", "_sending", "_x")

    def __init__(self, executor: AsyncExecutor) -> None:
        self._x = executor
        self._batch: list[_Entry] | None = None
        self._alone = 0  # calls sent on their own, in flight
        # The send tasks in flight: the loop keeps only weak references to its tasks.
        self._sending: set[asyncio.Task[None]] = set()

    async def run(self, work: Plan[T]) -> T:
        """Drive ``work`` as :meth:`AsyncExecutor.run` does, its single calls coalesced."""
        x = self._x
        if x.durable:
            return await x.run(work)
        return await x.run(work, one=self.call)

    async def call(self, call: Call[T]) -> T:
        """Run one call in the batch of this loop turn. A call that may be resent on its own
        (``call.replay``: the reads) goes alone, riding out transient errors as
        :meth:`AsyncExecutor.call` does; a batch is for the calls only their plan may resend."""
        if call.replay:
            return await self._x.call(call)
        batch = self._batch
        if batch is not None:  # a batch is forming in this loop turn: join it
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            batch.append((call, fut))
            return cast(T, await fut)
        if not self._alone and not self._sending:
            # Nothing in flight: send at once, no loop turn waited (a producer awaiting one
            # enqueue at a time pays nothing). Callers that come while it is out batch.
            return await self._lone(call)
        self._batch = batch = [(call, None)]
        try:
            await asyncio.sleep(0)  # the callers of this loop turn join meanwhile
        except BaseException:
            # The leader was cancelled: the callers that joined are still owed their calls.
            self._batch = None
            if len(batch) > 1:
                self._spawn(batch[1:])
            raise
        self._batch = None
        if len(batch) == 1:
            return await self._lone(call)
        # A task sends the batch, so a cancelled caller (the leader too) never strands the
        # others' replies.
        mine: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        batch[0] = (call, mine)
        self._spawn(batch)
        return cast(T, await mine)

    async def _lone(self, call: Call[T]) -> T:
        self._alone += 1
        try:
            return await self._x.call(call)
        finally:
            self._alone -= 1

    def _spawn(self, batch: list[_Entry]) -> None:
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[_Entry]) -> None:
        futures = [cast("asyncio.Future[Any]", fut) for _, fut in batch]
        x = self._x
        try:
            if x._cluster or x._fence.pending or x.native is None:
                # The executor's pipeline: it fences and picks the executor first, and on a
                # cluster routes by slot.
                results = await x.pipeline([c for c, _ in batch])
            else:
                await self._stream(batch, futures)
                return
        except asyncio.CancelledError:
            for fut in futures:
                fut.cancel()
            raise
        except BaseException as exc:
            _fail(futures, exc)
            if not isinstance(exc, Exception):
                raise
            return
        for fut, res in zip(futures, results, strict=True):
            _settle(fut, res)

    async def _stream(self, batch: list[_Entry], futures: list[asyncio.Future[Any]]) -> None:
        """The batch in one write on one pooled connection, each caller answered as soon as
        its own reply is read: the first callers' next work overlaps the server's running
        of the rest, as a client that writes each command at once gets (redis-py's pipeline
        answers only once every reply is in). The calls that did not run (NOSCRIPT: a
        restarted or flushed server; an ``EMQ.*`` command the server does not know: a
        replica without the module was promoted) go again through the executor's pipeline,
        which loads the scripts and decides the executor anew."""
        x = self._x
        calls = [c for c, _ in batch]
        native = bool(x.native)
        pool = x.client.connection_pool  # type: ignore[attr-defined]
        conn = await pool.get_connection()
        again: list[int] = []
        try:
            args = _pipeline_args(calls, False, False, native)
            await conn.send_packed_command([pack_command(a) for a in args])
            # One deadline for the batch's replies (the connection's socket timeout), not one
            # timeout context per reply as read_response makes by default: a hundred replies
            # read in a millisecond paid for a hundred timer handles. A reply past it fails
            # the batch as a socket timeout does (read_response disconnects on the cancel).
            try:
                async with _timeout(conn.socket_timeout):
                    for i, call in enumerate(calls):
                        try:
                            reply = await conn.read_response(timeout=math.inf)
                        except ResponseError as exc:
                            if isinstance(exc, NoScriptError) or (native and unknown_command(exc)):
                                again.append(i)
                                continue
                            reply = exc
                        _settle(futures[i], _decode_one(call, reply))
            except asyncio.TimeoutError:
                where = getattr(conn, "path", None) or f"{conn.host}:{conn.port}"
                raise RedisTimeout(f"Timeout reading from {where}") from None
        except BaseException as exc:
            # A lost connection: the calls not yet answered learn it (read_response has
            # disconnected it, so the pool reconnects, and fences, on its next use).
            _fail(futures, exc)
            if not isinstance(exc, Exception):
                raise
            return
        finally:
            await pool.release(conn)
        if again:
            results = await x.pipeline([calls[i] for i in again])
            for i, res in zip(again, results, strict=True):
                _settle(futures[i], res)


def _settle(fut: asyncio.Future[Any], res: Any) -> None:
    if fut.done():  # its caller was cancelled
        return
    if isinstance(res, BaseException):
        fut.set_exception(res)
    else:
        fut.set_result(res)


def _fail(futures: list[asyncio.Future[Any]], exc: BaseException) -> None:
    """A failed round trip: every caller not yet answered learns it and decides for its own
    call (an enqueue resends, flagged, with its nonce)."""
    for fut in futures:
        if fut.done():
            continue
        if isinstance(exc, asyncio.CancelledError):
            fut.cancel()
        else:
            fut.set_exception(exc)
