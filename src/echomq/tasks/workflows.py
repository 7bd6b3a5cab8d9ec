"""Signature's workflows: chain, group and chord, built as flows.

Workflows of tasks (issue 42): ``chain`` (steps in sequence, each given the previous
step's value), ``group`` (calls in parallel, their values in order) and ``chord`` (a group,
then a callback given the group's values). No new transition: each maps onto flows (D18).

- A chain ``a | b | c`` is a nested flow: ``c`` the root, ``b`` its one child, ``a`` b's one
  child. A flow parent is released by its child's completing script (on both executors, and
  through the outbox across queues), so the hand-off from step to step is inside that script:
  a worker crash between steps neither skips a step nor runs one twice.
- A step's envelope carries two options (``echomq.protocol.envelope``'s ``opts``): ``keep_ms``, how
  long its value (or its error) is kept, so that the next step and the receipt can read it,
  and ``prev``: ``1`` for "the one child's value is my first argument", a list of ids for a
  chord's callback ("their values, in this order"). The worker's runner reads the values from
  the job's own ``processed`` hash (``children_values``) and prepends them.
- A group is its members enqueued one by one; a chord is a flow whose root is the callback
  and whose children are the members.

Every id is minted (or taken from ``sig.options(id=...)``) before the tree is built, so the
receipts know every step's id; every call is checked before anything is sent.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from echomq import ids as _ids
from echomq import keyspace
from echomq._appface import HostApp, SignedTask
from echomq.errors import BadArguments, InvalidArgument, StateError
from echomq.protocol import calls as _p
from echomq.protocol import compose as _compose
from echomq.protocol import envelope as _envelope
from echomq.protocol.joboptions import JobOptions
from echomq.protocol.kernel import MAX_MS, Keys, Plan, _priority
from echomq.protocol.produce import mint
from echomq.tasks.workflow_receipts import ChainReceipt, ChordReceipt, GroupReceipt

__all__ = [
    "DEFAULT_KEEP_MS",
    "Signature",
    "Chain",
    "ChainReceipt",
    "Chord",
    "ChordReceipt",
    "Group",
    "GroupReceipt",
    "pipe",
]

# How long a workflow keeps each step's value (and error) unless told otherwise: long enough
# for a receipt's wait; the hand-off itself reads the parent's processed hash, which lives
# until the next step completes, whatever this is.
DEFAULT_KEEP_MS = 3_600_000


@dataclass(frozen=True, slots=True)
class Signature:
    """One call of a task, not yet sent (``task.s(...)``): a node of ``app.flow``. ``id``
    and ``group`` are the job's options; ``fail_parent=False`` makes its death an ignored
    failure of its parent instead of the parent's death."""

    task: SignedTask
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    id: str | None = None
    group: str | None = None
    fail_parent: bool = True
    priority: int | None = None  # None: the task's
    immutable: bool = False  # task.si(...): in a chain, the previous value is not passed
    chain_arg: str | None = None  # in a chain: the previous value as this keyword argument

    def options(
        self,
        *,
        id: str | None = None,
        group: str | None = None,
        fail_parent: bool = True,
        priority: int | None = None,
        chain_arg: str | None = None,
    ) -> Signature:
        """This signature with job options; ``chain_arg``: in a chain (or as a chord's
        callback), receive the previous value as this keyword argument, not as the first
        positional one."""
        if priority is not None:
            _priority(priority)
        if chain_arg is not None and not (isinstance(chain_arg, str) and chain_arg.isidentifier()):
            raise InvalidArgument(f"chain_arg must be an argument name, got {chain_arg!r}")
        return Signature(
            self.task,
            self.args,
            self.kwargs,
            id,
            group,
            fail_parent,
            priority,
            self.immutable,
            chain_arg,
        )

    def __or__(self, other: object) -> Chain:
        """``a.s() | b.s()``: a chain; see ``App.chain``."""
        return pipe(self, other)


def _keep(keep_result_ms: object) -> int:
    if isinstance(keep_result_ms, bool) or not isinstance(keep_result_ms, int):
        raise InvalidArgument(f"keep_result_ms must be an int >= 1, got {keep_result_ms!r}")
    if not 1 <= keep_result_ms <= MAX_MS:
        raise InvalidArgument(f"keep_result_ms must be in [1, {MAX_MS}], got {keep_result_ms}")
    return keep_result_ms


def _keys(app: HostApp, queue: str) -> Keys:
    """A queue's keys with the app's payload bound (as ``app.queue(name)`` has them)."""
    return Keys(queue) if app.max_payload is None else Keys(queue, app.max_payload)


