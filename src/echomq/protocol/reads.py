"""The sans-I/O read plane: browse, counts, pending_size, check.

The read plane, sans I/O: which set a state names, ``browse``, ``counts``, ``pending_size``
and the consistency ``check`` (check.lua, in bounded slices). ``protocol.calls`` re-exports the
verbs."""

from __future__ import annotations

from typing import Any

from echomq.errors import (
    InvalidArgument,
)
from echomq.protocol.kernel import (
    STATES,
    Arg,
    Call,
    Keys,
    Plan,
    _call,
    _cmd,
    _int,
    _int_reply,
    _s,
    _str_list,
)


def _state_key(k: Keys, state: object) -> tuple[str, bool]:
    """The set of a state name and whether its scores hold no time (a waiting set: the
    priority); "schedule" is an alias of "scheduled"."""
    table = {
        "pending": (k.pending, True),
        "dead": (k.dead, False),
        "active": (k.active, False),
        "schedule": (k.schedule, False),
        "scheduled": (k.schedule, False),
        "completed": (k.completed, False),
    }
    if not isinstance(state, str) or state not in table:
        raise InvalidArgument(
            f"state must be one of {', '.join(STATES)} (or the alias schedule), got {state!r}"
        )
    return table[state]


def browse(
    k: Keys, state: str = "pending", n: int = 50, group: str | None = None
) -> Call[list[str]]:
    count = _int("n", n, 1, 1_000_000)
    key, lexical = _state_key(k, state)
    if group is not None:
        if key != k.pending:
            raise InvalidArgument("a group can only be browsed in the pending state")
        key = k.lane(group)
    # pending and lanes are scored by priority (ties in mint order): the reverse rank is the
    # reverse claim order, i.e. newest first among jobs of one priority (a lexical range
    # would be undefined on mixed scores). active, schedule, dead and completed are ordered
    # by their times (lease, run-at, death, finish), newest first.
    if lexical:
        args: tuple[Arg, ...] = ("ZRANGE", key, 0, count - 1, "REV")
    else:
        args = ("ZRANGE", key, "+inf", "-inf", "BYSCORE", "REV", "LIMIT", 0, count)
    return _cmd(args, _str_list)


def pending_size(k: Keys) -> Call[int]:
    return _cmd(("ZCARD", k.pending), _int_reply)


def counts(k: Keys) -> Call[dict[str, int]]:
    names = ("pending", "active", "schedule", "dead", "completed", "failed", "kept")

    def decode(reply: Any) -> dict[str, int]:
        return dict(zip(names, (int(x) for x in reply), strict=True))

    return _call("counts", (k.meta,), (k.base,), decode)


def _check_step(reply: Any) -> tuple[list[str], str, list[str]]:
    lines, nxt, found = reply
    return _str_list(lines), _s(nxt) if isinstance(nxt, bytes) else str(nxt), _str_list(found)


def check(k: Keys, window: int = 1000) -> Plan[list[str]]:
    """The consistency checker, in bounded slices (see check.lua): the aggregates in one
    call, then every set, lane and the ring in windows of ``window`` members and the queue's
    keys by SCAN, each stream one call per round (pipelined). Returns the violations, each
    once, in the order found; empty when the queue is sound."""
    size = _int("window", window, 1, 100_000)

    def step(section: str, where: str, pos: int = 0) -> Call[tuple[list[str], str, list[str]]]:
        return _call("check", (k.meta,), (k.base, section, where, pos, size), _check_step)

    # stream: (section, where, position); a section is done at -1 (windows) or "0" (SCAN).
    streams: list[tuple[str, str, int]] = [("core", "", 0), ("ring", "", 0)]
    places = ("pending", "active", "schedule", "dead", "completed")
    streams += [("members", place, 0) for place in places]
    scans = ("lanes", "rows", "results", "dedups", "ttls", "repeats")
    streams += [(section, "0", 0) for section in scans]
    streams.append(("repeatidx", "", 0))
    found: dict[str, None] = {}
    lanes: dict[str, None] = {}
    while streams:
        replies = yield [step(*s) for s in streams]
        follow: list[tuple[str, str, int]] = []
        for (section, where, _), reply in zip(streams, replies, strict=True):
            if isinstance(reply, BaseException):
                raise reply
            lines, nxt, seen = reply
            found.update(dict.fromkeys(lines))
            for g in seen:
                if g not in lanes:
                    lanes[g] = None
                    follow.append(("members", "lane:" + g, 0))
            if section in scans:
                if nxt != "0":
                    follow.append((section, nxt, 0))
            elif nxt != "-1":
                follow.append((section, where, int(nxt)))
        streams = follow
    return list(found)
