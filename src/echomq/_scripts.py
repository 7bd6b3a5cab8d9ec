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

__all__ = ["SCRIPTS", "Script"]

_INCLUDE = re.compile(r"^--@include (\w+)$", re.M)
_KEY_LINE = re.compile(r"^\s*KEYS\[(\d+)\]", re.M)
_HEADER = re.compile(r"^--\[\[(.*?)\]\]", re.S)


@dataclass(frozen=True, slots=True)
class Script:
    """One transition: its name, the source sent on EVAL, its SHA1 and its KEYS count."""

    name: str
    source: str
    sha: str
    nkeys: int


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
        source = _expand(text, lua)
        sha = hashlib.sha1(source.encode("utf-8")).hexdigest()
        scripts[name] = Script(name, source, sha, nkeys)
    return scripts


SCRIPTS: dict[str, Script] = _load()
