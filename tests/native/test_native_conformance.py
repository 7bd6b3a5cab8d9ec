"""The native module trafikey against the Lua scripts it mirrors (native/README.md).

Every differential test runs the same inputs through the script (EVAL, queue A) and through
the EMQ.* command (queue B) of one server, then compares the replies and every key of both
queues (names normalised; clock-derived scores within native_fixtures.TOLERANCE_MS)."""

from __future__ import annotations

import contextlib
import os
import random
import re
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from echomq.client import native as _native
from echomq.server import EmbeddedServer
from native_fixtures import (
    Pair,
    SettlePair,
    assert_replicated,
    base,
    build,
    call_native,
    call_script,
    command,
    diff,
    differential_fixtures,
    empty_queues,
    expand,
    expand_args,
    jid,
    quiet,
    replica_of,
    settle_clock,
    snapshot,
    valgrind_server,
)

QA, QB = "natA", "natB"


module_path, nserver, r, pair, both = differential_fixtures(QA, QB, tmp_name="native")


# ---- the transitions' KEYS/ARGV ('@' = the queue's base) --------------------------------


def enq(
    pair: Pair,
    id: str,
    payload: str | bytes = "p",
    *,
    group: str = "",
    mode: str = "now",
    value: str = "0",
    flags: str = "",
    replay_ms: str = "0",
    nonce: str = "",
    dedup: str = "",
    dedup_mode: str = "simple",
    ttl: str = "0",
    second: str | None = None,
    priority: str | None = None,
    keep_logs: str | None = None,
) -> Any:
    args: list[str | bytes] = ["@", id, payload, group, mode, value, flags, replay_ms, nonce]
    if keep_logs is not None:  # issue 38: the named tail (the positional form has no slot)
        args += ["+opt", "keep_logs", keep_logs]
        if dedup:
            args += ["dedup", dedup, "dedup_mode", dedup_mode, "dedup_ttl_ms", ttl]
        if second is not None:
            args += ["second", second]
        if priority is not None:
            args += ["priority", priority]
        return pair.run("enqueue", ["@job:" + id, "@meta"], args)
    args += [dedup, dedup_mode, ttl]
    if second is not None or priority is not None:
        args.append(second or "0")
    if priority is not None:  # issue 24: ARGV[14]
        args.append(priority)
    return pair.run("enqueue", ["@job:" + id, "@meta"], args)


def enq_many(
    pair: Pair,
    items: list[tuple[str, str]],
    *,
    group: str = "",
    mode: str = "now",
    value: str = "0",
    replay_ms: str = "0",
    nonce: str = "",
    flags: str = "",
    priority: str = "0",
    keep_logs: str | None = None,
) -> Any:
    args: list[str | bytes] = ["@", group, mode, value, replay_ms, nonce, flags, priority, ""]
    if keep_logs is not None:  # issue 38: the named tail
        args[7:] = ["+opt", "2", "keep_logs", keep_logs, "priority", priority]
    for i, p in items:
        args += [i, p]
    return pair.run("enqueue_many", ["@meta"], args)


def ext(pair: Pair, id: str, token: int | str, lease: int = 30000) -> Any:
    return pair.run("extend", ["@active", "@job:" + id], ["@", id, str(token), str(lease)])


def ext_many(pair: Pair, pairs: list[tuple[str, int]], lease: int = 30000) -> Any:
    args: list[str | bytes] = ["@", str(lease)]
    for i, t in pairs:
        args += [i, str(t)]
    return pair.run("extend_many", ["@active"], args)


def repro(pair: Pair, id: str) -> Any:
    return pair.run("reprocess", ["@job:" + id, "@dead"], ["@", id])


def now_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


# ---- differential tests ----------------------------------------------------------------


@pytest.mark.parametrize("events", [False, True])
def test_enqueue_modes(pair: Pair, both: Any, r: redis.Redis, events: bool) -> None:
    if events:
        both(lambda q: q.enable_events(100))
    assert enq(pair, jid(1)) == ("ok", b"enqueued")
    assert enq(pair, jid(2), group="g1") == ("ok", b"enqueued")
    assert enq(pair, jid(3), b"bin\x00\r\n\xff", group="g1") == ("ok", b"enqueued")
    assert enq(pair, jid(4), mode="in", value="60000") == ("ok", b"scheduled")
    assert enq(pair, jid(5), mode="at", value=str(now_ms(r) + 90000), group="g2") == (
        "ok",
        b"scheduled",
    )
    assert enq(pair, jid(6), mode="at", value="1") == ("ok", b"enqueued")
    assert enq(pair, jid(7), mode="in", value="-5") == ("ok", b"enqueued")
    assert enq(pair, jid(1)) == ("ok", b"duplicate")
    assert enq(pair, jid(4), group="g1") == ("ok", b"duplicate")
    kind = enq(pair, "USR00000000001")
    assert kind[0] == "err" and kind[1].startswith("EMQKIND")
    assert enq(pair, "JO")[0] == "err"
    assert enq(pair, jid(8), flags="f") == ("ok", b"enqueued")
    # Issue 38: keep_logs is the row field both write, and the bound add_log reads.
    assert enq(pair, jid(9), keep_logs="3") == ("ok", b"enqueued")
    assert enq(pair, jid(10), group="g1", keep_logs="999999999999999", priority="2") == (
        "ok",
        b"enqueued",
    )
    assert enq(pair, jid(11), mode="in", value="60000", keep_logs="007") == ("ok", b"scheduled")
    assert pair.r.hget(base(QB) + "job:" + jid(11), "keep_logs") == b"7"
    assert pair.r.hget(base(QB) + "job:" + jid(10), "keep_logs") == b"999999999999999"
    for bad in ("0", "-1", "1000000000000000", "x", ""):
        assert enq(pair, jid(12), keep_logs=bad)[0] == "err"
    assert not pair.r.exists(base(QA) + "job:" + jid(12), base(QB) + "job:" + jid(12))
    assert enq_many(pair, [(jid(13), "a"), (jid(14), "b")], keep_logs="2") == (
        "ok",
        [b"enqueued", b"enqueued"],
    )
    assert pair.r.hget(base(QB) + "job:" + jid(14), "keep_logs") == b"2"
    assert enq_many(pair, [(jid(15), "a")], keep_logs="0")[0] == "err"


