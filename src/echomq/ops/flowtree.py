"""Flow trees for the dashboard: a queue's flow parents and their children, bounded.

The console's flow view (issue 26): the flow parents that still count children, found by a
``SCAN`` of at most ``bound_keys`` keys (no index of parents exists), each with its
children's outcomes, the tree walked level by level to at most ``FLOW_TREE_BOUND`` jobs.
Jobs are previewed as the console's lists preview them (``ops.console``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from echomq.client.executor import SyncExecutor
from echomq.ops import snapshots as _inspect
from echomq.ops.console import _cut, one_line, preview
from echomq.protocol.kernel import Call, Keys, _cmd, _s
from echomq.serializers import Serializer

__all__ = ["FLOW_TREE_BOUND", "FlowChild", "FlowNode", "FlowsView", "flows"]


@dataclass
class FlowChild:
    """One child in a flow tree (issue 26): its id and state, its task, what its parent
    recorded of it (a result or an error, cut short), and its own children when it is an
    inner node. ``state`` is the row's (pending, scheduled, active, dead,
    awaiting_children...), or, once its row is gone, its parent's record: completed, failed,
    ignored; ``absent`` when neither knows it (removed), ``elsewhere`` for an id re-admitted
    since under another parent."""

    id: str
    state: str
    task: str | None = None
    detail: str = ""
    children: list[FlowChild] = field(default_factory=list)
    waiting: int | None = None  # an inner node's children not settled yet (its `deps`)


@dataclass
class FlowNode:
    """A flow parent and its children's states, as far as the parent's keys know them: the
    settled children by id (completed, failed, ignored) and how many have not settled; and
    the tree of its same-queue children (the row field ``kids``, which ``remove`` walks),
    settled or not, down to the leaves."""

    id: str
    state: str  # the parent's place: awaiting_children, pending, active... or absent
    task: str | None
    waiting: int  # children not settled yet (the parent's `deps` counter)
    children: int | None  # how many it was added with (the row's `children`)
    settled: list[tuple[str, str, str]] = field(default_factory=list)  # (id, state, detail)
    tree: list[FlowChild] = field(default_factory=list)  # its same-queue children (kids)
    elsewhere: int = 0  # children on other queues (not in `kids`): recorded or counted only
    # A batch's anchor (issue 42): open | closed | success | complete, and its description;
    # `waiting` then counts its members only (not the open batch's hold).
    batch: str | None = None
    about: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class FlowsView:
    parents: list[FlowNode]
    scanned: int  # keys the SCAN visited
    keyspace: int  # keys in the database (DBSIZE), for the "searched N of M" note
    complete: bool


def flows(
    x: SyncExecutor,
    client: Any,
    k: Keys,
    *,
    serializer: Serializer | None = None,
    bound_keys: int = 50_000,
    limit: int = 50,
) -> FlowsView:
    """The queue's flow parents that still count children (their ``job:<id>:deps`` key),
    found by a ``SCAN`` of at most about ``bound_keys`` keys (no index of parents exists),
    each with its children's outcomes."""
    pattern = k.base + "job:*:deps"
    parents: list[str] = []
    scanned = 0
    cursor: Any = 0
    done = False
    while scanned < bound_keys and len(parents) < limit:
        cursor, keys = client.scan(cursor=cursor, match=pattern, count=1000)
        scanned += 1000
        parents += [_s(key)[len(k.base) + 4 : -5] for key in keys]
        if not cursor:
            done = True
            break
    parents = sorted(set(parents))[:limit]
    size = int(client.dbsize())
    nodes = _flow_nodes(x, k, parents, serializer)
    return FlowsView(nodes, min(scanned, size) if done else scanned, size, done)


