"""Sans-I/O enqueue and enqueue_many as plans, with the replay marker.

The producer's path, sans I/O: ``enqueue`` and ``enqueue_many`` as plans, with the replay
marker that makes a resent enqueue land once (docs/RELIABILITY.md, "The replay marker's
cost"). ``protocol.calls`` re-exports both verbs; this module holds what only they need: the
replay nonces, the marker keys' buckets and TTL bookkeeping, the batch chunking.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterable
from typing import Any

from echomq import ids, keyspace
from echomq.errors import EchoMQError, InvalidArgument, KindError, StateError
from echomq.protocol.joboptions import NO_OPTIONS, OPT_TAIL, JobOptions
from echomq.protocol.kernel import (
    Arg,
    Enqueued,
    Keys,
    Plan,
    Replay,
    _call,
    _iterable,
    _payload,
    _s,
    _str_list,
    _when,
)

# The id is the marker (include/admit.lua): an id minted in this call, due now, whose
# resends may come within this many ms, is sent without a nonce and leaves no marker: a
# resend finds the row, or the id in the retired record, which keeps every retirement that
# long (include/common.lua ID_REPLAY_MS, native/emq.h EMQ_ID_REPLAY_MS: the same number).
ID_REPLAY_MS = 70_000

_ENQUEUE_CHUNK_ITEMS = 1000
_ENQUEUE_CHUNK_BYTES = 1 << 20
_REMINT_TRIES = 8
_LEASE_TRIES = 8  # node_lease calls that found no free node before mint gives up

# Replay nonces come from a private generator seeded from os.urandom (and reseeded in a
# forked child): an application's random.seed() cannot make two processes' nonces collide,
# and a nonce costs a third of secrets.token_hex (no system call per enqueue).
_nonces = random.Random()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_nonces.seed)


def _nonce() -> str:
    """A fresh 48-bit replay nonce in hex (the call's identity across its resends)."""
    return f"{_nonces.getrandbits(48):012x}"


# The replay-marker keys (include/admit.lua) that take a TTL: per Keys (one queue on one
# server and database: Keys.marker_ttls) and replay_ms, the client-clock second they belong
# to and the nonce prefixes (one key each) whose TTL a call of ours has set. Until one has,
# every call to that key asks the script to set it (flag 'x'), so a key is never left
# without one by us; after, the key's later markers come within that second and cost one
# HSET. A new second starts the set afresh. Not per queue name: a process that enqueues into
# one queue name on two servers or databases wrote the second one's markers with no TTL.
# The answers of a call whose first copy wrote its marker (with the TTL, when flagged 'x').
_MARKED = frozenset(("enqueued", "scheduled", "replayed", "replayed:scheduled"))


# How many markers of one process a key gets in a second, about: the calls of a second are
# spread over one key per _PER_KEY of them (at the rate of that second or the one before,
# whichever is higher; 1 to 256 keys), so a key's TTL is written once per ~32 markers at any
# rate, and a key stays small enough for the compact listpack encoding (128 fields). Why 32:
# an HSET into a listpack hash scans its fields; at 32 a marker's HSET costs about half what
# it did at 64 (bench/RESULTS.md, issue 28), for one more PEXPIRE per 64 calls.
_PER_KEY = 32
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


def _needs_ttl(k: Keys, replay_ms: int, second: int, nn: str) -> bool:
    got = k.marker_ttls.get(replay_ms)
    return got is None or got[0] != second or nn not in got[1]


def _ttl_set(k: Keys, replay_ms: int, second: int, nn: str) -> None:
    got = k.marker_ttls.get(replay_ms)
    if got is None or got[0] < second:
        k.marker_ttls[replay_ms] = (second, {nn})
    elif got[0] == second:
        got[1].add(nn)


# --------------------------------------------------------------------------- minting (D2)


def _pair(r: Any) -> tuple[int, int]:
    """``node_lease``'s ``{node, floor}``."""
    return int(r[0]), int(r[1])


def mint(minter: ids.Minter | None) -> Plan[str]:
    """A new JOB id: from the minter's leased node, taking or renewing its lease first when
    it must (one ``node_lease`` call, about once per 20 s); without a minter (a plan driven
    by hand), ``ids.mint()``'s process-local node."""
    if minter is None:
        return ids.mint()
    full = 0
    while True:
        jid = minter.try_mint()
        if jid is not None:
            return jid
        token, start, lease_ms, hw, sent, _ = minter.lease_request(anywhere=full > 0)
        lease = _call("node_lease", (keyspace.NODES_KEY,), (token, start, lease_ms, hw), _pair)
        try:
            # A list: a refusal comes back as a value, so a full stretch of nodes can be
            # retried from elsewhere (the script probes 64 nodes from `start`).
            (reply,) = yield [lease]
        except Replay:
            continue  # a lease call is safe to send again: the same token, the same node
        if isinstance(reply, StateError) and full < _LEASE_TRIES:
            full += 1
            continue
        if isinstance(reply, BaseException):
            raise reply
        minter.granted(token, hw, sent, *reply)


# --------------------------------------------------------------------------- producer verbs


def enqueue(
    k: Keys,
    payload: bytes | str,
    opts: JobOptions = NO_OPTIONS,
    /,
    *,
    replay_ms: int = 0,
    minter: ids.Minter | None = None,
    **options: Any,
) -> Plan[Enqueued]:
    """``opts``: the job's options, checked (``JobOptions``; ``options``: its fields as
    keywords, for a plan made by hand), sent as the script's named option tail after the
    fixed arguments (none when there is none: the lean call). ``replay_ms``: how long the
    server remembers this call for its resends (a resend after a lost reply then finds its
    first copy even once that job has completed: it is never admitted twice); 0 when the
    caller never resends. ``minter``: where a minted id comes from (see ``mint``)."""
    data = _payload(payload, k.max_payload)
    if options:
        opts = JobOptions(**options)
    g = opts.group or ""
    mode, value = _when(opts.delay_ms, opts.at_ms)
    id = opts.id
    minted = id is None
    jid = (yield from mint(minter)) if id is None else id
    # A nonce (and a marker) only where the id cannot stand for the call (see ID_REPLAY_MS).
    by_id = minted and mode == "now" and 0 < replay_ms <= ID_REPLAY_MS
    nonce = _nonce() if replay_ms and not by_id else ""
    scope = f"{k.base}{replay_ms}"
    plain = opts is NO_OPTIONS

    for _ in range(_REMINT_TRIES):
        # flags: 'f' the id was minted here (never handed out: the script skips the retired
        # record), 'r' a resend, 'x' set the replay marker key's TTL (see _needs_ttl).
        flags = "f" if minted else ""
        second = 0
        tail: tuple[Arg, ...]
        if nonce:
            # The marker's key is named by this second of our clock (the same on every
            # resend): the script reads no clock for it and a resend reads one field.
            second = _second()
            nonce = _bucket(scope, second) + nonce[2:]
            if _needs_ttl(k, replay_ms, second, nonce[:2]):
                flags += "x"
            tail = opts.tail(second)
        else:
            tail = () if plain else opts.tail()
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
            _ttl_set(k, replay_ms, second, nonce[:2])  # that call wrote the marker and its TTL
        if status == "replayed":
            return Enqueued(jid, "enqueued")
        if status == "replayed:scheduled":
            return Enqueued(jid, "scheduled")
        if status.startswith("deduplicated:"):
            return Enqueued(status[len("deduplicated:") :], "deduplicated")
        if minted and status == "duplicate":
            if resent and not replay_ms:
                # No nonce, no marker (replay_ms=0, resends off): the row a resend of a
                # minted id finds is taken for its own first copy's (the 0.4 rule).
                return Enqueued(jid, "enqueued" if mode == "now" else "scheduled")
            # Else a minted id that already exists is a collision with another minter's,
            # not our own first copy: that one would have answered "replayed" from its
            # marker or, the id being the marker, from its row holding this payload (or
            # from the retired record). Mint again rather than report someone else's job.
            jid = yield from mint(minter)
            nonce = _nonce() if replay_ms and not by_id else ""
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
    opts: JobOptions = NO_OPTIONS,
    /,
    *,
    replay_ms: int = 0,
    minter: ids.Minter | None = None,
    **options: Any,
) -> Plan[list[Enqueued | EchoMQError]]:
    """``opts``: every job's options (the lane, run time, priority and expiry; ``options``:
    its fields as keywords), as ``enqueue``'s."""
    if options:
        opts = JobOptions(**options)
    g = opts.group or ""
    mode, value = _when(opts.delay_ms, opts.at_ms)
    # One priority and one expiry for every job of the call: the option tail's ('+opt', the
    # number of pairs, the pairs; ('+opt', 0) when none: enqueue_many.lua).
    named: list[Arg] = []
    if opts.priority:
        named += ("priority", opts.priority)
    if opts.ttl_ms is not None:
        named += ("ttl_ms", opts.ttl_ms)
    if opts.keep_logs is not None:
        named += ("keep_logs", opts.keep_logs)
    tail = (OPT_TAIL, len(named) // 2, *named)
    if isinstance(items, (str, bytes)):
        raise InvalidArgument("enqueue_many takes an iterable of payloads, not one payload")
    jobs: list[tuple[str, bytes, bool]] = []
    for item in _iterable("items", items):
        if isinstance(item, tuple):
            if len(item) != 2:
                raise InvalidArgument(f"an (id, payload) item has 2 parts, got {len(item)}")
            jobs.append((keyspace.check_id(item[0]), _payload(item[1], k.max_payload), False))
        else:
            jobs.append(("", _payload(item, k.max_payload), True))
    # Every item is checked before the first id is minted (minting may take a lease: a
    # write), so bad input writes nothing.
    for i, (_, data, minted) in enumerate(jobs):
        if minted:
            jobs[i] = ((yield from mint(minter)), data, True)
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
            _call("enqueue_many", (k.meta,), (*head, f, *tail, *_flat(jobs, span)), _str_list)
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
                        (*head, f + "r", *tail, *_flat(jobs, span)),
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
                    jobs[i] = ((yield from mint(minter)), data, True)
                    retry.append(i)
                else:
                    results[i] = Enqueued(jid, verdict)
        todo = retry
    if todo:  # pragma: no cover - 8 collisions in a row
        raise EchoMQError("could not mint fresh job ids")
    return [r for r in results if r is not None]