def test_enqueue_many_wakes_past_64(pair: Pair) -> None:
    for n in range(70):
        enq(pair, jid(100 + n))
    enq_many(pair, [(jid(300 + n), "x") for n in range(70)], group="big")


def test_replay_markers(pair: Pair) -> None:
    nonce = "0123456789ab"
    assert enq(pair, jid(1), replay_ms="5000", nonce=nonce) == ("ok", b"enqueued")
    assert enq(pair, jid(1), flags="r", replay_ms="5000", nonce=nonce) == ("ok", b"replayed")
    n2 = "ffeeddccbbaa"
    assert enq(pair, jid(2), mode="in", value="9000", replay_ms="5000", nonce=n2) == (
        "ok",
        b"scheduled",
    )
    assert enq(pair, jid(2), flags="r", replay_ms="5000", nonce=n2) == (
        "ok",
        b"replayed:scheduled",
    )
    # A resend whose first copy never landed is admitted.
    assert enq(pair, jid(3), flags="r", replay_ms="5000", nonce="aaaaaaaaaaaa") == (
        "ok",
        b"enqueued",
    )
    # Duplicates leave no marker.
    assert enq(pair, jid(3), replay_ms="5000", nonce="bbbbbbbbbbbb") == ("ok", b"duplicate")
    # A call that names its second (ARGV[13]): the key is that second's, the TTL is set only
    # with 'x', and a resend reads that key whatever the clock says.
    sec = "1700000000"
    kw: dict[str, Any] = {"replay_ms": "5000", "second": sec}
    assert enq(pair, jid(4), flags="fx", nonce="cc0000000001", **kw) == ("ok", b"enqueued")
    assert enq(pair, jid(5), flags="f", nonce="cc0000000002", **kw) == ("ok", b"enqueued")
    assert enq(pair, jid(6), flags="f", nonce="dd0000000003", **kw) == ("ok", b"enqueued")
    assert enq(pair, jid(4), flags="fxr", nonce="cc0000000001", **kw) == ("ok", b"replayed")
    assert enq(pair, jid(7), flags="r", nonce="cc0000000009", **kw) == ("ok", b"enqueued")
    assert enq(pair, jid(8), mode="in", value="9000", nonce="dd0000000004", **kw) == (
        "ok",
        b"scheduled",
    )
    assert enq(pair, jid(8), flags="r", nonce="dd0000000004", **kw) == (
        "ok",
        b"replayed:scheduled",
    )


@pytest.mark.parametrize("events", [False, True])
def test_dedup(pair: Pair, both: Any, events: bool) -> None:
    if events:
        both(lambda q: q.enable_events(100))
    assert enq(pair, jid(1), dedup="s1") == ("ok", b"enqueued")
    assert enq(pair, jid(2), dedup="s1") == ("ok", b"deduplicated:" + jid(1).encode())
    assert enq(pair, jid(3), dedup="t1", dedup_mode="throttle", ttl="60000") == ("ok", b"enqueued")
    assert enq(pair, jid(4), dedup="t1", dedup_mode="throttle", ttl="60000")[1].startswith(
        b"deduplicated:"
    )
    assert enq(pair, jid(5), "v1", group="g", dedup="d1", dedup_mode="debounce", ttl="60000") == (
        "ok",
        b"enqueued",
    )
    # Debounce: the waiting holder takes the payload and the later run time (leaves its lane).
    enq(
        pair, jid(6), "v2", mode="in", value="30000", dedup="d1", dedup_mode="debounce", ttl="60000"
    )
    enq(
        pair, jid(7), "v3", mode="in", value="40000", dedup="d1", dedup_mode="debounce", ttl="60000"
    )
    enq(pair, jid(8), "v4", dedup="d1", dedup_mode="debounce", ttl="60000")
    # Issue 38: a fold takes the newest call's keep_logs, and drops the holder's when the
    # newest call names none.
    kl = {"dedup": "d2", "dedup_mode": "debounce", "ttl": "60000"}
    assert enq(pair, jid(10), "k1", keep_logs="4", **kl) == ("ok", b"enqueued")
    enq(pair, jid(11), "k2", keep_logs="9", **kl)
    assert pair.r.hget(base(QB) + "job:" + jid(10), "keep_logs") == b"9"
    enq(pair, jid(12), "k3", **kl)
    assert not pair.r.hexists(base(QB) + "job:" + jid(10), "keep_logs")
    enq(pair, jid(13), "k4", keep_logs="2", **kl)
    assert pair.r.hget(base(QB) + "job:" + jid(10), "keep_logs") == b"2"
    # A simple key whose holder's row is gone is free again.
    pair.r.delete(base(QA) + "job:" + jid(1), base(QB) + "job:" + jid(1))
    assert enq(pair, jid(9), dedup="s1") == ("ok", b"enqueued")