def _sequence(x: object, what: str) -> tuple[Any, ...]:
    """A group's or chain's members as a tuple: a list or tuple of at least one."""
    if not isinstance(x, (list, tuple)):
        raise InvalidArgument(f"{what} takes a list of task signatures, got {x!r}")
    if not x:
        raise InvalidArgument(f"{what} needs at least one signature")
    return tuple(x)


def _sig(x: object, what: str) -> Signature:
    if not isinstance(x, Signature):
        raise InvalidArgument(f"{what} takes task signatures (task.s(...)), got {x!r}")
    return x


def _binds(sig: Signature, with_prev: bool, where: str) -> None:
    """:class:`BadArguments` unless the step's call binds (with the previous value first when
    it receives one)."""
    args = (None, *sig.args) if with_prev and sig.chain_arg is None else sig.args
    kwargs = {**sig.kwargs, sig.chain_arg: None} if with_prev and sig.chain_arg else sig.kwargs
    try:
        sig.task.check_call(args, kwargs)
    except BadArguments as exc:
        hint = (
            " (it receives the previous step's value as its first argument; use task.si(...) "
            "for a step that takes none)"
            if with_prev
            else ""
        )
        raise BadArguments(f"{where}: {exc}{hint}") from exc


def _opts(sig: Signature, keep_ms: int, prev: int | list[str] | None) -> dict[str, Any]:
    opts: dict[str, Any] = {"keep_ms": max(keep_ms, sig.task.keep_result_ms)}
    if prev is not None:
        opts["prev"] = prev
        if sig.chain_arg is not None:
            opts["arg"] = sig.chain_arg  # the keyword the worker passes the value as
    return opts


def _payload(sig: Signature, opts: dict[str, Any]) -> bytes:
    task = sig.task
    try:
        return _envelope.encode(task.app.serializer, task.name, sig.args, sig.kwargs, opts)
    except Exception as exc:
        raise task._unserializable(sig.args, sig.kwargs, exc) from exc


def _priority_of(sig: Signature) -> int:
    return sig.task.priority if sig.priority is None else sig.priority


@dataclass(frozen=True, slots=True)
class _Slot:
    """One job of a workflow: its signature, queue, and id (None until minted)."""

    sig: Signature
    queue: str
    id: str | None


def _slots(sigs: Iterable[Signature]) -> list[_Slot]:
    out = [_Slot(s, s.task.queue, None if s.id is None else keyspace.check_id(s.id)) for s in sigs]
    named = [s.id for s in out if s.id is not None]
    if len(set(named)) != len(named):
        raise InvalidArgument(f"a workflow names the same job id twice: {sorted(named)}")
    return out


def _minted(slots: list[_Slot], minter: _ids.Minter | None) -> Plan[list[str]]:
    """Every slot's id: its own, else a fresh one; then :class:`StateError` (nothing
    written) when a named id is held by a job already (across queues, a flow is added in
    several calls: checked first so that none of them writes)."""
    out: list[str] = []
    for s in slots:
        if s.id is None:
            out.append((yield from mint(minter)))
            continue
        state: str = yield _p.job_state(Keys(s.queue), s.id)
        if state != "absent":
            raise StateError(f"EMQSTATE exists {s.id}")
        out.append(s.id)
    return out


# --------------------------------------------------------------------------- group


