"""Sans-I/O kept results (D17), dedup keys (D20) and cancel (D22).

Sans-I/O calls for the controls a caller steers jobs with: kept results (D17), dedup keys
(D20) and cooperative cancel (D22).

Like :mod:`echomq.protocol.calls`, every function validates first and returns a :class:`Call` or a
plan, so bad input raises before any write.

Results (D17)
-------------
``emq:{q}:result:<id>`` is a HASH written by the settling script itself when the caller asked
to keep the outcome (``keep_result_ms > 0``): ``result`` (the completion's bytes) or ``error``
(a dead-letter's last error), ``attempts`` and ``finished_ms`` (server clock), with a PX TTL
of ``keep_result_ms``. The same script pushes one token on ``emq:{q}:notify:<id>`` (a LIST,
same TTL) -- only while a waiter's marker ``emq:{q}:want:<id>`` (a STRING, TTL
:data:`WANT_MS`) exists, so a result nobody waits for costs its hash alone. A waiter sets the
marker, reads the result, and only when it is absent blocks on the notify list (``BLPOP``);
a waiter that takes the token puts it back (``notify_rearm.lua``) before it reads the result
again, so one push wakes every waiter of the job in every process. Mark, read, block: a
completion after the read sees the marker and leaves its token in the list, so no wake-up is
lost, and no waiter polls.

Dedup (D20)
-----------
``emq:{q}:de:<did>`` is a STRING holding the id of the job that took the key; the job's row
keeps ``dedup = <did>``. *simple*: no TTL, released by the script that completes, dead-letters,
removes, cancels or drains the holder (only while it still names that holder). *throttle*:
held for ``dedup_ttl_ms``. *debounce*: held for ``dedup_ttl_ms``, and a refused enqueue
replaces the holder's payload and run time while the holder still waits. A refused enqueue
answers ``Enqueued(id=<holder>, status="deduplicated")``.

Cancel (D22)
------------
``cancel.lua``: a waiting or scheduled job is removed at once; an active one gets the row
field ``cancel`` (``"remove"`` with ``remove=True``: the holder's "cancelled" settle then
removes the job instead of dead-lettering it). ``extend_many`` appends ``"!" + id`` for every
extended job whose flag is set (``"!"`` is never part of an id); :func:`extend_leases` splits
that reply.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from echomq import keyspace
from echomq.errors import InvalidArgument, JobFailed
from echomq.protocol.kernel import (
    DEDUP_MODES,
    MAX_INT,
    MAX_MS,
    Arg,
    Call,
    Keys,
    Plan,
    Replay,
    _call,
    _cmd,
    _gone_if_zero,
    _int,
    _iterable,
    _lease,
    _resent,
    _s,
    _str_list,
    _token,
    check_dedup,
    dedup_args,
)

__all__ = [
    "DEDUP_MODES",
    "MAX_BLOCK_S",
    "Result",
    "outcome",
    "cancel",
    "check_dedup",
    "clear_rate_limit",
    "dedup_args",
    "dedup_holder",
    "extend_leases",
    "idle_wait_ms",
    "WANT_MS",
    "notify_key",
    "push_back",
    "rate_limit",
    "rate_limit_ttl",
    "rearm",
    "result",
    "result_key",
    "split_flags",
    "wait",
    "wait_deadline",
    "want",
    "want_key",
]

# A blocking read must end well inside the client's 30 s socket timeout (see _connect).
MAX_BLOCK_S = 20.0
# A waiter marker outlives any one block by a wide margin: a waiter refreshes it before each
# block, and a fixed TTL means another waiter's refresh can never shorten it.
WANT_MS = int(MAX_BLOCK_S * 1000) + 10_000


@dataclass(frozen=True, slots=True)
class Result:
    """A kept outcome (D17): ``value`` is what the completion passed as its result (empty for
    a dead-letter, whose last error is ``error``), ``attempts`` the job's attempt count and
    ``finished_ms`` the server time of the settle."""

    id: str
    value: bytes
    attempts: int
    finished_ms: int
    error: str | None = None


def result_key(k: Keys, id: str) -> str:
    return k.base + "result:" + keyspace.check_id(id)


def notify_key(k: Keys, id: str) -> str:
    return k.base + "notify:" + keyspace.check_id(id)


def want_key(k: Keys, id: str) -> str:
    """A waiter's marker: the settling script pushes the wake token only while it exists."""
    return k.base + "want:" + keyspace.check_id(id)


