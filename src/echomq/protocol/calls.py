"""The sans-I/O core: every verb validates, builds its keys and arguments, and decodes.

A verb returns a :class:`Call` (one script or command) or a :data:`Plan` (a generator that
yields calls, or lists of calls to pipeline, and returns the verb's result). ``Queue`` and
``AsyncQueue`` drive the same objects, so validation, keys, decoding and error mapping exist
once and the two classes differ only by ``await``. Nothing here touches the network: all
validation happens before the first call is yielded, so bad input never writes. The
producer's verbs are ``protocol.produce``'s, the reads ``protocol.reads``', the queue-wide
admin and lane verbs ``protocol.admin``'s; this module re-exports them all.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from echomq import keyspace
from echomq.errors import (
    InvalidArgument,
    JobGone,
    from_reply,
)
from echomq.protocol.admin import (
    drain,
    get_limit,
    is_paused,
    lane_depth,
    lanes,
    limit,
    limit_lane,
    obliterate,
    pause,
    pause_lane,
    propose_shards,
    reassign,
    resume,
    resume_lane,
    shards,
    weight_lane,
)
from echomq.protocol.kernel import (
    DEFAULT_MAX_PAYLOAD,
    MAX_MS,
    STATES,
    WIRE_VERSION,
    Arg,
    Call,
    Completed,
    Enqueued,
    Job,
    Keys,
    Plan,
    Replay,
    Retried,
    Settled,
    _call,
    _cmd,
    _gone_if_zero,
    _int,
    _int_reply,
    _iterable,
    _job,
    _lease,
    _payload,
    _priority,
    _s,
    _str_list,
    _text,
    _token,
    _when,
)
from echomq.protocol.produce import enqueue, enqueue_many
from echomq.protocol.reads import browse, check, counts, pending_size

__all__ = [
    "DEFAULT_MAX_PAYLOAD",
    "STATES",
    "WIRE_VERSION",
    "Call",
    "Completed",
    "Enqueued",
    "Job",
    "Keys",
    "Plan",
    "Replay",
    "Retried",
    "Settled",
]

# --------------------------------------------------------------------------- consumer verbs


def claim(k: Keys, lease_ms: int = 30_000) -> Call[Job | None]:
    def decode(reply: Any) -> Job | None:
        # {ms}: nothing claimed because a rate limit holds jobs back (D21): no job.
        return _job(reply) if reply and len(reply) > 1 else None

    return _call("claim", (k.meta, k.ring, k.active), (k.base, _lease(lease_ms)), decode)


def claim_batch(k: Keys, n: int, lease_ms: int = 30_000) -> Call[list[Job]]:
    def decode(reply: Any) -> list[Job]:
        if reply and not isinstance(reply[0], list):
            return []  # {ms}: a rate limit holds jobs back (D21)
        return [_job(r) for r in reply]

    args = (k.base, _lease(lease_ms), _int("n", n, 1, 1_000_000))
    return _call("claim_batch", (k.meta, k.ring, k.active), args, decode)


def complete(
    k: Keys, id: str, token: int, result: bytes | str | None = None, keep_result_ms: int = 0
) -> Call[None]:
    """complete.lua: the job is done; ``keep_result_ms`` > 0 keeps ``result`` that long (D17)."""
    keep = _int("keep_result_ms", keep_result_ms, 0, MAX_MS)
    res = b"" if result is None else _payload(result, k.max_payload)
    keys = (k.active, k.job(id))
    return _call("complete", keys, (k.base, id, _token(token), res, keep), _gone_if_zero(id))


def retry(
    k: Keys,
    id: str,
    token: int,
    *,
    delay_ms: int,
    max_attempts: int,
    error: str,
    keep_result_ms: int = 0,
) -> Call[str]:
    """retry.lua: back to schedule after ``delay_ms``, or dead at ``max_attempts`` (this
    incarnation's attempts); ``keep_result_ms`` > 0: a dead-letter keeps its error that long."""

    def decode(reply: Any) -> str:
        if reply == 0:
            raise JobGone(id)
        return _s(reply)

    keys = (k.active, k.schedule, k.dead, k.job(id))
    args = (
        k.base,
        id,
        _token(token),
        _int("delay_ms", delay_ms, 0, MAX_MS),
        _int("max_attempts", max_attempts, 1),
        _text("error", error),
        _int("keep_result_ms", keep_result_ms, 0, MAX_MS),
    )
    return _call("retry", keys, args, decode)


def delay(k: Keys, id: str, token: int, delay_ms: int) -> Call[None]:
    keys = (k.active, k.schedule, k.job(id))
    args = (k.base, id, _token(token), _int("delay_ms", delay_ms, 0, MAX_MS))
    return _call("delay", keys, args, _gone_if_zero(id))


def extend(k: Keys, id: str, token: int, lease_ms: int) -> Call[None]:
    keys = (k.active, k.job(id))
    return _call("extend", keys, (k.base, id, _token(token), _lease(lease_ms)), _gone_if_zero(id))


def extend_many(k: Keys, pairs: Iterable[tuple[str, int]], lease_ms: int) -> Plan[list[str]]:
    args: list[Arg] = [k.base, _lease(lease_ms)]
    for pair in _iterable("pairs", pairs):
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise InvalidArgument(f"extend_many takes (id, token) pairs, got {pair!r}")
        args += (keyspace.check_id(pair[0]), _token(pair[1]))
    if len(args) == 2:
        return []
    result: list[str] = yield _call("extend_many", (k.active,), tuple(args), _str_list)
    # '!'-prefixed entries are the cancel flags of extended jobs (D22, _control.extend_leases).
    return [i for i in result if not i.startswith("!")]


def _verdict(job_id: str, reply: Any) -> Any:
    """A per-item verdict of a batch: refusals become the exception they would raise."""
    if reply == 0:
        return JobGone(job_id)
    if isinstance(reply, bytes):
        text = reply.decode("utf-8", "replace")
        if text.startswith("EMQ"):
            return from_reply(text)
        return text
    return None if reply == 1 else reply


def _completed(item: object) -> Completed:
    if isinstance(item, Completed):
        return item
    if not isinstance(item, tuple) or len(item) not in (2, 4):
        raise InvalidArgument(f"completed takes (id, token) pairs, got {item!r}")
    return Completed(*item)


def _retried(item: object) -> Retried:
    if isinstance(item, Retried):
        return item
    if not isinstance(item, tuple) or len(item) not in (5, 6):
        raise InvalidArgument(
            f"retried takes (id, token, delay_ms, max_attempts, error), got {item!r}"
        )
    return Retried(*item)


def settle(
    k: Keys,
    completed: Iterable[Completed | tuple[Any, ...]] = (),
    retried: Iterable[Retried | tuple[Any, ...]] = (),
    n: int = 0,
    lease_ms: int = 30_000,
) -> Call[Settled]:
    """Complete and retry finished jobs and claim up to ``n`` more, in one script call.

    ``completed`` items are :class:`Completed` records (or their plain tuples: ``(id,
    token)``, ``(id, token, result, keep_result_ms)``); ``retried`` items are
    :class:`Retried` records (or ``(id, token, delay_ms, max_attempts, error[,
    keep_result_ms])``). Every settle is fenced on its own token exactly as
    ``complete``/``retry`` are.
    """
    done: list[str] = []
    args: list[Arg] = [k.base, _lease(lease_ms), _int("n", n, 0, 1_000_000), 0]
    kept: list[Arg] = []
    kept_pairs: list[Arg] = []
    kept_ids: list[str] = []
    # Where each input's verdict sits in the reply (the script answers the plain pairs first,
    # then the result-keeping ones): Settled.completed follows the caller's order.
    at: list[tuple[bool, int]] = []
    for item in _iterable("completed", completed):
        c = _completed(item)
        if _int("keep_result_ms", c.keep_result_ms, 0, MAX_MS) > 0:
            at.append((True, len(kept_ids)))
            kept_ids.append(keyspace.check_id(c.id))
            value = b"" if c.result is None else _payload(c.result, k.max_payload)
            kept_pairs += (c.id, _token(c.token))
            kept += (value, c.keep_result_ms)
            continue
        at.append((False, len(done)))
        done.append(keyspace.check_id(c.id))
        args += (c.id, _token(c.token))
    # The pairs that keep a result go last, their (result, keep_result_ms) after ("c:r", D17).
    args[3] = f"{len(done) + len(kept_ids)}:{len(kept_ids)}" if kept_ids else len(done)
    args += kept_pairs + kept
    plain = len(done)
    done += kept_ids
    order = [plain + j if keeps else j for keeps, j in at]
    again: list[str] = []
    for item in _iterable("retried", retried):
        r = _retried(item)
        keep = _int("keep_result_ms", r.keep_result_ms, 0, MAX_MS)
        again.append(keyspace.check_id(r.id))
        ceiling = _int("max_attempts", r.max_attempts, 1)
        args += (
            r.id,
            _token(r.token),
            _int("delay_ms", r.delay_ms, 0, MAX_MS),
            f"{ceiling}:{keep}" if keep else ceiling,
            _text("error", r.error),
        )

    def decode(reply: Any) -> Settled:
        c, r, jobs, *rest = reply
        return Settled(
            [_verdict(done[j], c[j]) for j in order]
            if kept_ids
            else [_verdict(i, v) for i, v in zip(done, c, strict=True)],
            [_verdict(i, v) for i, v in zip(again, r, strict=True)],
            [_job(j) for j in jobs],
            int(rest[0]) if rest else 0,
            len(rest) > 1 and int(rest[1]) == 1,
        )

    keys = (k.meta, k.ring, k.active, k.schedule, k.dead)
    return _call("settle", keys, tuple(args), decode)


def complete_many(k: Keys, pairs: Iterable[tuple[str, int]]) -> Plan[list[str]]:
    """Complete many held jobs in one call; returns the ids that were refused (gone/stale)."""
    call = settle(k, pairs)
    if not call.args[3]:
        return []
    result: Settled = yield call
    ids_sent = call.args[4::2][: int(call.args[3])]  # plain pairs only: no "c:r" here
    return [str(i) for i, e in zip(ids_sent, result.completed, strict=True) if e is not None]


# --------------------------------------------------------------------------- sweeps


def promote(k: Keys, limit: int = 100) -> Call[int]:
    return _call("promote", (k.schedule,), (k.base, _int("limit", limit, 1)), _int_reply)


def reap(k: Keys, limit: int = 100) -> Call[int]:
    return _call("reap", (k.active,), (k.base, _int("limit", limit, 1)), _int_reply)


def sweep_stalled(
    k: Keys, max_stalled: int = 1, limit: int = 100
) -> Call[tuple[list[str], list[str]]]:
    def decode(reply: Any) -> tuple[list[str], list[str]]:
        return _str_list(reply[0]), _str_list(reply[1])

    args = (k.base, _int("max_stalled", max_stalled, 1), _int("limit", limit, 1))
    return _call("sweep_stalled", (k.active, k.dead), args, decode)


# --------------------------------------------------------------------------- job verbs


def reprocess(
    k: Keys, id: str, delay_ms: int | None = None, at_ms: int | None = None
) -> Call[None]:
    """A dead or kept completed job runs again (issue 24): waiting now, or scheduled at
    now + ``delay_ms`` (server clock) / ``at_ms`` (the caller's) when that is in the future."""
    jk = k.job(id)
    mode, value = _when(delay_ms, at_ms)
    args: tuple[Arg, ...] = (k.base, id) if mode == "now" else (k.base, id, mode, value)
    return _call("reprocess", (jk, k.dead), args, _gone_if_zero(id))


def keep_completed(k: Keys, count: int | None, age_ms: int | None = None) -> Call[None]:
    """Keep completed rows in ``completed``, at most ``count`` of them and none older than
    ``age_ms`` (by finish time, server clock); ``count=0`` or both None: off (the default,
    completion deletes the row). The setting is the meta field ``keep_completed``,
    ``<count>:<age_ms>`` (either part empty: no bound of that kind). Refused before I/O:
    a negative or non-int count, an age below 1 ms, an age with ``count=0``."""
    c = None if count is None else _int("keep_completed count", count, 0)
    a = None if age_ms is None else _int("keep_completed age_ms", age_ms, 1, MAX_MS)
    if c == 0 and a is not None:
        raise InvalidArgument("keep_completed(count=0) turns keeping off: pass no age_ms with it")
    value = "" if c == 0 or (c is None and a is None) else f"{_opt(c)}:{_opt(a)}"
    return _call("keep", (k.meta,), ("keep_completed", value), lambda _: None)


def keep_dead(k: Keys, count: int | None, age_ms: int | None = None) -> Call[None]:
    """Bound the dead set to ``count`` rows and to rows dead for less than ``age_ms`` (the
    set is scored by the time of death, server clock, D25), the longest dead going first;
    both None: unbounded (the default). Every script that dead-letters trims it in the same
    call. Refused before I/O: a count below 1 (a queue that keeps no dead job would lose
    every failure unseen), an age below 1 ms, a non-int."""
    c = None if count is None else _int("keep_dead count", count, 1)
    a = None if age_ms is None else _int("keep_dead age_ms", age_ms, 1, MAX_MS)
    value = "" if c is None and a is None else f"{_opt(c)}:{_opt(a)}"
    return _call("keep", (k.meta,), ("keep_dead", value), lambda _: None)


def _opt(n: int | None) -> str:
    return "" if n is None else str(n)


def remove(k: Keys, id: str, children: bool = True, seen: str = "") -> Call[None]:
    """``children`` (issue 24): a flow parent's waiting descendants go with it; False
    removes the job alone. ``seen`` (issue 37, ``_seen``): the state the caller saw; a job
    that moved since is refused (``StateError`` "moved"), nothing written."""
    if not isinstance(children, bool):
        raise InvalidArgument(f"children must be a bool, got {children!r}")
    args: tuple[str, ...] = (k.base, id, "1") if children else (k.base, id)
    if seen:
        args = (k.base, id, "1" if children else "0", seen)
    return _call("remove", (k.job(id),), args, _gone_if_zero(id))


def change_priority(k: Keys, id: str, priority: int) -> Call[None]:
    """change_priority.lua: a waiting job is rescored in its set, a scheduled one gets the
    row field (read at its promotion); any other state is ``StateError``, no row ``JobGone``."""
    args = (k.base, id, _priority(priority))
    return _call("change_priority", (k.job(id),), args, _gone_if_zero(id))


def run_now(k: Keys, id: str) -> Call[None]:
    return _call("run_now", (k.job(id), k.schedule), (k.base, id), _gone_if_zero(id))


# ---- issue 24: small controls ----------------------------------------------------------


def reschedule(
    k: Keys, id: str, delay_ms: int | None = None, *, at_ms: int | None = None
) -> Call[None]:
    """A scheduled job's run time: now + ``delay_ms`` (server clock) or ``at_ms`` (the
    caller's clock); StateError for a job that is not scheduled, JobGone without a row."""
    if delay_ms is None and at_ms is None:
        raise InvalidArgument("reschedule takes delay_ms or at_ms")
    mode, value = _when(delay_ms, at_ms)
    if mode == "now":  # delay_ms=0: due now (the next promote moves it)
        mode = "in"
    args = (k.base, id, mode, value)
    return _call("reschedule", (k.job(id), k.schedule), args, _gone_if_zero(id))


def update_payload(k: Keys, id: str, payload: bytes | str) -> Call[None]:
    """A waiting or scheduled job's payload replaced (the size rules of enqueue);
    StateError for an active, dead or held job, JobGone without a row."""
    data = _payload(payload, k.max_payload)
    return _call("update_payload", (k.job(id),), (k.base, id, data), _gone_if_zero(id))


# ---- end issue 24, small controls --------------------------------------------------------


def update_progress(k: Keys, id: str, value: str) -> Call[None]:
    args = (k.base, id, _text("value", value))
    return _call("update_progress", (k.job(id),), args, _gone_if_zero(id))


def add_log(k: Keys, id: str, line: str, keep: int | None = None) -> Call[int]:
    """add_log.lua: ``keep`` None sends none, so the job's own bound (its ``keep_logs``
    row field) trims; 0 keeps every line; N the newest N."""

    def decode(reply: Any) -> int:
        if reply == -1:
            raise JobGone(id)
        return int(reply)

    jk = k.job(id)
    args: tuple[str, ...] = (_text("line", line),)
    if keep is not None:
        args += (str(_int("keep", keep, 0)),)
    return _call("add_log", (jk, jk + ":logs"), args, decode)


def clear_logs(k: Keys, id: str, keep: int = 0) -> Call[int]:
    """Drop the job's log lines but the newest ``keep``; the number removed. JobGone
    without a row. Resent after a lost reply: a second copy leaves the same newest ``keep``
    lines (the count it answers may then be short)."""

    def decode(reply: Any) -> int:
        if reply == -1:
            raise JobGone(id)
        return int(reply)

    jk = k.job(id)
    return _call("clear_logs", (jk, jk + ":logs"), (_int("keep", keep, 0),), decode)


def logs(k: Keys, id: str) -> Call[list[bytes]]:
    def decode(reply: Any) -> list[bytes]:
        if reply is None:
            raise JobGone(id)
        return list(reply)

    jk = k.job(id)
    return _call("logs", (jk, jk + ":logs"), (), decode)


def errors(k: Keys, id: str) -> Call[list[str]]:
    """The errors of the job's failed attempts, oldest first (the last 10, ``attempt N:
    text``), kept in ``<row>:errors`` by retry and deleted with the row; JobGone without a
    row. The logs script reads it: the same shape, a row and the LIST beside it."""

    def decode(reply: Any) -> list[str]:
        if reply is None:
            raise JobGone(id)
        return [_s(e) for e in reply]

    jk = k.job(id)
    return _call("logs", (jk, jk + ":errors"), (), decode)


def get_job(k: Keys, id: str) -> Call[dict[str, str | bytes] | None]:
    def decode(reply: Any) -> dict[str, str | bytes] | None:
        if not reply:
            return None
        items = (
            reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2], strict=True)
        )
        row: dict[str, str | bytes] = {}
        for field, value in items:
            name = _s(field)
            # The payload is opaque bytes (D7); every other field is text.
            row[name] = value if name == "payload" else _s(value)
        return row

    return _cmd(("HGETALL", k.job(id)), decode)


