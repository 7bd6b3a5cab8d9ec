"""Issue 13 controls: kept results and waiting (D17), dedup keys (D20) and cooperative cancel
(D22), each checked on the wire (the keys, their TTLs and the rows) on a real server.

The queue rate limit tests are in test_queue_rate_limit.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis
from results_dedup_cancel_support import (
    _p,
)

import echomq
from conftest import blocked_clients, snapshot, wait_for
from echomq.protocol import control as _ctl
from echomq.protocol.kernel import Call, Keys


def test_complete_keeps_result_with_ttl(anyq: Any, r: redis.Redis) -> None:
    e = anyq.enqueue(b"x")
    job = anyq.claim()
    anyq.complete(job.id, job.token, result=b"\x00answer", keep_result_ms=60_000)
    rk = _p(anyq.name) + "result:" + e.id
    row = r.hgetall(rk)
    assert row[b"result"] == b"\x00answer"
    assert row[b"attempts"] == b"1"
    assert abs(int(row[b"finished_ms"]) - int(r.time()[0]) * 1000) < 5_000
    assert 55_000 < r.pttl(rk) <= 60_000
    # Nobody waited: no wake token is written (only a waiter's marker asks for one).
    assert not r.exists(_p(anyq.name) + "notify:" + e.id)
    res = anyq.result(e.id)
    assert res == echomq_result(e.id, b"\x00answer", 1, int(row[b"finished_ms"]))
    assert anyq.wait(e.id, timeout_s=1) == res
    assert not r.exists(_p(anyq.name) + "job:" + e.id)  # completion still deletes the row


def echomq_result(id: str, value: bytes, attempts: int, finished: int) -> Any:
    from echomq.protocol.control import Result

    return Result(id, value, attempts, finished)


def test_complete_without_keep_writes_nothing_extra(anyq: Any, r: redis.Redis) -> None:
    e = anyq.enqueue(b"x")
    job = anyq.claim()
    anyq.complete(job.id, job.token, result=b"dropped")
    assert anyq.result(e.id) is None
    assert not r.exists(_p(anyq.name) + "result:" + e.id, _p(anyq.name) + "notify:" + e.id)
    with pytest.raises(TimeoutError):
        anyq.wait(e.id, timeout_s=0.05)


def test_dead_letter_keeps_error_and_wait_raises(anyq: Any, r: redis.Redis) -> None:
    e = anyq.enqueue(b"x")
    job = anyq.claim()
    verdict = anyq.retry(
        job.id, job.token, delay_ms=0, max_attempts=1, error="boom", keep_result_ms=30_000
    )
    assert verdict == "dead"
    row = r.hgetall(_p(anyq.name) + "result:" + e.id)
    assert row[b"error"] == b"boom" and b"result" not in row
    with pytest.raises(echomq.JobFailed) as info:
        anyq.wait(e.id, timeout_s=1)
    assert info.value.error == "boom"


def test_retry_that_reschedules_keeps_nothing(q: echomq.Queue, r: redis.Redis) -> None:
    e = q.enqueue(b"x")
    job = q.claim()
    assert q.retry(job.id, job.token, delay_ms=0, max_attempts=5, error="e", keep_result_ms=1000)
    assert not r.exists(_p(q.name) + "result:" + e.id)


def test_settle_batch_keeps_results(q: echomq.Queue, r: redis.Redis) -> None:
    a, b, c = (q.enqueue(x).id for x in (b"a", b"b", b"c"))
    ja, jb, jc = q.claim_batch(3)
    out = q.settle(
        completed=[(ja.id, ja.token), (jb.id, jb.token, b"B!", 10_000)],
        retried=[(jc.id, jc.token, 0, 1, "bad", 10_000)],
    )
    assert out.completed == [None, None] and out.retried == ["dead"]
    assert q.result(a) is None
    got = q.result(b)
    assert got is not None and got.value == b"B!"
    failed = q.result(c)
    assert failed is not None and failed.error == "bad"
    assert q.counts()["completed"] == 2
    # A stale token in the result-keeping section is refused like any other settle.
    q.enqueue(b"d")
    jd = q.claim()
    out = q.settle(completed=[(jd.id, jd.token + 1, b"no", 10_000)])
    assert isinstance(out.completed[0], echomq.StaleToken)
    assert q.result(jd.id) is None


def test_wait_is_woken_by_the_completion(q: echomq.Queue, url: str) -> None:
    e = q.enqueue(b"x")
    job = q.claim()
    assert job is not None
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(q.wait(e.id, timeout_s=60)))
    waiter.start()
    wait_for(lambda: blocked_clients(q.client) == 1, timeout=60)  # the waiter is blocked
    with echomq.Queue(q.name, url=url) as other:
        other.complete(job.id, job.token, result=b"done", keep_result_ms=60_000)
    waiter.join(60)
    assert got and got[0].value == b"done"
    # Woken by the push, not by its block running out (MAX_BLOCK_S, then a read): a woken
    # waiter puts the token back for the others (rearm). Keys, not a clock (issue 36).
    assert q.client.llen(_p(q.name) + "notify:" + e.id) == 1


def test_every_waiter_of_one_job_wakes(q: echomq.Queue, url: str) -> None:
    e = q.enqueue(b"x")
    job = q.claim()
    assert job is not None
    got: list[Any] = []
    lock = threading.Lock()

    def wait() -> None:
        with echomq.Queue(q.name, url=url) as mine:
            value = mine.wait(e.id, timeout_s=60)
        with lock:
            got.append(value)

    threads = [threading.Thread(target=wait) for _ in range(5)]
    for t in threads:
        t.start()
    wait_for(lambda: blocked_clients(q.client) == 5, timeout=60)
    q.complete(job.id, job.token, result=b"v", keep_result_ms=60_000)
    for t in threads:
        t.join(60)
    assert len(got) == 5 and {g.value for g in got} == {b"v"}
    assert q.client.llen(_p(q.name) + "notify:" + e.id) == 1  # each woken, token passed on


def test_wait_times_out(q: echomq.Queue) -> None:
    e = q.enqueue(b"x")
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        q.wait(e.id, timeout_s=0.3)
    assert time.monotonic() - t0 >= 0.3  # not before its timeout (how long after: below)


def test_a_wait_blocks_no_longer_than_its_timeout() -> None:
    """wait(timeout_s=0.3) ends at its timeout, not after a whole MAX_BLOCK_S block: each
    BLPOP it sends blocks for what is left of 0.3 s at most. The plan is driven here without
    a server (every block runs out): an elapsed-time bound said so only on an idle machine
    (issue 36)."""
    plan = _ctl.wait(Keys("q"), "JOB00000000001", 0.3)
    blocks: list[float] = []
    step = next(plan)
    with pytest.raises(TimeoutError):
        while True:
            assert isinstance(step, Call)
            if step.args[:1] == ("BLPOP",):
                blocks.append(float(step.args[2]))
                step = plan.send(False)  # the block ran out, no token
            else:
                step = plan.send(None)  # no marker reply, no outcome, no row
    assert blocks and all(0 <= b <= 0.3 for b in blocks)


async def test_200_async_waiters_on_one_queue(aq: echomq.AsyncQueue, r: redis.Redis) -> None:
    ids = [(await aq.enqueue(str(i))).id for i in range(200)]
    waits = [asyncio.create_task(aq.wait(i, timeout_s=60)) for i in ids]
    for _ in range(6000):  # their one reader blocks (not a fixed sleep: a busy machine)
        if blocked_clients(r):
            break
        await asyncio.sleep(0.01)
    assert blocked_clients(r) == 1
    clients_before = int(r.info("clients")["connected_clients"])
    jobs = await aq.claim_batch(200)
    for j in jobs:
        await aq.complete(j.id, j.token, result=j.payload, keep_result_ms=60_000)
    results = await asyncio.gather(*waits)
    assert [x.value for x in results] == [str(i).encode() for i in range(200)]
    # One blocking reader, not one connection per waiter.
    assert int(r.info("clients")["connected_clients"]) <= clients_before + 3


async def test_async_wait_timeout_and_failure(aq: echomq.AsyncQueue) -> None:
    e = await aq.enqueue(b"x")
    with pytest.raises(TimeoutError):
        await aq.wait(e.id, timeout_s=0.1)
    job = await aq.claim()
    assert job is not None
    later = asyncio.create_task(aq.wait(e.id, timeout_s=60))
    await asyncio.sleep(0.1)  # blocked by now or not: either way it meets the kept outcome
    await aq.retry(job.id, job.token, delay_ms=0, max_attempts=1, error="x", keep_result_ms=60_000)
    with pytest.raises(echomq.JobFailed):
        await later


@pytest.mark.parametrize(
    "kwargs",
    [{"keep_result_ms": -1}, {"keep_result_ms": "5"}, {"keep_result_ms": True}],
)
def test_bad_keep_result_writes_nothing(q: echomq.Queue, r: redis.Redis, kwargs: Any) -> None:
    q.enqueue(b"x")
    job = q.claim()
    assert job is not None
    before = snapshot(r, q.name)
    with pytest.raises(echomq.InvalidArgument):
        q.complete(job.id, job.token, result=b"v", **kwargs)
    with pytest.raises(echomq.InvalidArgument):
        q.settle(completed=[(job.id, job.token, b"v", kwargs["keep_result_ms"])])
    assert snapshot(r, q.name) == before


def test_bad_wait_arguments(q: echomq.Queue) -> None:
    with pytest.raises(echomq.InvalidArgument):
        q.wait(echomq.ids.mint(), timeout_s=-1)
    with pytest.raises(echomq.InvalidId):
        q.wait("nope", timeout_s=1)
    with pytest.raises(echomq.InvalidId):
        q.result("nope")


def test_simple_dedup_held_until_the_holder_completes(anyq: Any, r: redis.Redis) -> None:
    dk = _p(anyq.name) + "de:sync-42"
    first = anyq.enqueue(b"a", dedup="sync-42")
    assert first.status == "enqueued"
    assert r.get(dk) == first.id.encode() and r.pttl(dk) == -1
    assert r.hget(_p(anyq.name) + "job:" + first.id, "dedup") == b"sync-42"
    again = anyq.enqueue(b"b", dedup="sync-42")
    assert again == echomq.Enqueued(first.id, "deduplicated")
    assert anyq.counts()["pending"] == 1
    assert anyq.dedup_holder("sync-42") == first.id
    job = anyq.claim()
    assert anyq.enqueue(b"c", dedup="sync-42").status == "deduplicated"  # active still holds
    anyq.complete(job.id, job.token)
    assert not r.exists(dk)
    assert anyq.enqueue(b"d", dedup="sync-42").status == "enqueued"


@pytest.mark.parametrize("how", ["dead", "stalled", "removed", "drained"])
def test_simple_dedup_released_when_the_holder_ends(
    q: echomq.Queue, r: redis.Redis, how: str
) -> None:
    dk = _p(q.name) + "de:k"
    e = q.enqueue(b"a", dedup="k")
    if how == "dead":
        job = q.claim()
        assert q.retry(job.id, job.token, delay_ms=0, max_attempts=1, error="x") == "dead"
    elif how == "stalled":
        q.claim(lease_ms=1)
        time.sleep(0.02)
        assert q.sweep_stalled(max_stalled=1) == ([], [e.id])
    elif how == "removed":
        q.remove(e.id)
    else:
        assert q.drain() == 1
    assert not r.exists(dk)


def test_retry_keeps_the_key(q: echomq.Queue, r: redis.Redis) -> None:
    e = q.enqueue(b"a", dedup="k")
    job = q.claim()
    assert q.retry(job.id, job.token, delay_ms=0, max_attempts=3, error="x") == "scheduled"
    assert q.enqueue(b"b", dedup="k") == echomq.Enqueued(e.id, "deduplicated")


def test_release_only_the_holder_it_names(q: echomq.Queue, r: redis.Redis) -> None:
    dk = _p(q.name) + "de:k"
    e = q.enqueue(b"a", dedup="k")
    r.set(dk, "JOBsomeoneElse")  # the key moved on (another holder): not ours to release
    job = q.claim()
    q.complete(job.id, job.token)
    assert r.get(dk) == b"JOBsomeoneElse"
    assert e.id


def test_throttle_key_lives_out_its_ttl(q: echomq.Queue, r: redis.Redis) -> None:
    dk = _p(q.name) + "de:t"
    e = q.enqueue(b"a", dedup="t", dedup_mode="throttle", dedup_ttl_ms=400)
    assert 0 < r.pttl(dk) <= 400
    job = q.claim()
    q.complete(job.id, job.token)
    assert r.get(dk) == e.id.encode()  # completion does not release a throttle key
    assert q.enqueue(b"b", dedup="t", dedup_mode="throttle", dedup_ttl_ms=400).status == (
        "deduplicated"
    )
    wait_for(lambda: not r.exists(dk), timeout=60)
    assert q.enqueue(b"c", dedup="t", dedup_mode="throttle", dedup_ttl_ms=400).status == (
        "enqueued"
    )


def test_debounce_replaces_the_waiting_payload_and_delay(q: echomq.Queue, r: redis.Redis) -> None:
    first = q.enqueue(b"v1", dedup="d", dedup_mode="debounce", dedup_ttl_ms=60_000, delay_ms=500)
    assert first.status == "scheduled"
    again = q.enqueue(b"v2", dedup="d", dedup_mode="debounce", dedup_ttl_ms=60_000, delay_ms=5000)
    assert again == echomq.Enqueued(first.id, "deduplicated")
    jk = _p(q.name) + "job:" + first.id
    assert r.hget(jk, "payload") == b"v2"
    run_at = r.zscore(_p(q.name) + "schedule", first.id)
    assert run_at is not None and run_at - int(r.time()[0]) * 1000 > 3000
    # A waiting (pending) holder is pushed back by a delayed debounce: lanes stay exact.
    second = q.enqueue(b"w1", dedup="e", dedup_mode="debounce", dedup_ttl_ms=60_000, group="g")
    # (The fold names the holder's lane: a fold cannot move a holder between lanes, issue 37.)
    q.enqueue(
        b"w2", dedup="e", dedup_mode="debounce", dedup_ttl_ms=60_000, delay_ms=5000, group="g"
    )
    assert q.job_state(second.id) == "scheduled"
    assert q.lane_depth("g") == 0 and q.check() == []
    # Once the holder runs, a debounce enqueue is refused and changes nothing.
    q.enqueue(b"z1", dedup="f", dedup_mode="debounce", dedup_ttl_ms=60_000)
    job = q.claim()
    assert job is not None and job.payload == b"z1"
    q.enqueue(b"z2", dedup="f", dedup_mode="debounce", dedup_ttl_ms=60_000)
    assert r.hget(_p(q.name) + "job:" + job.id, "payload") == b"z1"


def test_eight_threads_same_key_exactly_one_admitted(q: echomq.Queue, url: str) -> None:
    barrier = threading.Barrier(8)
    out: list[echomq.Enqueued] = []
    lock = threading.Lock()

    def go(i: int) -> None:
        with echomq.Queue(q.name, url=url) as mine:
            barrier.wait()
            e = mine.enqueue(str(i), dedup="once")
        with lock:
            out.append(e)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    admitted = [e for e in out if e.status == "enqueued"]
    assert len(out) == 8 and len(admitted) == 1
    assert {e.id for e in out} == {admitted[0].id}
    assert q.counts()["pending"] == 1


def test_orphaned_simple_key_is_free(q: echomq.Queue, r: redis.Redis) -> None:
    r.set(_p(q.name) + "de:k", echomq.ids.mint())  # its holder's row is gone (obliterated)
    assert q.enqueue(b"a", dedup="k").status == "enqueued"


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"dedup": "a:b"}, echomq.InvalidId),
        ({"dedup": ""}, echomq.InvalidId),
        ({"dedup": "x" * 256}, echomq.InvalidId),
        ({"dedup": 5}, echomq.InvalidId),
        ({"dedup": "k", "dedup_mode": "nope"}, echomq.InvalidArgument),
        ({"dedup": "k", "dedup_mode": "throttle"}, echomq.InvalidArgument),
        ({"dedup": "k", "dedup_mode": "debounce", "dedup_ttl_ms": 0}, echomq.InvalidArgument),
        ({"dedup": "k", "dedup_mode": "throttle", "dedup_ttl_ms": -5}, echomq.InvalidArgument),
        ({"dedup": "k", "dedup_ttl_ms": 100}, echomq.InvalidArgument),
        ({"dedup_ttl_ms": 100}, echomq.InvalidArgument),
    ],
)
def test_bad_dedup_writes_nothing(
    anyq: Any, r: redis.Redis, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    before = snapshot(r, anyq.name)
    with pytest.raises(error):
        anyq.enqueue(b"x", **kwargs)
    assert snapshot(r, anyq.name) == before


def test_cancel_waiting_and_scheduled_jobs_removes_them(anyq: Any, r: redis.Redis) -> None:
    a = anyq.enqueue(b"a", group="g")
    b = anyq.enqueue(b"b", delay_ms=60_000)
    c = anyq.enqueue(b"c", dedup="k")
    assert anyq.cancel(a.id) == "removed"
    assert anyq.cancel(b.id) == "removed"
    assert anyq.cancel(c.id) == "removed"
    assert anyq.cancel(a.id) == "absent"
    assert anyq.counts()["pending"] == 0 and anyq.counts()["schedule"] == 0
    assert anyq.lanes() == [] and anyq.check() == []
    assert not r.exists(_p(anyq.name) + "de:k")
    assert anyq.cancel(echomq.ids.mint()) == "absent"


def test_cancel_active_flags_and_heartbeat_reports(anyq: Any, r: redis.Redis) -> None:
    e = anyq.enqueue(b"a")
    other = anyq.enqueue(b"b")
    ja, jb = anyq.claim_batch(2)
    assert anyq.cancel(e.id) == "signalled"
    assert r.hget(_p(anyq.name) + "job:" + e.id, "cancel") == b"1"
    assert anyq.job_state(e.id) == "active"
    pairs = [(ja.id, ja.token), (jb.id, jb.token), (echomq.ids.mint(), 1)]
    failed, flagged = anyq.extend_leases(pairs, lease_ms=30_000)
    assert flagged == [e.id] and len(failed) == 1
    # extend_many keeps its old reply: only the failures.
    assert anyq.extend_many(pairs, lease_ms=30_000) == failed
    # The holder dead-letters it under its token.
    held = ja if ja.id == e.id else jb
    assert anyq.retry(held.id, held.token, delay_ms=0, max_attempts=1, error="cancelled") == "dead"
    assert anyq.get_job(e.id)["last_error"] == "cancelled"
    assert anyq.cancel(e.id) == "absent"  # dead: nothing runs or waits
    assert other.id


def test_cancel_bad_id_writes_nothing(anyq: Any, r: redis.Redis) -> None:
    before = snapshot(r, anyq.name)
    with pytest.raises(echomq.InvalidId):
        anyq.cancel("JOB-not-an-id")
    assert snapshot(r, anyq.name) == before


def _cli(url: str, *args: str) -> Any:
    from click.testing import CliRunner

    from echomq.cli import main

    return CliRunner().invoke(main, ["--url", url, *args])


def test_cli_job_shows_dedup_cancel_and_result(q: echomq.Queue, url: str) -> None:
    e = q.enqueue(b"x", dedup="acct-7")
    out = _cli(url, "job", q.name, e.id)
    assert out.exit_code == 0 and "dedup: acct-7" in out.output
    job = q.claim()
    assert _cli(url, "cancel", q.name, e.id).output.strip() == "signalled"
    assert "cancel: 1" in _cli(url, "job", q.name, e.id).output
    q.complete(job.id, job.token, result=b"42", keep_result_ms=10_000)
    out = _cli(url, "job", q.name, e.id)
    assert out.exit_code == 0 and "kept result: 42" in out.output
    w = q.enqueue(b"y")
    assert _cli(url, "cancel", q.name, w.id).output.strip() == "removed"
    assert _cli(url, "cancel", q.name, w.id).output.strip() == "absent"
