"""EMQ.CLAIM (trafikey) against claim.lua / claim_batch.lua (native/README.md).

Each differential test runs the same input through the script (EVAL, queue A) and through
EMQ.CLAIM (queue B) of one server, then compares the replies and every key of both queues
(names normalised; lease scores within native_fixtures.TOLERANCE_MS). The `{ms}` reply of a
rate-held claim is a time: it is compared within the same tolerance."""

from __future__ import annotations

import contextlib
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest
import redis

import echomq
from echomq.server import EmbeddedServer
from native_fixtures import (
    TOLERANCE_MS,
    Pair,
    Reply,
    assert_replicated,
    base,
    build,
    call_native,
    call_script,
    command,
    differential_fixtures,
    expand,
    expand_args,
    jid,
    quiet,
    replica_of,
    valgrind_server,
)

QA, QB = "clmA", "clmB"
CLAIM_KEYS = ["@meta", "@ring", "@active"]


module_path, nserver, r, pair, both = differential_fixtures(QA, QB, tmp_name="nclaim")


# ---- the transitions' KEYS/ARGV ('@' = the queue's base) --------------------------------


def enq(pair: Pair, id: str, payload: str | bytes = "p", *, group: str = "") -> Any:
    args: list[str | bytes] = ["@", id, payload, group, "now", "0", "", "0", "", "", "simple"]
    return pair.run("enqueue", ["@job:" + id, "@meta"], [*args, "0"])


def enq_many(pair: Pair, items: list[tuple[str, str]], *, group: str = "") -> Any:
    args: list[str | bytes] = ["@", group, "now", "0", "0", "", "", "0", ""]
    for i, p in items:
        args += [i, p]
    return pair.run("enqueue_many", ["@meta"], args)


def is_wait(reply: Any) -> bool:
    """The D21 `{ms}` reply: a one-element array holding an integer."""
    return isinstance(reply, list) and len(reply) == 1 and isinstance(reply[0], int)


def run_claim(pair: Pair, script: str, args: list[str | bytes]) -> Reply:
    """One claim on both queues: replies equal (a `{ms}` within the tolerance), keyspaces
    equal."""
    ra = call_script(pair.r, script, expand(CLAIM_KEYS, pair.a), expand_args(args, pair.a))
    rb = call_native(pair.r, script, expand(CLAIM_KEYS, pair.b), expand_args(args, pair.b))
    pair.calls += 1
    if ra[0] == rb[0] == "ok" and is_wait(ra[1]) and is_wait(rb[1]):
        assert abs(ra[1][0] - rb[1][0]) <= TOLERANCE_MS, (ra, rb)
    else:
        assert ra == rb, f"{script} {args}: script {ra!r} != native {rb!r}"
    pair.check(f"after {script} {args!r}")
    return ra


def claim(pair: Pair, lease: int | str = 30000) -> Any:
    return run_claim(pair, "claim", ["@", str(lease)])


def claim_b(pair: Pair, n: int | str, lease: int | str = 30000) -> Any:
    return run_claim(pair, "claim_batch", ["@", str(lease), str(n)])


def ids_of(reply: Reply) -> list[str]:
    kind, value = reply
    assert kind == "ok" and not is_wait(value), reply
    return [j[0].decode() for j in value]


def plant(pair: Pair, *cmd: str) -> None:
    """The same raw command on both queues ('@' in an argument = the queue's base)."""
    for q in (pair.a, pair.b):
        command(pair.r, *[base(q) + c[1:] if c.startswith("@") else c for c in cmd])


# ---- differential tests ----------------------------------------------------------------