@dataclass(frozen=True)
class Group:
    """Calls run in parallel (``app.group([...])``); ``enqueue()`` answers a
    :class:`GroupReceipt`. ``group | callback`` is a :class:`Chord`."""

    app: HostApp
    sigs: tuple[Signature, ...]
    keep_result_ms: int = DEFAULT_KEEP_MS

    def __post_init__(self) -> None:
        object.__setattr__(self, "sigs", _sequence(self.sigs, "a group"))
        for i, s in enumerate(self.sigs):
            _binds(_sig(s, "a group"), False, f"group member {i}")
        _keep(self.keep_result_ms)
        _slots(self.sigs)

    def __or__(self, other: object) -> Chord | Chain:
        if isinstance(other, Signature):
            return Chord(self, other)
        if isinstance(other, Chain) and isinstance(other.steps[0], Signature):
            head = Chord(self, other.steps[0])
            return Chain(self.app, (head, *other.steps[1:]), other.keep_result_ms)
        raise InvalidArgument(
            f"group | x: x must be a task signature (a chord's callback) or a chain, got {other!r}"
        )

    def _payloads(self) -> list[bytes]:
        return [_payload(s, _opts(s, self.keep_result_ms, None)) for s in self.sigs]

    def _plan(self, minter: _ids.Minter | None) -> Plan[GroupReceipt]:
        slots = _slots(self.sigs)
        payloads = self._payloads()  # BadArguments (unserializable) before any write
        ids = yield from _minted(slots, minter)
        for s, jid, payload in zip(slots, ids, payloads, strict=True):
            opts = JobOptions(group=s.sig.group, id=jid, priority=_priority_of(s.sig))
            yield from _p.enqueue(_keys(self.app, s.queue), payload, opts)
        return GroupReceipt(self.app, ids, [s.queue for s in slots])

    def enqueue(self) -> GroupReceipt:
        """Enqueue every member (each on its task's queue), in order."""
        q = self.app.queue(self.sigs[0].task.queue)
        return q._x.run(self._plan(q._x.minter))

    async def aenqueue(self) -> GroupReceipt:
        """``enqueue`` for asyncio code."""
        q = self.app.aqueue(self.sigs[0].task.queue)
        return await q._x.run(self._plan(q._x.minter))


# --------------------------------------------------------------------------- chord


@dataclass(frozen=True)
class Chord:
    """A group, then a callback given the members' values (a list, in the group's order) as
    its first argument: a flow whose root is the callback (``app.chord`` or
    ``group | callback``). A member's death fails the callback, unless the member was given
    ``.options(fail_parent=False)``: its value is then ``None``."""

    group: Group
    callback: Signature

    def __post_init__(self) -> None:
        if not isinstance(self.group, Group):
            raise InvalidArgument(f"a chord's header is a group (app.group), got {self.group!r}")
        cb = _sig(self.callback, "a chord's callback")
        if not cb.immutable:
            _binds(cb, True, "the chord's callback")
        _slots((*self.group.sigs, cb))

    def __or__(self, other: object) -> Chain:
        return pipe(self, other)

    def _node(self, ids: Sequence[str], keep_ms: int) -> _compose.FlowJob:
        """The chord's flow node; ``ids``: the members' then the callback's."""
        members = [
            _compose.FlowJob(
                _payload(s, _opts(s, keep_ms, None)),
                id=jid,
                queue=s.task.queue,
                group=s.group,
                fail_parent=s.fail_parent,
                priority=_priority_of(s),
            )
            for s, jid in zip(self.group.sigs, ids, strict=False)
        ]
        cb = self.callback
        prev = None if cb.immutable else list(ids[: len(self.group.sigs)])
        return _compose.FlowJob(
            _payload(cb, _opts(cb, keep_ms, prev)),
            id=ids[len(self.group.sigs)],
            queue=cb.task.queue,
            group=cb.group,
            fail_parent=cb.fail_parent,
            children=members,
            priority=_priority_of(cb),
        )

    def _sigs(self) -> list[Signature]:
        return [*self.group.sigs, self.callback]

    def enqueue(self) -> ChordReceipt:
        """Add the chord (one script call when every job is on one queue)."""
        head = Chain(self.group.app, (self,), self.group.keep_result_ms).enqueue().head
        assert head is not None
        return head

    async def aenqueue(self) -> ChordReceipt:
        """``enqueue`` for asyncio code."""
        head = (await Chain(self.group.app, (self,), self.group.keep_result_ms).aenqueue()).head
        assert head is not None
        return head


# --------------------------------------------------------------------------- chain

Step = Signature | Chord


def pipe(left: object, right: object) -> Chain:
    """``left | right`` for signatures, chains and chords: one chain of both. A group after
    a step has no place in a tree (its members would each need the step as their child):
    :class:`InvalidArgument`."""
    lsteps = _steps_of(left, "the left of |")
    rsteps = _steps_of(right, "the right of |")
    app = lsteps[0].task.app if isinstance(lsteps[0], Signature) else lsteps[0].group.app
    keep = DEFAULT_KEEP_MS
    if isinstance(left, Chain):
        keep = left.keep_result_ms
    elif isinstance(left, Chord):
        keep = left.group.keep_result_ms
    return Chain(app, (*lsteps, *rsteps), keep)


def _steps_of(x: object, where: str) -> tuple[Step, ...]:
    if isinstance(x, Chain):
        return x.steps
    if isinstance(x, (Signature, Chord)):
        return (x,)
    if isinstance(x, Group):
        raise InvalidArgument(
            f"a group on {where} of a chain: a group can only come first, followed by its "
            "callback (group | callback, a chord)"
        )
    raise InvalidArgument(f"{where} must be a task signature, a chain or a chord, got {x!r}")


