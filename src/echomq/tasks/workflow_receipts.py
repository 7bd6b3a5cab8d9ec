"""What a workflow's enqueue answers: wait for values, name the dead job.

What a workflow's ``enqueue`` answers (issue 42, ``echomq.tasks.workflows``): the receipts of a
group, a chord and a chain, which wait for values and say which job died. They read kept
outcomes only (``protocol.control.outcome``): a receipt made from ids alone works in another
process too. Each verb is written once, as a generator of what it asks (``_Value``: a job's
value, waited for; ``_Outcome``: a job's kept outcome and state, read once), answered by
``_run`` for the plain verb and by ``_arun`` for its asyncio twin (issue 38).
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar, Union

from echomq._appface import HostApp
from echomq.errors import ChainFailed, GroupFailed, JobFailed
from echomq.protocol import control as _ctl

__all__ = ["ChainReceipt", "ChordReceipt", "GroupReceipt"]

T = TypeVar("T")


class _Value(NamedTuple):
    """Ask for a job's value (``App.wait_result``): a job that died is thrown back as the
    :class:`JobFailed` it raised."""

    jid: str
    queue: str
    timeout_s: float


class _Outcome(NamedTuple):
    """Ask for a job's kept outcome and state (``protocol.control.outcome``), read once."""

    jid: str
    queue: str


_Asks = Generator[Union[_Value, _Outcome], Any, T]  # noqa: UP007 - a runtime alias on 3.10


@dataclass(frozen=True)
class GroupReceipt:
    """The members' ids (``.ids``, in the group's order) and their queues."""

    app: HostApp
    ids: list[str]
    queues: list[str]

    def wait(self, timeout_s: float) -> list[Any]:
        """Every member's value, in order; :class:`GroupFailed` with every failure attached
        when some died, ``TimeoutError`` at the deadline."""
        return _run(self.app, self._wait(timeout_s))

    async def await_result(self, timeout_s: float) -> list[Any]:
        """``wait`` for asyncio code."""
        return await _arun(self.app, self._wait(timeout_s))

    def failures(self) -> list[JobFailed]:
        """The members that died so far, in order (read once, no waiting)."""
        return _run(self.app, self._failures())

    async def afailures(self) -> list[JobFailed]:
        """``failures`` for asyncio code."""
        return await _arun(self.app, self._failures())

    def _wait(self, timeout_s: float) -> _Asks[list[Any]]:
        deadline = time.monotonic() + timeout_s
        values: list[Any] = []
        failures: list[JobFailed] = []
        for jid, queue in _pairs(self):
            try:
                values.append((yield _Value(jid, queue, _left(deadline))))
            except JobFailed as exc:
                values.append(None)
                failures.append(exc)
        if failures:
            raise GroupFailed(failures, values)
        return values

    def _failures(self) -> _Asks[list[JobFailed]]:
        out = []
        for jid, queue in _pairs(self):
            error = _error(*(yield _Outcome(jid, queue)))
            if error is not None:
                out.append(JobFailed(jid, error))
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
        return _run(self.app, self._wait(timeout_s))

    async def await_result(self, timeout_s: float) -> Any:
        """``wait`` for asyncio code."""
        return await _arun(self.app, self._wait(timeout_s))

    def _wait(self, timeout_s: float) -> _Asks[Any]:
        try:
            return (yield _Value(self.id, self.queue, timeout_s))
        except JobFailed:
            failures = yield from self.members._failures()
            if failures:
                values: list[object] = [None] * len(self.members.ids)
                raise GroupFailed(failures, values)  # noqa: B904 - in its context, as before
            raise


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
        return _run(self.app, self._wait(timeout_s))

    async def await_result(self, timeout_s: float) -> Any:
        """``wait`` for asyncio code."""
        return await _arun(self.app, self._wait(timeout_s))

    def status(self) -> list[str]:
        """Each step's state, in order: ``completed`` or ``dead`` once its outcome is kept,
        else where it is (``pending``, ``active``, ``scheduled``, ``awaiting_children``)."""
        return _run(self.app, self._status())

    async def astatus(self) -> list[str]:
        """``status`` for asyncio code."""
        return await _arun(self.app, self._status())

    def failed_step(self) -> ChainFailed | None:
        """The first step that died, as the :class:`ChainFailed` ``wait`` raises (not
        raised), or None while none has. A chord step's failure names its first member
        that died."""
        return _run(self.app, self._failed_step())

    async def afailed_step(self) -> ChainFailed | None:
        """``failed_step`` for asyncio code."""
        return await _arun(self.app, self._failed_step())

    def _wait(self, timeout_s: float) -> _Asks[Any]:
        try:
            return (yield _Value(self.id, self.queues[-1], timeout_s))
        except JobFailed as exc:
            found = yield from self._failed_step()
            raise (found or ChainFailed(len(self.ids) - 1, self.id, exc.error, self.ids)) from exc

    def _status(self) -> _Asks[list[str]]:
        out = []
        for jid, queue in _pairs(self):
            out.append(_state(*(yield _Outcome(jid, queue))))
        return out

    def _failed_step(self) -> _Asks[ChainFailed | None]:
        for step, jid, q in self._inspected():
            error = _error(*(yield _Outcome(jid, q)))
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


def _run(app: HostApp, asks: _Asks[T]) -> T:
    """Answer a verb's asks with plain calls; its result."""
    reply: Any = None
    failed: JobFailed | None = None
    while True:
        try:
            ask = asks.send(reply) if failed is None else asks.throw(failed)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        reply, failed = None, None
        if isinstance(ask, _Outcome):
            q = app.queue(ask.queue)
            reply = q._x.run(_ctl.outcome(q._k, ask.jid))
            continue
        try:
            reply = app.wait_result(ask.jid, timeout_s=ask.timeout_s, queue=ask.queue)
        except JobFailed as exc:
            failed = exc


async def _arun(app: HostApp, asks: _Asks[T]) -> T:
    """The asyncio twin of :func:`_run`."""
    reply: Any = None
    failed: JobFailed | None = None
    while True:
        try:
            ask = asks.send(reply) if failed is None else asks.throw(failed)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        reply, failed = None, None
        if isinstance(ask, _Outcome):
            q = app.aqueue(ask.queue)
            reply = await q._x.run(_ctl.outcome(q._k, ask.jid))
            continue
        try:
            reply = await app.await_result(ask.jid, timeout_s=ask.timeout_s, queue=ask.queue)
        except JobFailed as exc:
            failed = exc
