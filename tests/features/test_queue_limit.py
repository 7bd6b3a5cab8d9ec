"""The queue-wide limit at full speed (issue 41, D24): ``settle`` says when its claim leaves
the queue at its limit while jobs wait (``Settled.at_limit``), and a worker that hears it
claims with the settles that free room instead of parking until that room's wake token comes
back to it. The limit stays exact under several worker processes, this release's and the
previous one's side by side. Every test runs on both executors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis
from release import materialise
from worker_support import InProcWorker

import echomq
from conftest import wait_for
from procs import Spawner, wait_log

pytestmark = pytest.mark.executors


def K(q: str, suffix: str) -> str:
    return "emq:{" + q + "}:" + suffix


def test_settle_says_when_its_claim_leaves_the_queue_at_its_limit(q: echomq.Queue) -> None:
    for i in range(5):
        q.enqueue(f"j{i}".encode())
    q.limit(2)
    first = q.settle(n=1, lease_ms=60_000)
    assert len(first.jobs) == 1 and not first.at_limit  # room for one more
    second = q.settle(n=5, lease_ms=60_000)
    assert len(second.jobs) == 1 and second.at_limit  # cut short: three wait, no room
    a, b = first.jobs[0], second.jobs[0]
    freed = q.settle(completed=[(a.id, a.token)])
    assert not freed.at_limit  # no claim asked: nothing to say
    refill = q.settle(completed=[(b.id, b.token)], n=2, lease_ms=60_000)
    assert len(refill.jobs) == 2 and refill.at_limit  # full, and at the limit again
    c, d = refill.jobs
    last = q.settle(completed=[(c.id, c.token), (d.id, d.token)], n=5, lease_ms=60_000)
    assert len(last.jobs) == 1 and not last.at_limit  # nothing waits after it
    held = last.jobs[0]
    q.enqueue(b"late")
    q.limit(None)
    assert not q.settle(n=0).at_limit
    free = q.settle(n=1, lease_ms=60_000)
    assert len(free.jobs) == 1 and not free.at_limit  # no limit: never held
    q.complete(held.id, held.token)
    q.complete(free.jobs[0].id, free.jobs[0].token)
    assert q.check() == []


def test_a_settle_at_the_limit_with_nothing_waiting_is_not_held(q: echomq.Queue) -> None:
    q.limit(1)
    q.enqueue(b"only")
    got = q.settle(n=3, lease_ms=60_000)
    assert len(got.jobs) == 1 and not got.at_limit  # at the limit, but no job waits
    assert q.settle(n=1).jobs == []
    q.enqueue(b"next")
    again = q.settle(n=1, lease_ms=60_000)
    assert again.jobs == [] and again.at_limit  # one waits behind the limit


def test_a_settle_reply_without_held_decodes_as_not_held() -> None:
    """A server whose settle answers four elements (0.6's trafikey, loaded beside this
    client) is read as never held: the worker parks and takes wake tokens, as before."""
    from echomq.protocol import calls as _p
    from echomq.protocol.kernel import Keys

    call = _p.settle(Keys("q"), n=2)
    assert call.decode([[], [], [], 0]).at_limit is False
    assert call.decode([[], [], [], 0, 0]).at_limit is False
    assert call.decode([[], [], [], 0, 1]).at_limit is True


def test_a_limited_worker_refills_with_its_settles_not_with_wake_tokens(
    url: str, qname: str, r: redis.Redis
) -> None:
    """``limit(3)`` at ``-c 4`` (bench/limit_refill.py's run): before issue 41 about every
    fourth job came through a park — the freeing settle pushed a wake token, the worker's
    BLPOP took it and a claim followed, three round trips more. Now each settle claims the
    room it frees: the worker's BLPOPs stay a handful (its first park, and a beat is ten
    minutes here), whatever the number of jobs."""
    app = echomq.App(url=url)
    done: list[int] = []

    @app.task(queue=qname, name="noop")
    def noop(i: int) -> None:
        done.append(i)

    jobs = 400
    q = app.queue(qname)
    q.limit(3)
    noop.enqueue_many([((i,), {}) for i in range(jobs)])
    r.delete(K(qname, "wake"))  # a producer that stopped: refills come from the worker
    r.config_resetstat()
    w = InProcWorker(echomq.Worker(app, queues=[qname], concurrency=4, beat_ms=600_000))
    try:
        wait_for(lambda: len(done) == jobs, timeout=120)
        parks = int(r.info("commandstats").get("cmdstat_blpop", {}).get("calls", 0))
    finally:
        w.stop()
        app.close()
    assert sorted(done) == list(range(jobs))
    # Before the fix: about jobs / 4 (a hundred here); after it: the first park or two.
    assert parks <= 10, parks


def _max_active(events: list[echomq.Event]) -> tuple[int, int]:
    """Replay the stream (written inside the scripts, so in the server's order): the most
    jobs active at once, and how many runs started."""
    active: set[str] = set()
    most = started = 0
    for e in events:
        if e.id is None:
            continue
        if e.event == "active":
            active.add(e.id)
            started += 1
            most = max(most, len(active))
        elif e.event in ("completed", "retried", "dead", "removed", "stalled", "pushed"):
            active.discard(e.id)
    return most, started


def _all_events(q: echomq.Queue) -> list[echomq.Event]:
    out: list[echomq.Event] = []
    after = "0"
    while batch := q.events(after=after, count=1000):
        out += batch
        after = batch[-1].stream_id
    return out


def test_the_limit_holds_under_worker_processes_of_this_release_and_the_last(
    spawn: Spawner, qname: str, url: str, r: redis.Redis, tmp_path: Path
) -> None:
    """Three ``echomq worker -c 4`` processes on one queue at ``limit(3)``: two of this tree
    and one of v0.6.0 (its own client code). On the native leg the 0.6 worker asks for
    ``executor=auto``: it needs trafikey 3 and the server loads 4 (the option tail), so it
    runs the Lua scripts beside this tree's native workers, both on one limited queue, as in
    a rolling upgrade. Replaying the event stream, never more than
    three jobs are active at once, and every job runs once."""
    old = materialise("v0.6.0", tmp_path / "releases")
    q = echomq.Queue(qname, url=url)
    q.enable_events(100_000)
    q.limit(3)
    app = echomq.App(url=url)

    @app.task(queue=qname, name="ahold")
    async def ahold(seconds: float) -> None: ...

    jobs = 300
    ahold.enqueue_many([((0.005,), {}) for _ in range(jobs)])
    q.pause()  # every worker is up before the first claim
    # The handlers' bookkeeping client is a plain redis-py one: no ?executor= in its URL.
    env: dict[str, Any] = {"EMQ_TEST_QUEUE": qname, "EMQ_TEST_BOOKS_URL": url.partition("?")[0]}
    workers = [
        spawn.start("worker", "apps.basic:app", "-c", "4", env=spawn.env(**env)) for _ in range(2)
    ]
    workers.append(
        spawn.start(
            "worker",
            "apps.basic:app",
            "-c",
            "4",
            env=old.env(
                spawn.env(**env, ECHOMQ_URL=url.replace("executor=native", "executor=auto"))
            ),
        )
    )
    for w in workers:
        wait_log(w, "serving")
    q.resume()
    done_key = "emqtest:" + qname + ":done"
    try:
        wait_for(lambda: q.counts()["completed"] == jobs, timeout=120)
    except AssertionError:
        raise AssertionError(
            f"{q.counts()}\n" + "\n".join(f"--- {w}\n{w.text()[-3000:]}" for w in workers)
        ) from None
    spawn.stop_all()
    most, started = _max_active(_all_events(q))
    assert most <= 3, most
    assert most == 3  # the limit was reached: the test exercised it
    assert started == jobs and all(int(v) == 1 for v in r.hvals(done_key))
    assert q.check() == []
    q.close()
    app.close()
