"""The worker as real processes (``python -m echomq worker apps.basic:app``): many jobs end
to end, a SIGKILLed worker's jobs recovered by another, heartbeats keeping a long job, a
frozen (SIGSTOPped) worker fenced out, SIGTERM with and past the grace period, and how
little an idle worker says to the server."""

from __future__ import annotations

import json
import re
import signal
import time

import pytest
import redis

import echomq
from conftest import wait_for
from echomq import JobGone, StaleToken
from procs import Proc, Spawner, wait_log


def call(task: str, *args: object) -> bytes:
    return json.dumps({"task": task, "args": list(args), "kwargs": {}}).encode()


def tokens(r: redis.Redis, queue: str) -> list[tuple[str, int]]:
    """(id, token) of every run start the handlers recorded, in order."""
    out = []
    for item in r.lrange(f"emqtest:{queue}:tokens", 0, -1):
        job_id, _, token = item.decode().partition(":")
        out.append((job_id, int(token)))
    return out


def done(r: redis.Redis, queue: str) -> dict[str, int]:
    raw = r.hgetall(f"emqtest:{queue}:done")
    return {k.decode(): int(v) for k, v in raw.items()}


def stats_of(proc: Proc) -> dict[str, int]:
    """The WorkerStats the worker logged when it stopped."""
    m = re.search(r"stopped: .* \(counters: (.*?)\)$", proc.text(), re.MULTILINE)
    assert m, f"no stats in the output of {proc}:\n{proc.text()}"
    return {k: int(v) for k, v in (kv.split("=") for kv in m.group(1).split(", "))}


def sigterm(proc: Proc, timeout: float = 60.0) -> int:
    """SIGTERM the worker and wait for it: its exit code. (No "it took under N s": what it
    did, finish or hand back, says whether it waited, on a machine of any speed; issue 36.)"""
    proc.signal(signal.SIGTERM)
    return proc.wait(timeout)


def test_thousand_jobs_through_two_worker_processes(
    spawn: Spawner, q: echomq.Queue, qname: str, r: redis.Redis
) -> None:
    workers = [spawn.worker(qname, "-c", "16", "--beat-ms", "200") for _ in range(2)]
    for w in workers:
        wait_log(w, "serving")
    ids: list[str] = []
    for start in range(0, 1000, 100):  # produced while the workers run (the wake path)
        receipts = q.enqueue_many([call("count", n) for n in range(start, start + 100)])
        ids += [x.id for x in receipts if isinstance(x, echomq.Enqueued)]
    assert len(set(ids)) == 1000
    wait_for(lambda: q.counts()["completed"] == 1000, timeout=60)
    assert done(r, qname) == dict.fromkeys(ids, 1)  # each handler ran once and returned
    assert sorted(tokens(r, qname)) == sorted((i, 1) for i in ids)  # each on its 1st attempt
    counts = q.counts()
    assert counts == {**counts, "pending": 0, "active": 0, "schedule": 0, "dead": 0}
    assert q.check() == []
    total = 0
    for w in workers:
        rc = sigterm(w)
        assert rc == 0, w.text()
        s = stats_of(w)
        assert (s["lost"], s["retried"], s["dead"]) == (0, 0, 0)
        total += s["completed"]
    assert total == 1000  # every settle accepted once, by one of the two