def test_the_named_option_tail(pair: Pair) -> None:
    """Issue 38: the options after the fixed arguments travel as '+opt' name value ...
    (enqueue.lua's header), parsed once by both executors; the positional form of 0.6 is
    still taken (every other test here sends it), and a malformed tail writes nothing."""

    clocked = SettlePair(pair.r, QA, QB)  # forgives each executor's own `expires`

    def raw(id: str, *tail: str) -> Any:
        args: list[str | bytes] = ["@", id, "p", "", "now", "0", "f", "0", "", *tail]
        return clocked.run("enqueue", ["@job:" + id, "@meta"], args)

    assert raw(jid(1)) == ("ok", b"enqueued")  # the lean call: 9 args, no tail
    assert raw(jid(2), "+opt", "ttl_ms", "60000", "priority", "5") == ("ok", b"enqueued")
    row = pair.r.hgetall(base(QA) + "job:" + jid(2))
    assert row[b"priority"] == b"5" and b"expires" in row
    assert pair.r.zscore(base(QA) + "pending", jid(2)) == 5
    # The same dedup by name and by position: the same holder answers both.
    tail = ("+opt", "dedup", "k1", "dedup_mode", "throttle", "dedup_ttl_ms", "60000")
    assert raw(jid(3), *tail) == ("ok", b"enqueued")
    held = ("ok", b"deduplicated:" + jid(3).encode())
    assert raw(jid(4), "k1", "throttle", "60000") == held
    assert raw(jid(5), "+opt", "dedup_mode", "throttle", "dedup_ttl_ms", "1", "dedup", "k1") == held
    # Refused before anything is written (pair.run compares both keyspaces too).
    unknown = ("err", "EMQARG unknown option in the tail (see PROTOCOL §6)")
    assert raw(jid(6), "+opt", "priority", "5", "delay", "9") == unknown
    assert raw(jid(6), "+opt", "priority", "5", "priority", "6") == (
        "err",
        "EMQARG an option named twice in the tail",
    )
    arity = (  # redis-py drops the ERR
        "err",
        "EMQ.ENQUEUE takes 2 keys (row, meta) and 6..24 args (enqueue) or 1 key (meta) "
        "and 9 + 2n args (enqueue_many)",
    )
    assert raw(jid(6), "+opt", "priority") == arity  # a name without its value
    assert raw(jid(6), "", "simple", "0", "0", "5", "", "x") == arity  # positional: 15 at most
    assert raw(jid(6), "+opt", "priority", "x")[0] == "err"  # a value is checked as before
    assert not pair.r.exists(base(QA) + "job:" + jid(6), base(QB) + "job:" + jid(6))


def test_the_named_option_tail_of_enqueue_many(pair: Pair) -> None:
    """enqueue_many's options: '+opt', the number of pairs, the pairs, then the jobs; the
    positional priority, ttl_ms of 0.6 still taken (enq_many sends it too)."""
    clocked = SettlePair(pair.r, QA, QB)

    def raw(*tail: str | bytes) -> Any:
        return clocked.run("enqueue_many", ["@meta"], ["@", "", "now", "0", "0", "", "f", *tail])

    assert raw("+opt", "0", jid(1), "a") == ("ok", [b"enqueued"])  # the lean call
    both = ("+opt", "2", "ttl_ms", "60000", "priority", "7")
    assert raw(*both, jid(2), "b", jid(3), "c") == ("ok", [b"enqueued", b"enqueued"])
    assert pair.r.hget(base(QA) + "job:" + jid(3), "priority") == b"7"
    assert pair.r.hexists(base(QA) + "job:" + jid(3), "expires")
    assert raw("3", "", jid(4), "d") == ("ok", [b"enqueued"])  # 0.6's positional form
    assert pair.r.zscore(base(QA) + "pending", jid(4)) == 3
    # A job id may look like a name: only the counted pairs are options.
    assert raw("+opt", "1", "priority", "2", "priority", "x") == ("ok", [b"kind"])
    assert raw("+opt", "1", "lifo", "1", jid(5), "e") == (
        "err",
        "EMQARG unknown option in the tail (see PROTOCOL §6)",
    )
    arity = (
        "err",
        "EMQ.ENQUEUE takes 2 keys (row, meta) and 6..24 args (enqueue) or 1 key (meta) "
        "and 9 + 2n args (enqueue_many)",
    )
    assert raw("+opt", "3", "priority", "2", jid(5), "e") == arity  # more pairs than sent
    assert raw("+opt", "-1", jid(5), "e") == arity
    assert not pair.r.exists(base(QA) + "job:" + jid(5), base(QB) + "job:" + jid(5))


def test_readmission_of_retired_id(pair: Pair, both: Any) -> None:
    enq(pair, jid(1), group="g")
    job = both(lambda q: q.claim())
    both(lambda q: q.complete(job.id, job.token))
    pair.check()
    assert enq(pair, jid(1), group="g") == ("ok", b"enqueued")
    # 'f' (freshly minted) does not read the retired record.
    enq(pair, jid(2))
    for j in both(lambda q: q.claim_batch(2)):
        both(lambda q, j=j: q.complete(j.id, j.token))
    assert enq(pair, jid(2), flags="f") == ("ok", b"enqueued")
    assert enq(pair, jid(1)) == ("ok", b"enqueued")


def test_enqueue_many(pair: Pair, both: Any) -> None:
    both(lambda q: q.enable_events(100))
    items = [(jid(1), "a"), ("USR00000000001", "b"), (jid(2), "c")]
    assert enq_many(pair, items) == ("ok", [b"enqueued", b"kind", b"enqueued"])
    assert enq_many(pair, [(jid(2), "x"), (jid(3), "y")], group="g") == (
        "ok",
        [b"duplicate", b"enqueued"],
    )
    assert enq_many(pair, [(jid(4), "x")], mode="in", value="5000", group="g")[1] == [b"scheduled"]
    nonce = "0123456789ab"
    got = enq_many(pair, [(jid(5), "x"), (jid(1), "y")], replay_ms="5000", nonce=nonce)
    assert got == ("ok", [b"enqueued", b"duplicate"])
    again = enq_many(pair, [(jid(5), "x"), (jid(1), "y")], replay_ms="5000", nonce=nonce, flags="r")
    assert again == ("ok", [b"replayed", b"duplicate"])
    assert enq_many(pair, [], replay_ms="5000", nonce="ffffffffffff") == ("ok", [])
    enq_many(pair, [(jid(9), "x")], mode="at", value="1", flags="f")


