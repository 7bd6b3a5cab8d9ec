"""The native module trafikey against the Lua scripts it mirrors (native/README.md).

Every differential test runs the same inputs through the script (EVAL, queue A) and through
the EMQ.* command (queue B) of one server, then compares the replies and every key of both
queues (names normalised; clock-derived scores within native_fixtures.TOLERANCE_MS).

The randomized, fuzz, malformed-input, replica and valgrind legs are in
test_native_conformance_fuzz.py.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from native_conformance_support import (
    QA,
    QB,
    enq,
    enq_many,
    ext,
    ext_many,
    repro,
)

from native_fixtures import (
    Pair,
    SettlePair,
    base,
    call_native,
    call_script,
    diff,
    differential_fixtures,
    expand,
    expand_args,
    jid,
    snapshot,
)

module_path, nserver, r, pair, both = differential_fixtures(QA, QB, tmp_name="native")


def now_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


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
