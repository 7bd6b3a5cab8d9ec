"""Many asyncio result waiters on one ``AsyncQueue``, one blocking connection (D17).

A blocking ``BLPOP`` holds its connection until it returns, so one ``BLPOP`` per waiter would
cost one connection per waiter. Instead every waiter of one queue registers here and a single
reader task blocks on all their notify lists at once (``BLPOP poke notify:<a> notify:<b> ...``;
every key of a queue shares its slot, so this is legal on a cluster too). ``poke`` is a list
private to this reader: a waiter that arrives while the reader is blocked pushes a token on it,
so the reader wakes and blocks again with the new key included. A completion that lands while
the reader is between two blocks leaves its token in the notify list, and the next block takes
it at once: no wake-up is lost, and nothing polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from typing import Any

from echomq import keyspace
from echomq.client.connect import TRANSIENT
from echomq.client.executor import AsyncExecutor
from echomq.protocol import control as _ctl
from echomq.protocol.kernel import Call, Keys, Plan, _cmd, _s

__all__ = ["ResultWaiters"]

# The poke list outlives a crashed reader by at most this long.
_POKE_TTL_MS = 60_000
# A marker is refreshed while it still has this long left beyond the next block.
_REFRESH_MARGIN_S = 5.0


class ResultWaiters:
    """The waiters of one ``AsyncQueue`` and their shared reader."""

    def __init__(self, x: AsyncExecutor, k: Keys) -> None:
        self._x = x
        self._k = k
        self._prefix = k.base + "notify:"
        # '~' is never part of a branded id: the poke list cannot be a job's notify list.
        self._poke = self._prefix + "~" + secrets.token_hex(8)
        self._futs: dict[str, list[asyncio.Future[_ctl.Result]]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._poked = False
        # id -> when its waiter marker was last set (monotonic s); refreshed before a block
        # that could outlast it.
        self._marked: dict[str, float] = {}

    async def wait(self, id: str, timeout_s: float) -> _ctl.Result:
        timeout = _ctl._timeout(timeout_s)
        keyspace.check_id(id)
        deadline = time.monotonic() + timeout
        # Marker before the read (see _ctl.wait): a completion after the read pushes a token.
        # Each step rides out a failover only until the wait's deadline.
        marked = time.monotonic()
        try:
            await self._x.run(_ctl.want(self._k, id), deadline=deadline)
            self._marked[id] = marked
            found = await self._x.run(_ctl.result(self._k, id), deadline=deadline)
        except TRANSIENT as exc:
            if time.monotonic() < deadline:
                raise
            raise TimeoutError(f"job {id}: no result within {timeout} s") from exc
        if found is not None:
            return _ctl._outcome(found)
        if timeout <= 0:
            raise TimeoutError(f"job {id}: no result within {timeout} s")
        fut: asyncio.Future[_ctl.Result] = asyncio.get_running_loop().create_future()
        self._futs.setdefault(id, []).append(fut)
        try:
            try:
                await self._kick(deadline)
                got = await asyncio.wait_for(fut, max(0.0, deadline - time.monotonic()))
            except (TimeoutError, asyncio.TimeoutError):
                raise TimeoutError(f"job {id}: no result within {timeout} s") from None
            except TRANSIENT as exc:
                if time.monotonic() < deadline:
                    raise
                raise TimeoutError(f"job {id}: no result within {timeout} s") from exc
        finally:
            waiting = self._futs.get(id)
            if waiting is not None and fut in waiting:
                waiting.remove(fut)
                if not waiting:
                    del self._futs[id]
            if id not in self._futs:
                self._marked.pop(id, None)
        return _ctl._outcome(got)

    async def _kick(self, deadline: float) -> None:
        if self._reader is None or self._reader.done():
            # A new reader reads the registry when it starts: no poke needed.
            self._poked = False
            self._reader = asyncio.create_task(self._read())
            return
        if not self._poked:
            self._poked = True
            await self._x.run(self._poke_plan(), deadline=deadline)

    def _poke_plan(self) -> Plan[None]:
        yield [
            _cmd(("LPUSH", self._poke, "1"), _none),
            _cmd(("PEXPIRE", self._poke, _POKE_TTL_MS), _none),
        ]

    def _block(self) -> Call[tuple[str, bytes] | None]:
        # Cleared in the same event-loop step that reads the registry: a waiter registered
        # after this point pokes, one registered before it is in the key list.
        self._poked = False
        keys = [self._prefix + id for id in self._futs]
        timeout = f"{_ctl.MAX_BLOCK_S:.3f}"

        def decode(reply: Any) -> tuple[str, bytes] | None:
            return None if reply is None else (_s(reply[0]), reply[1])

        return _cmd(("BLPOP", self._poke, *keys, timeout), decode)

    async def _read(self) -> None:
        try:
            while self._futs:
                await self._refresh()
                woke = await self._x.run(self._block())
                if woke is None or woke[0] == self._poke:
                    continue
                id = woke[0][len(self._prefix) :]
                # Put the token back first, so this job's waiters elsewhere wake too; 0 means
                # the result expired meanwhile and no token went back (nothing to spin on).
                await self._x.run(_ctl.rearm(self._k, id))
                found = await self._x.run(_ctl.result(self._k, id))
                if found is None:
                    continue
                for fut in self._futs.pop(id, []):
                    if not fut.done():
                        fut.set_result(found)
        except Exception as exc:  # the connection failed: every waiter learns it
            for futs in self._futs.values():
                for fut in futs:
                    if not fut.done():
                        fut.set_exception(exc)
            self._futs.clear()

    async def _refresh(self) -> None:
        # A marker set at t lasts until t + WANT_MS; the next block ends by now + MAX_BLOCK_S.
        now = time.monotonic()
        stale = now - (_ctl.WANT_MS / 1000 - _ctl.MAX_BLOCK_S - _REFRESH_MARGIN_S)
        ids = [id for id in self._futs if self._marked.get(id, 0.0) < stale]
        if ids:
            await self._x.run(self._want_plan(ids))
            for id in ids:
                self._marked[id] = now

    def _want_plan(self, ids: list[str]) -> Plan[None]:
        yield [_ctl.want(self._k, id) for id in ids]

    async def close(self) -> None:
        """Stop the reader (the queue is closing); its waiters are cancelled."""
        reader, self._reader = self._reader, None
        if reader is not None and not reader.done():
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
        for futs in self._futs.values():
            for fut in futs:
                fut.cancel()
        self._futs.clear()
        self._marked.clear()


def _none(_: Any) -> None:
    return None
