"""What a workflow's enqueue answers: wait for values, name the dead job.

What a workflow's ``enqueue`` answers (issue 42, ``echomq.tasks.workflows``): the receipts of a
group, a chord and a chain, which wait for values and say which job died. They read kept
outcomes only (``protocol.control.outcome``): a receipt made from ids alone works in another
process too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from echomq._appface import HostApp
from echomq.errors import ChainFailed, GroupFailed, JobFailed
from echomq.protocol import control as _ctl

__all__ = ["ChainReceipt", "ChordReceipt", "GroupReceipt"]


@dataclass(frozen=True)
class GroupReceipt:
    """The members' ids (``.ids``, in the group's order) and their queues."""

    app: HostApp
    ids: list[str]
    queues: list[str]

    def wait(self, timeout_s: float) -> list[Any]:
        """Every member's value, in order; :class:`GroupFailed` with every failure attached
        when some died, ``TimeoutError`` at the deadline."""
        deadline = time.monotonic() + timeout_s
        values: list[Any] = []
        failures: list[JobFailed] = []
        for jid, queue in zip(self.ids, self.queues, strict=True):
            try:
                values.append(self.app.wait_result(jid, timeout_s=_left(deadline), queue=queue))
            except JobFailed as exc:
                values.append(None)
                failures.append(exc)
        if failures:
            raise GroupFailed(failures, values)
        return values

    async def await_result(self, timeout_s: float) -> list[Any]:
        """``wait`` for asyncio code."""
        deadline = time.monotonic() + timeout_s
        values: list[Any] = []
        failures: list[JobFailed] = []
        for jid, queue in zip(self.ids, self.queues, strict=True):
            try:
                left = _left(deadline)
                values.append(await self.app.await_result(jid, timeout_s=left, queue=queue))
            except JobFailed as exc:
                values.append(None)
                failures.append(exc)
        if failures:
            raise GroupFailed(failures, values)
        return values

    def failures(self) -> list[JobFailed]:
        """The members that died so far, in order (read once, no waiting)."""
        found = [_error(*_outcome_of(self.app, j, q)) for j, q in _pairs(self)]
        return [JobFailed(j, e) for j, e in zip(self.ids, found, strict=True) if e is not None]

    async def afailures(self) -> list[JobFailed]:
        """``failures`` for asyncio code."""
        out = []
        for j, q in zip(self.ids, self.queues, strict=True):
            e = _error(*await _aoutcome_of(self.app, j, q))
            if e is not None:
                out.append(JobFailed(j, e))
        return out


def _left(deadline: float) -> float:
    """The time left for the next member's wait: a member already finished is still read
    after the deadline (its wait reads before it blocks)."""
    return max(deadline - time.monotonic(), 0.001)


@dataclass(frozen=True)
class ChordReceipt:
    """The callback's id and queue, and the members' (a :class:`GroupReceipt`)."""

    app: HostApp
    id: str
    queue: str
    members: GroupReceipt

    def wait(self, timeout_s: float) -> Any:
        """The callback's value; :class:`GroupFailed` (every member that died) when the
        callback died because of them, :class:`JobFailed` when it died itself."""
        try:
            return self.app.wait_result(self.id, timeout_s=timeout_s, queue=self.queue)
        except JobFailed:
            self._failed_members(self.members.failures())
            raise

    async def await_result(self, timeout_s: float) -> Any:
        """``wait`` for asyncio code."""
        try:
            return await self.app.await_result(self.id, timeout_s=timeout_s, queue=self.queue)
        except JobFailed:
            self._failed_members(await self.members.afailures())
            raise

    def _failed_members(self, failures: list[JobFailed]) -> None:
        if failures:
            values: list[object] = [None] * len(self.members.ids)
            raise GroupFailed(failures, values)


@dataclass(frozen=True)
class ChainReceipt:
    """Every step's id (``.ids``, in order; a chord step's is its callback's) and queue;
    ``.id`` is the last step's. ``head``: the chord's receipt when the chain starts with one."""

    app: HostApp
    ids: list[str]
    queues: list[str]
    head: ChordReceipt | None = None

    @property
    def id(self) -> str:
        return self.ids[-1]

    def wait(self, timeout_s: float) -> Any:
        """The last step's value; :class:`ChainFailed` naming the step that died (the steps
        after it never run), ``TimeoutError`` at the deadline."""
        try:
            return self.app.wait_result(self.id, timeout_s=timeout_s, queue=self.queues[-1])
        except JobFailed as exc:
            found = self.failed_step()
            raise (found or ChainFailed(len(self.ids) - 1, self.id, exc.error, self.ids)) from exc

    async def await_result(self, timeout_s: float) -> Any:
        """``wait`` for asyncio code."""
        try:
            return await self.app.await_result(self.id, timeout_s=timeout_s, queue=self.queues[-1])
        except JobFailed as exc:
            found = await self.afailed_step()
            raise (found or ChainFailed(len(self.ids) - 1, self.id, exc.error, self.ids)) from exc

    def status(self) -> list[str]:
        """Each step's state, in order: ``completed`` or ``dead`` once its outcome is kept,
        else where it is (``pending``, ``active``, ``scheduled``, ``awaiting_children``)."""
        return [_state(*_outcome_of(self.app, j, q)) for j, q in _pairs(self)]

    async def astatus(self) -> list[str]:
        """``status`` for asyncio code."""
        return [_state(*await _aoutcome_of(self.app, j, q)) for j, q in _pairs(self)]

    def failed_step(self) -> ChainFailed | None:
        """The first step that died, as the :class:`ChainFailed` ``wait`` raises (not
        raised), or None while none has. A chord step's failure names its first member
        that died."""
        for step, jid, q in self._inspected():
            error = _error(*_outcome_of(self.app, jid, q))
            if error is not None:
                return ChainFailed(step, jid, error, self.ids)
        return None

    async def afailed_step(self) -> ChainFailed | None:
        """``failed_step`` for asyncio code."""
        for step, jid, q in self._inspected():
            error = _error(*await _aoutcome_of(self.app, jid, q))
            if error is not None:
                return ChainFailed(step, jid, error, self.ids)
        return None

    def _inspected(self) -> list[tuple[int, str, str]]:
        """(step, id, queue) in the order they run: a chord's members before its callback."""
        out = [(i, j, q) for i, (j, q) in enumerate(zip(self.ids, self.queues, strict=True))]
        if self.head is not None:
            m = self.head.members
            out = [(0, j, q) for j, q in zip(m.ids, m.queues, strict=True)] + out
        return out


def _pairs(receipt: GroupReceipt | ChainReceipt) -> list[tuple[str, str]]:
    return list(zip(receipt.ids, receipt.queues, strict=True))


def _state(kept: Any, state: str) -> str:
    if kept is not None:
        return "dead" if kept.error is not None else "completed"
    return state


def _error(kept: Any, state: str) -> str | None:
    """The error of a job that died (its kept error, else ``dead``), None otherwise."""
    if kept is not None and kept.error is not None:
        return str(kept.error)
    return "dead" if state == "dead" else None


def _outcome_of(app: HostApp, jid: str, queue: str) -> tuple[Any, str]:
    q = app.queue(queue)
    return q._x.run(_ctl.outcome(q._k, jid))


async def _aoutcome_of(app: HostApp, jid: str, queue: str) -> tuple[Any, str]:
    q = app.aqueue(queue)
    return await q._x.run(_ctl.outcome(q._k, jid))