def test_sigkilled_worker_jobs_run_elsewhere_once(
    spawn: Spawner, q: echomq.Queue, qname: str, r: redis.Redis
) -> None:
    a = spawn.worker(qname, "-c", "10", "--beat-ms", "200", lease_ms=1000)
    # First attempts sleep a minute (they are held when the worker dies); later ones 1 s.
    ids = [q.enqueue(call("hold", 60, 1.0)).id for _ in range(5)]
    wait_for(lambda: len(tokens(r, qname)) == 5)
    assert sorted(tokens(r, qname)) == sorted((i, 1) for i in ids)
    a.signal(signal.SIGKILL)
    assert a.wait(60) == -signal.SIGKILL
    assert q.counts()["active"] == 5  # held until the leases lapse

    b = spawn.worker(qname, "-c", "10", "--beat-ms", "200", lease_ms=1000)
    wait_for(lambda: len(tokens(r, qname)) == 10, timeout=60)
    second = tokens(r, qname)[5:]
    assert sorted(second) == sorted((i, 2) for i in ids)
    # While the second worker holds them, the killed worker's tokens are refused.
    for job_id in ids:
        with pytest.raises(StaleToken):
            q.complete(job_id, 1)
        with pytest.raises(StaleToken):
            q.retry(job_id, 1, delay_ms=0, max_attempts=5, error="late")
    wait_for(lambda: q.counts()["completed"] == 5, timeout=60)
    assert done(r, qname) == dict.fromkeys(ids, 1)  # only the second runs returned
    for job_id in ids:
        assert q.job_state(job_id) == "absent"
        with pytest.raises((StaleToken, JobGone)):
            q.complete(job_id, 1)
    assert q.check() == []
    rc = sigterm(b)
    assert rc == 0
    s = stats_of(b)
    assert (s["completed"], s["recovered"], s["lost"]) == (5, 5, 0)


def test_long_job_with_heartbeats_is_delivered_once(
    spawn: Spawner, q: echomq.Queue, qname: str, r: redis.Redis
) -> None:
    # 3 s of work on a 300 ms lease (10x), with two workers sweeping every 100 ms.
    workers = [spawn.worker(qname, "--beat-ms", "100", lease_ms=300) for _ in range(2)]
    for w in workers:
        wait_log(w, "serving")
    e = q.enqueue(call("hold", 3.0, 3.0))
    wait_for(lambda: q.counts()["completed"] == 1, timeout=60)
    assert tokens(r, qname) == [(e.id, 1)]
    assert done(r, qname) == {e.id: 1}
    assert q.check() == []
    for w in workers:
        assert sigterm(w) == 0
        s = stats_of(w)
        assert (s["lost"], s["recovered"], s["swept_dead"]) == (0, 0, 0)
    assert sum(stats_of(w)["completed"] for w in workers) == 1


def test_frozen_worker_is_fenced_out(
    spawn: Spawner, q: echomq.Queue, qname: str, r: redis.Redis
) -> None:
    a = spawn.worker(qname, "--beat-ms", "100", lease_ms=300)
    e = q.enqueue(call("hold", 3.0, 1.0))
    wait_for(lambda: tokens(r, qname) == [(e.id, 1)])
    a.signal(signal.SIGSTOP)  # frozen: no heartbeat, its lease lapses
    b = spawn.worker(qname, "--beat-ms", "100", lease_ms=300)
    wait_for(lambda: tokens(r, qname) == [(e.id, 1), (e.id, 2)], timeout=60)
    assert q.job_state(e.id) == "active"
    with pytest.raises(StaleToken):
        q.complete(e.id, 1)  # the frozen worker's token no longer owns the job
    wait_for(lambda: q.counts()["completed"] == 1, timeout=60)

    a.signal(signal.SIGCONT)
    # Its heartbeat finds the lease gone (or its settle is refused): it never settles. The
    # fence's own line is waited for: the run's end ("completed in N ms", the outcome it
    # will send) is logged before the refused settle's line, and a busy machine read the
    # log between the two (issue 36).
    wait_for(lambda: "lease lost" in a.text() or "settle refused" in a.text(), timeout=60)
    assert sigterm(a) == 0
    sa = stats_of(a)
    assert (sa["completed"], sa["lost"], sa["retried"], sa["dead"]) == (0, 1, 0, 0)
    assert sigterm(b) == 0
    sb = stats_of(b)
    assert (sb["completed"], sb["recovered"], sb["lost"]) == (1, 1, 0)
    assert q.counts()["completed"] == 1  # completed exactly once, by the other worker
    with pytest.raises((StaleToken, JobGone)):
        q.complete(e.id, 1)
    assert q.check() == []


