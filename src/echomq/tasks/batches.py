"""Batches: Batch, BatchStatus, their verbs over lua/batch_*.

Batches (issue 42, Sidekiq Pro's): a named set of jobs, open while producers (and the
batch's own jobs) keep adding to it, with callbacks that each fire exactly once.

A batch is a flow whose parent stays open: its *anchor* row (the batch id) is a flow parent
held ``awaiting_children`` whose payload is the ``on_complete`` callback; every member is a
child with an ignored-failure policy, so a member's death counts as settled. The anchor's
``deps`` carries one extra count while the batch is open; ``close`` drops it. The anchor's
release (in the settling script of the last member, or in ``close``) is ``on_complete``
firing; ``on_success`` and ``on_death`` are kept on the anchor and admitted by the same
scripts (``include/compose.lua`` batch_done, batch_death and their C twins). A batch and
its callbacks live on one queue: counters on one cluster slot, every decision atomic.
See docs/guides/batches.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from echomq import ids, keyspace
from echomq._appface import HostApp
from echomq.errors import InvalidArgument, StateError
from echomq.protocol.kernel import Call, Keys, Plan, _call, _s
from echomq.protocol.produce import _nonce, mint

if TYPE_CHECKING:
    from echomq.tasks.workflows import Signature

# How long the server keeps an add's verdicts for a resend of it (a lost reply).
ADD_REPLAY_MS = 120_000
# The most failed member ids a status carries by default (the count is always exact).
FAILED_IDS = 100


@dataclass(frozen=True, slots=True)
class BatchStatus:
    """One snapshot of a batch (``Batch.status()``). ``total`` counts the members admitted;
    ``pending`` those not settled yet; ``succeeded`` / ``dead`` their counted outcomes (a
    member retried counts once, by its final outcome). ``failed_ids``: at most the limit
    asked of the dead members' ids. ``complete``: ``on_complete`` has fired (the batch was
    closed and every member settled); ``success``: ``on_success`` fired with it (no member
    dead); ``first_death``: the member whose death fired ``on_death``, or None."""

    id: str
    queue: str
    description: str | None
    total: int
    pending: int
    succeeded: int
    dead: int
    failed_ids: tuple[str, ...]
    closed: bool
    complete: bool
    success: bool
    first_death: str | None


def _job_of(k: Keys, sig: Signature, what: str) -> tuple[bytes, str, int]:
    """(payload, lane, priority) of a signature on the batch's queue, or InvalidArgument."""
    from echomq.tasks.workflows import Signature

    if not isinstance(sig, Signature):
        raise InvalidArgument(f"{what} must be a task signature (task.s(...)), got {sig!r}")
    if sig.task.queue != k.name:
        raise InvalidArgument(
            f"{what} runs on queue {sig.task.queue!r}, the batch on {k.name!r}: a batch, its "
            "members and its callbacks live on one queue"
        )
    pri = sig.task.priority if sig.priority is None else sig.priority
    return sig.task.payload(sig.args, sig.kwargs), sig.group or "", pri


def _callback(k: Keys, minter: ids.Minter | None, sig: Signature | None, what: str) -> Plan[bytes]:
    """The anchor's encoding of a callback: id NUL lane NUL priority NUL payload."""
    if sig is None:
        return b""
    payload, group, pri = _job_of(k, sig, what)
    cid = sig.id or (yield from mint(minter))
    head = f"{cid}\0{group}\0{pri}\0".encode()
    return head + payload


