"""Regression tests of the hardening round (issue 10) on the Lua scripts and the protocol
core: each reproduces a finding against a real server and fails on the code before its fix.

- 1: a stale token settled a re-admitted job (ABA on attempts);
- 3: drain held the server over every lane in one call;
- 5: enqueue wrote past maxmemory under noeviction;
- 10: enqueue_many answered ``enqueued`` for an id's dropped second payload;
- 11: ``branded()`` compared ids with the locale's collation;
- 12: reprocess kept the stall count;
- 13: lane transitions scanned the ring (LPOS/LREM);
- 14: a replayed at_ms enqueue in the past said ``scheduled``; remove left a ghost behind.

The id, retired-record and maxmemory regressions are in test_script_regressions_ids.py.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from script_regressions_support import (
    K,
    sound,
)

import echomq
from echomq import Enqueued, JobGone, StaleToken, ids
from echomq.protocol import calls as _protocol
from echomq.protocol.kernel import Replay


def test_a_stale_token_never_settles_a_readmitted_job(q: echomq.Queue, r: redis.Redis) -> None:
    jid = ids.mint()
    q.enqueue(b"v1", id=jid)
    a = q.claim()
    assert a is not None and a.token == 1
    q.remove(jid)
    assert q.enqueue(b"v2", id=jid) == Enqueued(jid, "enqueued")
    b = q.claim()
    assert b is not None and b.payload == b"v2"
    # The new incarnation continues the count: (jid, 1) is never handed out twice.
    assert b.token == 2
    with pytest.raises(StaleToken):
        q.complete(jid, a.token)
    q.complete(jid, b.token)
    assert q.counts()["completed"] == 1
    sound(r, q)


def test_an_old_retry_never_dead_letters_a_readmitted_job(q: echomq.Queue, r: redis.Redis) -> None:
    jid = ids.mint()
    q.enqueue(b"v1", id=jid)
    a = q.claim(lease_ms=30)
    assert a is not None
    time.sleep(0.06)
    assert q.reap() == 1
    c = q.claim()
    assert c is not None and c.token == 2
    q.complete(jid, c.token)
    q.enqueue(b"v2", id=jid)
    d = q.claim()
    assert d is not None and d.token == 3
    with pytest.raises(StaleToken):
        q.retry(jid, a.token, delay_ms=0, max_attempts=1, error="old")
    assert q.job_state(jid) == "active" and q.counts()["dead"] == 0
    q.complete(jid, d.token)
    sound(r, q)


def test_a_readmitted_job_keeps_its_full_retry_budget(q: echomq.Queue, r: redis.Redis) -> None:
    jid = ids.mint()
    q.enqueue(b"v1", id=jid)
    for _ in range(2):
        job = q.claim()
        assert job is not None
        verdict = q.retry(jid, job.token, delay_ms=0, max_attempts=2, error="e")
        q.promote()
    assert verdict == "dead"
    q.remove(jid)
    q.enqueue(b"v2", id=jid)
    assert q.get_job(jid)["floor"] == "2"  # type: ignore[index]
    job = q.claim()
    assert job is not None and job.token == 3
    # The claim reports the floor, so a worker counts this incarnation's attempt as the
    # ceiling does (its backoff, its "dead or retried" prediction, current_job().attempt).
    assert (job.floor, job.attempt) == (2, 1)
    # 3 attempts in all, but the first of this incarnation: max_attempts=2 is not reached.
    assert q.retry(jid, job.token, delay_ms=0, max_attempts=2, error="e") == "scheduled"
    sound(r, q)


def test_every_row_deletion_records_the_last_token(q: echomq.Queue, r: redis.Redis) -> None:
    done, gone, drained = ids.mint(), ids.mint(), ids.mint()
    for jid in (done, gone, drained):
        q.enqueue(b"x", id=jid)
    for _ in range(3):
        job = q.claim()
        assert job is not None
        if job.id == drained:
            q.delay(job.id, job.token, 0)  # back to pending with attempts 1
        elif job.id == done:
            q.complete(job.id, job.token)
    q.remove(gone)
    assert q.drain() == 1
    retired = {k.decode(): v for k, v in r.hgetall(K(q.name, "retired")).items()}
    assert retired == {done: b"1", gone: b"1", drained: b"1"}
    assert not r.exists(K(q.name, "retired:old"))
    # A never-claimed id is recorded with 0 (issue 28: a resend of its enqueue must find it,
    # include/admit.lua "the id is the marker"), and 0 carries no token over.
    fresh = q.enqueue(b"y").id
    q.remove(fresh)
    assert r.hget(K(q.name, "retired"), fresh) == b"0"
    q.enqueue(b"y again", id=fresh)
    job = q.claim()
    assert job is not None and job.id == fresh and job.token == 1
    q.complete(job.id, job.token)
    # Re-admission consumes the record.
    q.enqueue(b"z", id=done)
    assert r.hexists(K(q.name, "retired"), done) is False
    sound(r, q)
    q.pause()
    q.obliterate(force=True)
    assert list(r.scan_iter(match=f"emq:{{{q.name}}}:*")) == []


def test_drain_visits_a_bounded_number_of_lanes_per_call(q: echomq.Queue, r: redis.Redis) -> None:
    n = 450
    for i in range(n):
        q.enqueue(b"x", group=f"L{i}")
    q.enqueue_many([b"f"] * 5)
    plan = _protocol.drain(q._k, budget=1000)
    calls, total, reply = 0, 0, None
    try:
        call = next(plan)
        while True:
            calls += 1
            reply = q._x.call(call)  # type: ignore[arg-type]
            call = plan.send(reply)
    except StopIteration as stop:
        total = stop.value
    assert total == n + 5
    # One SSCAN page (about 100 lanes) per call: the lanes took several calls, not one.
    assert calls >= n // 150
    assert q.lanes() == [] and q.counts()["pending"] == 0
    sound(r, q)


def test_reprocess_restarts_the_stall_count(q: echomq.Queue, r: redis.Redis) -> None:
    jid = q.enqueue(b"x").id
    for _ in range(2):
        assert q.claim(lease_ms=20) is not None
        time.sleep(0.05)
        q.sweep_stalled(max_stalled=2)
    assert q.job_state(jid) == "dead"
    q.reprocess(jid)
    assert "stalled" not in q.get_job(jid)  # type: ignore[operator]
    assert q.claim(lease_ms=20) is not None
    time.sleep(0.05)
    recovered, dead = q.sweep_stalled(max_stalled=2)
    assert (recovered, dead) == ([jid], [])
    sound(r, q)


def test_lane_transitions_never_scan_the_ring(q: echomq.Queue, r: redis.Redis) -> None:
    lanes = 300
    for i in range(lanes):
        q.enqueue(b"x", group=f"L{i:03}")
        q.enqueue(b"y", group=f"L{i:03}")
    q.limit_lane("L000", 1)
    jobs = q.claim_batch(2 * lanes)
    assert len(jobs) == 2 * lanes - 1
    r.config_resetstat()
    for job in jobs:  # each lane empties (or frees a slot) in turn: joins and leaves
        q.complete(job.id, job.token)
    stats = r.info("commandstats")
    assert "cmdstat_lpos" not in stats and "cmdstat_lrem" not in stats, sorted(stats)
    sound(r, q)
    job = q.claim()
    assert job is not None and job.group == "L000"
    q.complete(job.id, job.token)
    assert r.exists(K(q.name, "ring"), K(q.name, "inring"), K(q.name, "ringstale")) == 0
    sound(r, q)


def test_check_reports_a_ring_that_disagrees_with_its_sets(q: echomq.Queue, r: redis.Redis) -> None:
    q.enqueue(b"x", group="A")
    r.sadd(K(q.name, "inring"), "B")
    r.sadd(K(q.name, "ringstale"), "A")
    found = q.check()
    assert any("inring holds B" in v for v in found), found
    assert any("both live and stale" in v for v in found), found


def _replay_enqueue(q: echomq.Queue, **kw: Any) -> Enqueued:
    """Drive an enqueue plan as the executor does when the first reply is lost: the first
    copy lands, its reply is dropped, the same call is resent."""
    plan = _protocol.enqueue(q._k, b"x", replay_ms=60_000, **kw)
    call = next(plan)
    q._x.call(call)  # landed; reply lost
    call = plan.throw(Replay(ConnectionError("lost")))
    try:
        plan.send(q._x.call(call))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    raise AssertionError("the plan did not finish")


def test_a_replayed_enqueue_reports_what_the_first_copy_did(q: echomq.Queue) -> None:
    past = _replay_enqueue(q, at_ms=1_000)
    assert past.status == "enqueued" and q.job_state(past.id) == "pending"
    later = _replay_enqueue(q, at_ms=int(time.time() * 1000) + 600_000)
    assert later.status == "scheduled" and q.job_state(later.id) == "scheduled"
    now = _replay_enqueue(q)
    assert now.status == "enqueued"


def test_remove_of_a_ghost_takes_it_out_of_its_set(q: echomq.Queue, r: redis.Redis) -> None:
    ghosts = {}
    for place in ("pending", "schedule", "dead", "active"):
        ghosts[place] = ids.mint()
        r.zadd(K(q.name, place), {ghosts[place]: 0})
    for place, jid in ghosts.items():
        with pytest.raises(JobGone):
            q.remove(jid)
        assert r.zscore(K(q.name, place), jid) is None, place
    sound(r, q)


def _drive(q: echomq.Queue, plan: Any) -> tuple[Any, list[int]]:
    """Run a plan step by step; returns its result and the size of each step (calls)."""
    steps: list[int] = []
    try:
        step = next(plan)
        while True:
            calls = step if isinstance(step, list) else [step]
            steps.append(len(calls))
            replies = q._x.pipeline(calls)
            step = plan.send(replies if isinstance(step, list) else replies[0])
    except StopIteration as stop:
        return stop.value, steps


def _plant(q: echomq.Queue, r: redis.Redis) -> set[str]:
    """Violations of every kind the per-id, per-lane and aggregate passes see."""
    ghost, orphan, twice = ids.mint(), ids.mint(), ids.mint()
    r.zadd(K(q.name, "schedule"), {ghost: 5})
    r.hset(K(q.name, "job:" + orphan), mapping={"state": "dead", "attempts": "1"})
    q.enqueue(b"t", id=twice)
    r.zadd(K(q.name, "dead"), {twice: 0})
    r.sadd(K(q.name, "lanes"), "nolane")
    r.hset(K(q.name, "gactive"), "L7", 3)
    return {ghost, orphan, twice, "nolane", "gactive L7"}


def test_check_works_in_bounded_slices_with_the_same_verdict(
    q: echomq.Queue, r: redis.Redis
) -> None:
    for i in range(40):
        q.enqueue_many([b"a", b"b"], group=f"L{i}")
    q.enqueue_many([b"f"] * 60)
    q.claim_batch(30)
    assert _drive(q, _protocol.check(q._k, window=7))[0] == []
    planted = _plant(q, r)
    whole, steps_whole = _drive(q, _protocol.check(q._k, window=100_000))
    sliced, steps_sliced = _drive(q, _protocol.check(q._k, window=7))
    assert sorted(whole) == sorted(sliced)
    for thing in planted:
        assert any(thing in line for line in sliced), (thing, sliced)
    # Each call reads at most `window` members of a set (or SCAN COUNT keys): a 60-job set in
    # windows of 7 takes 9 rounds.
    assert len(steps_sliced) >= 9 > len(steps_whole)


def test_check_on_a_live_queue_reports_no_torn_transition(url: str, q: echomq.Queue) -> None:
    import threading

    stop = threading.Event()

    def churn() -> None:
        p = echomq.Queue(q.name, url=url)
        n = 0
        while not stop.is_set():
            n += 1
            p.enqueue_many([b"x"] * 3, group=f"L{n % 7}")
            p.enqueue(b"y")
            for job in p.claim_batch(3, lease_ms=60_000):
                p.complete(job.id, job.token)
            job = p.claim(lease_ms=60_000)
            if job is not None:
                p.retry(job.id, job.token, delay_ms=0, max_attempts=3, error="e")
            p.promote()
        p.close()

    t = threading.Thread(target=churn)
    t.start()
    try:
        for _ in range(15):
            assert _drive(q, _protocol.check(q._k, window=3))[0] == []
    finally:
        stop.set()
        t.join()
    assert q.check() == []


def test_reprocess_all_counts_each_job_once_while_workers_rekill(
    url: str, q: echomq.Queue, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from echomq.cli import main

    dead = []
    for _ in range(3):
        jid = q.enqueue(b"x").id
        job = q.claim()
        assert job is not None
        q.retry(jid, job.token, delay_ms=0, max_attempts=1, error="boom")
        dead.append(jid)
    real = echomq.Queue.reprocess
    killed: set[str] = set()

    def reprocess_then_rekill(self: echomq.Queue, id: str, **options: Any) -> None:
        real(self, id, **options)
        if id not in killed:  # a worker claims it at once and it dies again
            killed.add(id)
            job = self.claim()
            assert job is not None and job.id == id
            self.retry(id, job.token, delay_ms=0, max_attempts=1, error="again")

    monkeypatch.setattr(echomq.Queue, "reprocess", reprocess_then_rekill)
    out = CliRunner().invoke(main, ["--url", url, "reprocess", q.name, "--all"])
    assert out.exit_code == 0, out.output
    assert "reprocessed 3 job(s)" in out.output
    assert sorted(q.browse("dead", 10)) == sorted(dead)  # each re-killed once, not retried


def test_scheduled_is_the_state_name_and_schedule_an_alias(url: str, q: echomq.Queue) -> None:
    from click.testing import CliRunner

    from echomq.cli import main

    later = q.enqueue(b"x", delay_ms=60_000).id
    assert q.job_state(later) == "scheduled"
    assert q.browse("scheduled") == [later]
    with pytest.warns(DeprecationWarning, match="pass state='scheduled'"):
        assert q.browse("schedule") == [later]  # the set's name: a deprecated alias
    assert "scheduled" in _protocol.STATES
    for name in ("scheduled", "schedule"):
        out = CliRunner().invoke(main, ["--url", url, "browse", q.name, "--state", name, "--ids"])
        assert out.exit_code == 0 and out.output.split() == [later], out.output
    with pytest.raises(echomq.InvalidArgument, match="scheduled"):
        q.browse("later")


def test_a_ring_written_before_its_sets_is_adopted(q: echomq.Queue, r: redis.Redis) -> None:
    """A queue written by the scripts before inring existed: its ring LIST has entries and no
    SETs. The next transition adopts them, so no lane gets a second entry."""
    for g in ("A", "B"):
        q.enqueue(b"x", group=g)
    r.delete(K(q.name, "inring"), K(q.name, "ringstale"))
    q.enqueue(b"y", group="A")
    q.enqueue(b"z", group="C")
    assert [x.decode() for x in r.lrange(K(q.name, "ring"), 0, -1)] == ["A", "B", "C"]
    sound(r, q)
    served = [job.group for job in q.claim_batch(4)]
    assert sorted(served) == ["A", "A", "B", "C"]
    sound(r, q)
