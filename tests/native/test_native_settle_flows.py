"""Native settle conformance for flows and sweeps: parents and children, deaths up the
tree, cross-queue outboxes, stall sweeps, their waiters and the ring order.
"""

from __future__ import annotations

import time
from typing import Any

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
    Reply,
    SettlePair,
    base,
    call_native,
    call_script,
    diff,
    differential_fixtures,
    expand,
    expand_args,
    jid,
    settle_clock,
    snapshot,
)

module_path, nserver, r, pair, both = differential_fixtures(
    QA, QB, tmp_name="native_settle", clean=(QA + "P", QB + "P"), pair_class=SettlePair
)


def test_flow_parent(pair: Pair, both: Both) -> None:
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
    jobs = {}
    for _ in range(4):
        j = both(lambda q: q.claim())
        jobs[j.id] = j
    assert set(jobs) == {jid(111), jid(112), jid(120), jid(130)}
    l1, l2 = jobs[jid(111)], jobs[jid(112)]
    assert comp(pair, l1.id, l1.token, "v1") == ("ok", 1)
    assert comp(pair, l2.id, l2.token, "v2") == ("ok", 1)  # mid becomes pending (lane g)
    c2 = jobs[jid(120)]
    assert retr(pair, c2.id, c2.token, max_attempts=1, error="ign") == ("ok", b"dead")
    mid = both(lambda q: q.claim())
    assert mid.id == jid(110)
    # The mid node completes: it records under root, and its own flow keys go (flow_forget).
    assert comp(pair, mid.id, mid.token, "m") == ("ok", 1)
    c3 = jobs[jid(130)]
    assert comp(pair, c3.id, c3.token, "v3") == ("ok", 1)  # root released
    root = both(lambda q: q.claim())
    assert root.id == jid(100)
    assert comp(pair, root.id, root.token) == ("ok", 1)


def test_flow_child_death_kills_up_the_tree(pair: Pair, both: Both) -> None:
    both(lambda q: q.enable_events(1000))
    tree = FlowJob(
        "root",
        id=jid(200),
        children=[FlowJob("mid", id=jid(210), children=[FlowJob("leaf", id=jid(211))])],
    )
    both(lambda q: q.add_flow(tree))
    leaf = both(lambda q: q.claim())
    assert retr(pair, leaf.id, leaf.token, max_attempts=1, error="bad") == ("ok", b"dead")
    assert pair.r.hget(base(QB) + "job:" + jid(200), "state") == b"dead"
    # The same through a stall death.
    tree2 = FlowJob("root", id=jid(300), children=[FlowJob("leaf", id=jid(301))])
    both(lambda q: q.add_flow(tree2))
    leaf2 = both(lambda q: q.claim(lease_ms=1))
    assert leaf2.id == jid(301)
    lapse()
    assert sweep(pair) == ("ok", [[], [jid(301).encode()]])
    assert pair.r.hget(base(QB) + "job:" + jid(300), "state") == b"dead"


def test_flow_cross_queue_outbox(nserver: EmbeddedServer, r: redis.Redis) -> None:
    """Children whose parent is on another queue append to their own queue's outbox. The
    rows and the entries name the parent queue, which differs between A (setA) and B (setB):
    the keyspaces are compared with that name swapped in A's values, everything else as
    usual."""
    qs = {q: echomq.Queue(q, url=nserver.url) for q in (QA, QB)}
    try:
        for q, queue in qs.items():
            queue.enable_events(100)
            kids = [FlowJob(p, id=jid(401 + n), queue=q + "P") for n, p in enumerate("cde")]
            queue.add_flow(FlowJob("root", id=jid(400), children=kids))
        pair = Pair(r, QA + "P", QB + "P")
        check_swapped(pair)
        claimed = {}
        for q in (QA, QB):
            child = echomq.Queue(q + "P", url=nserver.url)
            claimed[q] = [claim_one(child) for _ in range(3)]
            child.close()
        ja = claimed[QA]
        assert [j.id for j in ja] == [j.id for j in claimed[QB]]
        assert run_swapped(pair, "complete", ja[0].id, [str(ja[0].token), "res"]) == ("ok", 1)
        got = run_swapped(pair, "retry", ja[1].id, [str(ja[1].token), "0", "1", "err"])
        assert got == ("ok", b"dead")
        time.sleep(0.02)
        for q in (QA, QB):  # the third child stalls to death: a fail entry too
            r.zadd(base(q + "P") + "active", {ja[2].id: 1})
        keys, args = ["@active", "@dead"], ["@", "1", "100"]
        ra = call_script(r, "sweep_stalled", expand(keys, pair.a), expand_args(args, pair.a))
        rb = call_native(r, "sweep_stalled", expand(keys, pair.b), expand_args(args, pair.b))
        assert ra == rb == ("ok", [[], [ja[2].id.encode()]])
        check_swapped(pair)
        assert r.llen(base(QB + "P") + "flow:outbox") == 3
    finally:
        for queue in qs.values():
            queue.close()


def claim_one(q: echomq.Queue) -> echomq.Job:
    job = q.claim()
    assert job is not None
    return job