def want(k: Keys, id: str) -> Call[None]:
    """Set (or refresh) the waiter marker of ``id`` for :data:`WANT_MS`."""
    return _cmd(("SET", want_key(k, id), "1", "PX", WANT_MS), _nothing)


def _keep(value: object) -> int:
    return _int("keep_result_ms", value, 0, MAX_MS)


# --------------------------------------------------------------------------- results (D17)


def _decode_result(id: str, reply: Any) -> Result | None:
    if not reply:
        return None
    items = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2], strict=True)
    row = {_s(f): v for f, v in items}
    error = row.get("error")
    return Result(
        id,
        bytes(row.get("result") or b""),
        int(row.get("attempts") or 0),
        int(row.get("finished_ms") or 0),
        _s(error) if error is not None else None,
    )


def _dead_row(id: str, reply: Any) -> Result | None:
    # HMGET row state last_error attempts: a dead row is an outcome without a kept result.
    if not reply or reply[0] is None or _s(reply[0]) != "dead":
        return None
    error = _s(reply[1]) if reply[1] is not None else "dead"
    attempts = int(reply[2]) if reply[2] is not None and bytes(reply[2]).isdigit() else 0
    return Result(id, b"", attempts, 0, error)


def result(k: Keys, id: str) -> Plan[Result | None]:
    """The kept outcome of a job; else, when its row is dead (a dead-letter whose error was
    not kept, a flow parent failed by its child), that death (``error`` = its last error,
    ``finished_ms`` 0); else None (not finished, not kept, or expired). The row is read only
    when no outcome is kept."""
    kept: Result | None = yield _cmd(
        ("HGETALL", result_key(k, id)), lambda r: _decode_result(id, r)
    )
    if kept is not None:
        return kept
    # Single commands, not a pipeline: a pipeline holds a pooled connection of its own, and
    # hundreds of asyncio waiters reading at once would exhaust the pool.
    dead: Result | None = yield _cmd(
        ("HMGET", k.job(id), "state", "last_error", "attempts"), lambda r: _dead_row(id, r)
    )
    return dead


def rearm(k: Keys, id: str) -> Call[int]:
    """Put back the notify token a waiter took, so the job's other waiters wake too."""
    return _call("notify_rearm", (notify_key(k, id), result_key(k, id)), (), int)


def _outcome(r: Result) -> Result:
    if r.error is not None:
        raise JobFailed(r.id, r.error)
    return r


def _timeout(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise InvalidArgument(f"timeout_s must be a number >= 0, got {value!r}")
    try:
        return float(value)
    except OverflowError:  # an int past a float's range: 10**400 seconds
        raise InvalidArgument(f"timeout_s is too large, got {value!r}") from None


def wait(k: Keys, id: str, timeout_s: float) -> Plan[Result]:
    """Wait for a job's kept outcome: read it; while absent, block on its notify list
    (``BLPOP``, at most :data:`MAX_BLOCK_S` per call) and read again. Raises
    :class:`JobFailed` for a kept dead-letter or a dead row (at once: a job that is dead, or
    dies while waited on, never waits out the timeout) and ``TimeoutError`` at the deadline.

    Run it with the executor's ``deadline`` (:func:`wait_deadline`): a step lost to a
    failover is not resent as it was (a resent ``BLPOP`` would block for its whole first
    timeout again) but thrown back here as ``Replay``, and the wait starts over from the
    marker with the time that is left, or times out at its deadline."""
    timeout = _timeout(timeout_s)
    nk = notify_key(k, id)
    deadline = time.monotonic() + timeout
    while True:
        try:
            # Marker first, then read, then block: a completion after the read sees the
            # marker and pushes the token this block takes (include/control.lua keep_outcome).
            yield want(k, id)
            found = yield from result(k, id)
            if found is not None:
                return _outcome(found)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"job {id}: no result within {timeout} s")
            block = f"{min(left, MAX_BLOCK_S):.3f}"
            woken = yield Call(None, (), ("BLPOP", nk, block), lambda r: r is not None, False)
            if woken:
                yield rearm(k, id)
        except Replay as lost:
            # A token the lost BLPOP may have taken is not needed: the result it announced
            # is read at the top. Past the deadline the wait is over, whatever the server.
            if time.monotonic() >= deadline:
                raise TimeoutError(f"job {id}: no result within {timeout} s") from lost.cause


