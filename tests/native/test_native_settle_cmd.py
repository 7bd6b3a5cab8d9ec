"""trafikey's EMQ.SETTLE against settle.lua (the worker's round trip; native/README.md).

Every differential test runs the same inputs through the script (EVAL, queue A) and through
EMQ.SETTLE (queue B) of one server, then compares the replies (the `wait` element, a time,
within native_fixtures.TOLERANCE_MS) and every key of both queues (names normalised;
clock-derived scores and a kept outcome's finished_ms within the same tolerance).

The randomized, fuzz, replica and valgrind legs are in test_native_settle_cmd_fuzz.py.
"""

from __future__ import annotations

import time

import pytest
import redis
from native_settle_cmd_support import (
    QA,
    QB,
    SETTLE_KEYS,
    enq,
    enq_many,
    held_of,
    run_settle,
    settle,
    settle_args,
    want,
)

from echomq.protocol.compose import FlowJob
from native_fixtures import (
    Both,
    Pair,
    Reply,
    SettlePair,
    base,
    call_native,
    call_script,
    command,
    diff,
    differential_fixtures,
    expand,
    expand_args,
    jid,
    snapshot,
)

module_path, nserver, r, pair, both = differential_fixtures(
    QA, QB, tmp_name="nsettle", pair_class=SettlePair
)


def plant(pair: Pair, *cmd: str) -> None:
    """The same raw command on both queues ('@' in an argument = the queue's base)."""
    for q in (pair.a, pair.b):
        command(pair.r, *[base(q) + c[1:] if c.startswith("@") else c for c in cmd])


def enq_p(pair: Pair, id: str, priority: str, *, group: str = "", mode: str = "now") -> Reply:
    """enqueue with a priority (ARGV[14], after ARGV[10..13])."""
    value = "60000" if mode == "in" else "0"
    args = ["@", id, "p" + id, group, mode, value, "", "0", "", "", "simple", "0", "0", priority]
    return pair.run("enqueue", ["@job:" + id, "@meta"], list(args))


def test_priorities_and_the_queue_limit(pair: Pair, both: Both) -> None:
    """Issue 24 on both executors: a priority on enqueue and enqueue_many (refused alike out of
    range), claims in priority order, the score kept by reprocess, the stall sweep and a flow
    parent's release, and the queue-wide limit capping settle's claim."""
    both(lambda q: q.enable_events(100))
    for n, p in ((1, "5"), (2, "0"), (3, "2097152"), (4, "1")):
        assert enq_p(pair, jid(n), p) == ("ok", b"enqueued")
    assert enq_p(pair, jid(5), "3", group="g") == ("ok", b"enqueued")
    assert enq_p(pair, jid(6), "9", mode="in") == ("ok", b"scheduled")
    many = ["@", "g", "now", "0", "0", "", "", "7", "", jid(7), "x", jid(8), "y"]
    assert pair.run("enqueue_many", ["@meta"], many)[0] == "ok"
    for bad in ("-1", "2097153", "1.5", "x"):
        assert enq_p(pair, jid(9), bad)[0] == "err"
        bad_many = ["@", "", "now", "0", "0", "", "", bad, "", jid(9), "x"]
        assert pair.run("enqueue_many", ["@meta"], bad_many)[0] == "err"
    got = held_of(settle(pair, 4))
    assert [i for i, _ in got] == [jid(2), jid(5), jid(4), jid(7)]  # flat, lane, flat, lane
    # Dead and reprocessed (EMQ.REPROCESS), then lapsed and swept (EMQ.SWEEP): same score.
    settle(pair, 0, retries=[(jid(4), 1, 0, "1", "e")])
    assert pair.run("reprocess", ["@job:" + jid(4), "@dead"], ["@", jid(4)]) == ("ok", 1)
    assert pair.r.zscore(base(QB) + "pending", jid(4)) == 1.0  # parked by its priority
    settle(pair, 1, lease=1)  # a prioritised head (jid 4, or lane g's jid 8), lapsing
    time.sleep(0.01)
    pair.run("sweep_stalled", ["@active", "@dead"], ["@", "5", "100"])
    # A flow parent released by its child's completion (EMQ.SETTLE) keeps its priority.
    both(
        lambda q: q.add_flow(
            FlowJob(b"p", id=jid(20), priority=4, children=[FlowJob(b"c", id=jid(21))])
        )
    )
    pair.check()
    active = pair.r.zcard(base(QA) + "active")
    both(lambda q: q.limit(active + 2))
    first = settle(pair, 10)
    taken = held_of(first)
    assert len(taken) == 2 and first[4] == 1  # the room left; then held (issue 41)
    assert held_of(settle(pair, 10)) == []
    done = settle(pair, 10, completes=taken)
    assert len(done[2]) == 2 and done[4] == 1  # the two freed slots, taken again
    both(lambda q: q.limit(None))
    settle(pair, 50)


