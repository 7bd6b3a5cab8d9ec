"""Flows (D18), same-queue trees, on the wire: parents wait in no set, children's
completions fan in atomically, the failure policies, the reads, cleanup, and bad input."""

from __future__ import annotations

from typing import Any

import pytest
import redis

import echomq
from conftest import snapshot, wait_for
from echomq import ids
from echomq.protocol.compose import MAX_FLOW_DEPTH, FlowAdded, FlowJob


def _base(q: Any) -> str:
    return f"emq:{{{q.name}}}:"


def _in_sets(r: redis.Redis, q: Any, jid: str) -> list[str]:
    b = _base(q)
    return [
        s for s in ("pending", "active", "schedule", "dead") if r.zscore(b + s, jid) is not None
    ]


def _run_all(q: Any, results: dict[str, bytes] | None = None) -> list[str]:
    """Claim and complete every runnable job, one at a time; the ids in run order."""
    order = []
    while (job := q.claim(lease_ms=10_000)) is not None:
        order.append(job.id)
        q.complete(job.id, job.token, result=(results or {}).get(job.id, b"r-" + job.payload))
    return order


def test_one_level_flow_fans_in(anyq: Any, r: redis.Redis) -> None:
    added = anyq.add_flow(FlowJob(b"parent", children=[FlowJob(b"a"), FlowJob(b"b")]))
    assert isinstance(added, FlowAdded) and len(added.child_ids) == 2
    pid, (a, b) = added.parent_id, added.child_ids
    base = _base(anyq)
    assert r.hget(base + "job:" + pid, "state") == b"awaiting_children"
    assert _in_sets(r, anyq, pid) == []  # a held parent is in no set
    assert anyq.job_state(pid) == "awaiting_children"
    assert anyq.dependencies(pid) == 2
    assert r.hmget(base + "job:" + a, "parent", "parent_policy") == [pid.encode(), b"fp"]
    assert anyq.check() == []
    job = anyq.claim(lease_ms=10_000)
    assert job is not None and job.id == a  # children first, in order
    anyq.complete(a, job.token, result=b"ra")
    assert anyq.children_values(pid) == {a: b"ra"}
    assert anyq.dependencies(pid) == 1
    assert r.hget(base + "job:" + pid, "state") == b"awaiting_children"
    job = anyq.claim(lease_ms=10_000)
    assert job is not None and job.id == b
    anyq.complete(b, job.token, result=b"rb")
    assert anyq.dependencies(pid) == 0
    assert _in_sets(r, anyq, pid) == ["pending"]
    assert anyq.check() == []
    job = anyq.claim(lease_ms=10_000)
    assert job is not None and job.id == pid and job.payload == b"parent"
    assert anyq.children_values(pid) == {a: b"ra", b: b"rb"}
    anyq.complete(pid, job.token)
    # The parent's completion removes its flow keys with its row.
    assert list(r.scan_iter(match=base + "job:*")) == []
    assert anyq.check() == []


def test_nested_tree_runs_bottom_up_through_batch_settles(q: echomq.Queue, r: redis.Redis) -> None:
    tree = FlowJob(
        b"root",
        group="g1",
        children=[
            FlowJob(b"mid1", children=[FlowJob(b"leaf1"), FlowJob(b"leaf2", group="g2")]),
            FlowJob(b"mid2", children=[FlowJob(b"leaf3")]),
            FlowJob(b"leaf4"),
        ],
    )
    added = q.add_flow(tree)
    assert len(added.child_ids) == 3
    assert q.check() == []
    order: list[bytes] = []
    while True:
        jobs = q.claim_batch(10, lease_ms=10_000)
        if not jobs:
            break
        order += [j.payload for j in jobs]
        # The worker's path: complete_many (the batch settle, no result values).
        assert q.complete_many([(j.id, j.token) for j in jobs]) == []
        assert q.check() == []
    assert sorted(order[:4]) == [b"leaf1", b"leaf2", b"leaf3", b"leaf4"]
    assert sorted(order[4:6]) == [b"mid1", b"mid2"]
    assert order[6:] == [b"root"]
    assert list(r.scan_iter(match=_base(q) + "job:*")) == []