@pytest.mark.parametrize("events", [False, True])
def test_extend(pair: Pair, both: Any, events: bool) -> None:
    if events:
        both(lambda q: q.enable_events(100))
    enq(pair, jid(1), group="g")
    enq(pair, jid(2))
    both(lambda q: q.limit_lane("g", 1))
    j1 = both(lambda q: q.claim())
    assert ext(pair, j1.id, j1.token, 60000) == ("ok", 1)
    stale = ext(pair, j1.id, j1.token + 1)
    assert stale == ("err", "EMQSTALE extend token mismatch")
    assert ext(pair, j1.id, 0)[1] == "EMQSTALE extend token mismatch"
    assert ext(pair, jid(99), 1) == ("ok", 0)
    assert ext(pair, jid(2), 0)[0] == "err"
    # Lapsed and reaped, nobody claimed it since: extend re-arms it into active.
    j2 = both(lambda q: q.claim(lease_ms=1))
    time.sleep(0.02)
    both(lambda q: q.reap())
    pair.check()
    assert ext(pair, j2.id, j2.token) == ("ok", 1)
    # A lane job reaped and re-armed takes its lane slot again.
    both(lambda q: q.extend(j1.id, j1.token, lease_ms=1))
    time.sleep(0.02)
    both(lambda q: q.reap())
    assert ext(pair, j1.id, j1.token) == ("ok", 1)
    # A released job: lease settled.
    both(lambda q: q.delay(j1.id, j1.token, 0))
    assert ext(pair, j1.id, j1.token) == ("err", "EMQSTALE extend lease settled")


def test_extend_many(pair: Pair, both: Any) -> None:
    both(lambda q: q.enable_events(100))
    for n in range(1, 5):
        enq(pair, jid(n), group="g" if n % 2 else "")
    jobs = both(lambda q: q.claim_batch(4, lease_ms=1))
    time.sleep(0.02)
    both(lambda q: q.reap())
    enq(pair, jid(5))
    k5 = both(lambda q: q.claim())
    both(lambda q: q.cancel(k5.id))
    pairs = [(j.id, j.token) for j in jobs] + [(k5.id, k5.token), (jid(9), 1), (jid(1), 7)]
    got = ext_many(pair, pairs)
    assert got[0] == "ok" and jid(9).encode() in got[1] and jid(1).encode() in got[1]
    assert got[1][-1] == b"!" + k5.id.encode()
    # An odd ARGV: the last id has no token and fails, like the script's nil compare.
    assert pair.run("extend_many", ["@active"], ["@", "1000", jobs[0].id]) == (
        "ok",
        [jobs[0].id.encode()],
    )


@pytest.mark.parametrize("events", [False, True])
def test_reprocess(pair: Pair, both: Any, events: bool) -> None:
    if events:
        both(lambda q: q.enable_events(100))
    enq(pair, jid(1), group="g")
    enq(pair, jid(2))
    for _ in range(2):
        j = both(lambda q: q.claim())
        both(lambda q, j=j: q.retry(j.id, j.token, delay_ms=0, max_attempts=1, error="boom"))
    pair.check()
    assert repro(pair, jid(1)) == ("ok", 1)
    assert repro(pair, jid(2)) == ("ok", 1)
    assert repro(pair, jid(2)) == ("err", "EMQSTATE not dead or completed")
    assert repro(pair, jid(3)) == ("ok", 0)
    pair.r.set(base(QA) + "job:" + jid(4), "x")
    pair.r.set(base(QB) + "job:" + jid(4), "x")
    assert repro(pair, jid(4)) == ("err", "EMQSTATE not a job row")