def wait_deadline(timeout_s: float) -> float:
    """The monotonic deadline of a ``wait(timeout_s=...)`` (``timeout_s`` checked first)."""
    return time.monotonic() + _timeout(timeout_s)


# --------------------------------------------------------------------------- dedup (D20)


def dedup_holder(k: Keys, did: str) -> Call[str | None]:
    """The id of the job holding dedup id ``did``, or None."""
    key = k.base + "de:" + check_dedup(did)
    return _cmd(("GET", key), lambda r: _s(r) if r is not None else None)


# --------------------------------------------------------------------------- rate limits (D21)


def rate_limit(k: Keys, max: int, window_ms: int, group: str | None = None) -> Call[None]:
    """Allow at most ``max`` claims per ``window_ms`` (server clock), queue-wide or for one
    lane; counted inside every claim path (claim, claim_batch, settle)."""
    g = "" if group is None else keyspace.check_lane(group)
    args = (k.base, g, _int("max", max, 1, MAX_INT), _int("window_ms", window_ms, 1, MAX_MS))
    return _call("rate_limit", (k.meta,), args, _nothing)


def clear_rate_limit(k: Keys, group: str | None = None) -> Call[None]:
    g = "" if group is None else keyspace.check_lane(group)
    return _call("rate_limit", (k.meta,), (k.base, g, "", ""), _nothing)


def rate_limit_ttl(k: Keys, group: str | None = None) -> Call[int]:
    """The ms until the spent window reopens (queue-wide, or the lane's); 0 = open."""
    g = "" if group is None else keyspace.check_lane(group)
    return _call("rate_ttl", (k.meta,), (k.base, g), int)


def idle_wait_ms(k: Keys) -> Call[tuple[int, int]]:
    """The worker's idle wait (D21): ``(ms until the queue-wide window reopens, ms until the
    first rate-held lane is readmitted)``, each 0 when nothing waits."""
    return _call("rate_ttl", (k.meta,), (k.base, "*"), lambda r: (int(r[0]), int(r[1])))


def push_back(k: Keys, id: str, token: int, delay_ms: int) -> Call[None]:
    """Release a held job to run again after ``delay_ms`` without spending an attempt (a
    handler's ``raise echomq.RateLimit(delay_ms)``, and with 0 a worker's shutdown
    hand-back; see push_back.lua)."""
    keys = (k.active, k.schedule, k.job(id))
    args = (k.base, id, _token(token), _int("delay_ms", delay_ms, 0, MAX_MS))
    return _call("push_back", keys, args, _gone_if_zero(id))


def _nothing(_: Any) -> None:
    return None


# --------------------------------------------------------------------------- cancel (D22)


