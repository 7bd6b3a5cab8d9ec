"""The worker under what used to break it: a job re-claimed while its older run still goes,
handler exceptions it could not handle (a broken ``__str__``, ``BaseException``s, SystemExit
and KeyboardInterrupt), lifecycle hooks that raise, and — with worker processes on private
servers — a BUSY window, an OOM refusal and a replica outage in durable mode."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import test_worker
from test_worker_procs import call, done, sigterm, stats_of, tokens

import echomq
from conftest import tmp_server, wait_for
from echomq import Hooks, fixed, keyspace
from echomq.server import EmbeddedServer
from procs import Proc, Spawner, wait_log

# The in-process worker fixtures of test_worker.py.
make_app = test_worker.make_app
run_worker = test_worker.run_worker

# --------------------------------------------------------------------------- finding 2


def test_reclaimed_job_keeps_its_heartbeat(make_app, run_worker, qname, r: redis.Redis) -> None:
    """The worker claims again a job it still runs (its lease lapsed and a sweep recovered
    it). The older run is lost and never settles; the newer run keeps its heartbeat and
    completes on its first try. Keyed by id only, the older run's end removed the newer
    run's entry: no heartbeat, re-run after re-run, until dead as "stalled"."""
    app = make_app()
    runs: list[int] = []
    release = threading.Event()

    @app.task(queue=qname, name="slow", lease_ms=600, max_attempts=10)
    async def slow() -> None:
        job = echomq.current_job()
        assert job is not None
        runs.append(job.token)
        if job.token == 1:
            while not release.is_set():  # held until the test has seen the second run
                await asyncio.sleep(0.01)
        else:
            await asyncio.sleep(2.5)  # four leases: only a heartbeat keeps it

    e = slow.enqueue()
    w = run_worker(app, concurrency=4, max_stalled=3)
    wait_for(lambda: runs == [1])
    active = keyspace.queue_key(qname, "active")
    # The first run's lease "lapses" (its deadline moved into the past) until a sweep of
    # this same worker recovers it and its pump claims the job again.
    deadline = time.monotonic() + 10
    while len(runs) < 2:
        assert time.monotonic() < deadline, "the job was not claimed again"
        r.zadd(active, {e.id: 0}, xx=True)
        time.sleep(0.02)
    release.set()
    q = app.queue(qname)
    wait_for(lambda: q.job_state(e.id) in ("absent", "dead"), timeout=60)
    assert q.job_state(e.id) == "absent"  # completed, not dead
    assert runs == [1, 2]  # the second run was never re-delivered
    assert q.counts()["completed"] == 1
    stats = w.stop()
    assert (stats.completed, stats.dead, stats.swept_dead) == (1, 0, 0)
    assert stats.lost >= 1  # the first run: lost when the job was claimed again
    assert q.check() == []


# --------------------------------------------------------------------------- finding 7


class BadStr(Exception):
    def __str__(self) -> str:
        raise ValueError("no text for you")


class Fatal(BaseException):
    """A BaseException that is not an Exception."""


RAISED: dict[str, Callable[[], BaseException]] = {
    "bad-str": BadStr,
    "base-exception": lambda: Fatal("deep"),
    "system-exit": lambda: SystemExit(3),
    "keyboard-interrupt": KeyboardInterrupt,
}
EXPECTED_TEXT = {
    "bad-str": "BadStr: <str() raised ValueError>",
    "base-exception": "Fatal: deep",
    "system-exit": "SystemExit: 3",
    "keyboard-interrupt": "KeyboardInterrupt",
}