def job_state(k: Keys, id: str) -> Call[str]:
    return _call("job_state", (k.job(id),), (k.base, id), _s)


__all__ += [
    "add_log",
    "browse",
    "change_priority",
    "check",
    "claim",
    "claim_batch",
    "clear_logs",
    "complete",
    "counts",
    "delay",
    "drain",
    "enqueue",
    "enqueue_many",
    "extend",
    "extend_many",
    "get_job",
    "is_paused",
    "keep_completed",
    "keep_dead",
    "job_state",
    "lane_depth",
    "lanes",
    "limit",
    "get_limit",
    "limit_lane",
    "logs",
    "errors",
    "obliterate",
    "pause",
    "pause_lane",
    "pending_size",
    "promote",
    "propose_shards",
    "reap",
    "reassign",
    "remove",
    "reprocess",
    "resume",
    "resume_lane",
    "reschedule",
    "retry",
    "run_now",
    "settle",
    "shards",
    "complete_many",
    "sweep_stalled",
    "update_payload",
    "update_progress",
    "weight_lane",
]


def wake_wait(k: Keys, timeout_ms: int) -> Call[bool]:
    """Block up to ``timeout_ms`` for a wake token on the queue's ``wake`` list (a ``BLPOP``,
    the worker's idle wait); True when a token came. Sending it again after a lost reply at
    most consumes one more token: a wake only makes a worker claim sooner."""
    seconds = f"{_int('timeout_ms', timeout_ms, 1) / 1000:.3f}"
    return _cmd(("BLPOP", k.wake, seconds), lambda reply: reply is not None)


__all__ += ["wake_wait"]