def _flow_nodes(
    x: SyncExecutor, k: Keys, parents: list[str], serializer: Serializer | None
) -> list[FlowNode]:
    calls: list[Call[Any]] = []
    for pid in parents:
        jk = k.job(pid)
        calls += [
            _cmd(("HMGET", jk, "state", "payload", "children", "kids", "batch", "about"), list),
            _cmd(("GET", jk + ":deps"), lambda r: r),
            *_records(jk),
        ]
    replies = [_inspect._raise(r) for r in x.pipeline(calls)] if calls else []
    out = []
    for i, pid in enumerate(parents):
        (state, payload, children, kids, batch, about), deps, done, failed, ignored = replies[
            i * 5 : i * 5 + 5
        ]
        task, _args = preview(serializer, payload)
        node = FlowNode(
            pid,
            _s(state) if state is not None else "absent",
            task,
            int(_s(deps)) if deps is not None else 0,
            int(_s(children)) if children is not None else None,
        )
        if batch is not None:
            node.batch, node.about = _s(batch), _s(about) if about else None
            node.waiting = max(0, node.waiting - (node.batch == "open"))
            node.children = None  # members are added over time: no count to compare
        node.settled += [(c, "completed", _cut(v, 60)) for c, v in sorted(done.items())]
        node.settled += [(c, "failed", one_line(v, 60)) for c, v in sorted(failed.items())]
        node.settled += [(c, "ignored", one_line(v, 60)) for c, v in sorted(ignored.items())]
        node.tree = _kids(x, k, pid, _s(kids) if kids else "", node.settled, serializer)
        if node.children is not None:
            node.elsewhere = max(0, node.children - len(node.tree))
        out.append(node)
    # A parent shown inside another's tree is not listed again at the top.
    inner = {c.id for n in out for c in _walk(n.tree)}
    return [n for n in out if n.id not in inner]


# At most this many children are read per flows view (a tree is at most 8 deep, D18, but
# as wide as its add_flow call made it).
FLOW_TREE_BOUND = 2000


def _records(jk: str) -> list[Call[Any]]:
    """A parent's records of its settled children: processed, failed, unsuccessful."""
    return [_cmd(("HGETALL", jk + ":" + h), _inspect._hash) for h in _RECORDS]


_RECORDS = ("processed", "failed", "unsuccessful")


def _walk(tree: list[FlowChild]) -> Iterable[FlowChild]:
    for c in tree:
        yield c
        yield from _walk(c.children)


def _split_kids(kids: str) -> list[str]:
    """The ids in a row's ``kids`` field: 14 bytes each, concatenated (flow_add.lua)."""
    return [kids[i : i + 14] for i in range(0, len(kids) - 13, 14)]


def _kids(
    x: SyncExecutor,
    k: Keys,
    pid: str,
    kids: str,
    settled: list[tuple[str, str, str]],
    serializer: Serializer | None,
) -> list[FlowChild]:
    """The tree of ``pid``'s same-queue children, level by level (one pipeline a level): each
    child's row gives its state and task, a settled child's (row gone) comes from its
    parent's records, and an inner child's own ``kids`` and records give the next level."""
    top: list[FlowChild] = []
    level = [(pid, top, _split_kids(kids), {c: (st, d) for c, st, d in settled})]
    read = 0
    while level and read < FLOW_TREE_BOUND:
        batch = [(p, into, kid, rec) for p, into, ids_, rec in level for kid in ids_][
            : FLOW_TREE_BOUND - read
        ]
        read += len(batch)
        calls: list[Call[Any]] = []
        for _p, _into, kid, _rec in batch:
            jk = k.job(kid)
            calls += [
                _cmd(("HMGET", jk, "state", "payload", "parent", "kids"), list),
                _cmd(("GET", jk + ":deps"), lambda r: r),
                *_records(jk),
            ]
        replies = [_inspect._raise(r) for r in x.pipeline(calls)] if calls else []
        level = []
        for j, (p, into, kid, rec) in enumerate(batch):
            (state, payload, parent, more), deps, done, failed, ignored = replies[j * 5 : j * 5 + 5]
            if state is not None and _s(parent or b"") != p:
                into.append(FlowChild(kid, "elsewhere"))  # the id lives again, not here
                continue
            if state is None:
                st, detail = rec.get(kid, ("absent", ""))
                into.append(FlowChild(kid, st, None, detail))
                continue
            task, _args = preview(serializer, payload)
            child = FlowChild(kid, _s(state), task, rec.get(kid, ("", ""))[1])
            if deps is not None:
                child.waiting = int(_s(deps))
            into.append(child)
            if more:
                mine = {c: ("completed", _cut(v, 60)) for c, v in done.items()}
                mine |= {c: ("failed", one_line(v, 60)) for c, v in failed.items()}
                mine |= {c: ("ignored", one_line(v, 60)) for c, v in ignored.items()}
                level.append((kid, child.children, _split_kids(_s(more)), mine))
    return top
