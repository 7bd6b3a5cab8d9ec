"""The protocol kernel: what every sans-I/O verb module stands on.

:class:`Call` (one round trip), :data:`Plan` (a multi-call verb), :class:`Keys` (a queue's key
names), the records a reply decodes to (:class:`Job`, :class:`Enqueued`, :class:`Settled`),
the argument checks every verb runs before its first call (``_int``, ``_payload``, the dedup
id...), and the decoders. ``protocol.calls``, ``protocol.control``, ``protocol.compose``,
``protocol.observe``, ``ops.snapshots`` and ``client.waiters`` import from here and never from
each other's cores, so the verb modules form no import cycle (tests/repo/test_import_graph.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, NamedTuple, TypeVar, Union

from echomq import keyspace
from echomq.errors import (
    EchoMQError,
    InvalidArgument,
    InvalidId,
    JobGone,
    PayloadTooLarge,
)
from echomq.protocol.scripts import SCRIPTS, Script

T = TypeVar("T")
WIRE_VERSION = "echomq:3.0.0"
DEFAULT_MAX_PAYLOAD = 16 * 1024 * 1024
# Lua numbers are doubles: every integer we send stays exact below 2**53.
MAX_INT = 2**53 - 1
# The longest lease or delay we accept: ~69 years keeps now + ms far from 2**53.
MAX_MS = 2**41
# An absolute time (at_ms, unix ms): the scripts take at most 15 digits (exact in a Lua
# number), so up to the year 33658; one more digit was refused by the server, untyped.
MAX_AT_MS = 10**15 - 1
# The scripts' integer guard (include/args.lua, and the module) takes at most 15 digits: the
# default ceiling of every integer argument a script checks (a count, max_attempts, limit).
MAX_ARG = 10**15 - 1
# The user-facing state names (a row's `state` value); "schedule" (the set's key suffix) is
# accepted as an alias wherever a state is named.
STATES = ("pending", "active", "scheduled", "dead", "completed")

Arg = Union[str, bytes, int]  # noqa: UP007 - a runtime alias on 3.10


# Not frozen: one Call is built per round trip, and a frozen dataclass's __init__ costs
# four times a plain one (object.__setattr__ per field). Nothing mutates a Call.
@dataclass(slots=True)
class Call(Generic[T]):
    """One round trip: ``script`` with ``keys`` and ``args``, or the command ``args`` when
    ``script`` is None; ``decode`` turns the reply into the verb's result (and raises the
    typed error a sentinel reply means). ``replay`` says the call may be sent again when its
    reply was lost: applying it twice is the same as once, or only delays work."""

    script: Script | None
    keys: tuple[str, ...]
    args: tuple[Arg, ...]
    decode: Callable[[Any], T]
    replay: bool = False


class Replay(Exception):
    """Thrown into a plan by the executor when a call's reply was lost: the plan may catch it
    and yield the call again (it knows whether that is safe), or let it propagate."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


# A multi-call verb: yields a Call (receives its decoded result) or a list of Calls to
# pipeline (receives a list of decoded results or exceptions), returns the verb's result.
Plan = Generator[Call[Any] | list[Call[Any]], Any, T]


@dataclass(frozen=True, slots=True)
class Job:
    """A claimed job: ``token`` is the fencing token every settle verb must present.

    ``floor`` is the count a re-admitted id came back with (its retired last token), raised
    by one for each ``RateLimit`` push-back and each shutdown hand-back; ``attempt`` is
    this incarnation's attempt number (``token - floor``, 1 for the first run), the one
    ``max_attempts`` counts.
    """

    id: str
    payload: bytes
    token: int
    group: str | None
    floor: int = 0

    @property
    def attempt(self) -> int:
        return self.token - self.floor


@dataclass(frozen=True, slots=True)
class Enqueued:
    """The receipt of an enqueue: the job id and what happened to it (``deduplicated``: a
    dedup key refused it, and ``id`` is the holder's, D20)."""

    id: str
    status: Literal["enqueued", "scheduled", "duplicate", "deduplicated"]


@dataclass(frozen=True, slots=True)
class Settled:
    """What one ``settle`` call did: per completed pair ``None`` (accepted) or the refusal
    (``JobGone``/``StaleToken``); per retried item ``"scheduled"``/``"dead"`` or the refusal;
    and the jobs it claimed."""

    completed: list[EchoMQError | None]
    retried: list[str | EchoMQError]
    jobs: list[Job]
    # D21: when the claim part got nothing because a rate limit holds jobs back, the ms until
    # its window reopens (the claim's own answer, no second round trip); else 0.
    rate_limited_ms: int = 0
    # D24 (issue 41): a claim was asked and the queue-wide limit leaves no room after it
    # while jobs wait (the worker claims with its next settles instead of waiting on the
    # wake list alone). False from a server whose settle does not say (0.6's trafikey).
    at_limit: bool = False


