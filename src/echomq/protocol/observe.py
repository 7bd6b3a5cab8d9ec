"""Sans-I/O calls that read what echomq records about itself: events (D15) and metrics (D16).

Like :mod:`echomq.protocol.calls`, every function validates first and returns a :class:`Call` or a
plan; nothing here touches the network, so bad input raises before any write.

Events (D15)
------------
``emq:{q}:events`` is a STREAM. It is written only by the transition scripts, in the same
script as the move, while the queue's ``meta`` hash holds the field ``events`` (its value is
the stream's approximate bound: ``XADD key MAXLEN ~ <events> * event <name> id <id> ...``).
Each entry has the fields ``event`` and (for job events) ``id``, then the event's extras
(``attempts``, ``group``, ``error``, ``delay_ms``, ...). :func:`enable_events` and
:func:`disable_events` only set or delete that ``meta`` field: the stream itself stays after
``disable_events`` (listeners can finish reading it; ``obliterate`` removes it).

Metrics (D16)
-------------
``emq:{q}:metrics:<kind>:data`` (kind ``completed`` or ``failed``) is a LIST, newest first.
Each element is the text ``"<minute>:<count>"`` where ``minute`` is
``floor(server unix seconds / 60)`` (the server clock, from ``TIME``) and ``count`` how many
settles of that kind happened in that minute. Only minutes with at least one settle have an
element, so the minutes of consecutive elements strictly decrease and may skip: a reader
zero-fills the gaps. Because every element names its own minute, one ``LRANGE`` is a
consistent read and the writer never back-fills idle minutes. The list holds at most
:data:`METRICS_POINTS` elements (so at least the last 24 hours of history).

The writer (in the settling scripts, once per script call that settled ``n > 0`` jobs of
``kind``) is O(1): it reads the head; when the head's minute is the current one (or later: a
server clock that stepped back adds to the newest minute rather than rewrite history) it
``LSET``\\s the head to the new sum, else it ``LPUSH``\\es ``"<minute>:<n>"`` and ``LTRIM``\\s to
the bound. That writer is ``bump_metrics`` in ``lua/include/observe.lua`` (and its C twin,
``emq_bump_metrics`` in ``native/observe.c``); the settling scripts include it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from echomq.errors import InvalidArgument
from echomq.protocol.kernel import MAX_INT, Call, Keys, Plan, _cmd, _int, _s

__all__ = [
    "EVENT_NAMES",
    "MAX_BLOCK_MS",
    "METRICS_KINDS",
    "METRICS_POINTS",
    "Event",
    "decode_metrics",
    "disable_events",
    "enable_events",
    "events",
    "events_enabled",
    "metrics",
]

METRICS_KINDS = ("completed", "failed")
METRICS_POINTS = 1440
# A blocking read must end well inside the client's 30 s socket timeout, or the wait would
# look like a dead connection; wait longer by calling again with the last stream id.
MAX_BLOCK_MS = 25_000
# The names D15 lists; the stream may carry others later (a reader must accept unknown ones).
EVENT_NAMES = (
    "enqueued",
    "scheduled",
    "active",
    "completed",
    "retried",
    "dead",
    "stalled",
    "reaped",
    "promoted",
    "reprocessed",
    "removed",
    "progress",
    "paused",
    "resumed",
    "drained",
    "deduplicated",
    "cancelled",
    # Beyond D15's list: a lease released by its holder (delay), a waiting job moved to
    # another lane (reassign).
    "delayed",
    "reassigned",
)

_STREAM_ID = re.compile(r"[0-9]{1,20}(-[0-9]{1,20})?")


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of a queue's event stream (D15).

    ``stream_id`` is the entry's id in the stream: pass it as ``after`` to read what came
    next. ``event`` is its name, ``id`` the job id (None for queue events such as
    ``paused``), ``fields`` the event's extras (``attempts``, ``error``, ``delay_ms``, ...).
    """

    stream_id: str
    event: str
    id: str | None
    fields: dict[str, str] = field(default_factory=dict)


def events_key(k: Keys) -> str:
    return k.base + "events"


def metrics_key(k: Keys, kind: str) -> str:
    return k.base + "metrics:" + kind + ":data"


# --------------------------------------------------------------------------- events


def enable_events(k: Keys, maxlen: int = 10_000) -> Call[None]:
    """Turn the queue's events on: every transition from now on appends its event, and the
    stream is trimmed to about ``maxlen`` entries."""
    n = _int("maxlen", maxlen, 1, MAX_INT)
    # HSET of the same value is idempotent: safe to resend after a lost reply.
    return Call(None, (), ("HSET", k.meta, "events", n), lambda _: None, True)


