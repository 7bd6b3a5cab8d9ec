"""Sans-I/O queue-wide verbs: pause and resume, drain, obliterate, limits, lanes.

What an operator does to a queue as a whole, or to one lane of it (D14: pause, limit and
weight a lane, move a job to another); ``protocol.calls`` re-exports every verb here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from echomq import keyspace
from echomq.errors import InvalidArgument, JobGone
from echomq.protocol.kernel import (
    Call,
    Keys,
    Plan,
    _call,
    _cmd,
    _int,
    _int_reply,
    _none,
    _resent,
    _s,
    _str_list,
)

# The most shards a logical queue has (echomq.client.shards.MAX_SHARDS, lua/propose_shards.lua).
MAX_SHARDS = 256

__all__ = [
    "drain",
    "get_limit",
    "is_paused",
    "lane_depth",
    "lanes",
    "limit",
    "limit_lane",
    "obliterate",
    "pause",
    "pause_lane",
    "propose_shards",
    "reassign",
    "resume",
    "resume_lane",
    "shards",
    "weight_lane",
]


def pause(k: Keys) -> Call[None]:
    return _call("pause", (k.meta,), (), _none)


def resume(k: Keys) -> Call[None]:
    return _call("resume", (k.meta, k.ring), (k.base,), _none)


def is_paused(k: Keys) -> Call[bool]:
    return _cmd(("HEXISTS", k.meta, "paused"), bool)


def drain(k: Keys, include_schedule: bool = False, budget: int = 1000) -> Plan[int]:
    """Delete the waiting jobs in slices: each script call deletes at most ``budget`` jobs and
    visits one SSCAN page of lanes, so none holds the server long however many lanes exist."""
    flag = "1" if include_schedule else "0"
    _int("budget", budget, 1, 100_000)
    total = 0
    cursor = ""
    while True:
        # Resent after a lost reply (issue 37): a second copy of a slice drains what is
        # still waiting, so the total may come out short after an outage, never the effect.
        deleted, cursor = yield from _resent(
            _call(
                "drain",
                (k.pending, k.lanes),
                (k.base, flag, budget, cursor),
                lambda r: (int(r[0]), _s(r[1])),
            )
        )
        total += int(deleted)
        if not cursor:
            return total


def obliterate(k: Keys, force: bool = False, budget: int = 1000) -> Plan[None]:
    flag = "1" if force else "0"
    cursor = "0"
    while True:
        cursor = yield _call(
            "obliterate", (k.meta, k.active), (k.base, flag, cursor, budget), lambda r: _s(r[0])
        )
        if cursor == "0":
            return


# --------------------------------------------------------------------------- lanes


def pause_lane(k: Keys, group: str) -> Call[None]:
    return _call("pause_lane", (k.paused,), (k.base, keyspace.check_lane(group)), _none)


def resume_lane(k: Keys, group: str) -> Call[None]:
    return _call("resume_lane", (k.paused,), (k.base, keyspace.check_lane(group)), _none)


def limit_lane(k: Keys, group: str, n: int | None) -> Call[None]:
    limit = "" if n is None else _int("n", n, 1)
    return _call("limit_lane", (k.glimit,), (k.base, keyspace.check_lane(group), limit), _none)


def limit(k: Keys, n: int | None) -> Call[None]:
    """limit.lua: at most ``n`` jobs of the queue active at once, lanes included (None: no
    limit). Every claim path takes no more than the room left."""
    value = "" if n is None else _int("n", n, 1)
    return _call("limit", (k.meta,), (k.base, value), _none)


def get_limit(k: Keys) -> Call[int | None]:
    return _cmd(("HGET", k.meta, "limit"), lambda r: None if r is None else int(r))


def weight_lane(k: Keys, group: str, w: int) -> Call[None]:
    return _call(
        "weight_lane", (k.gweight,), (keyspace.check_lane(group), _int("w", w, 1, 1_000_000)), _none
    )


def reassign(k: Keys, id: str, group: str) -> Call[str]:
    def decode(reply: Any) -> str:
        if reply == 0:
            raise JobGone(id)
        return _s(reply)

    return _call("reassign", (k.job(id),), (k.base, id, keyspace.check_lane(group)), decode)


def lane_depth(k: Keys, group: str) -> Call[int]:
    return _cmd(("ZCARD", k.lane(group)), _int_reply)


def lanes(k: Keys) -> Call[list[str]]:
    return _cmd(("SMEMBERS", k.lanes), lambda r: sorted(_str_list(r)))


def _layout(k: Keys, reply: Any) -> list[str]:
    return _s(reply).split(",") if reply else [k.name]


def shards(k: Keys) -> Call[list[str]]:
    """The queue's stored layout (issue 43): its sub-queue names, the queue itself first;
    ``[name]`` for a queue that is not sharded."""
    return _cmd(("HGET", k.meta, "shards"), lambda r: _layout(k, r))


def propose_shards(k: Keys, names: Sequence[str]) -> Call[list[str]]:
    """propose_shards.lua: store ``names`` as the queue's layout when it extends the stored
    one (or nothing is stored and it has more than one name); the stored layout after the
    call either way. ``names`` are checked here: distinct legal queue names, the queue itself
    first, at most ``MAX_SHARDS``."""
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise InvalidArgument(f"names is a list of queue names, got {names!r}")
    checked = [keyspace.check_queue(n) for n in names]
    if not checked or checked[0] != k.name or len(set(checked)) != len(checked):
        raise InvalidArgument(
            f"a layout of {k.name!r} is distinct queue names, {k.name!r} first, got {names!r}"
        )
    if len(checked) > MAX_SHARDS:
        raise InvalidArgument(f"a layout has at most {MAX_SHARDS} shards, got {len(checked)}")
    return _call("propose_shards", (k.meta,), (k.base, ",".join(checked)), lambda r: _layout(k, r))