@pytest.mark.parametrize("kind", ["inline", "sync", "async", "sync-timeout", "async-timeout"])
@pytest.mark.parametrize("what", list(RAISED))
def test_unhandleable_handler_exceptions_follow_the_policy(
    make_app, run_worker, qname, kind: str, what: str
) -> None:
    """Whatever a handler raises, the job is retried per its policy (here: dead at its
    second attempt) with a usable error, its slot is freed (the next job runs on a worker of
    concurrency 1), and the worker lives on."""
    app = make_app()
    runs: list[int] = []

    def body() -> None:
        job = echomq.current_job()
        assert job is not None
        runs.append(job.token)
        raise RAISED[what]()

    opts: dict[str, Any] = {"queue": qname, "max_attempts": 2, "backoff": fixed(20)}
    if kind.endswith("-timeout"):  # the run goes through asyncio.wait_for
        opts["timeout"] = 30
    if kind.startswith("async"):

        @app.task(name="bad", **opts)
        async def bad() -> None:
            body()

    else:
        app.task(name="bad", inline=kind == "inline", **opts)(body)

    @app.task(queue=qname, name="ok")
    def ok() -> None:
        pass

    q = app.queue(qname)
    e = q.enqueue(b'{"task": "bad", "args": [], "kwargs": {}}')
    w = run_worker(app, concurrency=1)
    wait_for(lambda: q.job_state(e.id) == "dead", timeout=60)
    row = q.get_job(e.id)
    assert row is not None
    assert row["attempts"] == "2" and runs == [1, 2]  # max_attempts honoured, not "stalled"
    assert str(row["last_error"]).startswith(EXPECTED_TEXT[what]), row["last_error"]
    assert w.thread.is_alive() and w.error is None
    after = ok.enqueue()  # the one slot is free again
    wait_for(lambda: q.job_state(after.id) == "absent")
    stats = w.stop()
    assert (stats.dead, stats.retried, stats.completed) == (1, 1, 1)
    assert q.check() == []


def test_handler_raising_cancelled_error_is_a_failure(make_app, run_worker, qname) -> None:
    app = make_app()

    @app.task(queue=qname, name="c", max_attempts=1)
    async def c() -> None:
        raise asyncio.CancelledError("by the handler itself")

    e = c.enqueue()
    w = run_worker(app, concurrency=1)
    q = app.queue(qname)
    wait_for(lambda: q.job_state(e.id) == "dead")
    assert str(q.get_job(e.id)["last_error"]).startswith("CancelledError")  # type: ignore[index]
    assert w.stop().dead == 1


# --------------------------------------------------------------------------- hooks


@pytest.mark.parametrize("style", ["sync", "async"])
def test_lifecycle_hooks(make_app, run_worker, qname, style: str) -> None:
    app = make_app()
    seen: list[tuple[Any, ...]] = []

    @app.task(queue=qname, name="good", inline=True)
    def good() -> None:
        job = echomq.current_job()
        seen.append(("run", job.token if job else None))

    @app.task(queue=qname, name="flaky", max_attempts=2, backoff=fixed(10))
    async def flaky() -> None:
        raise RuntimeError("nope")

    def record(name: str) -> Callable[..., Any]:
        def sync(*args: Any) -> None:
            if name == "before_job":
                assert echomq.current_job() is args[0]  # runs in the job's context
            seen.append((name, *(a.task if isinstance(a, echomq.JobContext) else a for a in args)))

        async def asynchronous(*args: Any) -> None:
            await asyncio.sleep(0)
            sync(*args)

        return sync if style == "sync" else asynchronous

    def broken(*args: Any) -> None:
        raise RuntimeError("a broken hook")

    hooks = Hooks(
        on_startup=record("on_startup"),
        on_shutdown=[record("on_shutdown")],
        before_job=[broken, record("before_job")],  # a hook that raises is only logged
        after_job=[record("after_job"), broken],
    )
    a = good.enqueue()
    b = flaky.enqueue()
    w = run_worker(app, concurrency=2, hooks=hooks)
    q = app.queue(qname)
    wait_for(lambda: q.job_state(a.id) == "absent" and q.job_state(b.id) == "dead")
    stats = w.stop()
    assert (stats.completed, stats.retried, stats.dead) == (1, 1, 1)
    names = [s[0] for s in seen]
    assert names[0] == "on_startup" and names[-1] == "on_shutdown"
    assert ("on_startup", w.worker) in seen and ("on_shutdown", w.worker) in seen
    jobs = [s for s in seen if s[0] in ("before_job", "after_job", "run")]
    assert ("run", 1) in jobs
    assert jobs.count(("before_job", "good")) == 1
    assert jobs.count(("before_job", "flaky")) == 2
    assert ("after_job", "good", "completed", None) in jobs
    failures = [s for s in jobs if s[:2] == ("after_job", "flaky")]
    assert [s[2] for s in failures] == ["retried", "dead"]
    assert all(isinstance(s[3], RuntimeError) for s in failures)