def test_randomized(pair: Pair, both: Any) -> None:
    rng = random.Random(20261201)
    ids = [jid(n) for n in range(1, 13)]
    groups = ["", "", "g1", "g2"]
    tokens: dict[str, int] = {}
    both(lambda q: q.enable_events(1000))
    for step in range(180):
        roll = rng.random()
        i = rng.choice(ids)
        if roll < 0.3:
            mode = rng.choice(["now", "now", "in", "at"])
            value = {"now": "0", "in": str(rng.choice([-10, 0, 5000])), "at": "1"}[mode]
            kw: dict[str, Any] = {"group": rng.choice(groups), "mode": mode, "value": value}
            if rng.random() < 0.3:
                kw.update(replay_ms="5000", nonce=f"{rng.randrange(4):012x}")
                kw["flags"] = rng.choice(["", "r"])
            if rng.random() < 0.2:
                kw.update(
                    dedup=f"d{rng.randrange(3)}",
                    dedup_mode=rng.choice(["simple", "throttle", "debounce"]),
                    ttl="60000",
                )
                if kw["dedup_mode"] == "simple":
                    kw["ttl"] = "0"
            if rng.random() < 0.4 and "nonce" not in kw:
                # (With a nonce, the "0" second it would need names another marker key.)
                kw["priority"] = rng.choice(["0", "1", "7", "2097152"])
            if rng.random() < 0.3 and "nonce" not in kw:  # (the named tail: no "0" second)
                kw["keep_logs"] = rng.choice(["1", "5"])  # issue 38
            enq(pair, i, f"p{step}", **kw)
        elif roll < 0.4:
            items = [(rng.choice(ids), f"m{step}") for _ in range(rng.randrange(4))]
            items = list(dict(items).items())
            enq_many(
                pair,
                items,
                group=rng.choice(groups),
                nonce=f"{rng.randrange(3):012x}",
                # A marker lives replay_ms + 1 s: 60 s, so no marker lapses between the
                # script leg and the native leg of one step on a loaded box (with 5 s one
                # did, on the Valkey run: the legs answered a resend apart).
                replay_ms="60000",
                flags=rng.choice(["", "r"]),
                priority=rng.choice(["0", "3"]),
                keep_logs=rng.choice([None, None, "2"]),
            )
        elif roll < 0.55:
            ext(pair, i, tokens.get(i, rng.randrange(3)), rng.choice([1, 30000]))
        elif roll < 0.62:
            ext_many(
                pair, [(k, tokens.get(k, 1)) for k in rng.sample(ids, 3)], rng.choice([1, 30000])
            )
        elif roll < 0.7:
            repro(pair, i)
        elif roll < 0.82:
            lease = rng.choice([1, 30000])
            job = both(lambda q, lease=lease: q.claim(lease_ms=lease))
            if job:
                tokens[job.id] = job.token
        elif roll < 0.88 and tokens:
            k = rng.choice(sorted(tokens))
            both(
                lambda q, k=k: quiet(
                    lambda: q.retry(k, tokens[k], delay_ms=0, max_attempts=1, error="x")
                )
            )
        elif roll < 0.93 and tokens:
            k = rng.choice(sorted(tokens))
            both(lambda q, k=k: quiet(lambda: q.complete(k, tokens[k])))
        else:
            time.sleep(0.005)
            both(lambda q: (q.reap(), q.promote()))
        pair.check(f"step {step}")
    assert pair.calls > 80


# ---- keys, cross-slot, fuzz --------------------------------------------------------------


def test_getkeys_and_cross_slot(r: redis.Redis, module_path: Path) -> None:
    keys = r.command_getkeys("EMQ.ENQUEUE", "2", "emq:{a}:job:J", "emq:{a}:meta", "emq:{a}:", "J")
    assert [k if isinstance(k, str) else k.decode() for k in keys] == [
        "emq:{a}:job:J",
        "emq:{a}:meta",
    ]
    assert len(r.command_getkeys("EMQ.EXTEND", "1", "k", "a")) == 1
    mods = {m[b"name"]: m[b"ver"] for m in r.module_list()}
    assert mods[b"trafikey"] == _native.MODULE_VERSION
    before = snapshot(r, QB)
    b = base(QB)
    cases: list[tuple[list[str], list[str | bytes]]] = [
        ([b + "job:" + jid(1), "emq:{other}:meta"], [b, jid(1), "p", "", "now", "0"]),
        (["emq:{other}:job:x", b + "meta"], [b, jid(1), "p", "", "now", "0"]),
        ([b + "job:x", b + "meta"], ["emq:nohashtag:", jid(1), "p", "", "now", "0"]),
        ([b + "job:x", b + "meta"], ["emq:{}:", jid(1), "p", "", "now", "0"]),
    ]
    for keys_, args in cases:
        kind, msg = call_native(r, "enqueue", keys_, args)
        assert kind == "err" and ("base" in msg or "hash tag" in msg), msg
    assert snapshot(r, QB) == before == {}


def test_fuzz(r: redis.Redis) -> None:
    rng = random.Random(7)
    verbs = ["EMQ.ENQUEUE", "EMQ.EXTEND", "EMQ.REPROCESS"]
    b = base(QB)
    pool: list[bytes] = [
        b"-1",
        b"0",
        b"1",
        b"2",
        b"3",
        b"99999999999999999999",
        b"9999999999999999999",  # 19 digits past LLONG_MAX
        b"9007199254740993",  # a score past 2^53: the server's own ZADD
        b"a\x00b",  # a NUL byte: no C string names it
        b"x",
        b"",
        b"now",
        b"in",
        b"at",
        b"JOB00000000001",
        b.encode(),
        b"r",
        b"f",
    ]
    deadline = time.monotonic() + 6
    n = 0
    while time.monotonic() < deadline and n < 3000:
        n += 1
        verb = rng.choice(verbs)
        argc = rng.randrange(0, 16)
        args: list[bytes] = []
        for _ in range(argc):
            pick = rng.random()
            if pick < 0.5:
                args.append(rng.choice(pool))
            elif pick < 0.7:
                args.append(
                    (b + rng.choice(["job:JOB00000000001", "meta", "active", "dead"])).encode()
                )
            else:
                args.append(os.urandom(rng.randrange(0, 20)))
        if rng.random() < 0.6 and args:
            args[0] = str(rng.choice([-1, 0, 1, 2, 3, 50, 2**40])).encode()
        if rng.random() < 0.6 and len(args) > 3:
            k = int(args[0]) if re.fullmatch(rb"-?\d+", args[0]) else 0
            if 0 <= k < len(args) - 1:
                args[1 + k] = b.encode()
                for j in range(1, 1 + k):
                    args[j] = b.encode() + args[j]
        with contextlib.suppress(redis.ResponseError):
            command(r, verb, *args)
    assert r.ping()
    assert n > 100


