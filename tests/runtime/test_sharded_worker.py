"""A worker on a sharded queue (issue 43, decision 10): started on ``orders`` it serves every
shard of it — the stored list read at start and again on the beat (growth without a
restart) — with one pump a shard sharing the worker's slots, so an empty or busy shard never
parks the worker while another has work, and when slots are scarce the pumps take turns.

The layout is stored through the base queue (``propose_shards``) and jobs are placed on the
shards directly: each shard is an ordinary queue.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest
import worker_support

from conftest import wait_for
from echomq import App, ShardsError, Worker, current_job
from echomq.client.shards import grow, layout
from echomq.protocol.kernel import Keys
from echomq.runtime.queueloop import QueueLoop
from echomq.runtime.shardset import ShardSet, kick_order, logical_of, take_turn

make_app = worker_support.make_app
run_worker = worker_support.run_worker


def store(app: App, name: str, names: list[str]) -> list[str]:
    """Store a shard list on the base queue (the ``shards`` verb); the stored list."""
    stored: list[str] = app.queue(name).propose_shards(names)
    assert stored == names
    return stored


def place(app: App, task: Any, shard: str, ns: range) -> list[str]:
    """Enqueue ``task(n)`` for each n straight onto one shard; the job ids."""
    q = app.queue(shard)
    return [q.enqueue(task.payload((n,), {})).id for n in ns]


def completed(app: App, shards: list[str]) -> list[int]:
    return [app.queue(s).counts()["completed"] for s in shards]


def test_a_worker_on_the_logical_queue_drains_every_shard(make_app, run_worker, qname) -> None:
    app = make_app()
    ran: list[tuple[str, str, int]] = []

    @app.task(queue=qname, name="job", lease_ms=7_000)
    def job(n: int) -> int:
        ctx = current_job()
        assert ctx is not None
        ran.append((ctx.queue, ctx.id, n))
        return n

    shards = store(app, qname, layout(qname, 3))
    placed = {s: place(app, job, s, range(i * 10, i * 10 + 10)) for i, s in enumerate(shards)}
    w = run_worker(app, concurrency=4)
    wait_for(lambda: completed(app, shards) == [10, 10, 10])
    stats = w.stop()
    assert (stats.claimed, stats.completed, stats.lost, stats.dead) == (30, 30, 0, 0)
    # Each run's context names the shard its job lives in (its by-id verbs go there).
    assert sorted(ran) == sorted(
        (s, id_, i * 10 + k) for i, s in enumerate(shards) for k, id_ in enumerate(placed[s])
    )
    # One loop a shard, each knowing its logical queue and claiming with its task's lease.
    loops = w.worker._loops
    assert [ql.keys.name for ql in loops] == shards
    assert {(ql.logical, ql.lease_ms) for ql in loops} == {(qname, 7_000)}
    for s in shards:
        assert app.queue(s).check() == []


def test_a_plain_queue_is_served_as_before(make_app, run_worker, qname) -> None:
    app = make_app()

    @app.task(queue=qname, name="job")
    def job(n: int) -> None:
        pass

    place(app, job, qname, range(5))
    w = run_worker(app)
    wait_for(lambda: completed(app, [qname]) == [5])
    w.stop()
    assert [ql.keys.name for ql in w.worker._loops] == [qname]
    assert app.queue(qname).shards() == [qname]


def test_growth_is_served_without_a_restart(make_app, run_worker, qname, caplog) -> None:
    caplog.set_level(logging.INFO, "echomq.worker")
    app = make_app()

    @app.task(queue=qname, name="job")
    async def job(n: int) -> None:
        pass

    w = run_worker(app, concurrency=2)
    place(app, job, qname, range(3))
    wait_for(lambda: completed(app, [qname]) == [3])
    shards = store(app, qname, layout(qname, 2))  # nothing stored: one shard -> two
    place(app, job, shards[1], range(3, 8))
    wait_for(lambda: completed(app, shards) == [3, 5])
    more = store(app, qname, grow(qname, shards, 4))
    for i, s in enumerate(more[2:]):
        place(app, job, s, range(100 * (i + 1), 100 * (i + 1) + 4))
    wait_for(lambda: completed(app, more) == [3, 5, 4, 4])
    stats = w.stop()
    assert stats.completed == 16 and stats.lost == 0
    assert [ql.keys.name for ql in w.worker._loops] == more
    for shard in more[1:]:  # each new shard is logged once, when its loop starts
        assert caplog.text.count(f"queue {qname}: serving its shard {shard}") == 1


def test_a_busy_or_empty_shard_never_parks_the_worker(make_app, run_worker, qname) -> None:
    """Shard 0 holds one slot with a run that does not end until the test says so, shard 1
    is empty: shard 2's backlog is drained through the other slot meanwhile."""
    app = make_app()
    release = threading.Event()

    @app.task(queue=qname, name="job")
    def job(n: int) -> None:
        if n < 0:
            assert release.wait(120)

    shards = store(app, qname, layout(qname, 3))
    place(app, job, shards[0], range(-1, 0))
    w = run_worker(app, concurrency=2)
    wait_for(lambda: app.queue(shards[0]).counts()["active"] == 1)
    place(app, job, shards[2], range(40))
    wait_for(lambda: completed(app, shards) == [0, 0, 40])
    assert app.queue(shards[0]).counts()["active"] == 1  # still held: it never blocked shard 2
    release.set()
    wait_for(lambda: completed(app, shards) == [1, 0, 40])
    w.stop()