def test_hooks_are_checked(make_app, qname) -> None:
    app = make_app()
    app.task(queue=qname, name="t")(lambda: None)
    with pytest.raises(TypeError):
        Hooks(before_job=42)
    with pytest.raises(echomq.InvalidArgument):
        echomq.Worker(app, hooks=lambda: None)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- finding 3


@pytest.fixture
def private(tmp_path: Path) -> Iterator[EmbeddedServer]:
    """A server of the test's own, free to be made BUSY or full."""
    srv = tmp_server(tmp_path / "private", appendonly=False)
    yield srv
    srv.stop()


def _worker(spawn: Spawner, url: str, qname: str, *opts: str, **env: str) -> Proc:
    w = spawn.start(
        "worker",
        "apps.basic:app",
        "-c",
        "8",
        "--beat-ms",
        "100",
        *opts,
        env=spawn.env(EMQ_TEST_QUEUE=qname, ECHOMQ_URL=url, **env),
    )
    wait_log(w, "serving")
    return w


def _rides_out(
    spawn: Spawner,
    srv: EmbeddedServer,
    qname: str,
    books: redis.Redis,
    window: Callable[[redis.Redis], None],
) -> Proc:
    """A backlog is being worked when ``window`` makes the server refuse commands for a
    while: the worker finishes the backlog afterwards, dead-letters nothing, and still has
    all 8 of its slots. The handlers keep their books on another server (``books``), so
    only the worker's own calls meet the refusals."""
    r = redis.Redis.from_url(srv.url)
    q = echomq.Queue(qname, url=srv.url)
    books_url = "redis://{host}:{port}/{db}".format(**books.get_connection_kwargs())
    w = _worker(spawn, srv.url, qname, EMQ_TEST_BOOKS_URL=books_url)
    receipts = q.enqueue_many([call("ahold", 0.05) for _ in range(400)])
    ids = [x.id for x in receipts if isinstance(x, echomq.Enqueued)]
    assert len(ids) == 400
    wait_for(lambda: q.counts()["completed"] >= 40, timeout=60)
    window(r)
    assert q.counts()["completed"] < 400, "the backlog ended before the window"
    try:
        wait_for(lambda: q.counts()["completed"] == 400, timeout=60)
    except AssertionError:
        raise AssertionError(f"{q.counts()}\n{w.text()[-4000:]}") from None
    counts = q.counts()
    assert (counts["dead"], counts["pending"], counts["active"]) == (0, 0, 0), counts
    assert done(books, qname) == dict.fromkeys(ids, 1)  # each ran to its end, once
    # Every slot came back: 8 long jobs all run at once. One slot short, the 8th would start
    # only when one of them had finished: none has when the 8th starts (an ordering; it was
    # "all 8 started within 1.2 s", a clock on a busy machine, issue 36).
    books.delete(f"emqtest:{qname}:tokens")
    held = [q.enqueue(call("ahold", 20)).id for _ in range(8)]
    wait_for(lambda: len(tokens(books, qname)) == 8, timeout=60)
    assert not set(done(books, qname)) & set(held)
    wait_for(lambda: all(q.job_state(i) == "absent" for i in held), timeout=120)
    assert sigterm(w) == 0, w.text()
    s = stats_of(w)
    assert s["dead"] == 0 and s["completed"] >= 408, s
    assert q.check() == []
    q.close()
    r.close()
    return w


