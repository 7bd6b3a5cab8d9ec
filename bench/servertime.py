"""Server time from ``INFO commandstats``, each client call counted once.

A script's own commands (``redis.call('ZADD', ...)``) and, on servers that count them, a
module command's ``RedisModule_Call``\\ s get ``cmdstat_*`` rows of their own, and their time
is also inside the ``usec`` of the EVALSHA (or ``EMQ.*``) that ran them. Summing every row
counts a script's work twice (and a module command's key-API work once), so the server's time
for what clients sent is the sum over the top-level rows only: the script calls
(EVAL/EVALSHA and their read-only forms, FCALL) and the module's ``EMQ.*`` commands.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["TOP_LEVEL", "is_top_level", "top_level_calls", "top_level_usec", "usec_of"]

TOP_LEVEL = ("eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro")


def is_top_level(row: str) -> bool:
    """Whether a commandstats row (``cmdstat_evalsha`` or ``evalsha``) is a call a client
    sends whose time includes the commands it runs: a script call or an ``EMQ.*`` command."""
    name = row.removeprefix("cmdstat_").lower()
    return name in TOP_LEVEL or name.startswith("emq.")


def top_level_usec(stats: Mapping[str, Mapping[str, Any]]) -> float:
    """The µs the server spent in the top-level calls of ``INFO commandstats`` ``stats``."""
    return float(sum(float(v.get("usec", 0)) for k, v in stats.items() if is_top_level(k)))


def top_level_calls(stats: Mapping[str, Mapping[str, Any]]) -> int:
    """How many top-level calls (script calls and ``EMQ.*`` commands) ``stats`` counts."""
    return sum(int(v.get("calls", 0)) for k, v in stats.items() if is_top_level(k))


def usec_of(stats: Mapping[str, Mapping[str, Any]], names: tuple[str, ...]) -> float:
    """The µs of the rows ``names`` alone (``("lpush",)``: a peer's plain command)."""
    return float(sum(float(stats.get(f"cmdstat_{n}", {}).get("usec", 0)) for n in names))
