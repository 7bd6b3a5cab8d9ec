"""Sans-I/O flows (D18) and the pump (promote, repeats, flow outbox).

Sans-I/O calls that compose jobs: flows (D18) -- a parent that runs after its children,
on one queue or across queues --, and the pump (``beat``/``pump``: promote, fire due repeats,
deliver the flow outbox). The repeat verbs (D19) live in ``protocol.repeats`` and are re-exported
here, so ``protocol.compose`` stays the one name for both.

Like :mod:`echomq.protocol.calls`, every function validates first and returns a :class:`Call` or a
plan; nothing here touches the network, so bad input raises before any write.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from echomq import ids, keyspace
from echomq.errors import EchoMQError, InvalidArgument, StateError
from echomq.protocol.kernel import (
    Arg,
    Call,
    Keys,
    Plan,
    Replay,
    _call,
    _cmd,
    _group,
    _int,
    _int_reply,
    _payload,
    _priority,
    _s,
)
from echomq.protocol.produce import _REMINT_TRIES, mint
from echomq.protocol.repeats import (
    Repeat,
    _fire,
    cron_next,
    fire_due,
    occurrence_id,
    pause_repeat,
    repeat,
    repeats,
    resume_repeat,
    schedule,
    unrepeat,
)

__all__ = [
    "FlowAdded",
    "FlowJob",
    "Repeat",
    "add_flow",
    "beat",
    "deliver",
    "children_values",
    "dependencies",
    "ignored_failures",
    "pump",
    "cron_next",
    "fire_due",
    "occurrence_id",
    "pause_repeat",
    "repeat",
    "repeats",
    "resume_repeat",
    "schedule",
    "trim",
    "unrepeat",
]


# --------------------------------------------------------------------------- flows (D18)

MAX_FLOW_DEPTH = 8


@dataclass(frozen=True)
class FlowJob:
    """One node of a flow: its payload, an optional id (minted when None), the queue (None:
    its parent's), a lane, whether its death fails the parent (else it is recorded in the
    parent's ``ignored_failures`` and counts as settled), and its children."""

    payload: bytes | str
    id: str | None = None
    queue: str | None = None
    group: str | None = None
    fail_parent: bool = True
    children: Sequence[FlowJob] = ()
    priority: int = 0

    def __init__(
        self,
        payload: bytes | str,
        *,
        id: str | None = None,
        queue: str | None = None,
        group: str | None = None,
        fail_parent: bool = True,
        children: Sequence[FlowJob] = (),
        priority: int = 0,
    ) -> None:
        for name, value in (
            ("payload", payload),
            ("id", id),
            ("queue", queue),
            ("group", group),
            ("fail_parent", fail_parent),
            # A bad value is kept as given: add_flow refuses it with InvalidArgument.
            ("children", tuple(children) if isinstance(children, (list, tuple)) else children),
            ("priority", priority),
        ):
            object.__setattr__(self, name, value)


@dataclass(frozen=True, slots=True)
class FlowAdded:
    """The receipt of ``add_flow``: the root's id and its direct children's, in order."""

    parent_id: str
    child_ids: list[str]


@dataclass(frozen=True, slots=True)
class _Node:
    id: str
    payload: bytes
    group: str
    parent: str
    policy: str
    kids: int
    queue: str
    parent_queue: str
    depth: int
    priority: int


def _flow_nodes(k: Keys, root: object) -> list[_Node]:
    """The tree flattened parents-first, every node validated, the depth and repeated ids (a
    cycle) checked, before any I/O."""
    if not isinstance(root, FlowJob):
        raise InvalidArgument(f"add_flow takes a FlowJob, got {type(root).__name__}")
    out: list[_Node] = []
    seen: set[str] = set()
    # Iterative walk (no recursion limit on a hostile tree): (node, parent id, its queue, depth).
    stack: list[tuple[object, str, str, int]] = [(root, "", k.name, 1)]
    while stack:
        node, parent, parent_queue, depth = stack.pop()
        if not isinstance(node, FlowJob):
            raise InvalidArgument(f"flow children must be FlowJob, got {type(node).__name__}")
        if depth > MAX_FLOW_DEPTH:
            raise InvalidArgument(f"a flow nests at most {MAX_FLOW_DEPTH} levels")
        queue = parent_queue if node.queue is None else keyspace.check_queue(node.queue)
        if not isinstance(node.fail_parent, bool):
            raise InvalidArgument("fail_parent must be a bool")
        # A node without an id gets a placeholder until the tree is checked: ids are minted
        # after (minting may take a node lease, a write), so bad input writes nothing.
        jid = f"?{len(out)}" if node.id is None else keyspace.check_id(node.id)
        if jid in seen:
            raise InvalidArgument(f"flow cycle: {jid} appears twice in the tree")
        seen.add(jid)
        kids = list(_iterable_children(node.children))
        out.append(
            _Node(
                jid,
                _payload(node.payload, k.max_payload),
                _group(node.group),
                parent,
                "fp" if node.fail_parent else "id",
                len(kids),
                queue,
                parent_queue if parent and parent_queue != queue else "",
                depth,
                _priority(node.priority),
            )
        )
        stack.extend((c, jid, queue, depth + 1) for c in reversed(kids))
    return out


def _iterable_children(children: object) -> Sequence[object]:
    if isinstance(children, (str, bytes)) or not isinstance(children, (list, tuple)):
        raise InvalidArgument("children must be a list or tuple of FlowJob")
    return children


def add_flow(k: Keys, root: FlowJob, minter: ids.Minter | None = None) -> Plan[FlowAdded]:
    """Add a flow tree. All on one queue: one script call, all or nothing. Across queues:
    parents first, one call per (depth, queue); a call refused part-way leaves the parents
    already written held (``awaiting_children``), never claimable. An id minted here that
    another job already holds (a collision, never the caller's doing) is minted again and
    the call resent; an id the caller named that exists is its ``StateError``."""
    nodes = _flow_nodes(k, root)
    if len(nodes) > 100_000:
        raise InvalidArgument("a flow holds at most 100000 jobs")
    # The minted ids, for the placeholders _flow_nodes left (see mint, ids.Minter).
    named: dict[str, str] = {}
    for n in nodes:
        if n.id.startswith("?"):
            named[n.id] = yield from mint(minter)
    groups: dict[tuple[int, str], list[_Node]] = {}
    # One script for a tree that stays on this queue; else one per depth and queue. Decided
    # once: inside the loop it made a 10,000-child fan-out quadratic (10^8 comparisons).
    one_queue = all(m.queue == k.name for m in nodes)
    for n in nodes:
        key = (0, n.queue) if one_queue else (n.depth, n.queue)
        groups.setdefault(key, []).append(n)
    # The flow's mark, one per add_flow and the same in each of its calls: every node carries
    # it (row field `flow`), and a child counts only toward a parent row with its mark, so a
    # parent id re-used for a new flow never takes an old child's settle (PROTOCOL §2.4).
    mark = (yield from mint(minter))[3:]
    for (_, queue), members in sorted(groups.items(), key=lambda kv: kv[0][0]):
        # A node that carries the mark (a parent, or a child): how a resend tells whether
        # the call it lost landed. A lone root carries none (see below).
        probe = next((n for n in members if n.parent or n.kids), None)
        for _ in range(_REMINT_TRIES):
            args: list[Arg] = [keyspace.base(queue), len(members), mark]
            for n in members:
                args += (
                    named.get(n.id, n.id),
                    n.payload,
                    n.group,
                    named.get(n.parent, n.parent),
                    n.policy,
                    n.kids,
                    n.parent_queue,
                    n.priority,
                )
            call = _call("flow_add", (keyspace.queue_key(queue, "meta"),), tuple(args), _s)
            probe_key = (
                keyspace.queue_key(queue, "job:" + named.get(probe.id, probe.id))
                if probe is not None
                else None
            )
            reply, lost = yield from _flow_call(call, probe_key, mark)
            if reply is None:
                break
            taken = _taken(reply)
            ours = [p for p, jid in named.items() if jid == taken]
            if not ours:
                raise reply  # an id the caller named exists: the caller's StateError
            if lost and probe_key is None:
                # A lone root whose first copy's reply was lost: its minted id is unique
                # (D2, a leased node), so "exists" is that first copy, landed.
                break
            # A minted id another job holds: nothing of this call was written (flow_add
            # checks every node first); mint it anew (its children's parent id with it).
            named[ours[0]] = yield from mint(minter)
        else:  # pragma: no cover - 8 collisions in a row
            raise EchoMQError("could not mint fresh flow job ids")
    root_id = named.get(nodes[0].id, nodes[0].id)
    child_ids = [named.get(n.id, n.id) for n in nodes if n.parent == nodes[0].id]
    return FlowAdded(root_id, child_ids)


def _taken(reply: BaseException) -> str | None:
    """The id a flow_add refusal names (``EMQSTATE exists <id>``), else None."""
    if isinstance(reply, StateError):
        words = str(getattr(reply, "reason", "") or reply).split()
        if len(words) >= 2 and words[-2] == "exists":
            return words[-1]
    return None


def _flow_call(
    call: Call[Any], probe: str | None, mark: str
) -> Plan[tuple[BaseException | None, bool]]:
    """One flow_add call, ridden through a lost reply (issue 37): the call is all or
    nothing, so after a lost reply its probe node's row says whether it landed (the row
    carries this add_flow's mark) or not (the call is sent again). Answers the refusal (or
    None) and whether a reply was lost on the way. The outage is bounded by ``retry_for``
    (the executor gives up past it)."""
    lost = False
    while True:
        try:
            (reply,) = yield [call]  # a list: a refusal comes back as a value, not raised
        except Replay:
            reply = None
        else:
            if not isinstance(reply, Replay):
                return (reply if isinstance(reply, BaseException) else None), lost
        lost = True
        while probe is not None:
            try:
                seen = yield _cmd(("HGET", probe, "flow"), lambda r: _s(r) if r else "")
            except Replay:
                continue
            if seen == mark:
                return None, lost  # the lost reply's call landed: the flow is in, once
            break


def _hash(reply: Any) -> dict[str, bytes]:
    if isinstance(reply, dict):
        return {_s(a): b for a, b in reply.items()}
    return {_s(a): b for a, b in zip(reply[::2], reply[1::2], strict=True)}


def children_values(k: Keys, parent_id: str) -> Call[dict[str, bytes]]:
    """The results of the parent's completed children, by child id."""
    return _cmd(("HGETALL", k.job(parent_id) + ":processed"), _hash)


def ignored_failures(k: Keys, parent_id: str) -> Call[dict[str, str]]:
    """The errors of the parent's children that died with ``fail_parent=False``."""
    return _cmd(
        ("HGETALL", k.job(parent_id) + ":unsuccessful"),
        lambda r: {a: _s(b) for a, b in _hash(r).items()},
    )


def dependencies(k: Keys, parent_id: str) -> Call[int]:
    """How many of the parent's children have not settled yet (0 once it is released)."""
    return _cmd(("GET", k.job(parent_id) + ":deps"), lambda r: int(r) if r is not None else 0)


_OUTBOX_FAIL = b"\0fail\0"


def _parse_entry(entry: bytes) -> tuple[str, str, str, str, str, bytes, str] | None:
    """(parent queue, kind, parent id, child id, policy, value, flow mark) of an outbox
    entry, or None when it is malformed. The parent field is the parent's id, then ``:`` and
    the child's flow mark (none in an entry written before marks existed: mark '')."""
    try:
        if entry.startswith(_OUTBOX_FAIL):
            pq, pid, cid, policy, value = entry[len(_OUTBOX_FAIL) :].split(b"\0", 4)
            kind = "fail"
        else:
            pq, pid, cid, value = entry.split(b"\0", 3)
            kind, policy = "done", b""
        parent_queue = keyspace.check_queue(pq.decode())
        parent, _, mark = pid.decode().partition(":")
        return (
            parent_queue,
            kind,
            keyspace.check_id(parent),
            keyspace.check_id(cid.decode()),
            policy.decode(),
            value,
            mark,
        )
    except (ValueError, UnicodeDecodeError):
        return None


def deliver(k: Keys, entries: Sequence[bytes]) -> Plan[int]:
    """Deliver outbox entries (read from the head of ``k``'s outbox) to their parents'
    queues, in order, then trim what was delivered (deliver-before-remove: a crash in between
    delivers again, harmlessly). A malformed entry stops the delivery there and stays: it is
    never dropped (``check`` and the operator see it)."""
    done: list[bytes] = []
    for entry in entries:
        parsed = _parse_entry(entry)
        if parsed is None:
            break
        pq, kind, pid, cid, policy, value, mark = parsed
        yield _call(
            "flow_deliver",
            (keyspace.job_key(pq, pid),),
            (keyspace.base(pq), kind, pid, cid, policy, value, mark),
            _int_reply,
        )
        done.append(entry)
    if not done:
        return 0
    yield trim(k, done)
    return len(done)


def trim(k: Keys, delivered: Sequence[bytes]) -> Call[int]:
    """Remove delivered entries from the head of ``k``'s outbox (see ``flow_trim.lua``)."""
    return _call("flow_trim", (k.base + "flow:outbox",), tuple(delivered), _int_reply)


def beat(k: Keys, limit: int = 100) -> Plan[int]:
    """The worker beat's share (D18/D19): fire due repeats and deliver the flow outbox; one
    server call when there is nothing to do. Returns fired + delivered."""
    fired, outbox = yield from _fire(k, limit, _int("limit", limit, 1, 100_000))
    delivered = (yield from deliver(k, outbox)) if outbox else 0
    return fired + delivered


def pump(k: Keys, limit: int = 100) -> Plan[int]:
    """One pump pass: promote due scheduled jobs, fire due repeats, deliver the flow outbox.
    Returns promoted + fired + delivered."""
    from echomq.protocol import calls as _protocol

    promoted: int = yield _protocol.promote(k, limit)
    more: int = yield from beat(k, limit)
    return promoted + more