@pytest.mark.parametrize("k", [1, 10, 50])
@pytest.mark.parametrize("lanes", [False, True])
def test_worker_loop(pair: Pair, both: Both, k: int, lanes: bool) -> None:
    """settle(n=k), then settle(completed=held, n=k) until the queue is drained."""
    both(lambda q: q.enable_events(10000))
    total = 120
    if lanes:
        both(lambda q: q.weight_lane("a", 2))
        for g, lo, hi in (("a", 0, 50), ("b", 50, 90), ("", 90, 120)):
            enq_many(pair, [jid(n) for n in range(lo, hi)], group=g)
    else:
        enq_many(pair, [jid(n) for n in range(total)])
    value = settle(pair, k)
    held = held_of(value)
    done: list[str] = []
    rounds = 0
    while held:
        value = settle(pair, k, completes=held)
        assert value[0] == [1] * len(held) and value[1] == [] and value[3] == 0
        done += [i for i, _t in held]
        held = held_of(value)
        rounds += 1
        assert len(held) <= k
    assert sorted(done) == [jid(n) for n in range(total)]
    assert rounds >= total // k
    assert pair.r.hget(base(QB) + "metrics:completed", "count") == str(total).encode()
    assert pair.r.xlen(base(QB) + "events") > total


@pytest.mark.parametrize("events", [False, True])
def test_mixed_settles(pair: Pair, both: Both, r: redis.Redis, events: bool) -> None:
    """Completes (flat, lane, reaped, stale, gone, named twice, dedup), kept results,
    scheduled retries and dead-letters keeping their errors, in one call."""
    if events:
        both(lambda q: q.enable_events(1000))
    enq(pair, jid(1), dedup="d1")
    enq(pair, jid(2), group="g")
    enq_many(pair, [jid(n) for n in range(3, 12)])
    enq_many(pair, [jid(n) for n in range(12, 16)], group="h")
    got = held_of(settle(pair, 20))
    tok = dict(got)
    assert len(tok) == 15
    # A reaped flat job and a reaped lane job: the pending branch of the fence.
    enq(pair, jid(20))
    enq(pair, jid(21), group="g")
    reaped = held_of(settle(pair, 5, lease=1))
    assert {i for i, _ in reaped} == {jid(20), jid(21)}
    time.sleep(0.02)
    both(lambda q: q.reap())
    pair.check("after reap")
    tok.update(dict(reaped))
    want(r, jid(5))
    want(r, jid(8))
    value = settle(
        pair,
        3,
        completes=[
            (jid(1), tok[jid(1)]),  # dedup released
            (jid(2), tok[jid(2)]),  # lane
            (jid(20), tok[jid(20)]),  # reaped, pending
            (jid(21), tok[jid(21)]),  # reaped, in its lane
            (jid(3), 7),  # stale token
            (jid(99), 1),  # gone
            (jid(4), tok[jid(4)]),
            (jid(4), tok[jid(4)]),  # named twice: gone by its second mention
            (jid(12), 5),  # stale, then ...
            (jid(12), tok[jid(12)]),  # ... the right token completes it
            (jid(5), tok[jid(5)]),  # kept, a waiter
            (jid(6), tok[jid(6)]),  # kept, no waiter
            (jid(3), 9),  # stale and kept: nothing kept
        ],
        kept=[(b"r5\x00\xff", 60000), ("r6", 5000), ("r3", 5000)],
        retries=[
            (jid(7), tok[jid(7)], 0, "3", "e7"),  # scheduled
            (jid(8), tok[jid(8)], 0, "1:60000", "e8"),  # dead, error kept, a waiter
            (jid(9), tok[jid(9)], 500, "1", "e9"),  # dead, nothing kept
            (jid(13), tok[jid(13)], 100, "2:", "e13"),  # lane, scheduled
            (jid(14), 3, 0, "1", "x"),  # stale
            (jid(98), 1, 0, "1", "x"),  # gone
            (jid(4), tok[jid(4)], 0, "1", "x"),  # completed just before: gone
        ],
    )
    assert value[0] == [
        1, 1, 1, 1, b"EMQSTALE complete token mismatch", 0, 1, 0,
        b"EMQSTALE complete token mismatch", 1, 1, 1, b"EMQSTALE complete token mismatch",
    ]  # fmt: skip
    assert value[1] == [b"scheduled", b"dead", b"dead", b"scheduled",
                        b"EMQSTALE retry token mismatch", 0, 0]  # fmt: skip
    # Everything left is held or scheduled: the claim part finds nothing, no rate wait.
    assert value[2] == [] and value[3] == 0
    assert r.hget(base(QB) + "result:" + jid(5), "result") == b"r5\x00\xff"
    assert r.llen(base(QB) + "notify:" + jid(5)) == 1
    assert r.hget(base(QB) + "result:" + jid(8), "error") == b"e8"
    assert not r.exists(base(QB) + "result:" + jid(3))
    assert not r.exists(base(QB) + "result:" + jid(9))
    # A retried job comes back with attempts 2 and completes: its <row>:errors goes too.
    time.sleep(0.15)  # past jid(13)'s 100 ms delay
    both(lambda q: q.promote())
    pair.check("after promote")
    again = held_of(settle(pair, 10))
    assert dict(again).get(jid(7)) == 2 and jid(13) in dict(again)
    settle(pair, 0, completes=again, kept=[("last", 1000)])
    assert not r.exists(base(QB) + "job:" + jid(7) + ":errors")