def test_mutation_fuzz(r: redis.Redis) -> None:
    """Well-formed calls of every EMQ.* command with one to three arguments swapped for
    hostile values, dropped or repeated: deep paths (a far `at` score, a NUL byte in a lane
    name) that random arity never reaches. The server must stay up, answering errors."""
    j1, j2, j3, j4 = jid(1), jid(2), jid(3), jid(4)
    templates: list[tuple[str, list[str], list[str | bytes]]] = [
        ("enqueue", ["@job:" + j1, "@meta"],
         ["@", j1, "p", "g", "now", "0", "", "0", "", "", "simple", "0"]),
        ("enqueue", ["@job:" + j2, "@meta"],
         ["@", j2, "p", "", "in", "10", "", "100", "n1", "d1", "simple", "1000", "1", "7", "500"]),
        ("enqueue_many", ["@meta"],
         ["@", "g", "now", "0", "0", "", "", "0", "500", j3, "p", j4, "q"]),
        ("claim", ["@meta", "@ring", "@active"], ["@", "30000"]),
        ("claim_batch", ["@meta", "@ring", "@active"], ["@", "30000", "5"]),
        ("extend", ["@active", "@job:" + j1], ["@", j1, "1", "30000"]),
        ("extend_many", ["@active"], ["@", "30000", j1, "1", j2, "1"]),
        ("complete", ["@active", "@job:" + j1], ["@", j1, "1", "res", "1000"]),
        ("retry", ["@active", "@schedule", "@dead", "@job:" + j2],
         ["@", j2, "1", "0", "3", "boom", "1000"]),
        ("reprocess", ["@job:" + j1, "@dead"], ["@", j1]),
        ("sweep_stalled", ["@active", "@dead"], ["@", "1", "100"]),
        ("settle", ["@meta", "@ring", "@active", "@schedule", "@dead"],
         ["@", "30000", "2", "1:1", j1, "1", "res", "1000", j2, "1", "0", "3", "e"]),
    ]  # fmt: skip
    hostile: list[bytes] = [
        b"-1", b"0", b"1", b"3", b"9999999999999999999", b"9223372036854775807",
        b"-9223372036854775808", b"9007199254740993", b"99999999999999999999", b"1e3", b"x",
        b"", b"a\x00b", b"\x00", b"now", b"in", b"at", b"simple", b"1:1", b"5:9", b":",
        b"g", b"*", j1.encode(), b"JOBzzzzzzzzzzz", b"x" * 300,
    ]  # fmt: skip
    n = 0
    # Every single substitution, exhaustively (1,898 calls) ...
    for script, keys, args in templates:
        for at in range(1, len(args)):
            for value in hostile:
                call_native(
                    r,
                    script,
                    expand(keys, QB),
                    [*expand_args(args[:at], QB), value, *expand_args(args[at + 1 :], QB)],
                )
                n += 1
        assert r.ping(), script
    assert n == 1898
    # ... then random multi-mutations: swaps, random bytes, drops and repeats.
    rng = random.Random(5)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and n < 6000:
        n += 1
        script, keys, args = rng.choice(templates)
        call: list[str | bytes] = list(expand_args(args, QB))
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(1, len(call)) if len(call) > 1 else 0
            roll = rng.random()
            if roll < 0.7:
                call[at] = rng.choice(hostile)
            elif roll < 0.8:
                call[at] = os.urandom(rng.randrange(0, 12))
            elif roll < 0.9 and len(call) > 1:
                del call[at]
            else:
                call.insert(at, call[at])
        call_native(r, script, expand(keys, QB), call)
        if n % 100 == 0:
            assert r.ping()
    assert r.ping()
    assert n > 1898 + 200


# ---- replication ---------------------------------------------------------------------------


def test_replica_without_module(
    nserver: EmbeddedServer, pair: Pair, both: Any, tmp_path: Path
) -> None:
    with replica_of(nserver, tmp_path / "replica") as rr:
        assert b"trafikey" not in {m[b"name"] for m in rr.module_list()}
        both(lambda q: q.enable_events(100))
        for n in range(1, 6):
            enq(pair, jid(n), group="g" if n % 2 else "", replay_ms="5000", nonce=f"{n:012x}")
        enq(pair, jid(6), mode="in", value="5000", dedup="d", dedup_mode="throttle", ttl="9000")
        enq_many(pair, [(jid(7), "a"), (jid(8), "b")], group="g", replay_ms="5000", nonce="ab" * 6)
        jobs = both(lambda q: q.claim_batch(3, lease_ms=1))
        time.sleep(0.02)
        both(lambda q: q.reap())
        ext_many(pair, [(j.id, j.token) for j in jobs])
        j = jobs[0]
        both(lambda q: q.retry(j.id, j.token, delay_ms=0, max_attempts=1, error="e"))
        repro(pair, j.id)
        assert command(pair.r, "WAIT", 1, 5000) == 1
        assert_replicated(pair.r, rr, (QA, QB))


# ---- valgrind ----------------------------------------------------------------------------


@pytest.mark.slow  # valgrind: scripts/check --fast neither runs nor installs it
def test_valgrind(tmp_path: Path) -> None:
    with valgrind_server(tmp_path, build("debug"), socket_timeout=30) as (r, _url):
        p = Pair(r, QA, QB)
        for n in range(1, 30):
            enq(
                p,
                jid(n),
                group="g" if n % 3 == 0 else "",
                replay_ms="5000",
                nonce=f"{n:012x}",
                dedup=f"d{n % 4}",
                dedup_mode="debounce",
                # A window that outlives the test under valgrind: at 5 s, one leg's window
                # lapsed before the other's on a busy machine (issue 36: "enqueued" from the
                # script, "deduplicated" from the module, the same input).
                ttl="600000",
            )
        enq(p, "USR00000000001")
        enq_many(
            p,
            [(jid(40 + n), "x") for n in range(20)] + [("bad", "y")],
            group="g2",
            replay_ms="5000",
            nonce="abcdefabcdef",
        )
        ext_many(p, [(jid(n), 1) for n in range(1, 20)])
        ext(p, jid(1), 1)
        repro(p, jid(1))
        for verb in ("EMQ.ENQUEUE", "EMQ.EXTEND", "EMQ.REPROCESS"):
            for args in ([], ["x"], ["-1"], ["1", "k"], ["2", "a", "b", "c"], ["1", "{x}k", "{x}"]):
                with contextlib.suppress(redis.ResponseError):
                    command(r, verb, *args)