def test_fail_parent_kills_the_parent_and_up_the_tree(q: echomq.Queue, r: redis.Redis) -> None:
    mid = FlowJob(b"mid", children=[FlowJob(b"bad"), FlowJob(b"ok")])
    added = q.add_flow(FlowJob(b"root", children=[mid, FlowJob(b"other")]))
    root = added.parent_id
    mid_id = added.child_ids[0]
    base = _base(q)
    bad_id = next(
        jid for jid in q.browse("pending", n=10) if r.hget(base + "job:" + jid, "payload") == b"bad"
    )
    # Claim until we hold "bad", then kill it at its attempt ceiling.
    while True:
        job = q.claim(lease_ms=10_000)
        assert job is not None
        if job.id == bad_id:
            break
        q.complete(job.id, job.token)
    assert q.retry(bad_id, job.token, delay_ms=0, max_attempts=1, error="boom") == "dead"
    assert r.hget(base + "job:" + mid_id + ":failed", bad_id) == b"boom"
    assert r.hmget(base + "job:" + mid_id, "state", "last_error") == [
        b"dead",
        f"child {bad_id} failed".encode(),
    ]
    assert _in_sets(r, q, mid_id) == ["dead"]
    # The root is a parent of mid: it dies too, never runnable.
    assert r.hget(base + "job:" + root, "state") == b"dead"
    assert _in_sets(r, q, root) == ["dead"]
    _run_all(q)
    assert r.hget(base + "job:" + root, "state") == b"dead"
    assert q.check() == []


def test_ignored_failure_is_recorded_and_counts_as_settled(q: echomq.Queue, r: redis.Redis) -> None:
    added = q.add_flow(
        FlowJob(b"p", children=[FlowJob(b"flaky", fail_parent=False), FlowJob(b"fine")])
    )
    pid, (flaky, fine) = added.parent_id, added.child_ids
    job = q.claim(lease_ms=10_000)
    assert job is not None and job.id == flaky
    assert q.retry(flaky, job.token, delay_ms=0, max_attempts=1, error="nope") == "dead"
    assert q.ignored_failures(pid) == {flaky: "nope"}
    assert q.dependencies(pid) == 1
    job = q.claim(lease_ms=10_000)
    assert job is not None and job.id == fine
    q.complete(fine, job.token, result=b"1")
    assert q.job_state(pid) == "pending"
    assert q.children_values(pid) == {fine: b"1"}
    assert q.check() == []


def test_a_stalled_child_at_the_ceiling_fails_its_parent(q: echomq.Queue, r: redis.Redis) -> None:
    added = q.add_flow(FlowJob(b"p", children=[FlowJob(b"c")]))
    job = q.claim(lease_ms=10_000)
    assert job is not None
    base = _base(q)
    r.zadd(base + "active", {job.id: 1})  # its lease lapsed long ago
    _, dead = q.sweep_stalled(max_stalled=1)
    assert dead == [job.id]
    assert r.hget(base + "job:" + added.parent_id, "state") == b"dead"
    assert r.hget(base + "job:" + added.parent_id + ":failed", job.id) == b"stalled"
    assert q.check() == []


def test_remove_cleans_a_parents_flow_keys(q: echomq.Queue, r: redis.Redis) -> None:
    added = q.add_flow(FlowJob(b"p", children=[FlowJob(b"c")]))
    job = q.claim(lease_ms=10_000)
    assert job is not None
    q.complete(job.id, job.token, result=b"x")
    q.remove(added.parent_id)
    assert list(r.scan_iter(match=_base(q) + "job:*")) == []


def _chain(depth: int) -> FlowJob:
    node = FlowJob(b"leaf")
    for _ in range(depth - 1):
        node = FlowJob(b"n", children=[node])
    return node


def test_depth_cycles_and_bad_input_write_nothing(q: echomq.Queue, r: redis.Redis) -> None:
    q.add_flow(_chain(MAX_FLOW_DEPTH))  # depth 8 is allowed
    assert len(r.keys(_base(q) + "job:*:deps")) == MAX_FLOW_DEPTH - 1
    r.delete(*r.keys(_base(q) + "*"))
    before = snapshot(r, q.name)
    jid = ids.mint()
    bad = [
        _chain(MAX_FLOW_DEPTH + 1),
        FlowJob(b"p", id=jid, children=[FlowJob(b"c", id=jid)]),  # a cycle
        FlowJob(b"p", children=[b"not a FlowJob"]),  # type: ignore[list-item]
        FlowJob(b"p", children="abc"),  # type: ignore[arg-type]
        FlowJob(b"p", children=5),  # type: ignore[arg-type]
        FlowJob(123),  # type: ignore[arg-type]
        FlowJob(b"p", group="bad lane"),
        FlowJob(b"p", id="nope"),
    ]
    for flow in bad:
        with pytest.raises((echomq.InvalidArgument, echomq.InvalidId)):
            q.add_flow(flow)
    with pytest.raises(echomq.InvalidArgument):
        q.add_flow("not a flow")  # type: ignore[arg-type]
    # Refused by the script, still nothing written: a foreign-namespace id, an existing id.
    with pytest.raises(echomq.KindError):
        q.add_flow(FlowJob(b"p", children=[FlowJob(b"c", id=ids.mint("ORD"))]))
    assert snapshot(r, q.name) == before
    taken = q.enqueue(b"x").id
    before = snapshot(r, q.name)
    with pytest.raises(echomq.StateError):
        q.add_flow(FlowJob(b"p", children=[FlowJob(b"c", id=taken)]))
    assert snapshot(r, q.name) == before