def test_cancel_remove_and_floor(pair: Pair, both: Both, r: redis.Redis) -> None:
    both(lambda q: q.enable_events(100))
    enq_many(pair, [jid(n) for n in range(1, 4)])
    tok = dict(held_of(settle(pair, 3)))
    both(lambda q: q.cancel(jid(1), remove=True))
    pair.check("after cancel")
    value = settle(
        pair,
        0,
        retries=[
            (jid(1), tok[jid(1)], 0, "3:5000", "cancelled"),
            (jid(2), tok[jid(2)], 0, "3", "x"),
        ],
    )
    assert value[1] == [b"removed", b"scheduled"]
    assert not r.exists(base(QB) + "job:" + jid(1))
    assert r.hget(base(QB) + "result:" + jid(1), "error") == b"cancelled"


def test_flows(pair: Pair, both: Both) -> None:
    """Flow children settled in batches: kept results are what the parents record."""
    both(lambda q: q.enable_events(1000))
    tree = FlowJob(
        "root",
        id=jid(100),
        children=[
            FlowJob(
                "mid",
                id=jid(110),
                group="g",
                children=[FlowJob("leaf1", id=jid(111)), FlowJob("leaf2", id=jid(112))],
            ),
            FlowJob("c2", id=jid(120), fail_parent=False),
            FlowJob("c3", id=jid(130)),
        ],
    )
    both(lambda q: q.add_flow(tree))
    pair.check("after add_flow")
    tok = dict(held_of(settle(pair, 10)))
    assert set(tok) == {jid(111), jid(112), jid(120), jid(130)}
    # leaf1 keeps no result (the parent records ''), leaf2 keeps one; c2 dies (ignored).
    value = settle(
        pair,
        10,
        completes=[(jid(111), tok[jid(111)]), (jid(112), tok[jid(112)])],
        kept=[("v2", 60000)],
        retries=[(jid(120), tok[jid(120)], 0, "1", "ign")],
    )
    assert held_of(value) == [(jid(110), 1)]
    value = settle(
        pair, 10, completes=[(jid(110), 1), (jid(130), tok[jid(130)])], kept=[("m", 1), ("v3", 1)]
    )
    assert held_of(value) == [(jid(100), 1)]
    settle(pair, 10, completes=[(jid(100), 1)])
    # A child's death walks up the tree.
    tree2 = FlowJob("root", id=jid(200), children=[FlowJob("mid", id=jid(210),
                    children=[FlowJob("leaf", id=jid(211))])])  # fmt: skip
    both(lambda q: q.add_flow(tree2))
    leaf = held_of(settle(pair, 1))
    assert leaf == [(jid(211), 1)]
    settle(pair, 1, retries=[(jid(211), 1, 0, "1", "bad")])
    assert pair.r.hget(base(QB) + "job:" + jid(200), "state") == b"dead"