def test_lane_limits_pauses_and_rates(pair: Pair, both: Any) -> None:
    """sync's other branches: a paused lane, a lane at its limit, a rate-held lane (ratewait)."""
    both(lambda q: q.enable_events(100))
    both(lambda q: q.pause_lane("p"))
    assert enq(pair, jid(1), group="p") == ("ok", b"enqueued")
    both(lambda q: q.limit_lane("l", 1))
    enq(pair, jid(2), group="l")
    both(lambda q: q.rate_limit_lane("r", 1, 60000))
    enq(pair, jid(3), group="r")
    both(lambda q: q.claim_batch(3))
    pair.check()
    # The lanes are out of the ring now: their enqueues take the not-serviceable branch.
    assert enq(pair, jid(4), group="l") == ("ok", b"enqueued")
    assert enq(pair, jid(5), group="r") == ("ok", b"enqueued")
    assert enq_many(pair, [(jid(6), "x"), (jid(7), "y")], group="r")[1] == [b"enqueued"] * 2
    assert enq(pair, jid(8), group="p") == ("ok", b"enqueued")
    both(lambda q: q.resume_lane("p"))
    assert enq(pair, jid(9), group="p") == ("ok", b"enqueued")
    # A ring written before the inring SET existed is adopted by sync.
    for q in (QA, QB):
        pair.r.delete(base(q) + "inring", base(q) + "ringstale")
    assert enq(pair, jid(10)) == ("ok", b"enqueued")


def test_server_error_midway(pair: Pair) -> None:
    """A command failing inside the transition (a planted key of the wrong type) aborts the
    call on both executors after the same writes; only the error text differs (documented)."""
    for q in (QA, QB):
        pair.r.set(base(q) + "wake", "planted")
    keys, args = ["@job:" + jid(1), "@meta"], ["@", jid(1), "p", "", "now", "0"]
    ra = call_script(pair.r, "enqueue", expand(keys, QA), expand_args(args, QA))
    rb = call_native(pair.r, "enqueue", expand(keys, QB), expand_args(args, QB))
    assert ra[0] == rb[0] == "err"
    assert "WRONGTYPE" in ra[1] and rb[1].startswith("WRONGTYPE")
    pair.check()


def test_numbers_past_64_bits_are_refused_not_wrapped(
    pair: Pair, both: Any, r: redis.Redis
) -> None:
    """Every numeric ARGV goes through one integer parser that refuses a value past 15
    digits (19 digits, 9999999999999999999, once wrapped to a negative: an `in` delay
    became "now", a lease lay in the past). The scripts refuse the same numbers
    (include/args.lua, PROTOCOL §6); the Python client never sends one (its bounds are far
    below), and nothing is written."""
    big = "9999999999999999999"
    enq(pair, jid(1))
    j = both(lambda q: q.claim())
    before = snapshot(r, QB)
    refused: list[tuple[str, list[str], list[str | bytes]]] = [
        ("enqueue", ["@job:" + jid(2), "@meta"],
         ["@", jid(2), "p", "", "in", big, "", "0", "", "", "simple", "0"]),
        ("enqueue", ["@job:" + jid(2), "@meta"],
         ["@", jid(2), "p", "", "at", big, "", "0", "", "", "simple", "0"]),
        ("enqueue", ["@job:" + jid(2), "@meta"],
         ["@", jid(2), "p", "", "now", "0", "", big, "n", "", "simple", "0"]),
        ("extend", ["@active", "@job:" + j.id], ["@", j.id, str(j.token), big]),
        ("extend_many", ["@active"], ["@", big, j.id, str(j.token)]),
    ]  # fmt: skip
    for script, keys, args in refused:
        reply = call_native(r, script, expand(keys, QB), expand_args(args, QB))
        assert reply == ("err", "a numeric argument is not an integer"), (script, args, reply)
    assert not diff(before, snapshot(r, QB))
    # The largest value that fits still parses (here as an `at` time, far in the future).
    reply = call_native(
        r, "enqueue", expand(["@job:" + jid(3), "@meta"], QB),
        expand_args(["@", jid(3), "p", "", "at", "999999999999999", "", "0", "", "",
                     "simple", "0"], QB),
    )  # fmt: skip
    assert reply == ("ok", b"scheduled")


def test_slow_paths_answer_like_the_script(pair: Pair, both: Any) -> None:
    """The fast key-API writers hand what they cannot take to the server's own command: a
    lane name with a NUL byte (no C string can name that hash field). The fallback once
    called itself, recursing until the server's stack overflowed; now it agrees with the
    script, reply and keyspace. A score past 2^53 (an `at` far away) no longer reaches the
    writers: a numeric argument has at most 15 digits (PROTOCOL §6), on both executors."""
    kind, _ = enq(pair, jid(1), mode="at", value=str(2**53 + 1))
    assert kind == "err"
    assert enq(pair, jid(2), mode="at", value="999999999999999") == ("ok", b"scheduled")
    assert enq(pair, jid(3), group="a\x00b") == ("ok", b"enqueued")
    job = both(lambda q: q.claim())
    assert job is not None and job.id == jid(3)
    pair.check()


# ---- the malformed-input rule (PROTOCOL §6) -----------------------------------------------