def cancel(k: Keys, id: str, remove: bool = False, seen: str = "") -> Plan[str]:
    """cancel.lua; ``remove``: an active job's holder removes it instead of dead-lettering
    it (a waiting or scheduled job is removed either way). ``seen`` (issue 37, ``_seen``):
    the state the caller saw; a job that moved since is refused (``StateError`` "moved")."""
    if not isinstance(remove, bool):
        raise InvalidArgument(f"remove must be a bool, got {remove!r}")

    def decode(reply: Any) -> Literal["removed", "signalled", "absent"]:
        text = _s(reply)
        assert text in ("removed", "signalled", "absent"), text
        return text  # type: ignore[return-value]

    args: tuple[str, ...] = (k.base, id, "1") if remove else (k.base, id)
    if seen:
        args = (k.base, id, "1" if remove else "0", seen)
    # Resent after a lost reply (issue 37): a second copy finds the job cancelled (removed:
    # "absent"; signalled: flagged again, one more nudge). The job is cancelled either way.
    return (yield from _resent(_call("cancel", (k.job(id),), args, decode)))


def cancel_all(k: Keys, budget: int = 1000) -> Plan[dict[str, int]]:
    """Issue 24: cancel every waiting and scheduled job (removed, as ``cancel`` removes one)
    and signal every active one (as ``cancel`` signals one), in bounded slices: the drain
    script in its cancel mode, each call at most ``budget`` jobs, looped here until done.
    Returns ``{"removed": n, "signalled": m}``. Dead jobs and flow parents awaiting their
    children are left (a parent whose children all went is released and cancelled too)."""
    _int("budget", budget, 1, 100_000)
    removed = signalled = 0
    cursor = ""
    while True:
        # Resent after a lost reply (issue 37), as drain's slices are: the counts may come
        # out short after an outage, never the effect.
        deleted, cursor, flagged = yield from _resent(
            _call(
                "drain",
                (k.pending, k.lanes),
                (k.base, "1", budget, cursor, "cancel"),
                lambda r: (int(r[0]), _s(r[1]), int(r[2])),
            )
        )
        removed += deleted
        signalled += flagged
        if not cursor:
            return {"removed": removed, "signalled": signalled}


def cancels_signalled(k: Keys) -> Call[int]:
    """The queue's count of cancels signalled to running jobs (``meta.cancels``, D22): a
    worker holding jobs polls it and extends at once when it moves, so a cancel reaches
    the handler in well under a second instead of at the next lease/3 heartbeat."""
    return _cmd(("HGET", k.meta, "cancels"), lambda reply: int(reply or 0))


def extend_leases(
    k: Keys, pairs: Iterable[tuple[str, int]], lease_ms: int
) -> Plan[tuple[list[str], list[str]]]:
    """extend_many, returning ``(failed ids, cancel-flagged ids)`` (D22)."""
    args: list[Arg] = [k.base, _lease(lease_ms)]
    for pair in _iterable("pairs", pairs):
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise InvalidArgument(f"extend_many takes (id, token) pairs, got {pair!r}")
        args += (keyspace.check_id(pair[0]), _token(pair[1]))
    if len(args) == 2:
        return [], []
    reply: list[str] = yield _call("extend_many", (k.active,), tuple(args), _str_list)
    return split_flags(reply)


def split_flags(reply: list[str]) -> tuple[list[str], list[str]]:
    """An extend_many reply as ``(failed ids, cancel-flagged ids)``."""
    failed = [i for i in reply if not i.startswith("!")]
    flagged = [i[1:] for i in reply if i.startswith("!")]
    return failed, flagged


def outcome(k: Keys, id: str) -> Plan[tuple[Result | None, str]]:
    """The job's kept outcome (a dead row's death included), and where the job is when
    there is none. A job that finished between the two reads (absent, dead, or a kept
    completed row, now) is read again: its outcome is kept by then."""
    kept = yield from result(k, id)
    if kept is not None:
        return kept, "finished"
    # job_state.lua, as _protocol.job_state sends it (_control does not import _protocol).
    state: str = yield _call("job_state", (k.job(id),), (k.base, id), _s)
    if state in ("absent", "completed", "dead"):
        kept = yield from result(k, id)
    return kept, state
