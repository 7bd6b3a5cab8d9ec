"""Durable mode: every write waits for N replica acknowledgements before it returns.

The script and its ``WAIT`` (and ``WAITAOF`` with ``aof``) go in one pipeline on one
connection, because ``WAIT`` counts only the writes of its own connection; on a cluster,
on the node that owns the call's slot. When fewer replicas acknowledge in time the write
has still applied on the primary: :class:`~echomq.errors.DurabilityError` carries the
applied reply (``.reply``) and the job id when the call names one job (``.job_id``).

The policy is written once, as :func:`steps`, a generator that yields a :class:`Pipe` (run
these commands on the node owning ``key``) or :data:`REFRESH` (re-read the cluster's slot
map) and returns the script's raw reply; each executor runs it with its own I/O.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any, NamedTuple

from redis.exceptions import AskError, NoScriptError, ResponseError, TryAgainError

from echomq.client.connect import map_error, script_args
from echomq.errors import DurabilityError
from echomq.protocol.kernel import Call

__all__ = ["REFRESH", "Pipe", "job_id_of", "steps"]


class Pipe(NamedTuple):
    """Run ``commands`` in one pipeline on the connection that serves ``key``."""

    key: str
    commands: list[tuple[Any, ...]]


REFRESH = "refresh"  # re-read the cluster's slot map, then try again

Steps = Generator["Pipe | str", Any, Any]


def job_id_of(call: Call[Any]) -> str | None:
    """The job a call names: the id in its one row key (``emq:{q}:job:<id>``), else None."""
    found = [key.partition("}:job:")[2] for key in call.keys if "}:job:" in key]
    return found[0] if len(found) == 1 else None


def _waits(durable: int, timeout_ms: int, aof: bool) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = [("WAIT", durable, timeout_ms)]
    if aof:
        out.append(("WAITAOF", 0, durable, timeout_ms))
    return out


def _acked(replies: Sequence[Any]) -> int:
    """WAIT answers the replicas that acknowledged; WAITAOF ``[local, replicas]`` that
    fsynced: the fewest of them is what the write can count on."""
    counts = []
    for reply in replies:
        if isinstance(reply, BaseException):
            raise reply
        counts.append(int(reply[1]) if isinstance(reply, (list, tuple)) else int(reply))
    return min(counts)


def steps(call: Call[Any], durable: int, timeout_ms: int, aof: bool) -> Steps:
    """Run one write script with its acknowledgement; return its raw reply, or raise
    ``DurabilityError`` (with the raw reply) when too few replicas acknowledged."""
    waits = _waits(durable, timeout_ms, aof)
    key = call.keys[0]
    for _ in range(5):
        replies: Sequence[Any] = ()
        for use_eval in (False, True):
            replies = yield Pipe(key, [script_args(call, use_eval), *waits])
            if not isinstance(replies[0], NoScriptError):
                break
        if isinstance(replies[0], AskError):
            # The slot moved (a failover): the script did not run; learn the new map.
            yield REFRESH
            continue
        if isinstance(replies[0], ResponseError):
            raise map_error(replies[0])
        acked = _acked(replies[1:])
        if acked < durable:
            raise DurabilityError(acked, durable, reply=replies[0], job_id=job_id_of(call))
        return replies[0]
    raise TryAgainError("the queue's slot kept moving")