def test_worker_rides_out_a_busy_window(
    spawn: Spawner, private: EmbeddedServer, qname: str, r: redis.Redis
) -> None:
    def busy(r: redis.Redis) -> None:
        r.config_set("busy-reply-threshold", 100)
        spin = """
        local function us() local t = redis.call('TIME') return t[1] * 1000000 + t[2] end
        local start = us()
        while us() - start < 2000000 do end
        return 1"""
        other = redis.Redis.from_url(private.url, socket_timeout=30)
        runner = threading.Thread(target=other.eval, args=(spin, 0))
        runner.start()
        time.sleep(0.5)
        with pytest.raises(redis.ResponseError, match="BUSY"):
            r.ping()  # the server answers BUSY to everyone else now
        runner.join(60)
        other.close()

    w = _rides_out(spawn, private, qname, r, busy)
    assert "BUSY" in w.text()  # the worker's own calls met the window


def test_worker_rides_out_an_oom_refusal(
    spawn: Spawner, private: EmbeddedServer, qname: str, r: redis.Redis
) -> None:
    def full(r: redis.Redis) -> None:
        r.config_set("maxmemory", 1)
        try:
            time.sleep(0.3)
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                r.set(f"emqtest:{qname}:probe", b"x")
            time.sleep(2.0)
        finally:
            r.config_set("maxmemory", 0)

    # Which of the worker's calls the server refuses depends on each script's first write
    # (a write that may grow memory is refused, one that frees memory is not); the worker
    # must ride out whichever it meets.
    _rides_out(spawn, private, qname, r, full)


# --------------------------------------------------------------------------- finding 4


def test_durable_worker_runs_what_it_claimed_while_no_replica_acks(
    spawn: Spawner, tmp_path: Path, qname: str
) -> None:
    """Durable mode (one replica) with the replica stopped: every settle applies on the
    primary but raises DurabilityError. The jobs a settle claimed must still run; discarded,
    they waited out their lease and died "stalled" (max_stalled 1) without running."""
    # The full sync starts at once (the default waits 5 s for more replicas).
    primary = tmp_server(
        tmp_path / "primary", appendonly=False, args=["--repl-diskless-sync-delay", "0"]
    )
    replica = tmp_server(
        tmp_path / "replica", appendonly=False, args=["--replicaof", "127.0.0.1", str(primary.port)]
    )
    r = redis.Redis.from_url(primary.url)
    try:
        wait_for(lambda: r.info("replication")["connected_slaves"] == 1, timeout=60)
        w = _worker(
            spawn, primary.url, qname, "--max-stalled", "1",
            EMQ_TEST_DURABLE="1", EMQ_TEST_LEASE_MS="8000",
        )  # fmt: skip
        q = echomq.Queue(qname, url=primary.url)  # the producer is not durable
        assert replica.pid is not None
        replica_pid = replica.pid
        os.kill(replica_pid, signal.SIGSTOP)
        try:
            ids = [q.enqueue(call("count", n)).id for n in range(12)]
            wait_log(w, "replicas acknowledged", timeout=15)  # a settle met the outage
            time.sleep(3)
        finally:
            os.kill(replica_pid, signal.SIGCONT)
        wait_for(lambda: q.counts()["completed"] + q.counts()["dead"] >= 12, timeout=60)
        counts = q.counts()
        assert counts["dead"] == 0 and counts["completed"] == 12, counts
        assert set(done(r, qname)) == set(ids)
        assert sigterm(w, timeout=60) == 0, w.text()
        assert stats_of(w)["dead"] == 0
        q.close()
    finally:
        r.close()
        replica.stop()
        primary.stop()


# --------------------------------------------------------------------------- slots


def test_slots_are_the_only_way_in_and_out() -> None:
    from echomq.runtime.slots import Slots

    kicks: list[int] = []
    slots = Slots(3, lambda: kicks.append(1))
    assert slots.acquire(2) == 2 and slots.free == 1
    assert slots.acquire(5) == 1 and slots.free == 0 and slots.used == 3
    assert slots.acquire(1) == 0  # none left: nothing taken
    slots.release(2)
    assert slots.free == 2 and kicks == [1]  # a release wakes the pumps
    slots.release(0)
    assert kicks == [1]
    with pytest.raises(RuntimeError):
        slots.release(2)  # more than were taken: a bookkeeping bug, never silent
    for bad in (0, -1, 1_000_001, True, 2.0):
        with pytest.raises(echomq.InvalidArgument):
            Slots(bad)  # type: ignore[arg-type]
