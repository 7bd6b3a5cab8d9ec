"""Hostile values against a running worker: delays and values beyond the protocol,
malformed rows, and a flat set missing from the ring.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
from typing import Any

import pytest
import redis

import echomq
from conftest import server_ms, wait_for
from echomq import ids
from echomq.protocol.kernel import MAX_ARG, MAX_MS
from procs import Spawner, wait_log
from reliability import payload, read_books


class InProcWorker:
    """A Worker running ``arun()`` on a private loop in a thread."""

    def __init__(self, worker: echomq.Worker) -> None:
        self.worker = worker
        self.loop = asyncio.new_event_loop()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        try:
            self.loop.run_until_complete(self.worker.arun())
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.worker.stop)
            self.thread.join(30)
        assert not self.thread.is_alive(), "the worker did not stop"
        self.loop.close()
        if self.error is not None:
            raise self.error


@pytest.mark.parametrize("source", ["retry_signal", "backoff_policy"])
def test_a_delay_beyond_the_protocol_cannot_wedge_the_worker(
    url: str, qname: str, r: redis.Redis, source: str
) -> None:
    """A 300-year delay (a Retry signal's, or a policy's) once failed every settle batch of
    the worker, every turn: nothing completed again. Now it is the longest delay, MAX_MS."""
    app = echomq.App(url=url)
    policy = 10**13 if source == "backoff_policy" else 10
    seen: list[int] = []

    @app.task(queue=qname, name="absurd", backoff=policy, max_attempts=5)
    def absurd(n: int) -> None:
        seen.append(n)
        if n == 0:
            if source == "retry_signal":
                raise echomq.Retry(delay_ms=10**13)
            raise RuntimeError("fails")

    q = app.queue(qname)
    first = absurd.enqueue(0).id
    absurd.enqueue_many([((n,), {}) for n in range(1, 21)])
    w = InProcWorker(echomq.Worker(app, concurrency=4, beat_ms=100))
    try:
        wait_for(lambda: q.counts()["completed"] == 20, timeout=30)
        wait_for(lambda: q.job_state(first) == "scheduled", timeout=30)
    finally:
        w.stop()
        app.close()
    due = r.zscore(f"emq:{{{qname}}}:schedule", first)
    assert due is not None and abs(due - (server_ms(r) + MAX_MS)) < 60_000
    assert q.check() == []


def test_task_and_worker_refuse_values_beyond_the_protocol(url: str, qname: str) -> None:
    app = echomq.App(url=url)
    for kwargs in ({"max_attempts": MAX_ARG + 1}, {"lease_ms": MAX_MS + 1}):
        with pytest.raises(echomq.InvalidArgument):
            app.task(queue=qname, name=f"t{len(app.tasks)}", **kwargs)(lambda: None)
    app.task(queue=qname, name="edge", max_attempts=MAX_ARG, lease_ms=MAX_MS)(lambda: None)
    with pytest.raises(echomq.InvalidArgument):
        echomq.Worker(app, concurrency=1_000_001)
    with pytest.raises(echomq.InvalidArgument):
        echomq.Worker(app, max_stalled=MAX_ARG + 1)
    echomq.Worker(app, concurrency=1_000_000, max_stalled=MAX_ARG)
    app.close()


def test_malformed_rows_never_crash_a_worker(
    spawn: Spawner, q: echomq.Queue, qname: str, r: redis.Redis
) -> None:
    b = f"emq:{{{qname}}}:"
    lane = "tenant-a"
    past = server_ms(r) - 60_000
    dead: dict[str, str] = {}  # id -> the reason it must be dead-lettered with
    runs: dict[str, int] = {}  # id -> the n it must run (and complete) with
    gone: dict[str, str] = {}  # id -> the set it must have left

    def row(fields: dict[str, Any], where: str = "pending", score: float = 0) -> str:
        job_id = ids.mint()
        if fields:
            r.hset(b + "job:" + job_id, mapping=fields)
        r.zadd(b + where, {job_id: score})
        return job_id

    for att in ("abc", "-1", "1.5", "nan", "1e400", "99999999999999999999", "", " 7", "0x10"):
        dead[row({"state": "pending", "attempts": att, "payload": payload(1)})] = (
            "attempts is not an integer"
        )
    dead[row({"state": "pending", "payload": payload(2)})] = "attempts is not an integer"
    dead[row({"state": "pending", "attempts": "0"})] = "undecodable payload"
    dead[row({"attempts": "0", "payload": b"\xff\x00{"})] = "undecodable payload"
    envelope = json.dumps({"task": "chaos.run", "args": 5}).encode()
    dead[row({"attempts": "0", "payload": envelope})] = "undecodable payload"
    dead[row({"attempts": "0", "payload": json.dumps({"task": "nope"}).encode()})] = "unknown task"
    # A lapsed lease whose row cannot be leased again: recovered by the sweep, then dead.
    dead[row({"state": "active", "attempts": "x", "payload": payload(3)}, "active", past)] = (
        "attempts is not an integer"
    )
    # Not a branded id: a row the client could never settle (nor name).
    r.hset(b + "job:not-a-job-id", mapping={"state": "pending", "attempts": "0"})
    r.zadd(b + "pending", {"not-a-job-id": 0})
    r.zadd(b + "pending", {"zz-ghost": 0})

    runs[row({"attempts": "0", "payload": payload(1001)})] = 1001  # no state: runs anyway
    # A lapsed lease with a stall count that is not an integer: recovered, runs, completes.
    stalled = {"state": "active", "attempts": "1", "lease_epoch": "1", "stalled": "abc"}
    runs[row({**stalled, "payload": payload(1002)}, "active", past)] = 1002

    wrong = {}  # a key of the wrong type where the row hash should be
    for kind in ("string", "list", "set", "zset"):
        job_id = row({})
        key = b + "job:" + job_id
        if kind == "string":
            r.set(key, "x")
        elif kind == "list":
            r.rpush(key, "x")
        elif kind == "set":
            r.sadd(key, "x")
        else:
            r.zadd(key, {"x": 1})
        wrong[job_id] = kind
        gone[job_id] = "pending"
    for where, score in (("pending", 0), ("active", past), ("schedule", past)):
        gone[row({}, where, score)] = where  # ghosts: ids without a row
    key = b + "job:" + (sched := row({}, "schedule", past))
    r.set(key, "not a row")
    wrong[sched], gone[sched] = "string", "schedule"
    lane_ghost = row({}, f"g:{lane}:pending")
    gone[lane_ghost] = f"g:{lane}:pending"
    dead_ghost = row({}, "dead")

    # The good jobs (enqueued after the planted ids, which sort first and are popped first).
    for n, e in enumerate(q.enqueue_many([payload(n) for n in range(30)])):
        runs[e.id] = n
    for n in range(30, 40):
        runs[q.enqueue(payload(n), group=lane).id] = n

    w = spawn.start(
        "worker", "apps.chaos:app", "-c", "8", "--beat-ms", "100",
        env=spawn.env(EMQ_TEST_QUEUE=qname, EMQ_TEST_LEASE_MS="10000"),
    )  # fmt: skip
    wait_for(lambda: q.counts()["completed"] == len(runs), timeout=60)
    wait_for(lambda: q.counts()["active"] == q.counts()["pending"] == 0, timeout=30)

    ran = {job_id: n for job_id, _, _, n in read_books(r, qname).history}
    assert ran == runs  # every good job ran (once: no lease lapsed), no planted one did
    for job_id, reason in dead.items():
        assert q.job_state(job_id) == "dead", job_id
        assert reason in q.get_job(job_id)["last_error"], (job_id, q.get_job(job_id))
    assert (r.zscore(b + "dead", "not-a-job-id") or 0) > 0  # dead-lettered at its time of death
    assert "not a branded job id" in r.hget(b + "job:not-a-job-id", "last_error").decode()
    assert r.zscore(b + "pending", "zz-ghost") is None
    for job_id, where in gone.items():
        assert r.zscore(b + where, job_id) is None, (job_id, where)
        assert q.job_state(job_id) in ("absent", "unknown")
    for job_id, kind in wrong.items():
        assert r.type(b + "job:" + job_id).decode() == kind  # left alone, never rewritten
    assert r.zscore(b + "dead", dead_ghost) == 0  # a dead ghost waits for an operator
    counts = q.counts()
    assert counts["schedule"] == 0 and counts["dead"] == len(dead) + 2  # + not-a-job-id, ghost
    # The checker still reports the planted garbage, and nothing else.
    planted = [*dead, *wrong, dead_ghost]
    for line in q.check():
        assert any(p in line for p in planted), line

    # The worker kept running, and stops cleanly.
    assert w.popen.poll() is None, w.text()
    wait_log(w, "serving")
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.text()
    text = w.text()
    # The job lines (echomq.worker.jobs) report the planted jobs' dead-letters at ERROR.
    own = "\n".join(x for x in text.splitlines() if " echomq.worker.jobs[" not in x)
    for needle in ("Traceback", "crashed", "claim failed", "settle failed", "ERROR"):
        assert needle not in own, text


def test_a_flat_set_missing_from_the_ring_is_healed_by_the_next_beat(
    q: echomq.Queue, qname: str, r: redis.Redis
) -> None:
    """Enqueue's fast path trusts that a non-empty flat set is in the ring. A ring changed
    from outside (here: the entry removed) left the flat set unserved for good — a worker
    sat idle next to pending jobs. The beat's promote now puts the entry back."""
    ring = f"emq:{{{qname}}}:ring"
    first = q.enqueue(b"one").id
    r.lrem(ring, 0, "*")
    q.enqueue(b"two")  # the fast path: the flat set was non-empty, the ring is not looked at
    assert q.claim(lease_ms=60_000) is None  # stranded
    assert any("misses the flat set" in line for line in q.check())
    q.promote()
    assert r.lrange(ring, 0, -1) == [b"*"]
    assert q.check() == []
    job = q.claim(lease_ms=60_000)
    assert job is not None and job.id == first
