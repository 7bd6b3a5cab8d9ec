"""Every key suffix the Lua scripts, the C module and the keyspace docs spell is in the registry
(``keyspace.QUEUE_TYPES``, ``QUEUE_PREFIXES``, ``QUEUE_TAILS``; issue 23).

Spellings found: in Lua ``base .. 'xxx'`` (and ``.. ':xxx'`` after a job key), the header's
``KEYS[n] ... emq:{q}:xxx``; in C ``emq_key(e, "xxx")``, ``emq_key2(e, "xxx:", ...)``,
``EMQ_LIT(":xxx")`` / ``EMQ_LIT("xxx:")`` and the generated constants (``EMQ_K_*``), which
must be current (``scripts/gen-native --check``); in the docs, the ``p..xxx`` rows of the
keyspace tables. The scanners are tested on planted drift, so a suffix added in one place
only fails here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from echomq import keyspace

ROOT = Path(__file__).resolve().parents[2]
LUA = ROOT / "src" / "echomq" / "lua"
NATIVE = ROOT / "native"
DOCS = [ROOT / "docs" / "PROTOCOL.md", LUA / "README.md"]

TYPES = keyspace.QUEUE_TYPES
PREFIXES = keyspace.QUEUE_PREFIXES
TAILS = keyspace.QUEUE_TAILS


def registered_head(text: str, open_ended: bool) -> bool:
    """A suffix right after the base: a fixed type, a shaped prefix, or (when more is joined
    to it, ``'metrics:' .. kind``) the start of a registered type."""
    text = text.removesuffix("*")  # a SCAN/KEYS glob: 'job:*'
    if text in TYPES or text in PREFIXES:
        return True
    return open_ended and any(t.startswith(text) for t in TYPES | PREFIXES)


def registered_tail(text: str) -> bool:
    """What follows a job id, a lane or a joined part: a tail, or the end of a type."""
    return text in TAILS or any(t.endswith(text) for t in TYPES)


# --------------------------------------------------------------------------- scanners

_LUA_HEAD = re.compile(r"""\bbase\s*\.\.\s*(['"])([^'"]*)\1(\s*\.\.)?""")
_LUA_TAIL = re.compile(r"""\w\s*\.\.\s*(['"])(:[a-z_]+)\1""")
_KEYS_LINE = re.compile(r"^\s*KEYS\[\d+\].*?emq:\{q\}:(\S+)", re.M)
_PLACEHOLDER = re.compile(r"<[^>]*>")


def unregistered_lua(text: str) -> list[str]:
    bad = [
        m.group(2)
        for m in _LUA_HEAD.finditer(text)
        if not registered_head(m.group(2), bool(m.group(3)))
    ]
    bad += [m.group(2) for m in _LUA_TAIL.finditer(text) if not registered_tail(m.group(2))]
    for m in _KEYS_LINE.finditer(text):
        bad += unregistered_spelled(m.group(1))
    return bad


def unregistered_spelled(suffix: str) -> list[str]:
    """A documented suffix with placeholders: ``job:<id>:logs``, ``g:<lane>:pending``,
    ``recent:<replay_ms>:<second>:<nn>``: the part before the first placeholder is a type or
    a prefix, the part after the first one a tail (or nothing)."""
    suffix = suffix.strip("`").rstrip(",.;)")
    parts = _PLACEHOLDER.split(suffix)
    if len(parts) == 1:
        return [] if registered_head(suffix, False) else [suffix]
    bad = [] if parts[0] in PREFIXES else [parts[0]]
    rest = "".join(parts[1:])
    if parts[1] and not (registered_tail(parts[1]) or parts[0] == "recent:"):
        bad.append(rest)
    return bad


_C_KEY = re.compile(r'emq_key2?\(e,\s*"([^"]*)"')
_C_LIT = re.compile(r'EMQ_LIT\("(:[a-z_]+)"\)')
_C_BASE_LIT = re.compile(r'e->base,\s*EMQ_LIT\("([^"]*)"\)')
_C_CONST = re.compile(r"\bEMQ_K[PT]?_[A-Z0-9_]+\b")
_C_DEFINED = re.compile(r"^#define (EMQ_K[PT]?_[A-Z0-9_]+) ", re.M)


def unregistered_c(text: str, defined: set[str]) -> list[str]:
    bad = [s for s in _C_KEY.findall(text) if not registered_head(s, False)]
    bad += [s for s in _C_BASE_LIT.findall(text) if not registered_head(s, True)]
    bad += [s for s in _C_LIT.findall(text) if not registered_tail(s)]
    bad += [c for c in _C_CONST.findall(text) if c not in defined]
    return bad


_DOC_KEY = re.compile(r"`p\.\.([^`\s]+)`")


def unregistered_doc(text: str) -> list[str]:
    return [b for m in _DOC_KEY.finditer(text) for b in unregistered_spelled(m.group(1))]


# --------------------------------------------------------------------------- the sources


def lua_files() -> list[Path]:
    return sorted(LUA.glob("*.lua")) + sorted((LUA / "include").glob("*.lua"))


def defined_constants() -> set[str]:
    return set(_C_DEFINED.findall((NATIVE / "keyspace.gen.h").read_text()))


@pytest.mark.parametrize("path", lua_files(), ids=lambda p: p.name)
def test_lua_spells_only_registered_suffixes(path: Path) -> None:
    assert unregistered_lua(path.read_text()) == [], path.name


def test_lua_is_scanned() -> None:
    """The scanner sees the spellings (a pattern that silently matches nothing proves nothing)."""
    text = "\n".join(p.read_text() for p in lua_files())
    heads = {m.group(2) for m in _LUA_HEAD.finditer(text)}
    assert {"pending", "active", "job:", "retired:old", "metrics:"} <= heads
    assert {":logs", ":errors", ":deps"} <= {m.group(2) for m in _LUA_TAIL.finditer(text)}
    assert len(_KEYS_LINE.findall(text)) > 50


@pytest.mark.parametrize(
    "path", sorted(NATIVE.glob("*.c")) + sorted(NATIVE.glob("*.h")), ids=lambda p: p.name
)
def test_c_spells_only_registered_suffixes(path: Path) -> None:
    assert unregistered_c(path.read_text(), defined_constants()) == [], path.name


def test_c_uses_the_generated_constants() -> None:
    """The C code spells queue keys through keyspace.gen.h, not literals."""
    text = "\n".join(p.read_text() for p in sorted(NATIVE.glob("*.c")))
    assert _C_KEY.findall(text) == []
    assert len(_C_CONST.findall(text)) > 100


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_docs_spell_only_registered_suffixes(path: Path) -> None:
    text = path.read_text()
    assert len(_DOC_KEY.findall(text)) > 20
    assert unregistered_doc(text) == [], path.name


def test_every_registered_type_is_documented() -> None:
    """The other way round: the registry names nothing the keyspace table does not show."""
    text = (ROOT / "docs" / "PROTOCOL.md").read_text()
    documented = {_PLACEHOLDER.split(s)[0] for s in _DOC_KEY.findall(text)}
    assert TYPES - documented - {"recent"} == set()
    assert PREFIXES - documented == set()


def test_generated_native_files_are_current() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen-native"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


# --------------------------------------------------------------------------- planted drift


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("rcall('ZCARD', base .. 'pendng')", ["pendng"]),
        ("local k = base .. 'jobs:' .. id", ["jobs:"]),
        ("rcall('DEL', jk .. ':log')", [":log"]),
        ("  KEYS[1] row  HASH  emq:{q}:jobb:<id>\n", ["jobb:"]),
        ("  KEYS[1] row  HASH  emq:{q}:job:<id>:logz\n", [":logz"]),
        ("rcall('ZCARD', base .. 'pending'); rcall('DEL', jk .. ':logs')", []),
        ("local m = base .. 'metrics:' .. kind .. ':data'", []),
    ],
)
def test_lua_drift_is_found(text: str, found: list[str]) -> None:
    assert unregistered_lua(text) == found


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ('emq_key(e, "pendng")', ["pendng"]),
        ('emq_key2(e, "jobs:", id)', ["jobs:"]),
        ('emq_cat(e, 2, jk, EMQ_LIT(":logz"))', [":logz"]),
        ('emq_cat(e, 3, e->base, EMQ_LIT("jobs:"), id)', ["jobs:"]),
        ("emq_key(e, EMQ_K_PENDNG)", ["EMQ_K_PENDNG"]),
        ('emq_key(e, EMQ_K_PENDING); EMQ_LIT("state"); EMQ_LIT(EMQ_KT_LOGS)', []),
        ('EMQ_LIT("deduplicated:"); emq_cat(e, 3, e->base, EMQ_LIT("job:"), id)', []),
    ],
)
def test_c_drift_is_found(text: str, found: list[str]) -> None:
    assert unregistered_c(text, defined_constants()) == found


def test_doc_drift_is_found() -> None:
    assert unregistered_doc("| `p..pendng` | ZSET |") == ["pendng"]
    assert unregistered_doc("| `p..job:<id>:logz` | LIST |") == [":logz"]
    assert unregistered_doc("| `p..g:<lane>:pending` `p..retired:old` |") == []
