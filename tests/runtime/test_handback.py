"""Issue 36, item 1: a job a graceful shutdown hands back spends no attempt, yet the fence
still moves (a stale holder of the handed-back run stays refused). Each test runs real
in-process Workers against the leg's server, on both executors."""

from __future__ import annotations

import asyncio
import json
import signal
import threading

import pytest
import redis

import echomq
from conftest import running, wait_for
from echomq import App, StaleToken, Worker, current_job
from procs import Spawner

pytestmark = pytest.mark.executors


def _hanging_task(
    app: App, qname: str, started: threading.Event, state: dict[str, str]
) -> list[tuple[int, int]]:
    """Task ``t``: records each run's (attempt, token) in the list returned; hangs while
    ``state['mode']`` is ``hang`` (until a shutdown cancels it), raises once in ``fail``
    mode, else returns."""
    runs: list[tuple[int, int]] = []

    @app.task(queue=qname, name="t", max_attempts=3, backoff=lambda n: 0)
    async def t() -> str:
        job = current_job()
        assert job is not None
        runs.append((job.attempt, job.token))
        started.set()
        while state["mode"] == "hang":
            await asyncio.sleep(0.01)
        if state["mode"] == "fail":
            state["mode"] = "ok"
            raise RuntimeError("a real failure")
        return "ok"

    return runs


def _hand_back_once(app: App, started: threading.Event) -> None:
    """Run a worker until its hanging handler started, then stop it with a short grace: the
    run is handed back to pending (the shutdown of a deploy)."""
    started.clear()
    w = Worker(app, beat_ms=100, grace_s=0.05)
    with running(w):
        assert started.wait(30), "the handler never started"
    assert w.stats.handed_back == 1


def test_two_hand_backs_and_one_failure_do_not_dead_letter(url: str, qname: str) -> None:
    """The issue's story: two deploys (the job handed back at each) and one real failure
    leave a max_attempts=3 job retried, then completed, not dead; each run reports the
    attempt number the ceiling counts (1, 1, 1, then 2) while the tokens keep growing."""
    app = App(url=url)
    started, state = threading.Event(), {"mode": "hang"}
    runs = _hanging_task(app, qname, started, state)
    q = app.queue(qname)
    try:
        e = app.tasks["t"].enqueue()
        _hand_back_once(app, started)
        _hand_back_once(app, started)
        assert q.job_state(e.id) == "pending"
        row = q.get_job(e.id)
        state["mode"] = "fail"
        with running(Worker(app, beat_ms=100)):
            wait_for(lambda: len(runs) >= 4 or q.job_state(e.id) == "dead", 30)
            wait_for(lambda: q.job_state(e.id) in ("absent", "dead"), 30)
        assert q.job_state(e.id) == "absent"  # completed, not dead-lettered
        assert runs == [(1, 1), (1, 2), (1, 3), (2, 4)]
        # Each claim minted a token (the fence moved); both handed-back runs are discounted.
        assert row is not None and (int(row["attempts"]), int(row.get("floor", 0))) == (2, 2)
    finally:
        state["mode"] = "ok"
        app.close()


def test_a_stale_holder_of_a_handed_back_run_stays_refused(url: str, qname: str) -> None:
    """After a hand-back the handed-back run's token is refused, and stays refused after the
    next claim: the hand-back never lowers ``attempts`` (the token claim mints), it raises
    ``floor``, so the next run is attempt 1 again with a new token."""
    app = App(url=url)
    started, state = threading.Event(), {"mode": "hang"}
    _hanging_task(app, qname, started, state)
    q = app.queue(qname)
    try:
        e = app.tasks["t"].enqueue()
        _hand_back_once(app, started)
        with pytest.raises(StaleToken):
            q.complete(e.id, 1)
        again = q.claim(lease_ms=60_000)
        assert again is not None and again.id == e.id
        assert (again.token, again.attempt, again.floor) == (2, 1, 1)
        for stale in (
            lambda: q.complete(e.id, 1),
            lambda: q.retry(e.id, 1, delay_ms=0, max_attempts=1, error="stale"),
            lambda: q.extend(e.id, 1, lease_ms=1000),
        ):
            with pytest.raises(StaleToken):
                stale()
        # The ceiling counts this incarnation's runs from the floor: at max_attempts=2 the
        # first real failure retries, the second dead-letters.
        assert q.retry(e.id, 2, delay_ms=0, max_attempts=2, error="x") == "scheduled"
        wait_for(lambda: q.promote() or q.job_state(e.id) == "pending")
        third = q.claim(lease_ms=60_000)
        assert third is not None and (third.token, third.attempt) == (3, 2)
        assert q.retry(e.id, 3, delay_ms=0, max_attempts=2, error="x") == "dead"
    finally:
        state["mode"] = "ok"
        app.close()


# The Lua leg only: tests/apps/basic.py opens its bookkeeping client from the app's URL,
# which cannot carry ?executor=native; the in-process tests above cover both executors.
@pytest.mark.executors("lua")
def test_sigterm_past_grace_hands_back_without_spending_an_attempt(
    spawn: Spawner, q: echomq.Queue, qname: str, r: redis.Redis
) -> None:
    """The real deploy: ``echomq worker`` gets SIGTERM while a job runs past ``--grace``.
    The job is pending at once with ``floor`` = ``attempts`` = 1, and its next claim is
    attempt 1 on token 2 (the handed-back token refused)."""
    w = spawn.worker(qname, "-c", "1", "--grace", "0.3")  # a 30 s lease: it never lapses
    e = q.enqueue(json.dumps({"task": "ahold", "args": [30], "kwargs": {}}).encode())
    try:
        wait_for(lambda: r.llen(f"emqtest:{qname}:tokens") == 1, 30)
    except AssertionError:
        raise AssertionError(f"the job never started:\n{w.text()}") from None
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.text()
    assert q.job_state(e.id) == "pending"
    row = q.get_job(e.id)
    assert row is not None and (row["attempts"], row.get("floor")) == ("1", "1")
    job = q.claim(lease_ms=60_000)
    assert job is not None and (job.id, job.token, job.attempt) == (e.id, 2, 1)
    with pytest.raises(StaleToken):
        q.complete(e.id, 1)
    q.complete(e.id, job.token)