def disable_events(k: Keys) -> Call[None]:
    """Turn the queue's events off (no extra write on any path); the stream is kept."""
    return Call(None, (), ("HDEL", k.meta, "events"), lambda _: None, True)


def events_enabled(k: Keys) -> Call[int]:
    """The stream bound when events are on, else 0."""
    return _cmd(("HGET", k.meta, "events"), lambda r: int(r) if r is not None else 0)


def _after(value: object) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"after must be a stream id str, got {type(value).__name__}")
    if value in ("$", "0") or _STREAM_ID.fullmatch(value):
        return value
    raise InvalidArgument(
        f"after must be '0', '$' or a stream id like '1700000000000-0', got {value!r}"
    )


def _entry(raw: Sequence[Any]) -> Event:
    sid, flat = raw[0], raw[1]
    if isinstance(flat, dict):
        pairs = list(flat.items())
    else:
        pairs = list(zip(flat[::2], flat[1::2], strict=True))
    extras: dict[str, str] = {}
    name = ""
    job: str | None = None
    for f, v in pairs:
        key, value = _s(f), _s(v)
        if key == "event":
            name = value
        elif key == "id":
            job = value
        else:
            extras[key] = value
    return Event(_s(sid), name, job, extras)


def decode_events(reply: Any) -> list[Event]:
    """An XREAD reply (RESP2 list or RESP3 map; None when the block timed out) as events."""
    if not reply:
        return []
    streams = list(reply.values()) if isinstance(reply, dict) else [s[1] for s in reply]
    out: list[Event] = []
    for stream in streams:
        entries = stream
        # RESP3 with redis-py may wrap the entries of one stream in a one-element list.
        if (
            entries
            and isinstance(entries[0], list)
            and entries[0]
            and isinstance(entries[0][0], list)
        ):
            entries = entries[0]
        out.extend(_entry(e) for e in entries)
    return out


def events(
    k: Keys, after: str = "0", count: int = 100, block_ms: int | None = None
) -> Call[list[Event]]:
    """Up to ``count`` events after the stream id ``after``, oldest first.

    ``after="0"`` reads from the start of what the bound kept; ``after="$"`` only sees events
    appended while the call blocks (so it needs ``block_ms``). ``block_ms`` waits up to that
    long for the first event when none is there yet.
    """
    start = _after(after)
    n = _int("count", count, 1, 1_000_000)
    args: list[str | int] = ["XREAD", "COUNT", n]
    if block_ms is not None:
        args += ["BLOCK", _int("block_ms", block_ms, 1, MAX_BLOCK_MS)]
    args += ["STREAMS", events_key(k), start]
    return _cmd(tuple(args), decode_events)


# --------------------------------------------------------------------------- metrics


def _kind(kind: object) -> str:
    if not isinstance(kind, str) or kind not in METRICS_KINDS:
        raise InvalidArgument(f"kind must be one of {', '.join(METRICS_KINDS)}, got {kind!r}")
    return kind


def decode_metrics(now_s: int, entries: Sequence[bytes | str], minutes: int) -> list[int]:
    """``minutes`` per-minute counts, the current minute (of ``now_s``) first, zero-filled,
    from the elements of a ``metrics:<kind>:data`` list (see the module docstring)."""
    out = [0] * minutes
    current = now_s // 60
    for raw in entries:
        text = _s(raw)
        m, sep, c = text.partition(":")
        if not sep:
            continue  # not ours: a foreign or legacy element is skipped, never fatal
        try:
            minute, count = int(m), int(c)
        except ValueError:
            continue
        # A minute "in the future" is a server clock that stepped back: it is the newest.
        age = max(0, current - minute)
        if age >= minutes:
            break  # elements are newest first: every later one is older still
        out[age] += count
    return out


def metrics(k: Keys, kind: str = "completed", minutes: int = 60) -> Plan[list[int]]:
    """``minutes`` per-minute counts of ``kind`` settles, the current (open) minute first."""
    name = _kind(kind)
    m = _int("minutes", minutes, 1, METRICS_POINTS)
    # One element per minute at most: the first `m` elements cover every minute asked for.
    now, entries = yield [
        _cmd(("TIME",), lambda r: int(r[0])),
        _cmd(("LRANGE", metrics_key(k, name), 0, m - 1), list),
    ]
    for part in (now, entries):
        if isinstance(part, BaseException):
            raise part
    return decode_metrics(now, entries, m)
