"""The sans-I/O core: every verb validates, builds its keys and arguments, and decodes.

A verb returns a :class:`Call` (one script or command) or a :data:`Plan` (a generator that
yields calls, or lists of calls to pipeline, and returns the verb's result). ``Queue`` and
``AsyncQueue`` drive the same objects, so validation, keys, decoding and error mapping exist
once and the two classes differ only by ``await``. Nothing here touches the network: all
validation happens before the first call is yielded, so bad input never writes.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterable
from typing import Any

from echomq import ids, keyspace
from echomq._kernel import (
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
    _group,
    _int,
    _int_reply,
    _iterable,
    _job,
    _lease,
    _none,
    _payload,
    _priority,
    _s,
    _str_list,
    _text,
    _token,
    _ttl,
    _when,
    dedup_args,
)
from echomq.errors import (
    EchoMQError,
    InvalidArgument,
    JobGone,
    KindError,
    from_reply,
)

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

_ENQUEUE_CHUNK_ITEMS = 1000
_ENQUEUE_CHUNK_BYTES = 1 << 20
_REMINT_TRIES = 8

# Replay nonces come from a private generator seeded from os.urandom (and reseeded in a
# forked child): an application's random.seed() cannot make two processes' nonces collide,
# and a nonce costs a third of secrets.token_hex (no system call per enqueue).
_nonces = random.Random()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_nonces.seed)


def _nonce() -> str:
    """A fresh 48-bit replay nonce in hex (the call's identity across its resends)."""
    return f"{_nonces.getrandbits(48):012x}"


# The replay-marker keys (include/admit.lua) this process has seen take a TTL: per queue and
# replay_ms, the client-clock second they belong to and the nonce prefixes (one key each)
# whose TTL a call of ours has set. Until one has, every call to that key asks the script to
# set it (flag 'x'), so a key is never left without one by us; after, the key's later
# markers come within that second and cost one HSET. A new second starts the set afresh.
_marker_ttls: dict[str, tuple[int, set[str]]] = {}
# The answers of a call whose first copy wrote its marker (with the TTL, when flagged 'x').
_MARKED = frozenset(("enqueued", "scheduled", "replayed", "replayed:scheduled"))


# How many markers of one process a key gets in a second, about: the calls of a second are
# spread over one key per _PER_KEY of them (at the rate of that second or the one before,
# whichever is higher; 1 to 256 keys), so a key's TTL is written once per ~64 markers at any
# rate, and a key stays small enough for the compact listpack encoding (128 fields).
_PER_KEY = 64
_rates: dict[str, list[int]] = {}  # scope -> [second, calls in it, calls in the one before]


def _bucket(scope: str, second: int) -> str:
    """The marker key's nonce prefix (two hex digits) for a new call in ``second``."""
    got = _rates.get(scope)
    if got is None or got[0] != second:
        before = got[1] if got is not None and got[0] == second - 1 else 0
        got = _rates[scope] = [second, 0, before]
    got[1] += 1
    keys = min(256, (max(got[1], got[2]) - 1) // _PER_KEY + 1)
    return f"{_nonces.randrange(keys):02x}"


def _second() -> int:
    """The client-clock second that names a new call's marker key."""
    return int(time.time())


def _needs_ttl(scope: str, second: int, nn: str) -> bool:
    got = _marker_ttls.get(scope)
    return got is None or got[0] != second or nn not in got[1]


def _ttl_set(scope: str, second: int, nn: str) -> None:
    got = _marker_ttls.get(scope)
    if got is None or got[0] < second:
        _marker_ttls[scope] = (second, {nn})
    elif got[0] == second:
        got[1].add(nn)


# --------------------------------------------------------------------------- producer verbs


def enqueue(
    k: Keys,
    payload: bytes | str,
    *,
    id: str | None = None,
    group: str | None = None,
    delay_ms: int | None = None,
    at_ms: int | None = None,
    replay_ms: int = 0,
    dedup: str | None = None,
    dedup_ttl_ms: int | None = None,
    dedup_mode: str = "simple",
    priority: int = 0,
    ttl_ms: int | None = None,
) -> Plan[Enqueued]:
    """``priority``: 0..2^21, lower runs first (ARGV[14], sent when not 0 or with a ttl).
    ``replay_ms``: how long the server remembers this call for its resends (a resend
    after a lost reply then finds its first copy even once that job has completed: it is
    never admitted twice); 0 when the caller never resends. ``dedup*``: D20, see _control.
    ``ttl_ms``: the job expires that long after this call (server clock) unless claimed
    (ARGV[15])."""
    data = _payload(payload, k.max_payload)
    g = _group(group)
    mode, value = _when(delay_ms, at_ms)
    pri = _priority(priority)
    ttl = _ttl(ttl_ms)
    extra: tuple[Arg, ...] = ()
    if dedup is not None or dedup_ttl_ms is not None or dedup_mode != "simple":
        extra = dedup_args(dedup, dedup_ttl_ms, dedup_mode)
    minted = id is None
    jid = ids.mint() if id is None else keyspace.check_id(id)
    nonce = _nonce() if replay_ms else ""
    scope = f"{k.base}{replay_ms}"

    for _ in range(_REMINT_TRIES):
        # flags: 'f' the id was minted here (never handed out: the script skips the retired
        # record), 'r' a resend, 'x' set the replay marker key's TTL (see _marker_ttls).
        flags = "f" if minted else ""
        second = 0
        if nonce:
            # The marker's key is named by this second of our clock (the same on every
            # resend): the script reads no clock for it and a resend reads one field.
            second = _second()
            nonce = _bucket(scope, second) + nonce[2:]
            if _needs_ttl(scope, second, nonce[:2]):
                flags += "x"
            tail: tuple[Arg, ...] = (*(extra or ("", "simple", 0)), second)
        else:
            tail = extra
        if pri or ttl:
            # ARGV[14] (priority) and ARGV[15] (ttl) follow the optional ARGV[8..13]: fill
            # the ones this call left out (the second is read only with a nonce; the
            # priority 0 when only a ttl is sent).
            head = ("", "simple", 0) if not tail else tail[:3]
            tail = (*head, tail[3] if len(tail) > 3 else 0, pri)
            if ttl:
                tail = (*tail, ttl)
        args = (k.base, jid, data, g, mode, value, flags, replay_ms, nonce, *tail)
        # The id is a checked one (minted here, or check_id above): its key needs no check.
        keys = (k.base + "job:" + jid, k.meta)
        call = _call("enqueue", keys, args, _s)
        resent = False
        while True:
            try:
                status = yield call
                break
            except Replay:
                # The reply was lost: the enqueue may or may not have landed. Resend it flagged
                # as a resend: the same id and nonce find the first copy's marker if it landed
                # (even if that job has completed since), so it is never admitted twice.
                resend = (k.base, jid, data, g, mode, value, flags + "r", replay_ms, nonce, *tail)
                call = _call("enqueue", keys, resend, _s)
                resent = True
        if "x" in flags and status in _MARKED:
            _ttl_set(scope, second, nonce[:2])  # that call wrote the marker and its TTL
        if status == "replayed":
            return Enqueued(jid, "enqueued")
        if status == "replayed:scheduled":
            return Enqueued(jid, "scheduled")
        if status.startswith("deduplicated:"):
            return Enqueued(status[len("deduplicated:") :], "deduplicated")
        if minted and status == "duplicate":
            if resent and not nonce:
                # No marker (replay_ms=0): the row a resend of a minted id finds is its own
                # first copy's.
                return Enqueued(jid, "enqueued" if mode == "now" else "scheduled")
            # Else a minted id that already exists is a collision with another process's
            # minter, not our own first copy (that one would have answered "replayed" from
            # its marker): mint again rather than report someone else's job.
            jid = ids.mint()
            nonce = _nonce() if replay_ms else ""
            continue
        return Enqueued(jid, status)
    raise EchoMQError("could not mint a fresh job id")  # pragma: no cover - 8 collisions in a row


def _chunks(todo: list[int], sizes: list[int]) -> list[list[int]]:
    """Split job indices into script calls of at most 1000 jobs / ~1 MiB of payload, so no
    single script holds the server for long; a larger payload travels alone."""
    spans: list[list[int]] = [[]]
    size = 0
    for i, n in zip(todo, sizes, strict=True):
        span = spans[-1]
        if span and (len(span) >= _ENQUEUE_CHUNK_ITEMS or size + n > _ENQUEUE_CHUNK_BYTES):
            spans.append([])
            size = 0
        spans[-1].append(i)
        size += n
    return spans


def _flat(jobs: list[tuple[str, bytes, bool]], span: list[int]) -> list[Arg]:
    out: list[Arg] = []
    for i in span:
        out += (jobs[i][0], jobs[i][1])
    return out


def enqueue_many(
    k: Keys,
    items: Iterable[bytes | str | tuple[str, bytes | str]],
    *,
    group: str | None = None,
    delay_ms: int | None = None,
    at_ms: int | None = None,
    replay_ms: int = 0,
    priority: int = 0,
    ttl_ms: int | None = None,
) -> Plan[list[Enqueued | EchoMQError]]:
    g = _group(group)
    mode, value = _when(delay_ms, at_ms)
    pri = _priority(priority)  # one priority for every job of the call (ARGV[8])
    ttl = _ttl(ttl_ms)  # one expiry for every job of the call (ARGV[9])
    if isinstance(items, (str, bytes)):
        raise InvalidArgument("enqueue_many takes an iterable of payloads, not one payload")
    jobs: list[tuple[str, bytes, bool]] = []
    for item in _iterable("items", items):
        if isinstance(item, tuple):
            if len(item) != 2:
                raise InvalidArgument(f"an (id, payload) item has 2 parts, got {len(item)}")
            jobs.append((keyspace.check_id(item[0]), _payload(item[1], k.max_payload), False))
        else:
            jobs.append((ids.mint(), _payload(item, k.max_payload), True))
    results: list[Enqueued | EchoMQError | None] = [None] * len(jobs)
    # An id named twice in one call is sent once: its later mentions are duplicates of the
    # first by definition, answered here without a round trip (and never confused with a
    # resend of the first, whichever chunks they would have travelled in).
    first: dict[str, int] = {}
    todo = []
    for i, (jid, _, minted) in enumerate(jobs):
        if minted or jid not in first:
            first.setdefault(jid, i)
            todo.append(i)
        elif jid.startswith("JOB"):
            results[i] = Enqueued(jid, "duplicate")
        else:
            results[i] = KindError("EMQKIND job id must be JOB-namespaced")
    resent = False
    for _ in range(_REMINT_TRIES):
        if not todo:
            break
        spans = _chunks(todo, [len(jobs[i][1]) for i in todo])
        # One nonce a script call: each call's first copy leaves one marker of its verdicts.
        heads = [(k.base, g, mode, value, replay_ms, _nonce() if replay_ms else "") for _ in spans]
        # flags: 'f' when every id of the call was minted here (the script then skips the
        # retired record), 'r' on a resend.
        fresh = ["f" if all(jobs[i][2] for i in span) else "" for span in spans]
        calls = [
            _call("enqueue_many", (k.meta,), (*head, f, pri, ttl, *_flat(jobs, span)), _str_list)
            for head, f, span in zip(heads, fresh, spans, strict=True)
        ]
        while True:
            try:
                replies = yield calls
                break
            except Replay:
                # Lost replies: resend every call as a resend (ARGV[7]) with its nonce: a call
                # whose first copy landed answers that copy's verdicts ("replayed" for the
                # admitted jobs, even once they completed), never a second admission.
                calls = [
                    _call(
                        "enqueue_many",
                        (k.meta,),
                        (*head, f + "r", pri, ttl, *_flat(jobs, span)),
                        _str_list,
                    )
                    for head, f, span in zip(heads, fresh, spans, strict=True)
                ]
                resent = True
        retry: list[int] = []
        for span, reply in zip(spans, replies, strict=True):
            if isinstance(reply, BaseException):
                raise reply
            for i, verdict in zip(span, reply, strict=True):
                jid, data, minted = jobs[i]
                if verdict == "kind":
                    results[i] = KindError("EMQKIND job id must be JOB-namespaced")
                elif verdict == "replayed":
                    results[i] = Enqueued(jid, "enqueued")
                elif verdict == "replayed:scheduled":
                    results[i] = Enqueued(jid, "scheduled")
                elif verdict == "duplicate" and minted and resent and not replay_ms:
                    # No marker (replay_ms=0): our own first copy's row (see enqueue).
                    results[i] = Enqueued(jid, "enqueued" if mode == "now" else "scheduled")
                elif verdict == "duplicate" and minted:
                    # A minted id collided with another process's: mint again (see enqueue).
                    jobs[i] = (ids.mint(), data, True)
                    retry.append(i)
                else:
                    results[i] = Enqueued(jid, verdict)
        todo = retry
    if todo:  # pragma: no cover - 8 collisions in a row
        raise EchoMQError("could not mint fresh job ids")
    return [r for r in results if r is not None]


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


def remove(k: Keys, id: str, children: bool = True) -> Call[None]:
    """``children`` (issue 24): a flow parent's waiting descendants go with it; False
    removes the job alone."""
    if not isinstance(children, bool):
        raise InvalidArgument(f"children must be a bool, got {children!r}")
    args = (k.base, id, "1") if children else (k.base, id)
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


def add_log(k: Keys, id: str, line: str, keep: int = 0) -> Call[int]:
    def decode(reply: Any) -> int:
        if reply == -1:
            raise JobGone(id)
        return int(reply)

    jk = k.job(id)
    return _call(
        "add_log", (jk, jk + ":logs"), (_text("line", line), _int("keep", keep, 0)), decode
    )


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


# --------------------------------------------------------------------------- read plane


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
    streams += [("lanes", "0", 0), ("rows", "0", 0), ("results", "0", 0), ("dedups", "0", 0)]
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
            if section in ("lanes", "rows", "results", "dedups"):
                if nxt != "0":
                    follow.append((section, nxt, 0))
            elif nxt != "-1":
                follow.append((section, where, int(nxt)))
        streams = follow
    return list(found)


# --------------------------------------------------------------------------- queue admin


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
        deleted, cursor = yield _call(
            "drain",
            (k.pending, k.lanes),
            (k.base, flag, budget, cursor),
            lambda r: (int(r[0]), _s(r[1])),
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


__all__ += [
    "add_log",
    "browse",
    "change_priority",
    "check",
    "claim",
    "claim_batch",
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
