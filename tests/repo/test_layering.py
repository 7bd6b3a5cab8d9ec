"""The package's layering, read from the source with ``ast``: which module imports which.

Every import is an edge: at module level, inside a function (a later dependency, still one)
and under ``if TYPE_CHECKING:`` (the type checker's import is a dependency of the design: a
runtime module that names ``App`` in an annotation depends on the application layer). The
picture must have no circle, every module sits in a room by role, and an edge may only go
down the rooms:

    ops      -> app, runtime, face, client, protocol     (cli/, web/, prometheus, console...)
    app      -> face, client, protocol                   (App, Task, workflows)
    runtime  -> face, client, protocol                   (the worker and what it runs)
    face     -> client, protocol                         (what app and runtime share: the
                                                          Protocols of _appface, a job's
                                                          context, outcomes, hooks, backoff)
    client   -> protocol                                 (queues, executors, connections)
    protocol -> nothing above it                         (keys, ids, scripts, plans: sans-I/O)

A module in a folder by role (``protocol/``, ``client/``, ``tasks/``, ``runtime/``, ``ops/``)
sits in that folder's room (``FOLDERS``); a new module at the top of the package fails
``test_every_module_has_a_room`` until it is placed in ``ROOMS``.
``TYPE_CHECKING`` imports are counted: an annotation-only edge is where a circle hides, so
their number may only go down (``MAX_TYPE_CHECKING``).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "echomq"

PROTOCOL, CLIENT, FACE, APP, RUNTIME, OPS = "protocol", "client", "face", "app", "runtime", "ops"

# Which rooms a module of each room may import from (its own included).
ALLOWED: dict[str, set[str]] = {
    PROTOCOL: {PROTOCOL},
    CLIENT: {CLIENT, PROTOCOL},
    FACE: {FACE, CLIENT, PROTOCOL},
    APP: {APP, FACE, CLIENT, PROTOCOL},
    RUNTIME: {RUNTIME, FACE, CLIENT, PROTOCOL},
    OPS: {OPS, APP, RUNTIME, FACE, CLIENT, PROTOCOL},
}

# The folders by role: every module in one sits in the folder's room (one rule per folder, so
# a module added to a folder is placed by where it is).
FOLDERS: dict[str, str] = {
    "echomq.protocol": PROTOCOL,  # sans-I/O: scripts, the kernel, each verb as a Call/Plan
    "echomq.client": CLIENT,  # the I/O and the queues
    "echomq.tasks": APP,  # the application's objects: tasks, workflows, batches
    "echomq.runtime": RUNTIME,  # the worker and what it runs
    "echomq.ops": OPS,  # operating it: the console, snapshots, records, migrations
}

# The public modules at the top of the package (and the private _appface), each by role; a
# package's submodules are placed by its prefix (cli/, web/, contrib/).
ROOMS: dict[str, str] = {
    **FOLDERS,
    # the protocol: sans-I/O
    "echomq.ids": PROTOCOL,
    "echomq.keyspace": PROTOCOL,
    "echomq.errors": PROTOCOL,
    "echomq.serializers": PROTOCOL,
    # the client
    "echomq.queue": CLIENT,
    # what the application and the runtime share
    "echomq._appface": FACE,
    "echomq.context": FACE,
    "echomq.outcomes": FACE,
    "echomq.hooks": FACE,
    "echomq.backoff": FACE,
    # the application: declaring tasks and sending them
    "echomq.app": APP,
    # the runtime
    "echomq.worker": RUNTIME,
    # operating it
    "echomq.__main__": OPS,
    "echomq.cli": OPS,
    "echomq.web": OPS,
    "echomq.contrib": OPS,
    "echomq.prometheus": OPS,
    "echomq.otel": OPS,
    "echomq.events": OPS,
    "echomq.top": OPS,
    "echomq.demo": OPS,
    "echomq.server": OPS,
    "echomq.testing": OPS,
    "echomq.pytest_plugin": OPS,
}

# The annotation-only imports left, each deferred for a reason: _isolate and _pool are what an
# isolated run's child process imports first (it must start light); _health and _supervisor
# are loaded by `echomq worker -p N`'s parent, which runs no worker; otel and testing are
# loaded where the app already is. 10 on 2026-12-04 (18 before the runtime faces).
MAX_TYPE_CHECKING = 10


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported(node: ast.AST, package: str) -> set[str]:
    """The dotted names an import statement names (``from . import x`` resolved)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names}
    if not isinstance(node, ast.ImportFrom):
        return set()
    base = node.module or ""
    if node.level:
        parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        base = ".".join([*parts, *([node.module] if node.module else [])])
    return {base} | {f"{base}.{a.name}" for a in node.names}