class Completed(NamedTuple):
    """One finished job for ``settle``: fenced on ``token`` as ``complete`` is; with
    ``keep_result_ms`` > 0 its ``result`` is kept that long (D17). A plain ``(id, token)``
    or ``(id, token, result, keep_result_ms)`` tuple is accepted too."""

    id: str
    token: int
    result: bytes | str | None = None
    keep_result_ms: int = 0


class Retried(NamedTuple):
    """One failed attempt for ``settle``: back to schedule after ``delay_ms``, or dead at
    ``max_attempts`` (this incarnation's attempts), fenced on ``token`` as ``retry`` is;
    ``keep_result_ms`` > 0: a dead-letter keeps its error that long (D17). A plain 5- or
    6-tuple in this order is accepted too."""

    id: str
    token: int
    delay_ms: int
    max_attempts: int
    error: str
    keep_result_ms: int = 0


class Keys:
    """The precomputed key names of one queue (all carry the ``{queue}`` hash tag)."""

    __slots__ = (
        "active",
        "base",
        "completed",
        "dead",
        "gactive",
        "glimit",
        "gweight",
        "lanes",
        "marker_ttls",
        "max_payload",
        "meta",
        "name",
        "paused",
        "pending",
        "ring",
        "schedule",
        "wake",
    )

    def __init__(self, queue: str, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        self.name = keyspace.check_queue(queue)
        if isinstance(max_payload, bool) or not isinstance(max_payload, int) or max_payload < 1:
            raise InvalidArgument(f"max_payload must be a positive int, got {max_payload!r}")
        self.max_payload = max_payload
        self.base = keyspace.base(queue)
        b = self.base
        self.pending, self.active = b + "pending", b + "active"
        self.schedule, self.dead = b + "schedule", b + "dead"
        self.completed = b + "completed"  # kept completed rows (issue 24)
        self.meta, self.ring, self.wake = b + "meta", b + "ring", b + "wake"
        self.lanes, self.paused = b + "lanes", b + "paused"
        self.glimit, self.gactive, self.gweight = b + "glimit", b + "gactive", b + "gweight"
        # replay_ms -> (client second, nonce prefixes): the replay-marker keys whose TTL a
        # call through these Keys has set (_produce). Kept here, not per queue name in the
        # process: a Queue talks to one server and database, and a process that talks to
        # several under one queue name must flag its first call to each one's key (issue 37).
        self.marker_ttls: dict[int, tuple[int, set[str]]] = {}

    def job(self, job_id: str) -> str:
        """The row key; the id is gated here, before any I/O."""
        return self.base + "job:" + keyspace.check_id(job_id)

    def lane(self, group: str) -> str:
        return self.base + "g:" + keyspace.check_lane(group) + ":pending"


# --------------------------------------------------------------------------- validation


def _int(name: str, value: object, lo: int, hi: int = MAX_ARG) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if not lo <= value <= hi:
        raise InvalidArgument(f"{name} must be in [{lo}, {hi}], got {value}")
    return value


# A job's priority: 0..2^21, lower runs first, 0 the default (PROTOCOL §2.2). It is the job's
# score in its waiting set, so 2^21 keeps every score an exact small integer.
MAX_PRIORITY = 2**21


def _priority(value: object) -> int:
    return _int("priority", value, 0, MAX_PRIORITY)


def _lease(value: object) -> int:
    return _int("lease_ms", value, 1, MAX_MS)


def _token(value: object) -> str:
    # Tokens are minted by claim starting at 1; 0 would match a never-claimed row.
    return str(_int("token", value, 1))


def _text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{name} must be a str, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgument(f"{name} is not encodable as UTF-8: {exc}") from None
    return value


def _payload(value: object, limit: int) -> bytes:
    if isinstance(value, str):
        try:
            data = value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidArgument(f"payload is not encodable as UTF-8: {exc}") from None
    elif isinstance(value, bytes):
        data = value
    elif isinstance(value, (bytearray, memoryview)):
        data = bytes(value)
    else:
        raise InvalidArgument(f"payload must be bytes or str, got {type(value).__name__}")
    if len(data) > limit:
        raise PayloadTooLarge(len(data), limit)
    return data


def _group(group: object) -> str:
    return "" if group is None else keyspace.check_lane(group)


def _when(delay_ms: object, at_ms: object) -> tuple[str, str]:
    """The enqueue mode: now, in (server clock + ms) or at (the caller's absolute ms)."""
    if delay_ms is not None and at_ms is not None:
        raise InvalidArgument("pass delay_ms or at_ms, not both")
    if delay_ms is not None:
        ms = _int("delay_ms", delay_ms, 0, MAX_MS)
        return ("in", str(ms)) if ms > 0 else ("now", "0")
    if at_ms is not None:
        return "at", str(_int("at_ms", at_ms, 0, MAX_AT_MS))
    return "now", "0"


def _ttl(ttl_ms: object) -> str:
    """An enqueue's expiry (issue 24): '' for none, else ms > 0 (0 or less is refused: a job
    that expires at once is a mistake, not a choice)."""
    return "" if ttl_ms is None else str(_int("ttl_ms", ttl_ms, 1, MAX_MS))


def _s(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _iterable(name: str, value: object) -> Iterable[Any]:
    """An iterable argument; anything else is InvalidArgument (not a bare TypeError)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidArgument(f"{name} must be an iterable, got {type(value).__name__}")
    return value


_SEEN_STATES = ("pending", "active", "scheduled", "dead", "completed", "awaiting_children")


def _seen(if_state: str | None, if_attempts: int | None) -> str:
    """Issue 37: the state (and attempts) a caller saw, as remove and cancel check it in the
    script ('' : no check). A job that moved since is skipped there, nothing written."""
    if if_state is None:
        if if_attempts is not None:
            raise InvalidArgument("if_attempts needs if_state")
        return ""
    if if_state not in _SEEN_STATES:
        raise InvalidArgument(f"if_state is one of {', '.join(_SEEN_STATES)}, got {if_state!r}")
    if if_attempts is None:
        return if_state
    if isinstance(if_attempts, bool) or not isinstance(if_attempts, int) or if_attempts < 0:
        raise InvalidArgument(f"if_attempts must be an int >= 0, got {if_attempts!r}")
    return f"{if_state}:{if_attempts}"


# --------------------------------------------------------------------------- decoders


def _gone_if_zero(job_id: str) -> Callable[[Any], None]:
    def decode(reply: Any) -> None:
        if reply == 0:
            raise JobGone(job_id)

    return decode


def _none(_: Any) -> None:
    return None


def _int_reply(reply: Any) -> int:
    return int(reply)


# A claimed Job built without its frozen dataclass __init__ (one object.__setattr__ call a
# field, ~4x the cost of setting its slots directly): a claim reply makes one per job.
_new_job = object.__new__
_set_id, _set_payload, _set_token, _set_group, _set_floor = (
    Job.__dict__[f].__set__ for f in ("id", "payload", "token", "group", "floor")
)


def _job(reply: Sequence[Any]) -> Job:
    if len(reply) == 4:  # no floor: the common case, unpacked without a slice
        jid, payload, token, group = reply
        floor = 0
    else:
        jid, payload, token, group = reply[:4]
        floor = int(reply[4]) if reply[4] else 0
    job = _new_job(Job)
    _set_id(job, _s(jid))
    _set_payload(job, payload if payload is not None else b"")
    _set_token(job, int(token))
    _set_group(job, _s(group) if group else None)
    _set_floor(job, floor)
    return job


def _str_list(reply: Iterable[bytes | str]) -> list[str]:
    return [_s(x) for x in reply]


def _call(
    name: str, keys: tuple[str, ...], args: tuple[Arg, ...], decode: Callable[[Any], T]
) -> Call[T]:
    script = SCRIPTS[name]
    # Whether a lost reply may be answered by resending is the script's own declared trait
    # (``Flags: replay`` in its header, see protocol/scripts.py).
    return Call(script, keys, args, decode, script.replay)


def _resent(call: Call[T]) -> Plan[T]:
    """One step of a plan that is sent again after a lost reply (issue 37): for a call whose
    second copy does what the first did or nothing (a drain slice, a repeat fire, a
    cancel), though it may then count less than the first copy did. The executor bounds
    the outage by ``retry_for`` (it raises past it) and sleeps between the copies."""
    while True:
        try:
            result: T = yield call
        except Replay:
            continue
        return result


def _cmd(args: tuple[Arg, ...], decode: Callable[[Any], T]) -> Call[T]:
    # Every plain command here is a read: always safe to send again.
    return Call(None, (), args, decode, True)


# --------------------------------------------------------------------------- dedup ids (D20)


DEDUP_MODES = ("simple", "throttle", "debounce")
# A dedup id (D3's grammar for `did`): a lane name's alphabet, up to 255 characters; no ':'
# or '{' to confuse the keyspace.
_DID = re.compile(r"[A-Za-z0-9._-]{1,255}")


def check_dedup(did: object) -> str:
    if not isinstance(did, str) or not _DID.fullmatch(did):
        raise InvalidId(f"a dedup id matches [A-Za-z0-9._-]{{1,255}}, got {did!r}")
    return did


def dedup_args(did: str | None, ttl_ms: int | None, mode: str) -> tuple[Arg, ...]:
    """A dedup's options checked (D20): (did, mode, ttl), () without a dedup id."""
    if mode not in DEDUP_MODES:
        raise InvalidArgument(f"dedup_mode must be one of {', '.join(DEDUP_MODES)}, got {mode!r}")
    if did is None:
        if ttl_ms is not None:
            raise InvalidArgument("dedup_ttl_ms needs a dedup id")
        return ()
    check_dedup(did)
    if mode == "simple":
        if ttl_ms is not None:
            raise InvalidArgument("a simple dedup key is held until its job ends: no dedup_ttl_ms")
        return (did, mode, 0)
    if ttl_ms is None:
        raise InvalidArgument(f"dedup_mode {mode!r} needs dedup_ttl_ms")
    return (did, mode, _int("dedup_ttl_ms", ttl_ms, 1, MAX_MS))
