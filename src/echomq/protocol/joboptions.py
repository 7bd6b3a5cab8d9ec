"""One job's options as one record, checked once where it is made.

What ``Queue.enqueue``, ``Task.options`` and a
workflow's ``Signature`` take as keywords travels inward as a :class:`JobOptions`, checked
once, where it is made; the enqueue plan (``protocol.produce``) turns it into the script's named
option tail (``'+opt' name value ...``, lua/enqueue.lua, PROTOCOL §6). A call with no option
is :data:`NO_OPTIONS` and sends no tail.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from echomq import keyspace
from echomq.errors import InvalidArgument
from echomq.protocol.kernel import MAX_ARG, Arg, _group, _int, _priority, _ttl, _when, dedup_args

# The marker that opens the option tail (include/args.lua OPT_TAIL, native/cmd_enqueue.c):
# never a dedup id, a job id or a number, so a server tells it from the positional form.
OPT_TAIL = "+opt"


def budget(max_attempts: object) -> dict[str, Any] | None:
    """The envelope's ``opts`` for a per-job attempt budget (None: the task's), checked as
    ``@app.task(max_attempts=)`` is, before anything is sent."""
    if max_attempts is None:
        return None
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
        raise InvalidArgument(f"max_attempts must be an int >= 1, got {max_attempts!r}")
    if not 1 <= max_attempts <= MAX_ARG:
        raise InvalidArgument(f"max_attempts must be in [1, {MAX_ARG}], got {max_attempts}")
    return {"max_attempts": max_attempts}


def _keep_logs(keep_logs: object) -> None:
    """A job's log bound (BullMQ's ``keepLogs``): None (every line) or an int in
    [1, MAX_ARG]."""
    if keep_logs is not None:
        _int("keep_logs", keep_logs, 1)


@dataclass(frozen=True, slots=True)
class JobOptions:
    """One job's options, checked when the record is made (the same typed errors each
    keyword raised before it): a delay or an absolute run time, a lane (``group``), an id,
    a dedup key (D20), a priority (0..2**21, lower runs first; ``Task.options`` puts the
    task's own when it names none), an attempt budget (the envelope's; None: the task's),
    an expiry (``ttl_ms``) and a log bound (``keep_logs``: the job keeps its newest N log
    lines, row field ``keep_logs``; None: every line)."""

    delay_ms: int | None = None
    at_ms: int | None = None
    group: str | None = None
    id: str | None = None
    dedup: str | None = None
    dedup_ttl_ms: int | None = None
    dedup_mode: str = "simple"
    priority: int = 0
    max_attempts: int | None = None
    ttl_ms: int | None = None
    keep_logs: int | None = None

    def __post_init__(self) -> None:
        _when(self.delay_ms, self.at_ms)
        _group(self.group)
        if self.id is not None:
            keyspace.check_id(self.id)
        dedup_args(self.dedup, self.dedup_ttl_ms, self.dedup_mode)
        _priority(self.priority)
        budget(self.max_attempts)
        _ttl(self.ttl_ms)
        _keep_logs(self.keep_logs)

    def tail(self, second: int | None = None) -> tuple[Arg, ...]:
        """The enqueue script's named option tail, () when there is nothing to send (the
        lean call). ``second``: the replay marker key's client second (sent with a nonce)."""
        out: list[Arg] = []
        if second is not None:
            out += ("second", second)
        if self.dedup is not None:
            out += ("dedup", self.dedup, "dedup_mode", self.dedup_mode)
            out += ("dedup_ttl_ms", self.dedup_ttl_ms or 0)
        if self.priority:
            out += ("priority", self.priority)
        if self.ttl_ms is not None:
            out += ("ttl_ms", self.ttl_ms)
        if self.keep_logs is not None:
            out += ("keep_logs", self.keep_logs)
        return (OPT_TAIL, *out) if out else ()


# The record of a call with no option: the lean enqueue builds none (see ``job_options``).
NO_OPTIONS = JobOptions()


def job_options(
    delay_ms: int | None,
    at_ms: int | None,
    group: str | None,
    id: str | None,
    dedup: str | None,
    dedup_ttl_ms: int | None,
    dedup_mode: str,
    priority: int,
    ttl_ms: int | None,
    max_attempts: int | None = None,
    keep_logs: int | None = None,
) -> JobOptions:
    """The record of an enqueue's keywords: :data:`NO_OPTIONS` when none is set (the lean
    call makes and checks no record), else a checked new one."""
    if (
        delay_ms is None
        and at_ms is None
        and group is None
        and id is None
        and dedup is None
        and dedup_ttl_ms is None
        and dedup_mode == "simple"
        and type(priority) is int  # a bad value (None, False, 0.0): the record refuses it
        and priority == 0
        and ttl_ms is None
        and max_attempts is None
        and keep_logs is None
    ):
        return NO_OPTIONS
    return JobOptions(
        delay_ms,
        at_ms,
        group,
        id,
        dedup,
        dedup_ttl_ms,
        dedup_mode,
        priority,
        max_attempts,
        ttl_ms,
        keep_logs,
    )
