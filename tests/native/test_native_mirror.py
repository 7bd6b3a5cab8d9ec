"""The C module mirrors the scripts file for file (native/README.md: X.lua <-> X.c).

``native/X.c`` mirrors ``lua/include/X.lua`` and ``native/cmd_Y.c`` mirrors ``lua/Y.lua``;
the frame (``FRAME``) mirrors none. A C function whose Lua twin exists (the same name, less
the ``emq_`` prefix: ``emq_keep_outcome`` <-> ``keep_outcome``; a static helper may carry the
Lua name itself) is defined in the C file that mirrors the Lua file its twin is defined in, so
a reader finds each twin by its file and the C files import one another in the order the Lua
includes do: no circle among them (checked here on the calls between C files and on the
headers' includes). Everything is read from the files; nothing is listed by hand but the
frame."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "native"
LUA = ROOT / "src" / "echomq" / "lua"

# The module's frame: the EVAL-like command frame, values and key API (emq.c) and the module
# entry point (trafikey.c). Their emq_ functions are the runtime every twin is written on.
FRAME = {"emq.c", "trafikey.c"}

_COMMENTS = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
# A function definition at the start of a line: its return type, its name, its parameters, {.
_C_DEF = re.compile(
    r"^(static\s+)?[A-Za-z_][\w \t\*]*?\b([A-Za-z_]\w*)\s*\(([^;{}()]*)\)\s*\{", re.M
)
_LUA_DEF = re.compile(r"^\s*(?:local\s+)?function\s+([A-Za-z_]\w*)\s*\(", re.M)
_CALL = re.compile(r"\b(emq_\w+)\s*\(")
_INCLUDE = re.compile(r'^#include "([^"]+)"', re.M)


def c_source(path: Path) -> str:
    return _COMMENTS.sub("", path.read_text())


def c_functions(text: str) -> dict[str, bool]:
    """The functions a C file defines: name -> whether it is static."""
    keywords = {"if", "while", "for", "switch", "return", "sizeof"}
    return {m[2]: bool(m[1]) for m in _C_DEF.finditer(text) if m[2] not in keywords}


def lua_homes() -> dict[str, set[str]]:
    """Each Lua function name -> the Lua files (relative to lua/) that define it."""
    homes: dict[str, set[str]] = {}
    for path in sorted(LUA.glob("*.lua")) + sorted((LUA / "include").glob("*.lua")):
        for name in _LUA_DEF.findall(path.read_text()):
            homes.setdefault(name, set()).add(str(path.relative_to(LUA)))
    return homes


def mirror_of(c_file: str) -> str | None:
    """The Lua file a C file mirrors (relative to lua/), None for the frame."""
    stem = c_file.removesuffix(".c")
    if stem.startswith("cmd_"):
        return f"{stem.removeprefix('cmd_')}.lua"
    return f"include/{stem}.lua"


def away_from_home(sources: dict[str, str], homes: dict[str, set[str]]) -> list[str]:
    """Every C function defined outside the mirror of its Lua twin's file."""
    out = []
    for c_file, text in sorted(sources.items()):
        if c_file in FRAME:
            continue
        mirror = mirror_of(c_file)
        for name in sorted(c_functions(text)):
            twin = name.removeprefix("emq_")
            if twin in homes and mirror not in homes[twin]:
                out.append(f"{c_file}: {name} (its twin {twin} is in {sorted(homes[twin])})")
    return out


def call_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """C file -> the C files whose (non-static) functions it calls."""
    owner = {
        name: c_file
        for c_file, text in sources.items()
        for name, static in c_functions(text).items()
        if not static
    }
    return {
        c_file: {owner[n] for n in _CALL.findall(text) if n in owner} - {c_file}
        for c_file, text in sources.items()
    }


def include_graph() -> dict[str, set[str]]:
    files = sorted(NATIVE.glob("*.c")) + sorted(NATIVE.glob("*.h"))
    graph: dict[str, set[str]] = {}
    for path in files:
        # X.c and X.h are one unit: an edge to X.h is an edge to X.
        unit = path.stem
        graph.setdefault(unit, set()).update(
            Path(h).stem for h in _INCLUDE.findall(path.read_text()) if Path(h).stem != unit
        )
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a path (first == last), or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        path.append(v)
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                return [*path[path.index(w) :], w]
            if w not in state and (found := visit(w)) is not None:
                return found
        state[v] = 2
        path.pop()
        return None

    for v in sorted(graph):
        if v not in state and (found := visit(v)) is not None:
            return found
    return None


def sources() -> dict[str, str]:
    return {p.name: c_source(p) for p in sorted(NATIVE.glob("*.c"))}


def test_every_c_file_mirrors_a_lua_file_or_is_the_frame() -> None:
    missing = {
        c: mirror_of(c)
        for c in sources()
        if c not in FRAME and not (LUA / str(mirror_of(c))).exists()
    }
    assert not missing, f"C files whose Lua mirror does not exist: {missing}"


def test_every_twin_is_in_its_lua_homes_mirror() -> None:
    found = away_from_home(sources(), lua_homes())
    assert not found, "C twins outside their Lua home's mirror:\n" + "\n".join(found)


def test_the_pairs_are_found() -> None:
    """The reading sees the twins it is about (so an empty answer above means something)."""
    defined = {c: c_functions(t) for c, t in sources().items()}
    assert "emq_keep_outcome" in defined["control.c"]
    assert "emq_claim_gate" in defined["common.c"]
    assert defined["lease.c"]["turn_room"] is True  # a static twin, by its Lua name
    homes = lua_homes()
    assert homes["keep_outcome"] == {"include/control.lua"}
    assert mirror_of("cmd_sweep_stalled.c") == "sweep_stalled.lua"
    paired = sum(
        1
        for c, names in defined.items()
        if c not in FRAME
        for n in names
        if n.removeprefix("emq_") in homes
    )
    assert paired >= 60


def test_no_circle_among_the_c_files() -> None:
    assert cycle(call_graph(sources())) is None, cycle(call_graph(sources()))
    assert cycle(include_graph()) is None, cycle(include_graph())


def test_the_checks_see_planted_faults() -> None:
    """A twin planted in the wrong file and a planted circle are both found."""
    planted = dict(sources())
    planted["settle.c"] += "\nvoid emq_keep_death(emq *e) {\n}\n"
    assert any("settle.c: emq_keep_death" in line for line in away_from_home(planted, lua_homes()))
    planted["control.c"] += "\nvoid f(emq *e) { emq_complete_one(e); }\n"
    graph = call_graph(planted)
    assert "settle.c" in graph["control.c"]
    found = cycle(graph)
    assert found is not None and "control.c" in found and "settle.c" in found