def _seed(r: redis.Redis, q: str) -> None:
    """Two active jobs (j1, j2, token 1) and one pending (j3) on the flat set."""
    b = base(q)
    for j in (jid(1), jid(2)):
        r.hset(b + "job:" + j, mapping={"state": "active", "attempts": "1", "payload": "p"})
        r.hset(b + "job:" + j, "lease_epoch", "1")
        r.zadd(b + "active", {j: 10**13})
    r.hset(b + "job:" + jid(3), mapping={"state": "pending", "attempts": "0", "payload": "p"})
    r.zadd(b + "pending", {jid(3): 0})
    r.rpush(b + "ring", "*")
    r.sadd(b + "inring", "*")


def _same_keyspace(r: redis.Redis, pair: Pair, what: str) -> None:
    sa, sb = snapshot(r, pair.a), snapshot(r, pair.b)
    settle_clock(sa, sb)  # a kept outcome's finished_ms is each executor's own clock read
    d = diff(sa, sb)
    assert not d, f"keyspaces differ {what}:\n" + "\n".join(d[:20])


def test_malformed_input_is_answered_alike(pair: Pair, r: redis.Redis) -> None:
    """Issue 22 #7: the module answered ERR where the script took the input (a lease of
    '1e3', a 19-digit number, an extra argument) or answered 0/[]. One rule now holds on
    both (include/args.lua, native emq_run/emq_need_ll): the shape (KEYS and ARGV counts),
    the base's hash tag and every key under it, and each numeric argument a decimal integer
    of at most 15 digits, all checked before anything is read or written; a refusal is an
    ERR reply. Every template below, with each argument replaced by each hostile value,
    dropped, or an extra one appended, gets the same kind of reply and leaves the same
    keyspace on both executors. The one designed difference: EMQ.CLAIM's argument count
    names its verb (2: claim, 3: claim_batch), so a claim with one argument more or less
    is the other verb on the module."""
    j1, j2, j3, j4 = jid(1), jid(2), jid(3), jid(4)
    templates: list[tuple[str, list[str], list[str | bytes]]] = [
        ("enqueue", ["@job:" + j4, "@meta"],
         ["@", j4, "p", "g", "now", "0", "", "0", "", "", "simple", "0"]),
        ("enqueue", ["@job:" + j4, "@meta"],
         ["@", j4, "p", "", "in", "10", "", "100", "n1", "d1", "simple", "1000"]),
        ("enqueue_many", ["@meta"], ["@", "g", "now", "0", "0", "", "", "0", "", j4, "p"]),
        ("claim", ["@meta", "@ring", "@active"], ["@", "30000"]),
        ("claim_batch", ["@meta", "@ring", "@active"], ["@", "30000", "5"]),
        ("extend", ["@active", "@job:" + j1], ["@", j1, "1", "30000"]),
        ("extend_many", ["@active"], ["@", "30000", j1, "1", j2, "1"]),
        ("complete", ["@active", "@job:" + j1], ["@", j1, "1", "res", "1000"]),
        ("retry", ["@active", "@schedule", "@dead", "@job:" + j2],
         ["@", j2, "1", "0", "3", "boom", "1000"]),
        ("reprocess", ["@job:" + j1, "@dead"], ["@", j1]),
        ("sweep_stalled", ["@active", "@dead"], ["@", "1", "100"]),
        ("settle", ["@meta", "@ring", "@active", "@schedule", "@dead"],
         ["@", "30000", "2", "1:1", j1, "1", "res", "1000", j2, "1", "0", "3", "e"]),
    ]  # fmt: skip
    hostile: list[bytes | None] = [
        b"-1", b"0", b"1", b"3", b"999999999999999", b"9999999999999999",
        b"9223372036854775807", b"9007199254740993", b"1e3", b"1.5", b" 1", b"0x10", b"x",
        b"", b"a\x00b", b"now", b"in", b"1:1", b":", b"*", j3.encode(), b"x" * 300,
        None,  # the argument dropped
    ]  # fmt: skip
    calls = 0
    for script, keys, args in templates:
        arity_names_verb = script in ("claim", "claim_batch")
        for at in range(1, len(args) + 1):
            for value in hostile:
                if at == len(args):
                    if value is None or arity_names_verb:
                        continue
                    call: list[str | bytes] = [*args, value]  # one argument more
                elif value is None:
                    if arity_names_verb:
                        continue
                    call = [*args[:at], *args[at + 1 :]]
                else:
                    call = [*args[:at], value, *args[at + 1 :]]
                empty_queues(r, (pair.a, pair.b))
                _seed(r, pair.a)
                _seed(r, pair.b)
                ra = call_script(r, script, expand(keys, pair.a), expand_args(call, pair.a))
                rb = call_native(r, script, expand(keys, pair.b), expand_args(call, pair.b))
                what = f"{script} arg {at} = {value!r}: script {ra!r}, native {rb!r}"
                assert ra[0] == rb[0], what
                if ra[0] == "ok":
                    assert str(ra[1]).replace(pair.a, "Q") == str(rb[1]).replace(pair.b, "Q"), what
                _same_keyspace(r, pair, what)
                calls += 1
    # A bad base or a key outside it: refused alike, nothing written.
    for q in (pair.a, pair.b):
        _seed(r, q)
    for script, keys, args in templates:
        for bad_base in ("emq:nobrace:", "emq:{}:"):
            ra = call_script(
                r, script, expand(keys, pair.a), [bad_base, *expand_args(args, pair.a)[1:]]
            )
            rb = call_native(
                r, script, expand(keys, pair.b), [bad_base, *expand_args(args, pair.b)[1:]]
            )
            assert ra[0] == rb[0] == "err", (script, bad_base, ra, rb)
        other = ["emq:{elsewhere}:x", *expand(keys, pair.a)[1:]]
        ra = call_script(r, script, other, expand_args(args, pair.a))
        rb = call_native(r, script, other, expand_args(args, pair.b))
        assert ra[0] == rb[0] == "err", (script, ra, rb)
        _same_keyspace(r, pair, script)
    assert calls > 800
