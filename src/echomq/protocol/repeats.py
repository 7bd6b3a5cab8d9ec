"""Sans-I/O calls for repeatable / cron jobs (D19); ``protocol.compose`` re-exports them.

Like :mod:`echomq.protocol.calls`, every function validates first and returns a :class:`Call` or a
plan; nothing here touches the network, so bad input raises before any write.

Repeats (D19)
-------------
``emq:{q}:repeat`` is a ZSET: member = the repeat's name, score = its next fire (server ms).
``emq:{q}:repeat:<name>`` is a HASH: ``payload``, ``group``, ``every_ms`` *or* ``cron`` +
``tz``, and ``owner`` (the app that registered it, for ``@app.periodic``'s cleanup).

Firing is one script (``repeat_fire``): it takes only entries whose score is <= the server's
``TIME``, enqueues each occurrence and advances the score in the same call, so any number of
processes firing at once enqueue each occurrence exactly once. An occurrence's job id is
its fire time and the repeat's *slot* (``occurrence_id``): a number minted once when the name
is registered and kept in its row, unique among the queue's repeats (never a hash of the
name, whose truncated bits two names can share), so even a replayed fire finds the same job
instead of admitting a second one. An ``every_ms`` entry advances on the
server; a cron entry's next fire is computed here (croniter, in the entry's time zone) and
written by a compare-and-set on the old score in the next ``repeat_fire`` call.

Missed fires: a fleet that was down for several periods fires each repeat **once** when it
comes back, then continues on the schedule (an ``every_ms`` entry keeps its phase, a cron
entry its wall-clock times); it never replays one occurrence per missed period.

Cron and daylight saving time: an expression is matched against local wall-clock times in
``tz``, and the next fire is the earliest real instant after the previous one whose wall time
matches (never the first match of a naive local time: after 02:00 CEST on the autumn change
comes 02:15 CEST, not 02:00 CET). A wall time that does not exist (the spring-forward gap)
fires at the end of the gap, once however many of its times match (``*/15`` fires at 01:45
and 03:00, not four times at 03:00); a wall time that happens twice (fall back) fires once, at
its first occurrence, unless the expression's hour field is ``*`` (an hourly or finer job),
which fires in both hours as real time passes. So a daily 02:30 job fires once on both days.
An expression that matches no date (``0 0 30 2 *``) is ``InvalidArgument``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from echomq import ids, keyspace
from echomq.errors import InvalidArgument, InvalidId, StateError
from echomq.protocol.kernel import (
    MAX_INT,
    MAX_MS,
    Arg,
    Call,
    Keys,
    Plan,
    _call,
    _cmd,
    _group,
    _int,
    _int_reply,
    _payload,
    _resent,
    _s,
    _text,
)

__all__ = [
    "Repeat",
    "cron_next",
    "fire_due",
    "occurrence_id",
    "pause_repeat",
    "repeat",
    "repeats",
    "resume_repeat",
    "schedule",
    "unrepeat",
]

_SLOT_BITS = 22


@dataclass(frozen=True, slots=True)
class Repeat:
    """One registered repeatable job: its next fire (server ms; None once it is spent) and
    its schedule (``every_ms``, or ``cron`` in the time zone ``tz``); ``group`` is the lane
    its occurrences join, ``owner`` the app that registered it (``@app.periodic``).
    ``limit``/``until_ms`` (issue 24): at most that many fires, none due after that ms;
    ``fired`` counts the fires of a repeat that has either. ``paused`` (issue 26): it fires
    no more until ``resume_repeat`` (``next_ms`` is None meanwhile); ``last_ms``: the server
    ms of its last fire (None before its first, or for a spec written before issue 26)."""

    name: str
    next_ms: int | None
    every_ms: int | None
    cron: str | None
    tz: str
    group: str | None = None
    owner: str | None = None
    limit: int | None = None
    until_ms: int | None = None
    fired: int = 0
    paused: bool = False
    last_ms: int | None = None

    @property
    def ended(self) -> bool:
        """The repeat is spent (its limit reached or its end passed): it fires no more. A
        paused repeat is not ended (a spent one that is paused shows ended once resumed)."""
        return self.next_ms is None and not self.paused


# --------------------------------------------------------------------------- validation


def _name(name: object) -> str:
    try:
        return keyspace.check_lane(name)
    except InvalidId:
        raise InvalidArgument(
            f"a repeat name matches [A-Za-z0-9._-]{{1,128}}, got {name!r}"
        ) from None


def _zone(tz: object) -> ZoneInfo:
    if not isinstance(tz, str) or not tz:
        raise InvalidArgument(f"tz must be an IANA time zone name, got {tz!r}")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidArgument(f"unknown time zone {tz!r}") from None


def _cron(expr: object) -> str:
    from croniter import croniter  # type: ignore[import-untyped]

    if not isinstance(expr, str) or len(expr.split()) != 5:
        raise InvalidArgument(f"cron must be a 5-field cron expression, got {expr!r}")
    expr = " ".join(expr.split())
    if not croniter.is_valid(expr):
        raise InvalidArgument(f"invalid cron expression {expr!r}")
    if _never_fires(expr):
        raise InvalidArgument(f"cron expression {expr!r} never fires")
    return expr


@functools.lru_cache(maxsize=1024)
def _never_fires(expr: str) -> bool:
    """Whether a well-formed expression matches no date at all (``0 0 30 2 *``): croniter
    only finds out by searching for years (milliseconds), so the answer is kept; a beat
    meets the same hand-written entry again every second."""
    from croniter import CroniterError, croniter

    try:
        croniter(expr, datetime(2000, 1, 1)).get_next(datetime)
    except (CroniterError, ValueError):
        return True
    return False


# --------------------------------------------------------------------------- cron


def _instant(naive: datetime, zone: ZoneInfo, fold: int) -> datetime | None:
    """The UTC instant of a local wall time; None when it does not exist (DST gap)."""
    aware = naive.replace(tzinfo=zone, fold=fold)
    utc = aware.astimezone(timezone.utc)
    if utc.astimezone(zone).replace(tzinfo=None) != naive:
        return None
    return utc


def _gap_end(naive: datetime, zone: ZoneInfo) -> datetime:
    """The first instant after the DST gap that swallowed ``naive``: the wall time jumps
    over it, so a job set for it runs as soon as the clock is past it (as cron does)."""
    # fold=0 resolves a missing time with the offset before the gap: an instant after it.
    t = naive.replace(tzinfo=zone).astimezone(timezone.utc)
    step = timedelta(minutes=1)
    while (t - step).astimezone(zone).replace(tzinfo=None) > naive:
        t -= step
    return t


def cron_next(cron: str, tz: str, after_ms: int) -> int:
    """The first fire of ``cron`` in ``tz`` strictly after ``after_ms`` (unix ms), in unix
    ms: the earliest real instant after ``after_ms`` whose local wall time matches (see the
    module docstring for DST). ``InvalidArgument`` for an expression that never fires."""
    from croniter import CroniterError, croniter

    expr = _cron(cron)
    zone = _zone(tz)
    every_hour = expr.split()[1] == "*"
    after = datetime.fromtimestamp(after_ms / 1000, timezone.utc)
    # Walk naive local wall times. A wall time's instants do not grow with it across a fall
    # back (02:15 CEST is before 02:00 CET), so the first match after `after` is not always
    # the earliest instant: start early enough to see the matches of a repeated hour, keep
    # the earliest instant found, and stop once a wall time's earliest instant is past it
    # (the earliest instant of a wall time never decreases as the wall time grows).
    # A wall time n of an instant t > after is t + offset(t) > local(after) - (the largest
    # offset drop near `after`): start there (at local(after) when no change is near).
    window = timedelta(hours=3)
    offsets = [(after + d).astimezone(zone).utcoffset() for d in (-window, 0 * window, window)]
    spread = max(o for o in offsets if o is not None) - min(o for o in offsets if o is not None)
    start = after.astimezone(zone).replace(tzinfo=None) - spread
    best: datetime | None = None
    try:
        it = croniter(expr, start)
        for _ in range(100_000):
            naive: datetime = it.get_next(datetime)
            folds = (0, 1) if every_hour else (0,)
            found = [t for t in (_instant(naive, zone, f) for f in folds) if t is not None]
            if not found:
                found = [_gap_end(naive, zone)]
            if best is not None and min(found) > best:
                break
            for t in found:
                if t > after and (best is None or t < best):
                    best = t
    except (CroniterError, ValueError):
        raise InvalidArgument(f"cron expression {expr!r} never fires") from None
    if best is None:  # pragma: no cover - every valid expression matches within 100000 steps
        raise InvalidArgument(f"cron expression {expr!r} never fires")
    return int(best.timestamp() * 1000)


def occurrence_id(slot: int, fire_ms: int) -> str:
    """The job id ``repeat_fire`` gives the occurrence due at ``fire_ms`` of the repeat whose
    row holds ``slot`` (the same computation as ``occurrence_id`` in
    ``lua/include/compose.lua``)."""
    if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < 1 << _SLOT_BITS:
        raise InvalidArgument(f"a repeat slot is an int in [0, 2**22), got {slot!r}")
    return ids.encode("JOB", ((fire_ms - ids.EPOCH_MS) % (1 << 41)) << _SLOT_BITS | slot)


# --------------------------------------------------------------------------- verbs


def schedule(every_ms: object, cron: object, tz: object) -> tuple[str, str]:
    """Validate a repeat's schedule: ``(every_ms or '', normalized cron or '')``."""
    if (every_ms is None) == (cron is None):
        raise InvalidArgument("pass exactly one of every_ms and cron")
    _zone(tz)
    every = "" if every_ms is None else str(_int("every_ms", every_ms, 1, MAX_MS))
    expr = "" if cron is None else _cron(cron)
    return every, expr


