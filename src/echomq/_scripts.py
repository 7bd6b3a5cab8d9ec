"""The protocol's Lua scripts: loaded once at import, includes inlined, SHA1 computed once.

Each file in ``lua/`` is one transition and opens with a header contract (``KEYS[n] ...``
lines); ``--@include name`` inlines ``lua/include/name.lua`` so shared rules (the ring sync,
the D5 fence, the claim core) exist once in the source and the scripts stay self-contained
on the wire.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SCRIPTS", "Script", "parse_flags"]

_INCLUDE = re.compile(r"^--@include (\w+)$", re.M)
_KEY_LINE = re.compile(r"^\s*KEYS\[(\d+)\]", re.M)
_HEADER = re.compile(r"^--\[\[(.*?)\]\]", re.S)
_FLAGS = re.compile(r"^\s*Flags:\s*(.*?)\s*$", re.M)
# Every header declares one word of each pair. ``writes`` scripts wait for replica acks in
# durable mode; ``replay`` scripts may be resent when their reply was lost (a resend cannot
# double-apply them), ``once`` scripts never are.
_FLAG_PAIRS = (("reads", "writes"), ("replay", "once"))


@dataclass(frozen=True, slots=True)
class Script:
    """One transition: its name, the source sent on EVAL, its SHA1, its KEYS count and the
    traits its header's ``Flags:`` line declares."""

    name: str
    source: str
    sha: str
    nkeys: int
    writes: bool
    replay: bool


def parse_flags(name: str, header: str) -> tuple[bool, bool]:
    """``(writes, replay)`` from a header's ``Flags:`` line; a missing, unknown or ambiguous
    flag is an error at import, so no script can ship unclassified."""
    found = _FLAGS.findall(header)
    if len(found) != 1:
        raise RuntimeError(f"lua/{name}.lua: the header needs exactly one 'Flags:' line")
    words = found[0].split()
    known = {w for pair in _FLAG_PAIRS for w in pair}
    unknown = sorted(set(words) - known)
    if unknown:
        raise RuntimeError(f"lua/{name}.lua: unknown flags {unknown}")
    for pair in _FLAG_PAIRS:
        if sum(w in words for w in pair) != 1:
            raise RuntimeError(f"lua/{name}.lua: Flags must name one of {pair}")
    return "writes" in words, "replay" in words


def _expand(text: str, lua: Path, seen: tuple[str, ...] = ()) -> str:
    def inline(m: re.Match[str]) -> str:
        name = m.group(1)
        if name in seen:
            return ""
        body = (lua / "include" / f"{name}.lua").read_text(encoding="utf-8")
        return _expand(body, lua, (*seen, name))

    return _INCLUDE.sub(inline, text)


def _load() -> dict[str, Script]:
    lua = Path(__file__).parent / "lua"
    scripts = {}
    for entry in sorted(lua.glob("*.lua")):
        name = entry.name[:-4]
        text = entry.read_text(encoding="utf-8")
        header = _HEADER.match(text)
        if header is None:
            raise RuntimeError(f"lua/{entry.name} has no header contract")
        nkeys = len(_KEY_LINE.findall(header.group(1)))
        writes, replay = parse_flags(name, header.group(1))
        source = _expand(text, lua)
        sha = hashlib.sha1(source.encode("utf-8")).hexdigest()
        scripts[name] = Script(name, source, sha, nkeys, writes, replay)
    return scripts


SCRIPTS: dict[str, Script] = _load()