def open_batch(
    k: Keys,
    minter: ids.Minter | None,
    on_complete: Signature | None,
    on_success: Signature | None,
    on_death: Signature | None,
    description: str | None,
) -> Plan[str]:
    """Open a batch on ``k``'s queue; its id. Every argument is checked before the call."""
    if description is not None and not isinstance(description, str):
        raise InvalidArgument(f"description must be a str, got {description!r}")
    payload, group, pri = b"", "", 0
    if on_complete is not None:
        payload, group, pri = _job_of(k, on_complete, "on_complete")
    success = yield from _callback(k, minter, on_success, "on_success")
    death = yield from _callback(k, minter, on_death, "on_death")
    bid = yield from mint(minter)
    mark = (yield from mint(minter))[3:]
    args = (k.base, bid, mark, payload, group, pri, description or "", success, death)
    yield _call("batch_open", (k.job(bid),), args, lambda r: None)
    return bid


def add(
    k: Keys, minter: ids.Minter | None, bid: str, sigs: Sequence[Signature], adder: str
) -> Plan[list[str]]:
    """Admit ``sigs`` as members of batch ``bid``; their ids (a resend of a lost reply
    answers the first copy's verdicts, so no member is counted twice)."""
    keyspace.check_id(bid)
    jobs: list[tuple[str, bytes, str, int]] = []
    for i, sig in enumerate(sigs):
        payload, group, pri = _job_of(k, sig, f"member {i}")
        jobs.append((sig.id or "", payload, group, pri))
    if not jobs:
        return []
    out: list[str] = []
    args: list[Any] = [k.base, bid, _nonce(), ADD_REPLAY_MS, adder, len(jobs)]
    for named, payload, group, pri in jobs:
        jid = named or (yield from mint(minter))
        out.append(jid)
        args += (jid, payload, group, pri)
    yield _call("batch_add", (k.job(bid),), tuple(args), _verdicts)
    return out


def _verdicts(reply: Any) -> list[str]:
    return [_s(v) for v in reply]


def close(k: Keys, bid: str) -> Call[bool]:
    """Close batch ``bid``: True when this call closed it, False when it was closed before."""
    keyspace.check_id(bid)
    return _call("batch_close", (k.job(bid),), (k.base, bid), lambda r: int(r) == 1)


def status(k: Keys, bid: str, limit: int = FAILED_IDS) -> Call[BatchStatus]:
    """Batch ``bid``'s counts; StateError ``nobatch`` when no batch has that id (never
    opened, or finished and gone: see the guide)."""
    keyspace.check_id(bid)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= 10_000:
        raise InvalidArgument(f"limit must be an int in 0..10000, got {limit!r}")

    def decode(r: Any) -> BatchStatus:
        if not r:
            raise StateError(f"EMQSTATE nobatch {bid}")
        state, phase = _s(r[0]), _s(r[1])
        deps, ok, dead = int(r[2]), int(r[3]), int(r[4])
        held = phase == "awaiting_children"
        pending = max(deps - (1 if state == "open" else 0), 0) if held else 0
        return BatchStatus(
            id=bid,
            queue=k.name,
            description=_s(r[6]) or None,
            total=ok + dead + pending,
            pending=pending,
            succeeded=ok,
            dead=dead,
            failed_ids=tuple(_s(x) for x in r[7:]),
            closed=state != "open",
            complete=state in ("success", "complete"),
            success=state == "success",
            first_death=_s(r[5]) or None,
        )

    return _call("batch_status", (k.job(bid),), (k.base, limit), decode)