@pytest.mark.parametrize("task", ["hold", "ahold"])
def test_sigterm_lets_in_flight_jobs_finish_within_grace(
    spawn: Spawner, q: echomq.Queue, qname: str, r: redis.Redis, task: str
) -> None:
    w = spawn.worker(qname, "-c", "4", "--grace", "120")  # far past the 1 s runs, however slow
    args = (1.0, 1.0) if task == "hold" else (1.0,)
    ids = [q.enqueue(call(task, *args)).id for _ in range(2)]
    wait_for(lambda: len(tokens(r, qname)) == 2)
    rc = sigterm(w, 180)
    assert rc == 0, w.text()
    assert done(r, qname) == dict.fromkeys(ids, 1)
    assert q.counts()["completed"] == 2
    s = stats_of(w)
    assert (s["completed"], s["handed_back"]) == (2, 0)
    assert q.check() == []


@pytest.mark.parametrize("task", ["hold", "ahold"])
def test_sigterm_past_grace_hands_jobs_back_at_once(
    spawn: Spawner, q: echomq.Queue, qname: str, r: redis.Redis, task: str
) -> None:
    w = spawn.worker(qname, "-c", "4", "--grace", "0.3")  # leases of 30 s
    # Runs of 300 s: past the wait below, so an exit within it handed the jobs back.
    args = (300, 300) if task == "hold" else (300,)
    ids = [q.enqueue(call(task, *args)).id for _ in range(2)]
    wait_for(lambda: len(tokens(r, qname)) == 2)
    rc = sigterm(w)
    states = [q.job_state(i) for i in ids]
    assert rc == 0, w.text()
    assert states == ["pending", "pending"]
    for job_id in ids:
        job = q.get_job(job_id)
        assert job is not None and job["attempts"] == "1"  # handed back without minting
    assert done(r, qname) == {}
    s = stats_of(w)
    assert (s["handed_back"], s["completed"]) == (2, 0)
    assert q.check() == []
    # The next worker runs them on a fresh token.
    q.drain()


def test_second_sigterm_exits_immediately(
    spawn: Spawner, q: echomq.Queue, qname: str, r: redis.Redis
) -> None:
    w = spawn.worker(qname, "--grace", "300")  # past the wait below: no graceful exit in it
    e = q.enqueue(call("ahold", 300))
    wait_for(lambda: len(tokens(r, qname)) == 1)
    w.signal(signal.SIGTERM)
    wait_log(w, "received SIGTERM")
    rc = sigterm(w)
    assert rc == 128 + signal.SIGTERM  # the forced exit, not the graceful one (0)
    assert q.job_state(e.id) == "active"  # its lease lapses; a sweep recovers it
    q.drain()


def test_idle_worker_is_quiet(spawn: Spawner, qname: str, r: redis.Redis) -> None:
    def calls() -> dict[str, int]:
        stats = r.info("commandstats")
        return {k: int(v["calls"]) for k, v in stats.items()}

    w = spawn.worker(qname)  # the default beat: 1 s
    wait_log(w, "serving")
    time.sleep(1.5)  # past its first sweep and first parked wait: idle now
    before = calls()
    time.sleep(2.0)
    after = calls()
    diff = {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}
    diff["cmdstat_info"] = diff.get("cmdstat_info", 0) - 1  # our own first INFO
    total = sum(diff.values())
    print(f"\nidle worker over 2 s: {total} commands {diff}")
    # Per 1 s beat an idle worker makes three round trips: one parked BLPOP, the claim it
    # leads to, and one pipeline of promote + stall sweep + repeats/outbox (D18/D19). The
    # scripts' own commands (TIME, the due-window reads) make up the rest of the count. The
    # registry's beat (worker_beat.lua) is one more script call a beat, of 8 commands: TIME,
    # the prune's ZRANGEBYSCORE, HSET, ZADD, ZRANGE and two PEXPIREs.
    assert diff.get("cmdstat_blpop", 0) <= 3, diff
    assert diff.get("cmdstat_evalsha", 0) + diff.get("cmdstat_eval", 0) <= 12, diff
    assert total < 45 + 2 * 8, f"idle worker sent {total} commands in 2 s: {diff}"
    assert sigterm(w) == 0