# --------------------------------------------------------------------------- app layer


def test_app_flow_runs_parent_after_children_with_their_values(url: str, qname: str) -> None:
    import asyncio
    import threading

    app = echomq.App(url=url)
    got: dict[str, Any] = {}

    @app.task(queue=qname, keep_result_ms=60_000)
    def square(x: int) -> int:
        return x * x

    @app.task(queue=qname)
    async def total(label: str) -> None:
        ctx = echomq.current_job()
        assert ctx is not None
        got[label] = sorted((await ctx.achildren_values()).values())
        got["sync"] = sorted(ctx.children_values().values())

    added = app.flow(total.s("sum"), children=[square.s(2), square.s(3), square.s(4)])
    assert len(added.child_ids) == 3
    q = app.queue(qname)
    assert q.job_state(added.parent_id) == "awaiting_children"
    worker = echomq.Worker(app, queues=[qname], beat_ms=50)
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=lambda: loop.run_until_complete(worker.arun()), daemon=True)
    t.start()
    try:
        wait_for(lambda: "sum" in got, timeout=60)
    finally:
        loop.call_soon_threadsafe(worker.stop)
        t.join(60)
        loop.run_until_complete(app.aclose())  # the handler's async client, on its loop
        loop.close()
    assert got == {"sum": [4, 9, 16], "sync": [4, 9, 16]}
    wait_for(lambda: q.job_state(added.parent_id) == "absent", timeout=60)
    assert q.check() == []
    with pytest.raises(echomq.InvalidArgument):
        app.flow(total.s("x"), children=["not a signature"])  # type: ignore[list-item]
    app.close()


# --------------------------------------------------------------------------- cross-queue


@pytest.fixture
def q2(url: str, qname: str, r: redis.Redis) -> Any:
    other = echomq.Queue(qname + "-b", url=url)
    yield other
    for key in r.scan_iter(match=f"emq:{{{other.name}}}:*"):
        r.delete(key)
    other.close()


def _outbox(r: redis.Redis, q: Any) -> list[bytes]:
    return list(r.lrange(_base(q) + "flow:outbox", 0, -1))


def test_cross_queue_child_goes_through_the_outbox(
    q: echomq.Queue, q2: echomq.Queue, r: redis.Redis
) -> None:
    added = q.add_flow(FlowJob(b"p", children=[FlowJob(b"far", queue=q2.name), FlowJob(b"near")]))
    pid, (far, near) = added.parent_id, added.child_ids
    assert r.hmget(_base(q2) + "job:" + far, "parent", "parent_queue") == [
        pid.encode(),
        q.name.encode(),
    ]
    assert r.hget(_base(q) + "job:" + near, "parent_queue") is None
    job = q2.claim(lease_ms=10_000)
    assert job is not None and job.id == far
    q2.complete(far, job.token, result=b"v\x00with nul")
    # Settled on its own queue: the parent is untouched until the pump delivers.
    # The parent field carries the flow's mark after a ':' (the row field `flow`, PROTOCOL §5.3).
    mark = r.hget(_base(q) + "job:" + pid, "flow").decode()
    entry = f"{q.name}\0{pid}:{mark}\0{far}\0".encode() + b"v\x00with nul"
    assert _outbox(r, q2) == [entry]
    assert q.dependencies(pid) == 2 and q.children_values(pid) == {}
    assert q.pump() == 0  # the parent's queue has nothing to deliver
    assert q2.pump() == 1
    assert _outbox(r, q2) == []
    assert q.children_values(pid) == {far: b"v\x00with nul"}
    assert q.dependencies(pid) == 1
    job = q.claim(lease_ms=10_000)
    assert job is not None and job.id == near
    q.complete(near, job.token, result=b"n")
    assert q.job_state(pid) == "pending"
    assert q.check() == [] and q2.check() == []


