"""What a worker and an app do with their inputs: unknown tasks, undecodable payloads,
wrong arguments, enqueue options, serializers and the checks on task and worker
arguments.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis
import worker_support
from worker_support import (
    dead_with,
    row,
)

import echomq
from conftest import wait_for
from echomq import App, InvalidArgument, Worker, current_job

# Shared fixtures (bound here so pytest finds them in this module).
make_app = worker_support.make_app
run_worker = worker_support.run_worker


def test_unknown_task_is_dead_with_a_clear_error(make_app, run_worker, qname) -> None:
    app = make_app()

    @app.task(queue=qname, name="known")
    def known() -> None:
        pass

    q = app.queue(qname)
    e = q.enqueue(b'{"task":"nope","args":[],"kwargs":{}}')
    ok = known.enqueue()
    w = run_worker(app)
    err = dead_with(app, qname, e.id)
    assert "unknown task 'nope'" in err and "no handler" in err
    assert row(app, qname, e.id)["attempts"] == "1"  # never retried
    wait_for(lambda: q.job_state(ok.id) == "absent")
    stats = w.stop()
    assert (stats.dead, stats.completed) == (1, 1)
    assert q.check() == []


@pytest.mark.parametrize(
    "payload",
    [
        b"\xff\xfe not json",
        b"[1, 2]",
        b'{"args": [], "kwargs": {}}',
        b'{"task": "known", "args": 5}',
        b'{"task": "known", "args": [], "kwargs": [1]}',
    ],
    ids=["bytes", "list", "no-task", "bad-args", "bad-kwargs"],
)
def test_undecodable_payload_is_dead(make_app, run_worker, qname, payload) -> None:
    app = make_app()
    runs: list[int] = []

    @app.task(queue=qname, name="known")
    def known() -> None:
        runs.append(1)

    e = app.queue(qname).enqueue(payload)
    run_worker(app)
    err = dead_with(app, qname, e.id)
    assert err.startswith("undecodable payload"), err
    assert runs == []


def test_task_name_not_a_string_is_unknown(make_app, run_worker, qname) -> None:
    app = make_app()

    @app.task(queue=qname, name="known")
    def known() -> None:
        pass

    e = app.queue(qname).enqueue(b'{"task": 5, "args": [], "kwargs": {}}')
    run_worker(app)
    assert "unknown task 5" in dead_with(app, qname, e.id)


def test_wrong_arguments_are_dead_at_once(make_app, run_worker, qname) -> None:
    app = make_app()

    @app.task(queue=qname, name="one", max_attempts=5)
    def one(x: int) -> None:
        pass

    e = app.queue(qname).enqueue(b'{"task": "one", "args": [1, 2], "kwargs": {}}')
    run_worker(app)
    assert dead_with(app, qname, e.id).startswith("BadArguments: task 'one': too many")
    assert row(app, qname, e.id)["attempts"] == "1"  # never retried: it cannot ever bind


def test_options_delay_group_and_id(make_app, run_worker, qname, r: redis.Redis) -> None:
    app = make_app()
    seen: list[tuple[Any, float]] = []

    @app.task(queue=qname, name="opt")
    def opt(x: int) -> None:
        seen.append((current_job(), time.time()))

    job_id = echomq.ids.mint()
    t0 = time.time()
    e = opt.options(delay_ms=400, group="acme", id=job_id).enqueue(7)
    assert (e.id, e.status) == (job_id, "scheduled")
    again = opt.options(id=job_id).enqueue(7)
    assert (again.id, again.status) == (job_id, "duplicate")
    q = app.queue(qname)
    assert q.job_state(job_id) == "scheduled"
    stored = row(app, qname, job_id)
    assert stored["group"] == "acme"
    assert app.serializer.loads(stored["payload"]) == ["opt", [7]]
    run_worker(app)
    wait_for(lambda: q.counts()["completed"] == 1)
    [(ctx, started)] = seen
    assert started - t0 >= 0.399
    assert (ctx.id, ctx.group, ctx.queue, ctx.task) == (job_id, "acme", qname, "opt")


def test_options_at_ms_and_plain_group(make_app, run_worker, qname, r: redis.Redis) -> None:
    app = make_app()
    seen: list[Any] = []

    @app.task(queue=qname, name="opt")
    def opt() -> None:
        seen.append(current_job())

    sec, usec = r.time()
    at = int(sec) * 1000 + int(usec) // 1000 + 300
    e1 = opt.options(at_ms=at).enqueue()
    e2 = opt.options(group="g2").enqueue()
    assert e1.status == "scheduled" and e2.status == "enqueued"
    q = app.queue(qname)
    assert q.lane_depth("g2") == 1
    run_worker(app)
    wait_for(lambda: q.counts()["completed"] == 2)
    assert {(c.id, c.group) for c in seen} == {(e1.id, None), (e2.id, "g2")}


def test_enqueue_many_and_aenqueue(make_app, run_worker, qname) -> None:
    app = make_app()
    got: list[int] = []

    @app.task(queue=qname, name="add")
    async def add(a: int, b: int = 0) -> None:
        got.append(a + b)

    receipts = add.enqueue_many([((1,), {}), ((2,), {"b": 3})], group="lane1")
    assert [x.status for x in receipts] == ["enqueued", "enqueued"]

    async def produce() -> echomq.Enqueued:
        try:
            return await add.options(group="lane2").aenqueue(10, b=1)
        finally:
            await app.aclose()

    e = asyncio.run(produce())
    assert e.status == "enqueued"
    run_worker(app)
    q = app.queue(qname)
    wait_for(lambda: q.counts()["completed"] == 3)
    assert sorted(got) == [1, 5, 11]


def test_msgpack_app_round_trips_bytes(make_app, run_worker, qname) -> None:
    app = make_app(serializer="msgpack")
    got: list[Any] = []

    @app.task(queue=qname, name="bin")
    def bin_(data: bytes, n: int) -> None:
        got.append((data, n))

    e = bin_.enqueue(b"\x00\xffraw", n=3)
    stored = row(app, qname, e.id)["payload"]
    assert isinstance(stored, bytes) and stored[:1] != b"{"  # not JSON on the wire
    run_worker(app)
    wait_for(lambda: got)
    assert got == [(b"\x00\xffraw", 3)]


def test_task_and_worker_arguments_are_checked(make_app, qname) -> None:
    app = make_app()

    @app.task(queue=qname, name="t")
    def t() -> None:
        pass

    with pytest.raises(InvalidArgument):
        app.task(name="t")(lambda: None)  # the name is taken
    for bad in ({"max_attempts": 0}, {"lease_ms": 50}, {"timeout": -1}, {"max_attempts": True}):
        with pytest.raises(InvalidArgument):
            app.task(queue=qname, name=f"bad{bad}", **bad)(lambda: None)
    with pytest.raises(echomq.InvalidId):
        app.task(queue="no spaces", name="bad-queue")(lambda: None)
    with pytest.raises(InvalidArgument):
        app.task(queue=qname, name="bad-backoff", backoff="soon")(lambda: None)
    for bad_kw in ({"concurrency": 0}, {"beat_ms": 1}, {"max_stalled": -1}):
        with pytest.raises(InvalidArgument):
            Worker(app, **bad_kw)
    with pytest.raises(InvalidArgument, match="no queues"):
        Worker(App(url=app.url))
    assert repr(t) == f"<Task t queue={qname}>"
    assert t.name == "t" and t.max_attempts == 3 and t.lease_ms == 30_000


def test_default_task_name_is_module_qualname(make_app) -> None:
    app = make_app()

    @app.task
    def plain() -> None:
        pass

    assert plain.name == f"{__name__}.test_default_task_name_is_module_qualname.<locals>.plain"
    assert plain.queue == "default"
    assert app.tasks[plain.name] is plain


def test_url_cannot_change_after_first_use(make_app, qname) -> None:
    app = make_app()
    app.queue(qname)
    with pytest.raises(echomq.EchoMQError):
        app.url = "redis://127.0.0.1:1/0"


def test_an_unsettleable_settle_does_not_block_the_batch(make_app, qname) -> None:
    """A settle the protocol refuses before any I/O (a token or id no claim can produce, e.g.
    from a planted row) is dropped on its own; the rest of its batch still goes out."""
    from echomq.protocol.kernel import Keys
    from echomq.runtime.queueloop import QueueLoop
    from echomq.runtime.runner import Settle as _Settle

    app = make_app()
    app.task(queue=qname, name="t")(lambda: None)
    ql = QueueLoop(Keys(qname), 30_000)
    good = [
        _Settle(echomq.ids.mint(), 1, "completed"),
        _Settle(echomq.ids.mint(), 2, "retried", 10, 3, "e"),
    ]
    bad = [_Settle(echomq.ids.mint(), 0, "completed"), _Settle("not-an-id", 1, "dead", 0, 1, "x")]
    assert ql.valid(good) == good
    assert ql.valid([bad[0], good[0], bad[1], good[1]]) == good