def _swap(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.replace(QA.encode(), QB.encode())
    if isinstance(value, dict):
        return {_swap(k): _swap(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_swap(v) for v in value)
    if isinstance(value, set):
        return {_swap(v) for v in value}
    return value


def check_swapped(pair: Pair) -> None:
    sa = {name: _swap(v) for name, v in snapshot(pair.r, pair.a).items()}
    sb = snapshot(pair.r, pair.b)
    settle_clock(sa, sb)
    d = diff(sa, sb)
    assert not d, "\n".join(d[:20])


def run_swapped(pair: Pair, script: str, id: str, rest: list[str]) -> Reply:
    """One call on both queues, then the keyspaces compared with the parent queue swapped."""
    if script == "complete":
        keys = ["@active", "@job:" + id]
    else:
        keys = ["@active", "@schedule", "@dead", "@job:" + id]
    args: list[str | bytes] = ["@", id, *rest]
    ra = call_script(pair.r, script, expand(keys, pair.a), expand_args(args, pair.a))
    rb = call_native(pair.r, script, expand(keys, pair.b), expand_args(args, pair.b))
    assert ra == rb
    check_swapped(pair)
    return ra


@pytest.mark.parametrize("events", [False, True])
def test_sweep(pair: Pair, both: Both, r: redis.Redis, events: bool) -> None:
    if events:
        both(lambda q: q.enable_events(100))
    for n in range(1, 5):
        enq(pair, jid(n), group="g" if n % 2 == 0 else "")
    both(lambda q: q.limit_lane("g", 1))
    assert sweep(pair, 2) == ("ok", [[], []])  # nothing active: a no-op
    both(lambda q: q.claim_batch(3, lease_ms=1))
    lapse()
    got = sweep(pair, 2, 2)  # limit 2: the rest waits for the next call
    assert len(got[1][0]) == 2 and got[1][1] == []
    got = sweep(pair, 2)
    assert len(got[1][0]) == 1
    # Again: each is at max_stalled now, dead with last_error "stalled".
    both(lambda q: q.claim_batch(4, lease_ms=1))
    lapse()
    got = sweep(pair, 2)
    assert got[0] == "ok" and len(got[1][1]) >= 1
    # A lane job's slot is freed and the lane re-enters the ring.
    assert r.hget(base(QB) + "gactive", "g") is None
    # A planted non-integer stall count restarts at 1; a planted non-hash row is dropped.
    enq(pair, jid(9))
    j9 = both(lambda q: q.claim(lease_ms=1))
    for q in (QA, QB):
        r.hset(base(q) + "job:" + j9.id, "stalled", "x")
        r.zadd(base(q) + "active", {"ghost": 1})
        r.set(base(q) + "job:ghost", "x")
    lapse()
    sweep(pair, 3)


def test_sweep_waiter_on_stall_death(pair: Pair, both: Both, r: redis.Redis) -> None:
    both(lambda q: q.enable_events(100))
    enq(pair, jid(1))
    enq(pair, jid(2))
    both(lambda q: q.claim_batch(2, lease_ms=1))
    want(r, jid(1))
    lapse()
    assert sweep(pair, 1) == ("ok", [[], [jid(1).encode(), jid(2).encode()]])
    assert r.hget(base(QB) + "result:" + jid(1), "error") == b"stalled"
    assert 0 < r.pttl(base(QB) + "result:" + jid(1)) <= 60000
    assert not r.exists(base(QB) + "result:" + jid(2))


@pytest.mark.parametrize("nlanes", [3, 7, 13, 40])
def test_sweep_ring_order_is_the_order_first_met(
    pair: Pair, both: Both, r: redis.Redis, nlanes: int
) -> None:
    """The lanes a sweep syncs re-enter the ring in the order the sweep first met them
    (common.lua's ordered tally, cmd_sweep_stalled.c's twin). It walked pairs() once: an order that
    follows the server Lua's string hash, which Valkey 8 changed from Redis 7's, so no
    module could mirror both. The ring ends identical on both executors and is that order."""
    lanes = [f"lane{n}" for n in range(nlanes)] + ["x", "queue-with-a-long-lane-name-" * 2]
    n = 0
    for g in lanes:
        both(lambda q, g=g: q.limit_lane(g, 1))
        for _ in range(2):
            n += 1
            enq(pair, jid(n), group=g)
    enq(pair, jid(999))  # the flat set too: key '*'
    lane_of: dict[str, str] = {}
    while len(lane_of) < len(lanes) + 1:
        j = both(lambda q: q.claim(lease_ms=1))
        if j is None:
            break
        lane_of[j.id] = j.group or "*"
    # Every lane is at its limit and out of the ring; the flat job is active.
    lapse()
    got = sweep(pair, 5)
    assert got[0] == "ok" and len(got[1][0]) == len(lane_of)
    # The sweep's reply lists the recovered jobs in the order it met them.
    first_met = list(dict.fromkeys(lane_of[i.decode()] for i in got[1][0]))
    for q in (QA, QB):
        raw: list[bytes] = r.lrange(base(q) + "ring", 0, -1)  # type: ignore[assignment]
        assert [k.decode() for k in raw] == first_met, q