@pytest.mark.parametrize("events", [False, True])
def test_flat_single_and_batch(pair: Pair, both: Any, events: bool) -> None:
    if events:
        both(lambda q: q.enable_events(100))
    assert claim(pair) == ("ok", [])
    assert claim_b(pair, 5) == ("ok", [])
    for n in range(1, 7):
        enq(pair, jid(n), f"payload-{n}")
    enq(pair, jid(7), b"bin\x00\r\n\xff")
    got = claim(pair)
    assert got == ("ok", [jid(1).encode(), b"payload-1", 1, None])
    assert ids_of(claim_b(pair, 2)) == [jid(2), jid(3)]
    assert ids_of(claim_b(pair, 50, 1)) == [jid(n) for n in range(4, 8)]
    assert claim_b(pair, 3) == ("ok", [])
    assert claim_b(pair, 0) == ("ok", [])
    assert claim_b(pair, -2) == ("ok", [])
    # Reaped and claimed again: attempts (the token) counts up.
    time.sleep(0.02)
    both(lambda q: q.reap())
    pair.check()
    again = claim_b(pair, 10)
    assert [j[2] for j in again[1]] == [2, 2, 2, 2]


def test_lanes_with_weights(pair: Pair, both: Any) -> None:
    """The service order over many claims, single and batch, is the script's exactly."""
    both(lambda q: q.weight_lane("a", 3))
    both(lambda q: q.weight_lane("c", 2))
    n = 0
    for lane, count in (("a", 12), ("b", 8), ("c", 10), ("", 6)):
        items = [(jid(1000 + n + i), f"{lane}{i}") for i in range(count)]
        n += count
        enq_many(pair, items, group=lane)
    order: list[Any] = []
    for _ in range(12):
        got = claim(pair)
        order.append(got[1][3])
    sizes = [1, 4, 2, 5, 3]
    while True:
        got = claim_b(pair, sizes[len(order) % len(sizes)])
        if not got[1]:
            break
        order += [j[3] for j in got[1]]
    assert len(order) == 36
    # The weights show: "a" is served 3 times in a row at least once.
    lanes = b"".join(x or b"*" for x in order)
    assert b"aaa" in lanes and b"cc" in lanes, lanes


def test_concurrency_limits_and_paused_lanes(pair: Pair, both: Any) -> None:
    both(lambda q: q.enable_events(100))
    both(lambda q: q.limit_lane("l", 2))
    both(lambda q: q.pause_lane("p"))
    enq_many(pair, [(jid(n), "x") for n in range(1, 6)], group="l")
    enq_many(pair, [(jid(n), "y") for n in range(10, 13)], group="p")
    enq_many(pair, [(jid(n), "z") for n in range(20, 22)], group="f")
    got = ids_of(claim_b(pair, 20))
    assert sorted(got) == sorted([jid(1), jid(2), jid(20), jid(21)])
    assert claim(pair) == ("ok", [])
    both(lambda q: q.resume_lane("p"))
    assert ids_of(claim_b(pair, 20)) == [jid(10), jid(11), jid(12)]
    # A freed slot lets the limited lane back in.
    both(lambda q: q.complete(jid(1), 1))
    pair.check()
    got = claim(pair)
    assert got[1][3] == b"l"
    # A limit raised above the active count, then a lane at a planted over-limit count.
    both(lambda q: q.limit_lane("l", 5))
    assert ids_of(claim_b(pair, 5)) == [jid(4), jid(5)]
    enq(pair, jid(30), group="m")
    both(lambda q: q.limit_lane("m", 1))
    plant(pair, "HSET", "@gactive", "m", "3")
    assert claim_b(pair, 3) == ("ok", [])


def test_paused_queue(pair: Pair, both: Any) -> None:
    enq(pair, jid(1))
    enq(pair, jid(2), group="g")
    both(lambda q: q.pause())
    assert claim(pair) == ("ok", [])
    assert claim_b(pair, 4) == ("ok", [])
    # The arguments are checked first, paused or not, in both (PROTOCOL §6).
    assert claim(pair, "x") == ("err", "a numeric argument is not an integer")
    both(lambda q: q.resume())
    assert len(ids_of(claim_b(pair, 4))) == 2