def test_scarce_slots_take_turns_across_shards(make_app, run_worker, qname) -> None:
    """Three shards with a backlog each and a worker with two slots: every shard makes
    progress while the others still have work (no pump holds the slots for its shard)."""
    app = make_app()

    @app.task(queue=qname, name="job")
    async def job(n: int) -> None:
        await asyncio.sleep(0)

    shards = store(app, qname, layout(qname, 3))
    for i, s in enumerate(shards):
        place(app, job, s, range(i * 1000, i * 1000 + 60))
    w = run_worker(app, concurrency=2)
    wait_for(lambda: min(completed(app, shards)) >= 10)
    w.stop()
    done = completed(app, shards)
    # Starved, one shard would get nothing until another drained its 60.
    assert max(done) < 60, done
    wait_for(lambda: all(app.queue(s).counts()["active"] == 0 for s in shards))


def test_shard_names_and_kick_order() -> None:
    assert logical_of("orders") == "orders"
    for name in layout("orders", 5):
        assert logical_of(name) == "orders"
    assert logical_of("a.shard3.77.shard1.2") == "a.shard3.77"
    assert logical_of("orders.shard0.1") == "orders.shard0.1"  # shard 0 is the base name
    assert logical_of("orders.shard2.") == "orders.shard2."
    loops = [QueueLoop(Keys(n), 1000) for n in ("a", "b", "c")]
    sset = ShardSet(["a"])
    orders = [[q.keys.name for q in kick_order(loops, sset)] for _ in range(3)]
    assert sorted(o[0] for o in orders) == ["a", "b", "c"]  # each pump is kicked first in turn
    assert all(sorted(o) == ["a", "b", "c"] for o in orders)  # and every pump every time
    assert kick_order(loops[:1], sset) == loops[:1]
    # A free slot goes to the pump that has waited longest; the others defer to it.
    a, b, c = loops
    assert not take_turn(a, loops, 0) and not take_turn(b, loops, 0)  # both starved: a first
    assert a.starved and b.starved > a.starved
    assert not take_turn(c, loops, 1) and a.kick.is_set()  # c defers to a, kicked
    assert not take_turn(b, loops, 1)  # b too: a waited longer
    assert take_turn(a, loops, 1) and not a.starved
    assert take_turn(b, loops, 1) and not b.starved  # then b
    assert take_turn(c, loops, 1)  # nobody waits: c takes
    b.starved = 99
    b.idle.set()  # a parked pump does not ask: nobody defers to it
    assert take_turn(c, loops, 1)


def test_testing_drain_waits_for_every_shard(make_app, qname) -> None:
    from echomq.testing import drain

    app = make_app()

    @app.task(queue=qname, name="job")
    def job(n: int) -> None:
        pass

    shards = store(app, qname, layout(qname, 3))
    for i, s in enumerate(shards):
        place(app, job, s, range(i * 10, i * 10 + 5 * (i + 1)))
    done = drain(app, timeout_s=60)
    assert done.completed == 5 + 10 + 15 and done.dead == 0
    assert completed(app, shards) == [5, 10, 15]
    assert set(done.counts) == set(shards)


def test_a_task_rate_limit_on_a_sharded_queue_is_refused(make_app, qname, r) -> None:
    """A task's ``rate_limit=`` is set by the worker on its queue at start, which on a
    sharded queue is shard 0 alone (the other shards would run unlimited): refused when the
    app says the queue is sharded (at the decorator), and at worker start when the queue is
    sharded on the server only; nothing is set on any shard."""
    sharded = make_app(shards={qname: 3})
    with pytest.raises(ShardsError, match="rate_limit_lane"):
        sharded.task(queue=qname, name="limited", rate_limit=(5, 1000))(lambda: None)
    assert "limited" not in sharded.tasks

    app = make_app()
    app.task(queue=qname, name="limited", rate_limit=(5, 1000))(lambda: None)
    names = store(app, qname, layout(qname, 3))
    clients = r.info("clients")["connected_clients"]
    w = worker_support.InProcWorker(Worker(app, beat_ms=100))
    w.thread.join(30)
    assert not w.thread.is_alive()
    w.loop.close()
    assert isinstance(w.error, ShardsError) and "task 'limited'" in str(w.error), w.error
    # A refused start closes what it opened (no connection left for the GC to find).
    wait_for(lambda: r.info("clients")["connected_clients"] == clients)
    for name in names:
        assert app.queue(name).rate_limit_ttl() == 0
        assert r.hget(f"emq:{{{name}}}:meta", "rate_max") is None
