"""The protocol's Lua scripts: loaded once at import, includes inlined, SHA1 computed once.

Each file in ``lua/`` is one transition and opens with a header contract (``KEYS[n] ...``
lines); ``--@include name`` inlines ``lua/include/name.lua`` so shared rules (the ring sync,
the D5 fence, the claim core) exist once in the source and the scripts stay self-contained
on the wire.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from functools import cached_property
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
# Optional: ``allow-oom`` sends the script with the shebang ``#!lua flags=allow-oom`` (Redis 7,
# Valkey), so the server runs it at maxmemory. Only for a script that never grows memory
# and must not be refused there: a heartbeat moves scores of ids already in ``active``, and a
# refused one lets a running job's lease lapse (the job would run twice).
_OPTIONAL_FLAGS = ("allow-oom",)


@dataclass(frozen=True)
class Script:
    """One transition: its name, its KEYS count and the traits its header's ``Flags:`` line
    declares (read at import, so no script ships unclassified), and the source sent on EVAL
    with its SHA1, built on first use: inlining, shaking and lazifying every script at
    import would cost each process (every CLI call) tens of ms for scripts it never runs."""

    name: str
    text: str = field(repr=False)  # the file as written, includes not yet inlined
    nkeys: int
    writes: bool
    replay: bool
    allow_oom: bool = False

    @cached_property
    def source(self) -> str:
        body = _lazify(_shake(_expand(self.text, _LUA)))
        return "#!lua flags=allow-oom\n" + body if self.allow_oom else body

    @cached_property
    def sha(self) -> str:
        return hashlib.sha1(self.source.encode("utf-8")).hexdigest()


def parse_flags(name: str, header: str) -> tuple[bool, bool]:
    """``(writes, replay)`` from a header's ``Flags:`` line; a missing, unknown or ambiguous
    flag is an error at import, so no script can ship unclassified."""
    found = _FLAGS.findall(header)
    if len(found) != 1:
        raise RuntimeError(f"lua/{name}.lua: the header needs exactly one 'Flags:' line")
    words = found[0].split()
    known = {w for pair in _FLAG_PAIRS for w in pair} | set(_OPTIONAL_FLAGS)
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


# A top-level function of an inlined include: from ``local function name(`` at column 0 to the
# first ``end`` alone at column 0 (the sources keep every inner block indented).
_FUNCTION = re.compile(r"^local function (\w+)\(.*?^end$\n?", re.M | re.S)
_WORD = re.compile(r"\w+")
_COMMENT = re.compile(r"--(?!\[\[).*$", re.M)


def _shake(source: str) -> str:
    """Drop the included functions a script never calls. Every call of a script runs its
    whole chunk, creating one closure per ``local function``: a script that inlines four
    includes for two of their functions would pay for all of them, on every call. A function
    is kept when the script's own code (everything outside the function definitions) calls
    it, or a kept function does; comments do not count."""
    found = list(_FUNCTION.finditer(source))
    bodies = {m.group(1): set(_WORD.findall(_COMMENT.sub("", m.group(0)))) for m in found}
    outside, last = [], 0
    for m in found:
        outside.append(source[last : m.start()])
        last = m.end()
    outside.append(source[last:])
    todo = [n for n in set(_WORD.findall(_COMMENT.sub("", "".join(outside)))) if n in bodies]
    kept: set[str] = set()
    while todo:
        name = todo.pop()
        if name not in kept:
            kept.add(name)
            todo += [n for n in bodies[name] if n in bodies and n not in kept]
    for m in reversed(found):
        if m.group(1) not in kept:
            source = source[: m.start()] + source[m.end() :]
    return source


# A lazy group of an include: ``--@lazy name`` ... ``--@end`` around top-level functions (and
# the locals only they use) that most calls of a script never run.
_LAZY = re.compile(r"^--@lazy (\w+)\n(.*?)^--@end\n", re.M | re.S)
_DEF = re.compile(r"^local function (\w+)\(", re.M)


def _lazify(source: str) -> str:
    """Build each lazy group on first use instead of on every call. A script's chunk creates
    every closure it defines each time it runs; a group such as the flow functions would cost
    every completion a dozen closures it almost never calls. The group becomes one loader
    that defines its functions and returns them in a table, and every call of one of them
    outside the group goes through the loader (``load_flows().flow_child_done(...)``)."""
    while (m := _LAZY.search(source)) is not None:
        group, body = m.group(1), m.group(2)
        names = _DEF.findall(body)
        if not names:
            loader = ""
        else:
            table = ", ".join(f"{n} = {n}" for n in names)
            loader = (
                f"local lazy_{group} = nil\n"
                f"local function load_{group}()\n"
                f"  if lazy_{group} then return lazy_{group} end\n"
                f"{body}"
                f"  lazy_{group} = {{{table}}}\n"
                f"  return lazy_{group}\n"
                "end\n"
            )
        head, tail = source[: m.start()], source[m.end() :]
        if names:
            alt = "|".join(names)
            tail = re.sub(rf"(?<![.\w])({alt})\(", rf"load_{group}().\1(", tail)
            other = re.search(rf"(?<![.\w])({alt})\b", _COMMENT.sub("", tail))
            if other:
                raise RuntimeError(f"lazy function {other.group(1)} is used other than by a call")
        source = head + loader + tail
    return source


_LUA = Path(__file__).parent / "lua"


def _load() -> dict[str, Script]:
    scripts = {}
    for entry in sorted(_LUA.glob("*.lua")):
        name = entry.name[:-4]
        text = entry.read_text(encoding="utf-8")
        header = _HEADER.match(text)
        if header is None:
            raise RuntimeError(f"lua/{entry.name} has no header contract")
        nkeys = len(_KEY_LINE.findall(header.group(1)))
        writes, replay = parse_flags(name, header.group(1))
        allow_oom = "allow-oom" in _FLAGS.findall(header.group(1))[0].split()
        scripts[name] = Script(name, text, nkeys, writes, replay, allow_oom)
    return scripts


SCRIPTS: dict[str, Script] = _load()