def test_paused_queue(pair: Pair, both: Both) -> None:
    enq_many(pair, [jid(n) for n in range(1, 6)])
    held = held_of(settle(pair, 2))
    both(lambda q: q.pause())
    value = settle(pair, 3, completes=held)
    assert value == [[1, 1], [], [], 0, 0]  # paused: no claim, never held (issue 41)
    # The arguments are checked first, paused or not, in both (PROTOCOL §6).
    assert run_settle(pair, settle_args(3, lease="x")) == (
        "err",
        "a numeric argument is not an integer",
    )
    both(lambda q: q.resume())
    assert len(settle(pair, 10)[2]) == 3


def test_rate_limit_wait(pair: Pair, both: Both) -> None:
    both(lambda q: q.rate_limit(2, 60000))
    enq_many(pair, [jid(n) for n in range(1, 6)])
    value = settle(pair, 5)
    assert len(value[2]) == 2 and value[3] == 0
    value = settle(pair, 5, completes=held_of(value))
    assert value[0] == [1, 1] and value[2] == [] and 55000 < value[3] <= 60000
    # A lane rate limit holding its lane back: the wait comes from the ratewait set.
    both(lambda q: q.rate_limit(100, 60000))
    both(lambda q: q.rate_limit_lane("g", 1, 30000))
    enq_many(pair, [jid(n) for n in range(10, 13)], group="g")
    value = settle(pair, 5)
    assert [j[3] for j in value[2]].count(b"g") == 1 and len(value[2]) == 4  # + 3 flat jobs
    value = settle(pair, 5, completes=held_of(value))
    assert value[2] == [] and 25000 < value[3] <= 30000
    assert settle(pair, 0)[3] == 0  # n = 0 never claims, never waits


def test_big_batches(pair: Pair, both: Both) -> None:
    """Past 2000 pairs: the ZREM active and the row DELs go in slices of 2000."""
    ids = [jid(n) for n in range(2300)]
    for lo in range(0, 2300, 500):
        enq_many(pair, ids[lo : lo + 500])
    enq_many(pair, [jid(n) for n in range(5000, 5100)], group="g")
    held = held_of(settle(pair, 2400))
    assert len(held) == 2400
    value = settle(pair, 0, completes=[*held, (jid(1), 1)], kept=[("k", 1000)])
    assert value[0] == [1] * 2400 + [0]
    assert pair.r.zcard(base(QB) + "active") == 0