def test_malformed_numbers_refused(pair: Pair) -> None:
    enq(pair, jid(1))
    b = base(QB)
    keys = [b + "meta", b + "ring", b + "active"]
    for args in ([b, "x"], [b, "1e3"], [b, " 5"], [b, "9223372036854775807"], [b, "10", "2.5"]):
        kind, msg = call_native(pair.r, "claim" if len(args) == 2 else "claim_batch", keys, args)
        assert kind == "err" and "not an integer" in msg, (args, msg)
    # Nothing was written: the job is still pending in B, the keyspace as before.
    assert pair.r.zcard(b + "pending") == 1 and pair.r.zcard(b + "active") == 0
    for bad in ([b, "1", "2", "3"], [b]):
        kind, msg = call_native(pair.r, "claim", keys, bad)
        assert kind == "err" and "EMQ.CLAIM takes" in msg


def test_big_batch_chunks_the_active_zadd(pair: Pair) -> None:
    """More than 1000 jobs in one claim: the ZADD of active goes in chunks of 1000 pairs."""
    enq_many(pair, [(jid(n), "x") for n in range(1, 2502)])
    got = ids_of(claim_b(pair, 3000))
    assert got == [jid(n) for n in range(1, 2502)]


@pytest.mark.parametrize("events", [False, True])
def test_ghosts_and_malformed_rows(
    pair: Pair, both: Any, r: redis.Redis, nserver: EmbeddedServer, events: bool
) -> None:
    if events:
        both(lambda q: q.enable_events(100))
    for n in range(1, 7):
        enq(pair, jid(n))
    enq(pair, jid(7), group="g")
    enq(pair, jid(8), group="g")
    plant(pair, "DEL", "@job:" + jid(1))  # a ghost
    plant(pair, "HSET", "@job:" + jid(2), "attempts", "x")
    plant(pair, "HSET", "@job:" + jid(3), "attempts", "1234567890123456")  # 16 digits
    plant(pair, "DEL", "@job:" + jid(7))  # a ghost in a lane
    # Ids that are not branded: too large (past AzL8n0Y58m7), too short, lowercase brand.
    for bad in ("JOBAzL8n0Y58m8", "JOBzzzzzzzzzzz", "JOB123", "job00000000001"):
        plant(pair, "HSET", "@job:" + bad, "attempts", "0", "state", "pending", "payload", "b")
        plant(pair, "ZADD", "@pending", "0", bad)
    plant(pair, "HSET", "@job:JOBAzL8n0Y58m7", "attempts", "0", "state", "pending")
    plant(pair, "ZADD", "@pending", "0", "JOBAzL8n0Y58m7")  # the largest legal id
    plant(pair, "SET", "@job:" + jid(9), "not a hash")
    plant(pair, "ZADD", "@pending", "0", jid(9))
    got = ids_of(claim_b(pair, 10))
    assert sorted(got) == sorted([jid(4), jid(5), jid(6), "JOBAzL8n0Y58m7", jid(8)])
    assert r.zcard(base(QB) + "dead") == 6
    assert r.hget(base(QB) + "metrics:failed", "count") == b"6"
    assert r.hget(base(QB) + "job:JOB123", "last_error") == (
        b"malformed row: the id is not a branded job id"
    )
    assert r.hget(base(QB) + "job:" + jid(2), "last_error") == (
        b"malformed row: attempts is not an integer"
    )
    assert r.get(base(QB) + "job:" + jid(9)) == b"not a hash"
    log = (nserver.dir / "server.log").read_text(errors="replace")
    for q in (QA, QB):
        assert f"echomq: dropped {jid(9)} from {base(q)}pending: not a hash" in log
    # A single claim walks past the same kinds of rows.
    enq(pair, jid(20))
    enq(pair, jid(21))
    plant(pair, "HSET", "@job:" + jid(20), "attempts", "-1")
    assert ids_of(("ok", [claim(pair)[1]])) == [jid(21)]


def test_non_hash_meta_fails_like_the_script(pair: Pair) -> None:
    plant(pair, "SET", "@meta", "x")
    ra = call_script(pair.r, "claim", expand(CLAIM_KEYS, QA), [base(QA), "1000"])
    rb = call_native(pair.r, "claim", expand(CLAIM_KEYS, QB), [base(QB), "1000"])
    assert ra[0] == rb[0] == "err" and "WRONGTYPE" in ra[1] and rb[1].startswith("WRONGTYPE")
    pair.check()


