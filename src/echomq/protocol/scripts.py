"""The protocol's Lua scripts: loaded once at import, includes inlined, SHA1 computed once.

Each file in ``lua/`` is one transition and opens with a header contract (``KEYS[n] ...``
lines); ``--@include name`` inlines ``lua/include/name.lua`` so shared rules (the ring sync,
the D5 fence, the claim core) exist once in the source and the scripts stay self-contained
on the wire.

A header's ``Native: EMQ.<VERB> args=<arity> [deny-oom]`` line names the script's twin in the
``trafikey`` module (``lua/README.md``): :data:`TWINS` and the C command table
(``scripts/gen-native``) are derived from those lines, nowhere written by hand.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

__all__ = [
    "SCRIPTS",
    "TWINS",
    "Arity",
    "Native",
    "Script",
    "arity_error",
    "include_text",
    "parse_flags",
    "parse_native",
    "twin_forms",
]

_INCLUDE = re.compile(r"^--@include (\w+)$", re.M)
_KEY_LINE = re.compile(r"^\s*KEYS\[(\d+)\]\s+(\S+)", re.M)
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
_NATIVE = re.compile(r"^\s*Native:(.*)$", re.M)
_VERB = re.compile(r"EMQ\.[A-Z][A-Z_]*")
_ARITY = re.compile(r"(\d+)(?:(\.\.)(\d+)?|\+(\d+)n|\|(\d+))?")


@dataclass(frozen=True)
class Arity:
    """The ARGV counts a script (and its native form) accepts: ``lo`` up to ``hi`` (None: no
    bound) in steps of ``step``. Written in a header as ``N`` (exactly), ``N..M``, ``N..`` (at
    least), ``N+kn`` (N plus a multiple of k) or ``N|M`` (either)."""

    lo: int
    hi: int | None
    step: int = 1

    def fits(self, n: int) -> bool:
        return n >= self.lo and (self.hi is None or n <= self.hi) and (n - self.lo) % self.step == 0

    def text(self) -> str:
        """The count in an arity error: ``4 args``, ``4..5 args``, ``2 or 4 args``, ``at least
        4 args``, ``9 + 2n args``."""
        if self.hi == self.lo:
            return f"{self.lo} arg" + ("" if self.lo == 1 else "s")
        if self.hi is None:
            if self.step == 1:
                return f"at least {self.lo} args"
            return f"{self.lo} + {self.step}n args"
        if self.step == 1:
            return f"{self.lo}..{self.hi} args"
        return " or ".join(map(str, range(self.lo, self.hi + 1, self.step))) + " args"


@dataclass(frozen=True)
class Native:
    """A header's ``Native:`` line: the module command that runs the script, the ARGV counts
    it takes (KEYS: the header's ``KEYS[n]`` lines), and whether it is refused at maxmemory
    (``deny-oom``: it grows memory; every other twin settles or frees and must never be)."""

    command: str
    args: Arity
    deny_oom: bool = False


def parse_native(name: str, header: str) -> Native | None:
    """The header's ``Native:`` line (None: the script has no twin, it always runs as Lua);
    a malformed or repeated one is an error at import."""
    found = _NATIVE.findall(header)
    if not found:
        return None
    if len(found) > 1:
        raise RuntimeError(f"lua/{name}.lua: the header has more than one 'Native:' line")
    words = found[0].split()
    if len(words) < 2 or not _VERB.fullmatch(words[0]) or not words[1].startswith("args="):
        raise RuntimeError(
            f"lua/{name}.lua: 'Native:' takes EMQ.<VERB> args=<arity> [deny-oom], got {found[0]!r}"
        )
    m = _ARITY.fullmatch(words[1][5:])
    if m is None:
        raise RuntimeError(f"lua/{name}.lua: bad arity {words[1]!r} (N, N..M, N.., N+kn, N|M)")
    lo = int(m.group(1))
    if m.group(2):
        arity = Arity(lo, int(m.group(3)) if m.group(3) else None)
    elif m.group(4):
        arity = Arity(lo, None, int(m.group(4)))
    elif m.group(5):
        other = int(m.group(5))
        if other <= lo:
            raise RuntimeError(f"lua/{name}.lua: bad arity {words[1]!r} (N|M needs M > N)")
        arity = Arity(lo, other, other - lo)
    else:
        arity = Arity(lo, lo)
    if (arity.hi is not None and arity.hi < lo) or arity.step < 1:
        raise RuntimeError(f"lua/{name}.lua: bad arity {words[1]!r}")
    rest = words[2:]
    if rest not in ([], ["deny-oom"]):
        raise RuntimeError(f"lua/{name}.lua: unknown 'Native:' words {rest}")
    return Native(words[0], arity, bool(rest))


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
    native: Native | None = None
    key_names: tuple[str, ...] = ()  # the header's KEYS[n] names, in order

    @cached_property
    def source(self) -> str:
        body = _lazify(_chill(_shake(_expand(self.text, _LUA))))
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


# A script's cold roots: ``--@cold name ...`` names included functions that its common path
# never calls (a ring resync on an enqueue into a live set, the retired-record lookup of a
# minted id). They, and every function only they (or a lazy group) call, are built on first
# use instead of on every call: see _chill.
_COLD = re.compile(r"^--@cold ((?:\w+ ?)+)$", re.M)
_LAZY_SPAN = re.compile(r"^--@lazy \w+\n.*?^--@end\n", re.M | re.S)


def _chill(source: str) -> str:
    """Move a script's cold functions into one loader built on first use. Every call of a
    script creates a closure per top-level function, used or not: an enqueue paid a dozen
    for the ring and rate-limit code that only its first job into an empty set runs. The
    cold set is every kept function that the script's own code reaches only through a cold
    root (``--@cold``) or a lazy group; the loader is forward-declared at the top, defined
    after the last include (every function it needs is then in scope), and each call of a
    cold function becomes ``load_cold().name(...)``."""
    roots = {w for m in _COLD.finditer(source) for w in m.group(1).split()}
    if not roots:
        return source
    lazy = [(m.start(), m.end()) for m in _LAZY_SPAN.finditer(source)]

    def in_lazy(pos: int) -> bool:
        return any(a <= pos < b for a, b in lazy)

    found = [m for m in _FUNCTION.finditer(source) if not in_lazy(m.start())]
    bodies = {m.group(1): set(_WORD.findall(_COMMENT.sub("", m.group(0)))) for m in found}
    unknown = roots - set(bodies)
    if unknown:
        raise RuntimeError(f"--@cold names no kept function: {sorted(unknown)}")
    # The script's own code: everything outside the function definitions and lazy groups.
    outside, last = [], 0
    for a, b in sorted([(m.start(), m.end()) for m in found] + lazy):
        outside.append(source[last:a])
        last = b
    outside.append(source[last:])
    todo = [n for n in set(_WORD.findall(_COMMENT.sub("", "".join(outside)))) if n in bodies]
    warm: set[str] = set()
    while todo:
        name = todo.pop()
        if name not in warm and name not in roots:
            warm.add(name)
            todo += [n for n in bodies[name] if n in bodies and n not in warm]
    cold = [m for m in found if m.group(1) not in warm]
    names = [m.group(1) for m in cold]
    body = "".join(m.group(0) for m in cold)
    for m in reversed(cold):
        source = source[: m.start()] + source[m.end() :]
    # After the last function or lazy group left: where the script's own code starts.
    ends = [m.end() for m in _FUNCTION.finditer(source)]
    ends += [m.end() for m in _LAZY_SPAN.finditer(source)]
    at = max(ends, default=0)
    table = ", ".join(f"{n} = {n}" for n in names)
    loader = (
        "load_cold = function()\n"
        "  if lazy_cold then return lazy_cold end\n"
        f"{body}"
        f"  lazy_cold = {{{table}}}\n"
        "  return lazy_cold\n"
        "end\n"
    )
    call = re.compile(rf"(?<![.\w])({'|'.join(names)})\(")
    head = call.sub(r"load_cold().\1(", source[:at])
    tail = call.sub(r"load_cold().\1(", source[at:])
    other = re.search(rf"(?<![.\w])({'|'.join(names)})\b", _COMMENT.sub("", head + tail))
    if other:
        raise RuntimeError(f"cold function {other.group(1)} is used other than by a call")
    return "local lazy_cold, load_cold\n" + head + loader + tail


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


_LUA = Path(__file__).parent.parent / "lua"


def _load() -> dict[str, Script]:
    scripts = {}
    for entry in sorted(_LUA.glob("*.lua")):
        name = entry.name[:-4]
        text = entry.read_text(encoding="utf-8")
        header = _HEADER.match(text)
        if header is None:
            raise RuntimeError(f"lua/{entry.name} has no header contract")
        key_names = tuple(n for _, n in _KEY_LINE.findall(header.group(1)))
        writes, replay = parse_flags(name, header.group(1))
        allow_oom = "allow-oom" in _FLAGS.findall(header.group(1))[0].split()
        native = parse_native(name, header.group(1))
        scripts[name] = Script(
            name, text, len(key_names), writes, replay, allow_oom, native, key_names
        )
    return scripts


SCRIPTS: dict[str, Script] = _load()

# Script name -> native command: every script with a twin in ``trafikey`` (its header's
# ``Native:`` line). Two forms of one command (enqueue / enqueue_many) are told apart by
# their KEYS and ARGV counts; a script not listed here always runs as Lua.
TWINS: dict[str, str] = {
    name: s.native.command for name, s in SCRIPTS.items() if s.native is not None
}


def twin_forms(scripts: dict[str, Script] | None = None) -> dict[str, list[Script]]:
    """Native command -> the scripts it runs (its forms), by script name. Two forms of one
    command must be told apart by their counts, and agree on ``deny-oom``."""
    forms: dict[str, list[Script]] = {}
    for s in sorted((scripts or SCRIPTS).values(), key=lambda s: s.name):
        if s.native is not None:
            forms.setdefault(s.native.command, []).append(s)
    for command, group in forms.items():
        if len({s.native.deny_oom for s in group if s.native}) != 1:
            raise RuntimeError(f"{command}: its scripts disagree on deny-oom")
        for i, a in enumerate(group):
            for b in group[i + 1 :]:
                if a.nkeys == b.nkeys and any(
                    a.native and b.native and a.native.args.fits(n) and b.native.args.fits(n)
                    for n in range(64)
                ):
                    raise RuntimeError(f"{command}: {a.name} and {b.name} take the same counts")
    return forms


def arity_error(command: str, forms: list[Script]) -> str:
    """The error both executors answer a call of ``command`` with counts no form takes: the
    Lua scripts' ``shape()`` text and the C table's (tests/protocol/test_scripts_contract.py)."""
    parts = []
    for s in forms:
        assert s.native is not None
        keys = f"{s.nkeys} key" + ("" if s.nkeys == 1 else "s")
        parts.append(f"{keys} ({', '.join(s.key_names)}) and {s.native.args.text()} ({s.name})")
    return f"ERR {command} takes " + " or ".join(parts)


def include_text(name: str) -> str:
    """The text of ``lua/include/<name>.lua`` with its own includes inlined: a complete chunk
    that a test can run with a call appended (``include_text("common")`` defines
    ``bump_metrics``, ``emit``, ``sync`` ...)."""
    return _expand(f"--@include {name}\n", _LUA)