def test_malformed_refused_before_any_write(pair: Pair, r: redis.Redis) -> None:
    enq_many(pair, [jid(n) for n in range(1, 4)])
    held = held_of(settle(pair, 2))
    (i1, t1), (i2, t2) = held
    b = base(QB)
    keys = expand(SETTLE_KEYS, QB)
    ok_pair = [i1, str(t1)]
    bad: list[list[str | bytes]] = [
        [b, "1000", "x", "1", *ok_pair],  # n
        [b, "1000", "1e1", "1", *ok_pair],
        [b, "y", "1", "1", *ok_pair],  # lease_ms (claims)
        [b, "99999999999999999999", "1", "0"],
        [b, "9223372036854775807", "1", "0"],  # now + lease_ms overflows
        [b, "1000", "1", "x", *ok_pair],  # completes spec
        [b, "1000", "1", ":1", *ok_pair],
        [b, "1000", "1", "1:2", *ok_pair, "r", "1"],  # r > c
        [b, "1000", "1", "2", *ok_pair],  # too few pairs
        [b, "1000", "1", "1", *ok_pair, "extra"],  # not whole retries
        [b, "1000", "1", "1:1", *ok_pair, "r", "soon"],  # keep_result_ms
        [b, "1000", "1", "1", *ok_pair, i2, str(t2), "later", "3", "e"],  # delay_ms
        [b, "1000", "1", "1", *ok_pair, i2, str(t2), "0", "three", "e"],  # max_attempts
        [b, "1000", "1", "1", *ok_pair, i2, str(t2), "0", "3:x", "e"],
        [b, "1000", "1", "1", *ok_pair, i2, str(t2), "9223372036854775807", "3", "e"],
        [b, "1000", "1", "99999999999999999999999", *ok_pair],
        [b, "1000", "9999999999999999999", "0"],  # 19 digits past LLONG_MAX: not a wrap
        [b, "1000", "1", "1", *ok_pair, i2, str(t2), "0", "9999999999999999999", "e"],
    ]
    before = snapshot(r, QB)
    for args in bad:
        kind, msg = call_native(r, "settle", keys, args)
        assert kind == "err" and msg.startswith(("a numeric", "EMQ.SETTLE")), (args, msg)
    assert not diff(before, snapshot(r, QB))
    short: list[tuple[list[str], list[str | bytes]]] = [
        (keys[:4], [b, "1", "1", "0"]),
        (keys, [b, "1", "1"]),
    ]
    for ks, sargs in short:
        kind, msg = call_native(r, "settle", ks, sargs)
        assert kind == "err" and "EMQ.SETTLE takes 5 keys" in msg
    # Another slot's key: refused by the frame, nothing written.
    kind, msg = call_native(r, "settle", [*keys[:4], "emq:{x}:dead"], [b, "1", "1", "0"])
    assert kind == "err"
    assert not diff(before, snapshot(r, QB))
    # The script refuses a malformed n too (raising after its writes, which is why the module
    # checks first): the same calls still agree on well-formed input afterwards.
    pair.check()


def test_non_hash_meta_fails_like_the_script(pair: Pair) -> None:
    """The gate's HMGET fails first, in both, before any write; the module's text is the
    server's own, without EVAL's '@user_script' suffix (native/README.md)."""
    plant(pair, "SET", "@meta", "x")
    plant(pair, "ZADD", "@active", "1", jid(1))
    args = settle_args(1, completes=[(jid(1), 1)])
    ka, ma = call_script(pair.r, "settle", expand(SETTLE_KEYS, QA), expand_args(args, QA))
    kb, mb = call_native(pair.r, "settle", expand(SETTLE_KEYS, QB), expand_args(args, QB))
    assert ka == kb == "err" and ma.startswith(mb) and mb.startswith("WRONGTYPE"), (ma, mb)
    pair.check()


def test_priority_text_is_canonical_on_both(pair: Pair) -> None:
    """A raw priority '-0' or '007' is stored as the number it is, alike on both executors."""
    assert enq_p(pair, jid(1), "-0") == ("ok", b"enqueued")
    assert enq_p(pair, jid(2), "007") == ("ok", b"enqueued")
    assert pair.r.zscore(base(QA) + "pending", jid(1)) == 0.0
    assert pair.r.hget(base(QA) + "job:" + jid(2), "priority") == b"7"