def test_stale_and_planted_ring_entries(pair: Pair, both: Any) -> None:
    enq_many(pair, [(jid(n), "x") for n in range(1, 4)], group="a")
    enq_many(pair, [(jid(n), "x") for n in range(4, 7)], group="b")
    enq(pair, jid(7))
    both(lambda q: q.pause_lane("a"))  # "a" stays in the LIST as stale
    plant(pair, "LPUSH", "@ring", "zz", "b")  # planted: one unknown, one duplicate
    assert len(ids_of(claim_b(pair, 2))) == 2
    both(lambda q: q.resume_lane("a"))
    assert len(ids_of(claim_b(pair, 10))) == 5
    # A ring with entries but no SETs beside it (written before they existed).
    enq_many(pair, [(jid(n), "x") for n in range(10, 13)], group="c")
    enq(pair, jid(13))
    plant(pair, "DEL", "@inring", "@ringstale")
    assert len(ids_of(claim_b(pair, 10))) == 4


def test_queue_rate_limit(pair: Pair, both: Any) -> None:
    both(lambda q: q.enable_events(100))
    both(lambda q: q.rate_limit(3, 60000))
    enq_many(pair, [(jid(n), "x") for n in range(1, 6)])
    assert len(ids_of(claim_b(pair, 10))) == 3
    got = claim(pair)
    assert is_wait(got[1]) and 55000 < got[1][0] <= 60000, got
    got = claim_b(pair, 4)
    assert is_wait(got[1])
    # A window without expiry (planted) answers 1 ms; a garbage rate_max means no limit.
    plant(pair, "PERSIST", "@limiter")
    assert claim(pair) == ("ok", [1])
    plant(pair, "HSET", "@meta", "rate_max", "lots")
    assert len(ids_of(claim_b(pair, 10))) == 2


def test_lane_rate_limits(pair: Pair, both: Any) -> None:
    both(lambda q: q.enable_events(100))
    both(lambda q: q.rate_limit_lane("r", 2, 60000))
    both(lambda q: q.rate_limit_lane("s", 1, 150))
    enq_many(pair, [(jid(n), "x") for n in range(1, 6)], group="r")
    enq_many(pair, [(jid(n), "x") for n in range(10, 13)], group="s")
    enq(pair, jid(20))
    got = ids_of(claim_b(pair, 10))
    assert len(got) == 4  # 2 of r, 1 of s, the flat one
    got2 = claim(pair)
    assert is_wait(got2[1]) and got2[1][0] <= 150, got2
    time.sleep(0.3)
    # s's window reopened: readmitted by the claim (readmit_rated), served once more.
    got3 = ids_of(claim_b(pair, 10))
    assert got3 == [jid(11)]
    got4 = claim_b(pair, 10)
    assert is_wait(got4[1])
    # Both limits at once: the queue-wide window caps the lanes too.
    time.sleep(0.3)
    both(lambda q: q.rate_limit(1, 60000))
    assert len(ids_of(claim_b(pair, 10))) == 1
    got5 = claim(pair)
    assert is_wait(got5[1]) and got5[1][0] > 50000


def test_floor_reported(pair: Pair, both: Any) -> None:
    enq(pair, jid(1), group="g")
    enq(pair, jid(2))
    for _ in range(2):
        job = both(lambda q: q.claim())
        both(lambda q, job=job: q.complete(job.id, job.token))
    pair.check()
    # Re-admitted ids carry their floor (the retired attempts).
    enq(pair, jid(1), group="g")
    enq(pair, jid(2))
    got = claim_b(pair, 5)
    assert {j[0]: j for j in got[1]} == {
        jid(1).encode(): [jid(1).encode(), b"p", 2, b"g", b"1"],
        jid(2).encode(): [jid(2).encode(), b"p", 2, None, b"1"],
    }
    enq(pair, jid(3))
    plant(pair, "HSET", "@job:" + jid(3), "floor", "7", "attempts", "7")
    assert claim(pair) == ("ok", [jid(3).encode(), b"p", 8, None, b"7"])


