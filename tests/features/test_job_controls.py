"""Issue 24, points 5 and 6: per-job attempt budgets, expiry (``ttl_ms``) and the small
controls (run_now, reschedule, update_payload, cancel_all, repeat limits, remove with
children, flow wait), each on a real server and, where a native twin runs, on both legs.

Repeat limits and app flow waits are in test_job_controls_repeat_flow.py.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
import redis
from job_controls_support import (
    _fire_now,
    _p,
)

import echomq
from conftest import snapshot


def _row(r: redis.Redis, queue: str, jid: str) -> dict[bytes, bytes]:
    return r.hgetall(_p(queue) + "job:" + jid)  # type: ignore[return-value]


@pytest.mark.executors
def test_expired_job_is_dead_lettered_by_the_claim_that_meets_it(
    q: echomq.Queue, r: redis.Redis
) -> None:
    old = q.enqueue(b"old", ttl_ms=1)
    fresh = q.enqueue(b"fresh", ttl_ms=3_600_000)
    plain = q.enqueue(b"plain")
    row = _row(r, q.name, old.id)
    assert int(row[b"expires"]) > 0
    time.sleep(0.01)
    job = q.claim()
    # The expired job was never leased; the claim went on to the next one.
    assert job is not None and job.id == fresh.id and job.token == 1
    dead = _row(r, q.name, old.id)
    assert dead[b"state"] == b"dead" and dead[b"last_error"] == b"expired"
    assert dead[b"attempts"] == b"0"
    assert (r.zscore(_p(q.name) + "dead", old.id) or 0) > 0  # its time of death (D25)
    # The ttl bounds the wait before the first claim only: a leased job carries no deadline.
    assert b"expires" not in _row(r, q.name, fresh.id)
    assert b"expires" not in _row(r, q.name, plain.id)
    assert q.counts()["failed"] == 1
    assert q.check() == []


@pytest.mark.executors
def test_expiry_in_claim_batch_and_lanes(q: echomq.Queue, r: redis.Redis) -> None:
    a = q.enqueue(b"a", group="t1", ttl_ms=1)
    b = q.enqueue(b"b", group="t1")
    c = q.enqueue_many([b"c1", b"c2"], ttl_ms=1)
    d = q.enqueue(b"d")
    time.sleep(0.01)
    got = q.claim_batch(10)
    assert sorted(j.id for j in got) == sorted([b.id, d.id])
    for e in (a, *c):
        assert isinstance(e, echomq.Enqueued)
        assert _row(r, q.name, e.id)[b"last_error"] == b"expired"
    assert q.job_state(a.id) == "dead"
    assert r.hget(_p(q.name) + "gactive", "t1") == b"1"  # only b holds the lane's slot
    assert q.check() == []


@pytest.mark.executors
def test_expired_job_in_settle_claim_part(q: echomq.Queue, r: redis.Redis) -> None:
    first = q.enqueue(b"1")
    gone = q.enqueue(b"2", ttl_ms=1)
    nxt = q.enqueue(b"3")
    job = q.claim()
    assert job is not None and job.id == first.id
    time.sleep(0.01)
    out = q.settle(completed=[(job.id, job.token)], n=5)
    assert [j.id for j in out.jobs] == [nxt.id]
    assert q.job_state(gone.id) == "dead"


@pytest.mark.executors
def test_reprocess_of_an_expired_job_starts_without_the_deadline(
    q: echomq.Queue, r: redis.Redis
) -> None:
    e = q.enqueue(b"x", ttl_ms=1)
    time.sleep(0.01)
    assert q.claim() is None
    q.reprocess(e.id)
    assert b"expires" not in _row(r, q.name, e.id)
    job = q.claim()
    assert job is not None and job.id == e.id


def test_expiry_releases_dedup_and_wakes_a_waiter(q: echomq.Queue, r: redis.Redis) -> None:
    e = q.enqueue(b"x", ttl_ms=1, dedup="k")
    r.set(_p(q.name) + "want:" + e.id, "1", px=30_000)
    time.sleep(0.01)
    assert q.claim() is None
    assert not r.exists(_p(q.name) + "de:k")
    with pytest.raises(echomq.JobFailed, match="expired"):
        q.wait(e.id, timeout_s=1)


def test_a_delayed_job_with_a_ttl_expires_from_its_enqueue(q: echomq.Queue, r: redis.Redis) -> None:
    # The deadline is counted from the enqueue, not from the run time.
    e = q.enqueue(b"x", delay_ms=20, ttl_ms=5)
    time.sleep(0.03)
    q.promote()
    assert q.claim() is None
    assert q.job_state(e.id) == "dead"


@pytest.mark.parametrize("ttl", [0, -1, 1.5, True, "10"])
def test_bad_ttl_is_refused_and_writes_nothing(q: echomq.Queue, r: redis.Redis, ttl: Any) -> None:
    before = snapshot(r, q.name)
    with pytest.raises(echomq.InvalidArgument, match="ttl_ms"):
        q.enqueue(b"x", ttl_ms=ttl)
    with pytest.raises(echomq.InvalidArgument, match="ttl_ms"):
        q.enqueue_many([b"x"], ttl_ms=ttl)
    assert snapshot(r, q.name) == before


async def test_async_ttl(aq: echomq.AsyncQueue, r: redis.Redis) -> None:
    e = await aq.enqueue(b"x", ttl_ms=1)
    f = await aq.enqueue_many([b"y"], ttl_ms=1)
    assert isinstance(f[0], echomq.Enqueued)
    time.sleep(0.01)
    assert await aq.claim() is None
    assert await aq.job_state(e.id) == "dead"
    assert await aq.job_state(f[0].id) == "dead"


def _app(url: str) -> echomq.App:
    return echomq.App(url=url)


def test_options_max_attempts_overrides_the_tasks_budget(url: str, qname: str) -> None:
    from echomq.backoff import fixed
    from echomq.testing import drain

    app = _app(url)
    runs: list[str] = []

    @app.task(queue=qname, name="flaky", max_attempts=5, backoff=fixed(0))
    def flaky(tag: str) -> None:
        runs.append(tag)
        raise ValueError(tag)

    try:
        one = flaky.options(max_attempts=2).enqueue("one")
        plain = flaky.enqueue("plain")
        many = flaky.enqueue_many([(("m",), {})], max_attempts=1)
        drain(app, timeout_s=20, beat_ms=20)
        q = app.queue(qname)
        assert runs.count("one") == 2 and runs.count("plain") == 5 and runs.count("m") == 1
        assert q.get_job(one.id)["attempts"] == "2"  # type: ignore[index]
        assert q.get_job(plain.id)["attempts"] == "5"  # type: ignore[index]
        assert isinstance(many[0], echomq.Enqueued)
        assert q.job_state(many[0].id) == "dead"
        # Reprocess restarts the budget (floor = attempts): two more runs, not zero, not five.
        q.reprocess(one.id)
        drain(app, timeout_s=20, beat_ms=20)
        assert runs.count("one") == 4
        assert q.get_job(one.id)["attempts"] == "4"  # type: ignore[index]
    finally:
        app.close()


def test_task_options_ttl_expires(url: str, qname: str, r: redis.Redis) -> None:
    app = _app(url)

    @app.task(queue=qname, name="t")
    def t() -> None:
        return None

    try:
        e = t.options(ttl_ms=1).enqueue()
        f = t.enqueue_many([((), {})], ttl_ms=1)
        time.sleep(0.01)
        q = app.queue(qname)
        assert q.claim() is None
        assert q.job_state(e.id) == "dead"
        assert isinstance(f[0], echomq.Enqueued) and q.job_state(f[0].id) == "dead"
    finally:
        app.close()


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3", 2**53])
def test_bad_max_attempts_is_refused(url: str, qname: str, r: redis.Redis, bad: Any) -> None:
    app = _app(url)

    @app.task(queue=qname, name="t")
    def t() -> None:
        return None

    try:
        before = snapshot(r, qname)
        with pytest.raises(echomq.InvalidArgument, match="max_attempts"):
            t.options(max_attempts=bad)
        with pytest.raises(echomq.InvalidArgument, match="max_attempts"):
            t.enqueue_many([((), {})], max_attempts=bad)
        with pytest.raises(echomq.InvalidArgument, match="ttl_ms"):
            t.options(ttl_ms=0)
        assert snapshot(r, qname) == before
    finally:
        app.close()


def test_envelope_carries_the_budget_and_old_readers_agree() -> None:
    from echomq.protocol import envelope as _envelope
    from echomq.serializers import JSON

    s = JSON()
    raw = _envelope.encode(s, "t", (1,), {}, {"max_attempts": 3})
    assert _envelope.parse(s, raw) == ("t", [1], {})
    assert _envelope.parse_full(s, raw)[3] == {"max_attempts": 3}
    assert _envelope.attempt_budget({"max_attempts": 0}) == 0
    assert _envelope.attempt_budget({"max_attempts": "3"}) == 0
    assert _envelope.parse_full(s, _envelope.encode(s, "t", (1,)))[3] == {}


def test_reschedule_moves_a_scheduled_jobs_run_time(anyq: Any, r: redis.Redis) -> None:
    e = anyq.enqueue(b"x", delay_ms=3_600_000, ttl_ms=7_200_000)
    expires = _row(r, anyq.name, e.id)[b"expires"]
    now_ms = int(r.time()[0]) * 1000
    assert anyq.reschedule(e.id, 60_000) is None
    score = r.zscore(_p(anyq.name) + "schedule", e.id)
    assert score is not None and now_ms + 55_000 < score < now_ms + 70_000
    anyq.reschedule(e.id, at_ms=123)
    assert r.zscore(_p(anyq.name) + "schedule", e.id) == 123
    assert _row(r, anyq.name, e.id)[b"expires"] == expires  # the ttl counts from the enqueue
    assert anyq.promote() == 1
    assert anyq.claim().id == e.id
    assert anyq.check() == []


def test_reschedule_refusals_write_nothing(anyq: Any, r: redis.Redis) -> None:
    waiting = anyq.enqueue(b"w").id
    active = anyq.enqueue(b"a").id
    assert anyq.claim().id == waiting
    before = snapshot(r, anyq.name)
    for jid in (waiting, active):
        with pytest.raises(echomq.StateError):
            anyq.reschedule(jid, 10)
    with pytest.raises(echomq.JobGone):
        anyq.reschedule(echomq.ids.mint(), 10)
    with pytest.raises(echomq.InvalidArgument):
        anyq.reschedule(active)
    with pytest.raises(echomq.InvalidArgument):
        anyq.reschedule(active, 10, at_ms=10)
    with pytest.raises(echomq.InvalidArgument):
        anyq.reschedule(active, -1)
    assert snapshot(r, anyq.name) == before


def test_update_payload_of_waiting_and_scheduled_jobs(anyq: Any, r: redis.Redis) -> None:
    w = anyq.enqueue(b"old", group="g1")
    s = anyq.enqueue(b"old", delay_ms=3_600_000)
    anyq.update_payload(w.id, b"new\x00")
    anyq.update_payload(s.id, "text")
    assert _row(r, anyq.name, s.id)[b"payload"] == b"text"
    job = anyq.claim()
    assert job.id == w.id and job.payload == b"new\x00"
    assert anyq.check() == []


def test_update_payload_refusals_write_nothing(anyq: Any, r: redis.Redis) -> None:
    a = anyq.enqueue(b"a").id
    assert anyq.claim().id == a
    d = anyq.enqueue(b"d").id
    job = anyq.claim()
    anyq.retry(job.id, job.token, delay_ms=0, max_attempts=1, error="x")
    before = snapshot(r, anyq.name)
    for jid in (a, d):
        with pytest.raises(echomq.StateError):
            anyq.update_payload(jid, b"x")
    with pytest.raises(echomq.JobGone):
        anyq.update_payload(echomq.ids.mint(), b"x")
    with pytest.raises(echomq.PayloadTooLarge):
        anyq.update_payload(a, b"x" * (16 * 1024 * 1024 + 1))
    assert snapshot(r, anyq.name) == before


def test_update_payload_ends_a_reaped_lease(q: echomq.Queue, r: redis.Redis) -> None:
    e = q.enqueue(b"old")
    job = q.claim(lease_ms=1)
    assert job is not None
    time.sleep(0.01)
    assert q.reap() == 1
    q.update_payload(e.id, b"new")
    with pytest.raises(echomq.StaleToken):
        q.complete(job.id, job.token)  # its holder ran the old payload
    again = q.claim()
    assert again is not None and again.payload == b"new"


def test_cancel_all_removes_waiting_and_signals_active(anyq: Any, r: redis.Redis) -> None:
    from echomq.protocol import control as _control

    dead = anyq.enqueue(b"x").id
    d = anyq.claim()
    anyq.retry(d.id, d.token, delay_ms=0, max_attempts=1, error="boom")
    held = anyq.enqueue(b"held").id
    job = anyq.claim()
    assert job.id == held
    flat = [anyq.enqueue(b"f%d" % i).id for i in range(5)]
    lane = [anyq.enqueue(b"l", group=f"g{i}").id for i in range(3)]
    later = anyq.enqueue(b"s", delay_ms=3_600_000, dedup="d1").id
    r.set(_p(anyq.name) + "want:" + flat[0], "1", px=30_000)
    # A small budget: the client loops the bounded calls to the end.
    if isinstance(anyq, echomq.Queue):
        got = anyq._x.run(_control.cancel_all(anyq._k, budget=2))
    else:
        got = anyq.cancel_all()
    assert got == {"removed": 9, "signalled": 1}
    for jid in (*flat, *lane, later):
        assert anyq.job_state(jid) == "absent"
    assert anyq.job_state(dead) == "dead"
    assert r.hget(_p(anyq.name) + "job:" + held, "cancel") == b"1"
    assert not r.exists(_p(anyq.name) + "de:d1")
    assert r.hget(_p(anyq.name) + "result:" + flat[0], "error") == b"cancelled"
    assert anyq.lanes() == []
    assert anyq.check() == []
    # Again: nothing waits, the active job's flag is already set.
    assert anyq.cancel_all() == {"removed": 0, "signalled": 0}


def test_remove_a_flow_parent_takes_its_waiting_descendants(anyq: Any, r: redis.Redis) -> None:
    from echomq import FlowJob

    tree = FlowJob(
        b"root",
        children=[
            FlowJob(b"mid", children=[FlowJob(b"leaf1"), FlowJob(b"leaf2", group="g2")]),
            FlowJob(b"runs"),
            FlowJob(b"dies"),
        ],
    )
    added = anyq.add_flow(tree)
    mid, runs, dies = added.child_ids
    leaves = [j for j in anyq.browse("pending", 10) if j not in (runs, dies)]
    leaves += anyq.browse("pending", 10, group="g2")
    assert len(leaves) == 2
    # Hold 'runs' and 'dies' (the leaves go back to waiting); kill 'dies'.
    held = {}
    for job in anyq.claim_batch(10):
        if job.id in (runs, dies):
            held[job.id] = job
        else:
            anyq.delay(job.id, job.token, 0)
    assert len(held) == 2
    d = held[dies]
    anyq.retry(d.id, d.token, delay_ms=0, max_attempts=1, error="x")
    assert anyq.job_state(added.parent_id) == "dead"  # a fail_parent child killed the root
    anyq.remove(added.parent_id)
    for jid in (added.parent_id, mid, *leaves):
        assert anyq.job_state(jid) == "absent"
    assert anyq.job_state(runs) == "active"  # runs on; its settle records nothing
    assert anyq.job_state(dies) == "dead"
    anyq.complete(runs, held[runs].token)
    assert anyq.check() == []


def test_remove_children_false_keeps_them(anyq: Any, r: redis.Redis) -> None:
    from echomq import FlowJob

    added = anyq.add_flow(FlowJob(b"root", children=[FlowJob(b"a"), FlowJob(b"b")]))
    anyq.remove(added.parent_id, children=False)
    assert anyq.job_state(added.parent_id) == "absent"
    for kid in added.child_ids:
        assert anyq.job_state(kid) == "pending"
    with pytest.raises(echomq.InvalidArgument):
        anyq.remove(added.child_ids[0], children=1)
    assert anyq.check() == []


def test_cli_reschedule_cancel_all_and_remove(url: str, q: echomq.Queue, r: redis.Redis) -> None:
    from click.testing import CliRunner

    from echomq.cli import main

    def cli(*args: str) -> Any:
        return CliRunner().invoke(main, ["--url", url, *args])

    later = q.enqueue(b"x", delay_ms=3_600_000).id
    waiting = q.enqueue(b"w").id
    out = cli("reschedule", q.name, later, "--at-ms", "5")
    assert out.exit_code == 0 and out.output == f"{later}: rescheduled\n"
    assert r.zscore(_p(q.name) + "schedule", later) == 5
    out = cli("reschedule", q.name, waiting, "--delay-ms", "5")
    assert out.exit_code == 1 and "not scheduled" in out.output
    out = cli("cancel-all", q.name)
    assert out.exit_code == 0 and out.output == "removed 2, signalled 0\n"
    added = q.add_flow(echomq.FlowJob(b"p", children=[echomq.FlowJob(b"c")]))
    out = cli("remove", q.name, added.parent_id, "--keep-children")
    assert out.exit_code == 0 and q.job_state(added.child_ids[0]) == "pending"


def test_cli_repeats_shows_a_spent_repeat(url: str, q: echomq.Queue, r: redis.Redis) -> None:
    from click.testing import CliRunner

    from echomq.cli import main

    q.repeat("once", b"x", every_ms=60_000, limit=1)
    q.repeat("plain", b"x", every_ms=60_000)
    assert _fire_now(q, r, "once") == 1
    out = CliRunner().invoke(main, ["--url", url, "repeats", q.name])
    assert out.exit_code == 0, out.output
    lines = dict(line.split(" ", 1) for line in out.output.splitlines())
    # issue 26: the last fire (UTC) follows a repeat that fired
    head, last = lines["once"].split(" last=")
    assert head == "ended every 60000 ms limit=1 fired=1"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", last), last
    assert lines["plain"].endswith(" every 60000 ms")
    assert "limit" not in lines["plain"]


@pytest.mark.executors
def test_a_priority_and_a_ttl_land_together(q: echomq.Queue, r: redis.Redis) -> None:
    both = q.enqueue(b"both", priority=5, ttl_ms=3_600_000)
    ttl_only = q.enqueue(b"ttl", ttl_ms=3_600_000)  # ARGV[14] sent as 0: no priority field
    many = q.enqueue_many([b"m1", b"m2"], priority=3, ttl_ms=3_600_000)
    row = _row(r, q.name, both.id)
    assert row[b"priority"] == b"5" and int(row[b"expires"]) > 0
    assert b"priority" not in _row(r, q.name, ttl_only.id)
    for e in many:
        assert isinstance(e, echomq.Enqueued)
        got = _row(r, q.name, e.id)
        assert got[b"priority"] == b"3" and int(got[b"expires"]) > 0
        assert r.zscore(_p(q.name) + "pending", e.id) == 3
    claimed = [j.id for j in q.claim_batch(10)]
    assert claimed == [
        ttl_only.id,
        *(e.id for e in many if isinstance(e, echomq.Enqueued)),
        both.id,
    ]
    assert q.check() == []


@pytest.mark.executors
def test_an_expired_prioritized_job_is_skipped_in_priority_order(
    q: echomq.Queue, r: redis.Redis
) -> None:
    late = q.enqueue(b"late", priority=9)
    gone = q.enqueue(b"gone", priority=1, ttl_ms=1)
    first = q.enqueue(b"first", priority=2)
    time.sleep(0.01)
    assert [j.id for j in q.claim_batch(2)] == [first.id, late.id]
    assert _row(r, q.name, gone.id)[b"last_error"] == b"expired"
    q.reprocess(gone.id, delay_ms=3_600_000)  # kept history's delayed reprocess
    row = _row(r, q.name, gone.id)
    assert row[b"state"] == b"scheduled" and b"expires" not in row
    assert row[b"priority"] == b"1"


@pytest.mark.executors
def test_expiry_trims_a_bounded_dead_set(q: echomq.Queue, r: redis.Redis) -> None:
    q.keep_dead(1)
    doomed = [q.enqueue(b"x%d" % i, ttl_ms=1).id for i in range(3)]
    live = q.enqueue(b"live")
    time.sleep(0.01)
    job = q.claim()
    assert job is not None and job.id == live.id
    # The claim dead-lettered all three at one time of death and trimmed dead to its bound:
    # ties go by id, the lowest first.
    assert r.zrange(_p(q.name) + "dead", 0, -1) == [doomed[-1].encode()]
    for jid in doomed[:-1]:
        assert not r.exists(_p(q.name) + "job:" + jid)
    assert q.check() == []