def _spec_keys(k: Keys, name: str) -> tuple[str, str]:
    return k.base + "repeat", k.base + "repeat:" + name


def _set_keys(k: Keys, name: str) -> tuple[str, str, str, str]:
    return (*_spec_keys(k, name), k.meta, k.base + "repeatfree")


def repeat(
    k: Keys,
    name: str,
    payload: bytes | str,
    *,
    every_ms: int | None = None,
    cron: str | None = None,
    tz: str = "UTC",
    group: str | None = None,
    owner: str | None = None,
    limit: int | None = None,
    until_ms: int | None = None,
) -> Plan[str]:
    """Register (or update) ``name``: ``"registered"`` or ``"updated"``. ``limit``: at most
    that many fires; ``until_ms``: no fire due after that ms (the caller's clock) (issue 24)."""
    n = _name(name)
    data = _payload(payload, k.max_payload)
    g = _group(group)
    who = "" if owner is None else _text("owner", owner)
    every, expr = schedule(every_ms, cron, tz)
    most, end = repeat_limits(limit, until_ms)
    first: Arg = ""
    if expr:
        # The first fire is computed from the server's clock, like every later one.
        sec, usec = yield _cmd(("TIME",), lambda r: (int(r[0]), int(r[1])))
        first = cron_next(expr, tz, sec * 1000 + usec // 1000)
    status: str = yield _call(
        "repeat_set",
        _set_keys(k, n),
        (n, data, g, every, expr, tz, first, who, k.base, most, end),
        _s,
    )
    return status


def unrepeat(k: Keys, name: str) -> Call[bool]:
    """Unregister ``name``; True when it was registered. Enqueued occurrences stay."""
    n = _name(name)
    keys = (*_spec_keys(k, n), k.base + "repeatfree")
    return _call("repeat_remove", keys, (n,), lambda r: int(r) == 1)


def repeats(k: Keys) -> Plan[list[Repeat]]:
    """Every registered repeat, soonest first."""
    reg = k.base + "repeat"
    listed = yield _cmd(("ZRANGE", reg, 0, -1, "WITHSCORES"), lambda r: r)
    # A spent repeat's score is +inf (issue 24): no next fire.
    pairs = [(_s(m), _score(s)) for m, s in _pairs(listed)]
    if not pairs:
        return []
    fields: tuple[str, ...] = ("every_ms", "cron", "tz", "group", "owner", "limit", "until_ms")
    fields += ("fired", "paused", "last_ms")  # issue 26: paused, last_ms
    rows = yield [_cmd(("HMGET", reg + ":" + m, *fields), lambda r: r) for m, _ in pairs]
    out = []
    for (m, score), row in zip(pairs, rows, strict=True):
        if isinstance(row, BaseException):
            raise row
        every, expr, tz, grp, who, most, end, fired, paused, last = (
            _s(x) if x else "" for x in row
        )
        if not every and not expr:
            continue  # unregistered between the two reads
        out.append(
            Repeat(
                m,
                score,
                int(every) if every else None,
                expr or None,
                tz or "UTC",
                grp or None,
                who or None,
                int(most) if most else None,
                int(end) if end else None,
                int(fired) if fired else 0,
                paused == "1",
                int(last) if last else None,
            )
        )
    return out


def pause_repeat(k: Keys, name: str) -> Call[bool]:
    """Pause ``name`` (repeat_pause.lua, issue 26): it fires no more, its spec is kept, and
    registering it again (a worker start) keeps it paused. True when it is registered
    (paused now or already), False when no repeat has that name (nothing written)."""
    n = _name(name)
    return _call("repeat_pause", _spec_keys(k, n), (n,), lambda r: int(r) == 1)


def resume_repeat(k: Keys, name: str) -> Plan[bool]:
    """Resume a paused ``name`` (repeat_resume.lua, issue 26): its next fire is computed
    afresh from the server clock (``every_ms``: now + every_ms; cron: the first fire after
    now, computed here from the spec's cron and tz as ``repeat`` does). True when it is
    registered (resumed, or it was not paused: left as it is), False when no repeat has that
    name (nothing written). A spec whose schedule changes between the read and the call is
    read again."""
    n = _name(name)
    keys = _spec_keys(k, n)
    for _ in range(5):
        replies = yield [
            _cmd(("HMGET", keys[1], "every_ms", "cron", "tz", "paused"), lambda r: r),
            _cmd(("TIME",), lambda r: (int(r[0]), int(r[1]))),
        ]
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        spec, (sec, usec) = replies
        every, expr, tz, paused = (_s(x) if x else "" for x in spec)
        if not every and not expr:
            return False
        if paused != "1":
            return True
        first: Arg = ""
        zone = tz or "UTC"
        if expr:
            first = cron_next(expr, zone, sec * 1000 + usec // 1000)
        got: int = yield _call(
            "repeat_resume", keys, (n, expr, zone if expr else "", first), _int_reply
        )
        if got >= 0:
            return got == 1
    raise StateError(f"EMQSTATE repeat {n!r}: its schedule kept changing while it was resumed")


def _score(raw: Any) -> int | None:
    value = float(raw)
    return None if value == float("inf") else int(value)


def repeat_limits(limit: object, until_ms: object) -> tuple[Arg, Arg]:
    """A repeat's ``limit`` (fires, > 0) and ``until_ms`` (>= 0) as sent ('' for none);
    ``InvalidArgument`` before anything is written (issue 24)."""
    most: Arg = "" if limit is None else _int("limit", limit, 1, MAX_INT)
    end: Arg = "" if until_ms is None else _int("until_ms", until_ms, 0, MAX_INT)
    return most, end


def _pairs(reply: Any) -> list[tuple[Any, Any]]:
    if isinstance(reply, dict):
        return list(reply.items())
    items = list(reply)
    if items and isinstance(items[0], (list, tuple)):
        return [(a, b) for a, b in items]
    return list(zip(items[::2], items[1::2], strict=True))


def _fire(k: Keys, limit: int, peek: int) -> Plan[tuple[int, list[bytes]]]:
    """Fire due repeats; also read up to ``peek`` entries of the flow outbox in the same
    call. Returns (occurrences enqueued, outbox head)."""
    lim = _int("limit", limit, 1, 100_000)
    keys = (k.base + "repeat", k.meta)

    def decode(reply: Any) -> tuple[int, list[tuple[str, int, str, str]], int, list[bytes]]:
        fired, needs, now, outbox = reply
        flat = [_s(x) for x in needs]
        todo = [
            (flat[i], int(float(flat[i + 1])), flat[i + 2], flat[i + 3])
            for i in range(0, len(flat), 4)
        ]
        return int(fired), todo, int(now), [_b(e) for e in outbox]

    fired: int
    todo: list[tuple[str, int, str, str]]
    outbox: list[bytes]
    # Resent after a lost reply (issue 37): every caller fires each occurrence once (D19),
    # so a second copy is one more caller; only the count may come out short.
    fired, todo, now, outbox = yield from _resent(
        _call("repeat_fire", keys, (k.base, lim, peek, 0), decode)
    )
    if not todo:
        return fired, outbox
    triples: list[Arg] = []
    for name, old, expr, tz in todo:
        try:
            nxt = cron_next(expr, tz, max(old, now))
        except InvalidArgument:
            # A spec written by hand or by a newer client that we cannot parse: leave it for
            # a caller that can, rather than fail this caller's beat.
            continue
        triples += (name, old, nxt)
    if not triples:
        return fired, outbox
    more: int
    more, _, _, _ = yield from _resent(
        _call("repeat_fire", keys, (k.base, lim, 0, len(triples) // 3, *triples), decode)
    )
    return fired + more, outbox


def _b(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value


def fire_due(k: Keys, limit: int = 100) -> Plan[int]:
    """Enqueue every due occurrence (at most ``limit`` entries examined per call); returns
    how many were enqueued. One server call when nothing is due, or only ``every_ms``
    entries are; a second one carries the cron entries' next fires (compare-and-set)."""
    fired, _ = yield from _fire(k, limit, 0)
    return fired