def test_randomized(pair: Pair, both: Any) -> None:
    rng = random.Random(20261202)
    ids = [jid(n) for n in range(1, 25)]
    lanes = ["", "", "a", "b", "c"]
    tokens: dict[str, int] = {}
    seen = {"job": 0, "wait": 0, "empty": 0}
    both(lambda q: q.enable_events(1000))
    for step in range(200):
        roll = rng.random()
        i = rng.choice(ids)
        if roll < 0.25:
            enq(pair, i, f"p{step}", group=rng.choice(lanes))
        elif roll < 0.35:
            items = list({rng.choice(ids): f"m{step}" for _ in range(rng.randrange(9))}.items())
            enq_many(pair, items, group=rng.choice(lanes))
        elif roll < 0.5:
            got = claim(pair, rng.choice([1, 1, 30000]))
            seen["wait" if is_wait(got[1]) else "job" if got[1] else "empty"] += 1
            if got[1] and not is_wait(got[1]):
                tokens[got[1][0].decode()] = got[1][2]
        elif roll < 0.62:
            got = claim_b(pair, rng.choice([1, 2, 3, 7, 50]), rng.choice([1, 1, 30000]))
            seen["wait" if is_wait(got[1]) else "job" if got[1] else "empty"] += 1
            if not is_wait(got[1]):
                for j in got[1]:
                    tokens[j[0].decode()] = j[2]
        elif roll < 0.67 and tokens:
            k = rng.choice(sorted(tokens))
            args: list[str | bytes] = ["@", k, str(tokens[k]), str(rng.choice([1, 30000]))]
            pair.run("extend", ["@active", "@job:" + k], args)
        elif roll < 0.72 and tokens:
            k = rng.choice(sorted(tokens))
            both(lambda q, k=k: quiet(lambda: q.complete(k, tokens[k])))
        elif roll < 0.76 and tokens:
            k = rng.choice(sorted(tokens))
            both(
                lambda q, k=k: quiet(
                    lambda: q.retry(k, tokens[k], delay_ms=0, max_attempts=3, error="x")
                )
            )
        elif roll < 0.88:
            g = rng.choice(["a", "b", "c"])
            admin = rng.randrange(6)
            lim, w, m = rng.choice([None, 1, 2]), rng.choice([1, 2, 3]), rng.choice([1, 3])
            # Windows outlast the test: one that ran out between the script's call and the
            # module's (a 40 ms window did, on a loaded run) would make the two queues differ
            # by timing, not by logic. Clearing a limit stands in for a window reopening,
            # which test_lane_rate_limits checks with time to spare on both sides.
            window = 60_000
            if admin == 0:
                both(lambda q, g=g: q.pause_lane(g))
            elif admin == 1:
                both(lambda q, g=g: q.resume_lane(g))
            elif admin == 2:
                both(lambda q, g=g, n=lim: q.limit_lane(g, n))
            elif admin == 3:
                both(lambda q, g=g, w=w: q.weight_lane(g, w))
            elif admin == 4:
                if rng.random() < 0.6:
                    both(lambda q, g=g, m=m, w=window: q.rate_limit_lane(g, m, w))
                else:
                    both(lambda q, g=g: q.clear_rate_limit(g))
            else:
                pause = rng.random() < 0.15
                both(lambda q, pause=pause: q.pause() if pause else q.resume())
        else:
            time.sleep(0.005)
            both(lambda q: (q.reap(), q.promote()))
        pair.check(f"step {step}")
    assert pair.calls > 70
    # The sequence reaches every kind of reply.
    assert seen["job"] > 25 and seen["wait"] > 3 and seen["empty"] >= 1, seen


# ---- fuzz, replica, valgrind -------------------------------------------------------------