class Batch:
    """A handle on one batch (``app.batch(...)``, ``app.batch_by_id(...)``,
    ``current_job().batch``). ``add`` / ``add_many`` admit members (after ``close`` only a
    running member of the batch may add), ``close`` ends the adding from outside, ``status``
    reads the counts. Each verb has an asyncio twin (``aadd``, ``aadd_many``, ``aclose``,
    ``astatus``) running the same plan through the app's :class:`AsyncQueue`."""

    __slots__ = ("app", "id", "queue")

    def __init__(self, app: HostApp, queue: str, id: str) -> None:
        self.app = app
        self.queue = keyspace.check_queue(queue)
        self.id = keyspace.check_id(id)

    def __repr__(self) -> str:
        return f"<Batch {self.id} queue={self.queue}>"

    # One plan per verb, built the same for both drivers: the sync methods run it through
    # the app's Queue, the async ones through its AsyncQueue (both carry _k and _x.minter).

    def _add_plan(self, q: Any, sigs: Iterable[Signature] | object) -> Any:
        # q: a Queue or an AsyncQueue (typed Any: the layering keeps _batches below them).
        if isinstance(sigs, (str, bytes)) or not isinstance(sigs, Iterable):
            raise InvalidArgument("add_many takes an iterable of task signatures")
        from echomq.context import current_job

        cur = current_job()
        adder = cur.id if cur is not None and cur.queue == self.queue else ""
        return add(q._k, q._x.minter, self.id, list(sigs), adder)

    def add(self, sig: Signature) -> str:
        """Admit one member; its job id."""
        return self.add_many([sig])[0]

    def add_many(self, sigs: Iterable[Signature] | object) -> list[str]:
        """Admit members in one call (all or nothing); their job ids, in order. A running
        member of this batch may add after ``close`` (its own run holds the batch open)."""
        q = self.app.queue(self.queue)
        result: list[str] = q._x.run(self._add_plan(q, sigs))
        return result

    def close(self) -> bool:
        """No more adds from outside the batch; True when this call closed it."""
        q = self.app.queue(self.queue)
        closed: bool = q._x.run(close(q._k, self.id))
        return closed

    def status(self, failed_limit: int = FAILED_IDS) -> BatchStatus:
        """The batch's counts now (``StateError`` once it finished and its anchor is gone)."""
        q = self.app.queue(self.queue)
        found: BatchStatus = q._x.run(status(q._k, self.id, failed_limit))
        return found

    async def aadd(self, sig: Signature) -> str:
        """:meth:`add` for asyncio (does not block the loop)."""
        return (await self.aadd_many([sig]))[0]

    async def aadd_many(self, sigs: Iterable[Signature] | object) -> list[str]:
        """:meth:`add_many` for asyncio (does not block the loop)."""
        q = self.app.aqueue(self.queue)
        result: list[str] = await q._x.run(self._add_plan(q, sigs))
        return result

    async def aclose(self) -> bool:
        """:meth:`close` for asyncio (does not block the loop)."""
        q = self.app.aqueue(self.queue)
        closed: bool = await q._x.run(close(q._k, self.id))
        return closed

    async def astatus(self, failed_limit: int = FAILED_IDS) -> BatchStatus:
        """:meth:`status` for asyncio (does not block the loop)."""
        q = self.app.aqueue(self.queue)
        found: BatchStatus = await q._x.run(status(q._k, self.id, failed_limit))
        return found


def which_batch(k: Keys, job_id: str) -> Plan[str | None]:
    """The id of the batch job ``job_id`` belongs to: as a member (its parent is an anchor),
    as the anchor (the on_complete callback) or as an on_success / on_death callback
    (``batch_of``); None for any other job."""
    from echomq.protocol.kernel import _cmd

    keyspace.check_id(job_id)
    row = yield _cmd(("HMGET", k.job(job_id), "batch", "batch_of", "parent"), list)
    if row[0]:
        return job_id
    if row[1]:
        return _s(row[1])
    if row[2] and (yield _cmd(("HEXISTS", k.job(_s(row[2])), "batch"), int)):
        return _s(row[2])
    return None


def batch_of(app: HostApp, queue: str, job_id: str) -> Batch | None:
    """The :class:`Batch` job ``job_id`` belongs to (:func:`which_batch`), else None."""
    q = app.queue(queue)
    bid = q._x.run(which_batch(q._k, job_id))
    return None if bid is None else Batch(app, queue, bid)


async def abatch_of(app: HostApp, queue: str, job_id: str) -> Batch | None:
    """:func:`batch_of` for asyncio (does not block the loop)."""
    q = app.aqueue(queue)
    bid = await q._x.run(which_batch(q._k, job_id))
    return None if bid is None else Batch(app, queue, bid)