@pytest.mark.parametrize("fail_parent", [True, False])
def test_cross_queue_death_is_delivered_by_policy(
    q: echomq.Queue, q2: echomq.Queue, r: redis.Redis, fail_parent: bool
) -> None:
    added = q.add_flow(
        FlowJob(b"p", children=[FlowJob(b"far", queue=q2.name, fail_parent=fail_parent)])
    )
    pid, far = added.parent_id, added.child_ids[0]
    job = q2.claim(lease_ms=10_000)
    assert job is not None
    assert q2.retry(far, job.token, delay_ms=0, max_attempts=1, error="bad") == "dead"
    policy = "fp" if fail_parent else "id"
    mark = r.hget(_base(q) + "job:" + pid, "flow").decode()
    want = f"\0fail\0{q.name}\0{pid}:{mark}\0{far}\0{policy}\0bad"
    assert _outbox(r, q2) == [want.encode()]
    assert q2.pump() == 1 and _outbox(r, q2) == []
    if fail_parent:
        assert q.job_state(pid) == "dead"
        assert r.hget(_base(q) + "job:" + pid + ":failed", far) == b"bad"
    else:
        assert q.ignored_failures(pid) == {far: "bad"}
        assert q.job_state(pid) == "pending"
    assert q.check() == [] and q2.check() == []


def test_delivering_twice_applies_once(q: echomq.Queue, q2: echomq.Queue, r: redis.Redis) -> None:
    """Two pumps that read the same outbox head (or a pump that crashed before its trim)
    deliver the same entries again: HSETNX makes that a no-op, and the trim removes only
    entries still at the head."""
    from echomq.protocol import compose as _compose

    added = q.add_flow(
        FlowJob(b"p", children=[FlowJob(b"a", queue=q2.name), FlowJob(b"b", queue=q2.name)])
    )
    for _ in range(2):
        job = q2.claim(lease_ms=10_000)
        assert job is not None
        q2.complete(job.id, job.token, result=b"r")
    q2.enqueue(b"unrelated")
    entries = _outbox(r, q2)
    assert len(entries) == 2
    first = q2._x.run(_compose.deliver(q2._k, entries[:1]))
    assert first == 1 and q.dependencies(added.parent_id) == 1
    # A second pump that read both entries before the first trimmed.
    assert q2._x.run(_compose.deliver(q2._k, entries)) == 2
    assert _outbox(r, q2) == []
    assert q.dependencies(added.parent_id) == 0
    assert q.job_state(added.parent_id) == "pending"
    assert len(q.children_values(added.parent_id)) == 2


def test_a_malformed_outbox_entry_blocks_and_stays(
    q: echomq.Queue, q2: echomq.Queue, r: redis.Redis
) -> None:
    added = q.add_flow(FlowJob(b"p", children=[FlowJob(b"far", queue=q2.name)]))
    r.rpush(_base(q2) + "flow:outbox", b"garbage")
    job = q2.claim(lease_ms=10_000)
    assert job is not None
    q2.complete(job.id, job.token)
    assert q2.pump() == 0
    assert len(_outbox(r, q2)) == 2 and q.dependencies(added.parent_id) == 1


def test_cross_queue_add_refused_part_way_leaves_the_parent_held(
    q: echomq.Queue, q2: echomq.Queue, r: redis.Redis
) -> None:
    taken = q2.enqueue(b"x").id
    pid = ids.mint()
    with pytest.raises(echomq.StateError):
        q.add_flow(FlowJob(b"p", id=pid, children=[FlowJob(b"c", id=taken, queue=q2.name)]))
    assert q.job_state(pid) == "awaiting_children"  # held, in no set: never claimable
    assert q.claim(lease_ms=1000) is None
    assert q.check() == []


def test_workers_pump_a_cross_queue_tree(url: str, qname: str) -> None:
    import asyncio
    import threading

    app = echomq.App(url=url)
    got: list[Any] = []

    @app.task(queue=qname + "-leaf", keep_result_ms=60_000)
    def leaf(x: int) -> int:
        return x + 1

    @app.task(queue=qname + "-mid", keep_result_ms=60_000)
    def mid() -> int:
        ctx = echomq.current_job()
        assert ctx is not None
        return sum(ctx.children_values().values())

    @app.task(queue=qname)
    def root() -> None:
        ctx = echomq.current_job()
        assert ctx is not None
        got.append(sorted(ctx.children_values().values()))

    app.flow(
        root.s(),
        children=[
            app.flow_job(mid.s(), children=[leaf.s(1), leaf.s(2)]),
            app.flow_job(mid.s(), children=[leaf.s(10)]),
        ],
    )
    worker = echomq.Worker(app, beat_ms=50)
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=lambda: loop.run_until_complete(worker.arun()), daemon=True)
    t.start()
    try:
        wait_for(lambda: bool(got), timeout=60)
    finally:
        loop.call_soon_threadsafe(worker.stop)
        t.join(60)
        loop.run_until_complete(app.aclose())
        loop.close()
    assert got == [[5, 11]]
    for name in (qname, qname + "-mid", qname + "-leaf"):
        assert app.queue(name).check() == []
    app.close()