def test_fuzz(r: redis.Redis) -> None:
    rng = random.Random(11)
    b = base(QB)
    for n in range(1, 20):
        command(r, "EMQ.ENQUEUE", 2, f"{b}job:{jid(n)}", b + "meta", b, jid(n), "p",
                rng.choice(["", "g"]), "now", "0")  # fmt: skip
    pool: list[bytes] = [
        b"-1", b"0", b"1", b"2", b"3", b"50", b"99999999999999999999", b"9223372036854775807",
        b"x", b"", b"1.5", b"JOB00000000001", b.encode(),
    ]  # fmt: skip
    deadline = time.monotonic() + 6
    n = 0
    while time.monotonic() < deadline and n < 3000:
        n += 1
        argc = rng.randrange(0, 9)
        args: list[bytes] = []
        for _ in range(argc):
            pick = rng.random()
            if pick < 0.5:
                args.append(rng.choice(pool))
            elif pick < 0.75:
                args.append((b + rng.choice(["meta", "ring", "active", "pending"])).encode())
            else:
                args.append(os.urandom(rng.randrange(0, 20)))
        if rng.random() < 0.7 and args:
            args[0] = rng.choice([b"3", b"3", b"2", b"-1", b"0", b"9"])
        if rng.random() < 0.6 and len(args) > 4 and args[0] == b"3":
            args[1:4] = [(b + k).encode() for k in ("meta", "ring", "active")]
            args[4] = b.encode()
        with contextlib.suppress(redis.ResponseError):
            command(r, "EMQ.CLAIM", *args)
        if n % 200 == 0:
            # Planted damage the claim must survive.
            command(r, "ZADD", b + "pending", "0", rng.choice(["bad", jid(99), "JOBzzzzzzzzzzz"]))
            command(r, "RPUSH", b + "ring", rng.choice(["*", "g", "q"]))
    assert r.ping()
    assert n > 100


def test_replica_without_module(
    nserver: EmbeddedServer, pair: Pair, both: Any, tmp_path: Path
) -> None:
    with replica_of(nserver, tmp_path / "replica") as rr:
        both(lambda q: q.enable_events(100))
        both(lambda q: q.weight_lane("a", 2))
        both(lambda q: q.rate_limit_lane("b", 2, 60000))
        both(lambda q: q.rate_limit(9, 60000))
        enq_many(pair, [(jid(n), "x") for n in range(1, 5)], group="a")
        enq_many(pair, [(jid(n), "x") for n in range(5, 9)], group="b")
        enq(pair, jid(9))
        plant(pair, "HSET", "@job:" + jid(9), "attempts", "x")
        claim(pair)
        claim_b(pair, 20)
        assert command(pair.r, "WAIT", 1, 5000) == 1
        assert_replicated(pair.r, rr, (QA, QB))


@pytest.mark.slow  # valgrind: scripts/check --fast neither runs nor installs it
def test_valgrind(tmp_path: Path) -> None:
    with valgrind_server(tmp_path, build("debug")) as (r, url):
        p = Pair(r, QA, QB)
        qa, qb = echomq.Queue(QA, url=url), echomq.Queue(QB, url=url)
        for q in (qa, qb):
            q.enable_events(1000)
            q.weight_lane("a", 3)
            q.limit_lane("b", 5)
            q.rate_limit_lane("c", 20, 60000)
        for lane in ("", "a", "b", "c"):
            enq_many(p, [(jid(1000 * len(lane) + 100 * ord(lane[:1] or "x") + n), "x")
                         for n in range(25)], group=lane)  # fmt: skip
        plant(p, "HSET", "@job:" + jid(1000 + 100 * ord("a")), "attempts", "x")
        plant(p, "ZADD", "@pending", "0", "JOBzzzzzzzzzzz")
        plant(p, "HSET", "@job:JOBzzzzzzzzzzz", "attempts", "0")
        plant(p, "SET", "@job:" + jid(7), "s")
        plant(p, "ZADD", "@pending", "0", jid(7))
        for k in range(45):  # small: every call is compared, under valgrind (<~20 s)
            claim(p, 60000)
            if k % 10 == 0:
                claim_b(p, 7)
        for q in (qa, qb):
            q.rate_limit(5, 60000)
        claim_b(p, 50)
        claim(p)
        for args in ([], ["x"], ["3", "a", "b", "c"], ["3", "{x}a", "{x}b", "{x}c", "{x}", "y"]):
            with contextlib.suppress(redis.ResponseError):
                command(r, "EMQ.CLAIM", *args)
        qa.close()
        qb.close()