def _imports(tree: ast.AST, package: str, modules: set[str]) -> tuple[set[str], set[str]]:
    """(every module imported, those imported only under ``if TYPE_CHECKING:``)."""
    found: set[str] = set()
    typing_only: set[str] = set()
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, under = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend((n, True) for n in node.body)
            stack.extend((n, under) for n in node.orelse)
            continue
        names = _imported(node, package)
        (typing_only if under else found).update(names)
        stack.extend((child, under) for child in ast.iter_child_nodes(node))
    found &= modules
    return found | (typing_only & modules), (typing_only & modules) - found


def _package_of(path: Path, name: str) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def import_graph() -> tuple[dict[str, set[str]], set[tuple[str, str]]]:
    """(module -> the modules it imports, the edges that are ``TYPE_CHECKING`` only)."""
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    graph: dict[str, set[str]] = {}
    typing_edges: set[tuple[str, str]] = set()
    for path in paths:
        name = _module_name(path)
        tree = ast.parse(path.read_text())
        found, typing_only = _imports(tree, _package_of(path, name), modules)
        # A package's __init__ is imported by each of its modules; it is not their dependency.
        graph[name] = found - {name, "echomq"}
        typing_edges |= {(name, m) for m in typing_only - {name, "echomq"}}
    return graph, typing_edges


def room_of(module: str) -> str | None:
    while module:
        if module in ROOMS:
            return ROOMS[module]
        module = module.rpartition(".")[0]
    return None


def cycles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: set[tuple[str, ...]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.add(tuple(sorted(component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def against_the_rooms(graph: dict[str, set[str]]) -> list[str]:
    """Every edge from a room to one it may not import, as 'a (room) -> b (room)'."""
    out = []
    for a in sorted(graph):
        for b in sorted(graph[a]):
            ra, rb = room_of(a), room_of(b)
            if ra is not None and rb is not None and rb not in ALLOWED[ra]:
                out.append(f"{a} ({ra}) -> {b} ({rb})")
    return out


def test_no_import_cycle() -> None:
    graph, _ = import_graph()
    found = cycles(graph)
    assert found == set(), "import cycles (TYPE_CHECKING imports included): " + "; ".join(
        " <-> ".join(c) for c in sorted(found)
    )


def test_every_module_has_a_room() -> None:
    graph, _ = import_graph()
    unplaced = sorted(m for m in graph if m != "echomq" and room_of(m) is None)
    assert not unplaced, (
        f"place each new module in a room by its role (ROOMS in {Path(__file__).name}): {unplaced}"
    )
    stale = sorted(m for m in ROOMS if m not in graph)
    assert not stale, f"ROOMS names modules that are gone: {stale}"


def test_imports_go_down_the_rooms() -> None:
    graph, _ = import_graph()
    wrong = against_the_rooms(graph)
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_type_checking_imports_are_counted() -> None:
    _, typing_edges = import_graph()
    listed = "\n".join(f"{a} -> {b}" for a, b in sorted(typing_edges))
    print(f"{len(typing_edges)} TYPE_CHECKING-only imports:\n{listed}")
    assert len(typing_edges) <= MAX_TYPE_CHECKING, (
        f"{len(typing_edges)} TYPE_CHECKING-only imports, at most {MAX_TYPE_CHECKING}:\n{listed}"
    )


def test_the_checks_see_planted_faults() -> None:
    """The checks can fail: a planted cycle, a planted upward edge, an unplaced module and a
    planted TYPE_CHECKING import are each found."""
    graph, _ = import_graph()
    graph["echomq.ids"] = graph["echomq.ids"] | {"echomq.worker"}
    assert any("echomq.ids" in c and "echomq.worker" in c for c in cycles(graph))
    assert cycles({"a": {"b"}, "b": set()}) == set()
    assert "echomq.ids (protocol) -> echomq.worker (runtime)" in against_the_rooms(graph)
    assert "echomq.runtime.runner (runtime) -> echomq.app (app)" in against_the_rooms(
        {"echomq.runtime.runner": {"echomq.app"}}
    )
    assert room_of("echomq.cli.work") == OPS and room_of("echomq.not_placed") is None
    assert room_of("echomq.runtime.not_yet_written") == RUNTIME  # placed by its folder
    assert room_of("echomq._not_placed") is None  # a private module at the top is not
    tree = ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from echomq.app import App\n"
        "def f():\n    from echomq.protocol import kernel\n"
    )
    modules = {"echomq.app", "echomq.protocol.kernel", "echomq"}
    found, typing_only = _imports(tree, "echomq", modules)
    assert found == {"echomq.app", "echomq.protocol.kernel"} and typing_only == {"echomq.app"}
