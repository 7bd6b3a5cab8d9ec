"""trafikey's EMQ.COMPLETE, EMQ.RETRY and EMQ.SWEEP against complete.lua, retry.lua and
sweep_stalled.lua (native/README.md).

Every differential test runs the same inputs through the script (EVAL, queue A) and through
the EMQ.* command (queue B) of one server, then compares the replies and every key of both
queues (names normalised; clock-derived scores within native_fixtures.TOLERANCE_MS). States
are built with the Queue API (the scripts) on both queues.

Flow and sweep conformance is in test_native_settle_flows.py.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import time
from pathlib import Path

import pytest
import redis
from native_settle_support import (
    QA,
    QB,
    comp,
    enq,
    lapse,
    retr,
    sweep,
    want,
)

import echomq
from echomq.protocol.compose import FlowJob
from echomq.server import EmbeddedServer
from native_fixtures import (
    Both,
    Pair,
    SettlePair,
    assert_replicated,
    base,
    build,
    call_native,
    command,
    diff,
    differential_fixtures,
    expand,
    jid,
    quiet,
    replica_of,
    snapshot,
    valgrind_server,
)

module_path, nserver, r, pair, both = differential_fixtures(
    QA, QB, tmp_name="native_settle", clean=(QA + "P", QB + "P"), pair_class=SettlePair
)


@pytest.mark.parametrize("events", [False, True])
def test_complete(pair: Pair, both: Both, r: redis.Redis, events: bool) -> None:
    if events:
        both(lambda q: q.enable_events(100))
    enq(pair, jid(1))
    enq(pair, jid(2), group="g")
    enq(pair, jid(3))
    j1 = both(lambda q: q.claim())
    assert comp(pair, j1.id, j1.token + 1) == ("err", "EMQSTALE complete token mismatch")
    assert comp(pair, j1.id, 0) == ("err", "EMQSTALE complete token mismatch")
    assert comp(pair, j1.id, j1.token) == ("ok", 1)
    assert comp(pair, j1.id, j1.token) == ("ok", 0)  # gone
    assert comp(pair, jid(99), 1) == ("ok", 0)
    # A lane job frees its slot (leave_active + touch).
    both(lambda q: q.limit_lane("g", 1))
    j2 = both(lambda q: q.claim())
    assert j2.id == jid(2)
    assert comp(pair, j2.id, j2.token, "x", 0) == ("ok", 1)
    # Completed after a reap (D5: pending, lease generation still open).
    j3 = both(lambda q: q.claim(lease_ms=1))
    lapse()
    assert both(lambda q: q.reap()) == 1
    assert comp(pair, j3.id, j3.token) == ("ok", 1)
    # A released job (retry -> promote -> claim again): the old token is settled.
    enq(pair, jid(4))
    j4 = both(lambda q: q.claim())
    both(lambda q: q.delay(j4.id, j4.token, 0))
    assert comp(pair, j4.id, j4.token) == ("err", "EMQSTALE complete lease settled")
    # A planted non-hash row: gone.
    for q in (QA, QB):
        r.set(base(q) + "job:" + jid(5), "x")
    assert comp(pair, jid(5), 1) == ("ok", 0)


def test_a_minute_boundary_between_the_legs_is_forgiven(
    pair: Pair, both: Both, r: redis.Redis
) -> None:
    """Issue 36: test_valgrind failed with "keyspaces differ after complete" when the script
    (queue A) and the module (queue B) filed a completion under minutes either side of a
    boundary. The boundary is put between the legs here without waiting for one: B's series
    is planted with a head one minute ahead, which its complete counts into (D16: a head not
    older than the clock's minute is the newest), as if B's leg ran a minute later."""
    for n in (1, 2):
        enq(pair, jid(n))
    j1 = both(lambda q: q.claim())
    assert comp(pair, j1.id, j1.token) == ("ok", 1)
    j2 = both(lambda q: q.claim())
    series = base(QB) + "metrics:completed:data"
    head = r.lindex(series, 0)
    assert head is not None
    minute = int(head.split(b":")[0])
    r.lset(series, 0, f"{minute + 1}:1")  # B's first completion, filed a minute later
    assert comp(pair, j2.id, j2.token) == ("ok", 1)  # pair.check() compares the keyspaces
    assert r.lrange(series, 0, -1) == [f"{minute + 1}:2".encode()]
    assert (
        sum(int(e.split(b":")[1]) for e in r.lrange(base(QA) + "metrics:completed:data", 0, -1))
        == 2
    )


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ([b"101:1", b"100:2"], [b"101:2"]),  # a count lost
        ([b"101:3"], [b"103:3"]),  # filed two minutes apart
        ([b"101:1", b"100:2"], [b"101:1", b"100:1", b"99:1"]),  # filed a minute early
        ([b"100:1", b"101:2"], [b"101:3"]),  # oldest first
        ([b"101:3"], [b"101:1", b"101:2"]),  # a minute twice
        ([b"101:3"], [b"101:x"]),  # not <minute>:<count>
    ],
)
def test_the_series_tolerance_hides_no_miscount(a: list[bytes], b: list[bytes]) -> None:
    name = "emq:{Q}:metrics:completed:data"
    assert diff({name: ("list", a, -1)}, {name: ("list", b, -1)})
    assert not diff({name: ("list", a, -1)}, {name: ("list", a, -1)})


def test_complete_kept_result_and_waiter(pair: Pair, both: Both, r: redis.Redis) -> None:
    both(lambda q: q.enable_events(100))
    for n in (1, 2, 3):
        enq(pair, jid(n))
    j1 = both(lambda q: q.claim())
    assert comp(pair, j1.id, j1.token, b"\x00bin\xff", 60000) == ("ok", 1)  # nobody waits
    j2 = both(lambda q: q.claim())
    want(r, j2.id)
    assert comp(pair, j2.id, j2.token, "kept", 60000) == ("ok", 1)  # a waiter: notify:<id>
    assert r.llen(base(QB) + "notify:" + j2.id) == 1
    assert r.hget(base(QB) + "result:" + j2.id, "result") == b"kept"
    # A retried job (attempts 2) completes: its <row>:errors goes with the row.
    j3 = both(lambda q: q.claim())
    retr(pair, j3.id, j3.token)
    both(lambda q: q.promote())
    j3 = both(lambda q: q.claim())
    assert j3.token == 2
    assert comp(pair, j3.id, j3.token, "r", 5000) == ("ok", 1)
    assert not r.exists(base(QB) + "job:" + j3.id + ":errors")
    # Malformed keep_result_ms: ERR before anything is written (documented difference).
    enq(pair, jid(4))
    j4 = both(lambda q: q.claim())
    before = snapshot(r, QB)
    kind, msg = call_native(
        r, "complete", expand(["@active", "@job:" + j4.id], QB), [base(QB), j4.id, "1", "r", "x"]
    )
    assert (kind, msg) == ("err", "a numeric argument is not an integer")
    assert not diff(before, snapshot(r, QB))


def test_dedup_release(pair: Pair, both: Both) -> None:
    both(lambda q: q.enable_events(100))
    enq(pair, jid(1), dedup="d1")
    enq(pair, jid(2), dedup="d2")
    enq(pair, jid(3), dedup="d3", group="g")
    dedup = {jid(n): f"de:d{n}" for n in (1, 2, 3)}
    j1 = both(lambda q: q.claim())
    assert pair.r.get(base(QB) + dedup[j1.id]) == j1.id.encode()
    assert comp(pair, j1.id, j1.token) == ("ok", 1)  # released on complete
    assert pair.r.get(base(QB) + dedup[j1.id]) is None
    j2 = both(lambda q: q.claim())
    assert retr(pair, j2.id, j2.token, max_attempts=1) == ("ok", b"dead")  # released on dead
    assert pair.r.get(base(QB) + dedup[j2.id]) is None
    j3 = both(lambda q: q.claim(lease_ms=1))
    lapse()
    assert sweep(pair) == ("ok", [[], [j3.id.encode()]])  # released on a stall death
    assert pair.r.get(base(QB) + dedup[j3.id]) is None


@pytest.mark.parametrize("events", [False, True])
def test_retry(pair: Pair, both: Both, r: redis.Redis, events: bool) -> None:
    if events:
        both(lambda q: q.enable_events(100))
    enq(pair, jid(1))
    enq(pair, jid(2), group="g")
    j = both(lambda q: q.claim())
    assert retr(pair, j.id, j.token + 1) == ("err", "EMQSTALE retry token mismatch")
    assert retr(pair, j.id, j.token, delay=5000) == ("ok", b"scheduled")
    assert retr(pair, j.id, j.token) == ("err", "EMQSTALE retry lease settled")
    assert retr(pair, jid(99), 1) == ("ok", 0)
    both(lambda q: q.limit_lane("g", 1))
    g = both(lambda q: q.claim())
    assert g.id == jid(2)
    # Three attempts with a ceiling of 3: scheduled, scheduled, dead; errors kept per attempt.
    for attempt in (1, 2, 3):
        want_verdict = b"dead" if attempt == 3 else b"scheduled"
        assert retr(pair, g.id, g.token, error=f"e{attempt}") == ("ok", want_verdict)
        if attempt < 3:
            both(lambda q: q.promote())
            g = both(lambda q: q.claim())
    assert r.lrange(base(QB) + "job:" + jid(2) + ":errors", 0, -1) == [
        b"attempt 1: e1",
        b"attempt 2: e2",
        b"attempt 3: e3",
    ]
    # More than 10 attempts: LTRIM keeps the last 10.
    enq(pair, jid(3))
    for _ in range(12):
        k = both(lambda q: q.claim())
        retr(pair, k.id, k.token, max_attempts=100)
        both(lambda q: q.promote())
    assert r.llen(base(QB) + "job:" + jid(3) + ":errors") == 10
    # Retry after a reap (pending) releases from the waiting set.
    enq(pair, jid(4), group="h")
    k = both(lambda q: q.claim(lease_ms=1))
    while k.id != jid(4):
        both(lambda q, k=k: q.complete(k.id, k.token))
        k = both(lambda q: q.claim(lease_ms=1))
    lapse()
    both(lambda q: q.reap())
    assert retr(pair, k.id, k.token, delay=0) == ("ok", b"scheduled")


def test_retry_floor_keep_and_cancel(pair: Pair, both: Both, r: redis.Redis) -> None:
    both(lambda q: q.enable_events(100))
    # A re-admitted id comes back with floor = its last attempts: the ceiling counts anew.
    enq(pair, jid(1))
    j = both(lambda q: q.claim())
    assert retr(pair, j.id, j.token, max_attempts=1, error="first") == ("ok", b"dead")
    both(lambda q: q.remove(j.id))
    enq(pair, jid(1))
    pair.check()
    j = both(lambda q: q.claim())
    assert j.token == 2
    assert retr(pair, j.id, j.token, max_attempts=2) == ("ok", b"scheduled")
    both(lambda q: q.promote())
    j = both(lambda q: q.claim())
    assert retr(pair, j.id, j.token, max_attempts=2) == ("ok", b"dead")
    # keep_ms: a dead-letter keeps its error, and wakes a waiter.
    enq(pair, jid(2))
    j2 = both(lambda q: q.claim())
    want(r, j2.id)
    assert retr(pair, j2.id, j2.token, max_attempts=1, error="kept", keep=9000) == (
        "ok",
        b"dead",
    )
    assert r.hget(base(QB) + "result:" + j2.id, "error") == b"kept"
    assert r.llen(base(QB) + "notify:" + j2.id) == 1
    # keep_ms on a scheduled retry writes no outcome.
    enq(pair, jid(3))
    j3 = both(lambda q: q.claim())
    assert retr(pair, j3.id, j3.token, keep=9000) == ("ok", b"scheduled")
    # D22: cancel with remove, then the holder's "cancelled" settle removes the job.
    enq(pair, jid(4), dedup="d4")
    both(lambda q: q.promote())
    j4 = both(lambda q: q.claim())
    while j4.id != jid(4):
        both(lambda q, j4=j4: q.complete(j4.id, j4.token))
        j4 = both(lambda q: q.claim())
    assert both(lambda q: q.cancel(j4.id, remove=True)) == "signalled"
    want(r, j4.id)
    assert retr(pair, j4.id, j4.token, error="cancelled", keep=9000) == ("ok", b"removed")
    assert not r.exists(base(QB) + "job:" + j4.id)
    assert r.hget(base(QB) + "result:" + j4.id, "error") == b"cancelled"
    # A cancel without remove: "cancelled" dead-letters as any error does.
    enq(pair, jid(5))
    j5 = both(lambda q: q.claim())
    both(lambda q: q.cancel(j5.id))
    assert retr(pair, j5.id, j5.token, error="cancelled", max_attempts=1) == ("ok", b"dead")
    # Malformed numbers: ERR before anything is written.
    enq(pair, jid(6))
    j6 = both(lambda q: q.claim())
    before = snapshot(r, QB)
    keys = expand(["@active", "@schedule", "@dead", "@job:" + j6.id], QB)
    for bad in (["1e3", "3", "x"], ["0", "", "x"], ["0", "3", "x", "k"]):
        got = call_native(r, "retry", keys, [base(QB), j6.id, str(j6.token), *bad])
        assert got == ("err", "a numeric argument is not an integer")
    assert not diff(before, snapshot(r, QB))


def test_randomized(pair: Pair, both: Both) -> None:
    rng = random.Random(20261202)
    ids = [jid(n) for n in range(1, 15)]
    groups = ["", "", "g1", "g2", "g3"]
    tokens: dict[str, int] = {}
    both(lambda q: q.enable_events(2000))
    both(lambda q: q.limit_lane("g1", 1))
    for step in range(220):
        roll = rng.random()
        i = rng.choice(ids)
        if roll < 0.25:
            enq(pair, i, group=rng.choice(groups), dedup=rng.choice(["", "", "d1", "d2"]))
        elif roll < 0.42:
            lease = rng.choice([1, 1, 30000])
            job = both(lambda q, lease=lease: q.claim(lease_ms=lease))
            if job:
                tokens[job.id] = job.token
        elif roll < 0.57:
            tok = tokens.get(i, rng.randrange(3))
            if rng.random() < 0.2:
                tok += rng.choice([-1, 1])
            keep = rng.choice([None, 0, 5000])
            if keep and rng.random() < 0.5:
                want(pair.r, i)
            comp(pair, i, tok, f"r{step}", keep)
        elif roll < 0.72:
            tok = tokens.get(i, rng.randrange(3))
            retr(
                pair,
                i,
                tok,
                delay=rng.choice([0, 0, 10000]),
                max_attempts=rng.choice([1, 2, 3]),
                error=rng.choice(["e", "cancelled"]),
                keep=rng.choice([None, 0, 5000]),
            )
        elif roll < 0.82:
            time.sleep(0.005)
            sweep(pair, rng.choice([1, 2, 3]), rng.choice([1, 100]))
        elif roll < 0.86:
            k, rm = rng.choice(ids), rng.random() < 0.5
            both(lambda q, k=k, rm=rm: quiet(lambda: q.cancel(k, remove=rm)))
        elif roll < 0.9:
            both(lambda q: (q.promote(), q.reap()))
        elif roll < 0.94:
            k = rng.choice(ids)
            both(lambda q, k=k: quiet(lambda: q.reprocess(k)))
        else:
            time.sleep(0.005)
        pair.check(f"step {step}")
    assert pair.calls > 110


def test_fuzz(r: redis.Redis) -> None:
    rng = random.Random(11)
    verbs = ["EMQ.COMPLETE", "EMQ.RETRY", "EMQ.SWEEP"]
    b = base(QB)
    pool: list[bytes] = [
        b"-1", b"0", b"1", b"2", b"3", b"99999999999999999999", b"x", b"", b"cancelled",
        b"JOB00000000001", b.encode(), b"active", b"1e3",
    ]  # fmt: skip
    for n in (1, 2):  # some live state for the commands to chew on
        r.hset(b + f"job:JOB0000000000{n}", mapping={"attempts": "1", "state": "active",
                                                     "lease_epoch": "1", "group": "g"})  # fmt: skip
        r.zadd(b + "active", {f"JOB0000000000{n}": 1})
    deadline = time.monotonic() + 6
    n = 0
    while time.monotonic() < deadline and n < 3000:
        n += 1
        verb = rng.choice(verbs)
        args: list[bytes] = []
        for _ in range(rng.randrange(0, 14)):
            pick = rng.random()
            if pick < 0.5:
                args.append(rng.choice(pool))
            elif pick < 0.7:
                args.append((b + rng.choice(["job:JOB00000000001", "active", "dead"])).encode())
            else:
                args.append(os.urandom(rng.randrange(0, 20)))
        if rng.random() < 0.6 and args:
            args[0] = str(rng.choice([-1, 0, 1, 2, 4, 50, 2**40])).encode()
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


def test_replica_without_module(
    nserver: EmbeddedServer, pair: Pair, both: Both, tmp_path: Path
) -> None:
    with replica_of(nserver, tmp_path / "replica") as rr:
        assert b"trafikey" not in {m[b"name"] for m in rr.module_list()}
        both(lambda q: q.enable_events(100))
        for n in range(1, 9):
            enq(pair, jid(n), group="g" if n % 2 else "", dedup=f"d{n}")
        both(lambda q: q.add_flow(FlowJob("root", id=jid(50), children=[FlowJob("c", id=jid(51))])))
        jobs = [both(lambda q: q.claim()) for _ in range(5)]
        comp(pair, jobs[0].id, jobs[0].token, "r", 9000)
        retr(pair, jobs[1].id, jobs[1].token, max_attempts=1, keep=9000)
        retr(pair, jobs[2].id, jobs[2].token, delay=100)
        both(lambda q: q.cancel(jobs[3].id, remove=True))
        retr(pair, jobs[3].id, jobs[3].token, error="cancelled")
        both(lambda q: q.claim_batch(5, lease_ms=1))
        lapse()
        sweep(pair, 1, 2)
        sweep(pair, 2)
        assert command(pair.r, "WAIT", 1, 5000) == 1
        assert_replicated(pair.r, rr, (QA, QB), hashes=True)


@pytest.mark.slow  # valgrind: scripts/check --fast neither runs nor installs it
def test_valgrind(tmp_path: Path) -> None:
    calls = 0
    with valgrind_server(tmp_path, build("debug")) as (r, url):
        p = SettlePair(r, QA, QB)
        qa, qb = (
            echomq.Queue(QA, url=url),
            echomq.Queue(QB, url=url),
        )
        try:
            for q in (qa, qb):
                q.enable_events(100)
                q.limit_lane("g", 2)
                q.add_flow(FlowJob("root", id=jid(500), children=[FlowJob("c", id=jid(501))]))
            for n in range(1, 49):  # small: every call is compared, under valgrind (<~20 s)
                enq(p, jid(n), group="g" if n % 3 == 0 else "", dedup=f"d{n}" if n % 4 else "")
            claims = 0
            for n in range(40):
                ja, jb = (
                    qa.claim(lease_ms=1 if n % 4 == 0 else 30000),
                    qb.claim(lease_ms=1 if n % 4 == 0 else 30000),
                )
                if ja is None:
                    break
                assert jb is not None and ja.id == jb.id
                claims += 1
                if n % 4 == 1:
                    comp(p, ja.id, ja.token, "r", 5000 if n % 8 == 1 else None)
                elif n % 4 == 2:
                    retr(p, ja.id, ja.token, max_attempts=1 if n % 8 == 2 else 3, keep=5000)
                elif n % 4 == 3:
                    comp(p, ja.id, ja.token + 1)
            assert claims > 25
            time.sleep(0.05)
            sweep(p, 1, 3)
            sweep(p, 2)
        finally:
            qa.close()
            qb.close()
        calls = p.calls
        for verb in ("EMQ.COMPLETE", "EMQ.RETRY", "EMQ.SWEEP"):
            for args in ([], ["x"], ["-1"], ["1", "k"], ["2", "a", "b", "c"], ["1", "{x}k", "{x}"]):
                with contextlib.suppress(redis.ResponseError):
                    command(r, verb, *args)
                calls += 1
    assert calls > 60
