"""The package's import graph: which module imports which, read from the source with ``ast``
(an import under ``if TYPE_CHECKING:`` is for the type checker alone and is not counted; one
inside a function is counted: it is a dependency all the same, only a later one).

No import cycle may appear. ``KNOWN`` lists the cycles left to break; it is empty since the
protocol kernel (``_kernel``) took what ``_protocol`` and ``_control`` both need. The test
also fails when a listed cycle is gone, so the list only ever shrinks."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "echomq"

# Each known cycle as the sorted tuple of its modules (one strongly connected component).
KNOWN: set[tuple[str, ...]] = set()


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, modules: set[str]) -> set[str]:
    found: set[str] = set()
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        stack.extend(ast.iter_child_nodes(node))
    return {name for name in found if name in modules}


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    graph = {}
    for path in paths:
        name = _module_name(path)
        # A package's __init__ is imported by each of its modules; it is not their dependency.
        graph[name] = _imports(ast.parse(path.read_text()), modules) - {name, "echomq"}
    return graph


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
        for w in graph.get(v, ()):
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


def test_no_import_cycle_beyond_the_known_ones() -> None:
    found = cycles(import_graph())
    assert found - KNOWN == set(), f"a new import cycle: {found - KNOWN}"
    assert KNOWN - found == set(), f"a known cycle is gone: drop it from KNOWN: {KNOWN - found}"


def test_the_cycle_finder_sees_a_planted_cycle() -> None:
    graph = import_graph()
    graph["echomq.ids"] = graph["echomq.ids"] | {"echomq.worker"}
    assert any("echomq.ids" in c and "echomq.worker" in c for c in cycles(graph))
    assert cycles({"a": {"b"}, "b": set()}) == set()