@dataclass(frozen=True)
class Chain:
    """Steps run one after another, each given the previous step's value as its first
    argument (``task.si(...)``: a step that takes none). ``app.chain(a.s(1), b.s())`` or
    ``a.s(1) | b.s()``; ``enqueue()`` answers a :class:`ChainReceipt`. A chord may be the
    first step. At most ``MAX_FLOW_DEPTH`` (8) levels: a chord counts two."""

    app: HostApp
    steps: tuple[Step, ...]
    keep_result_ms: int = DEFAULT_KEEP_MS

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", _sequence(self.steps, "a chain"))
        _keep(self.keep_result_ms)
        levels = 0
        for i, step in enumerate(self.steps):
            if isinstance(step, Chord):
                if i:
                    raise InvalidArgument(
                        f"chain step {i} is a chord: a chord can only be a chain's first step"
                    )
                levels += 2
                continue
            sig = _sig(step, "a chain")
            if sig.task.app is not self.app:
                raise InvalidArgument(f"chain step {i}: its task belongs to another App")
            if not sig.fail_parent:
                raise InvalidArgument(
                    f"chain step {i}: fail_parent=False has no meaning in a chain (a failed "
                    "step always stops it)"
                )
            _binds(sig, bool(i) and not sig.immutable, f"chain step {i}")
            levels += 1
        if levels > _compose.MAX_FLOW_DEPTH:
            raise InvalidArgument(
                f"a chain is at most {_compose.MAX_FLOW_DEPTH} levels deep (a chord counts "
                f"two), this one is {levels}"
            )
        _slots(self._sigs())

    def __or__(self, other: object) -> Chain:
        return pipe(self, other)

    def _sigs(self) -> list[Signature]:
        out: list[Signature] = []
        for step in self.steps:
            out += step._sigs() if isinstance(step, Chord) else [step]
        return out

    def _tree(self, ids: list[str]) -> _compose.FlowJob:
        """The nested flow, built bottom-up: the first step is the deepest leaf."""
        keep = self.keep_result_ms
        at = 0
        node: _compose.FlowJob | None = None
        for step in self.steps:
            if isinstance(step, Chord):
                width = len(step.group.sigs) + 1
                node = step._node(ids[at : at + width], keep)
                at += width
                continue
            prev = None if node is None or step.immutable else 1
            node = _compose.FlowJob(
                _payload(step, _opts(step, keep, prev)),
                id=ids[at],
                queue=step.task.queue,
                group=step.group,
                children=[] if node is None else [node],
                priority=_priority_of(step),
            )
            at += 1
        assert node is not None
        return node

    def _plan(self, minter: _ids.Minter | None) -> Plan[ChainReceipt]:
        sigs = self._sigs()
        slots = _slots(sigs)
        placeholder = [f"?{i}" for i in range(len(sigs))]
        self._tree(placeholder)  # BadArguments (unserializable) before any write
        ids = yield from _minted(slots, minter)
        root = self._tree(ids)
        last = sigs[-1].task.queue
        yield from _compose.add_flow(_keys(self.app, last), root, minter)
        return self._receipt(ids)

    def _receipt(self, ids: list[str]) -> ChainReceipt:
        head: ChordReceipt | None = None
        step_ids: list[str] = []
        queues: list[str] = []
        at = 0
        for step in self.steps:
            if isinstance(step, Chord):
                n = len(step.group.sigs)
                members = GroupReceipt(
                    self.app, ids[at : at + n], [s.task.queue for s in step.group.sigs]
                )
                head = ChordReceipt(self.app, ids[at + n], step.callback.task.queue, members)
                step_ids.append(ids[at + n])
                queues.append(step.callback.task.queue)
                at += n + 1
                continue
            step_ids.append(ids[at])
            queues.append(step.task.queue)
            at += 1
        return ChainReceipt(self.app, step_ids, queues, head)

    def enqueue(self) -> ChainReceipt:
        """Add the chain: one script call when every step is on one queue, else one per step
        and queue, parents (the later steps) first; see docs/guides/workflows.md."""
        q = self.app.queue(self._sigs()[-1].task.queue)
        return q._x.run(self._plan(q._x.minter))

    async def aenqueue(self) -> ChainReceipt:
        """``enqueue`` for asyncio code."""
        q = self.app.aqueue(self._sigs()[-1].task.queue)
        return await q._x.run(self._plan(q._x.minter))
