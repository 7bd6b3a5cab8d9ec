"""The process pool of a worker: a dying child, CPU-bound jobs, timeouts, cancel and
the pool options.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fleet_support
import pytest

import echomq
from conftest import wait_for
from echomq import App, InvalidArgument, Worker
from procs import pid_gone

# Shared fixtures (bound here so pytest finds them in this module).
inproc = fleet_support.inproc


pytestmark = pytest.mark.executors


def pool_pid(n: int) -> dict[str, int]:
    """CPU-bound work in a pool child: the child's pid and a result."""
    total = 0
    for i in range(n):
        total += i * i % 7
    return {"pid": os.getpid(), "total": total}


def pool_hang(pid_file: str) -> None:
    Path(pid_file).write_text(str(os.getpid()))
    time.sleep(60)


def pool_crash_once() -> int:
    import echomq as _e

    job = _e.current_job()
    assert job is not None
    if job.token == 1:
        os._exit(3)  # the child dies mid-job (a segfault, the OOM killer)
    return os.getpid()


def test_a_pool_child_that_dies_fails_its_run_and_is_replaced(
    inproc: Callable[..., Any], qname: str, caplog: pytest.LogCaptureFixture
) -> None:
    app: App = inproc.make_app()  # type: ignore[attr-defined]
    task = app.task(name="crash", queue=qname, pool="process", keep_result_ms=60_000, backoff=10)(
        pool_crash_once
    )
    handle = inproc(app, concurrency=1, pool_size=1)
    job = task.enqueue()
    with caplog.at_level("WARNING", logger="echomq.worker.jobs"):
        pid = job.wait(30.0)  # the first attempt died with its child; the retry, in a new one
    assert "attempt 1/3) failed: ChildDied: the pool's child exited" in caplog.text
    assert "(exit code 3)" in caplog.text
    assert handle.worker.pool is not None and handle.worker.pool.pids() == [pid]


def test_pool_runs_cpu_bound_jobs_on_persistent_children(
    inproc: Callable[..., Any], qname: str
) -> None:
    app: App = inproc.make_app()  # type: ignore[attr-defined]
    task = app.task(name="cpu", queue=qname, pool="process", keep_result_ms=60_000)(pool_pid)
    handle = inproc(app, concurrency=4, pool_size=2)
    jobs = [task.enqueue(20_000) for _ in range(12)]
    results = [j.wait(30.0) for j in jobs]
    pool = handle.worker.pool
    assert pool is not None and len(pool.pids()) == 2
    used = {res["pid"] for res in results}
    # Persistent: 12 jobs ran on the pool's two children, none of them the worker itself.
    assert used <= set(pool.pids()) and os.getpid() not in used
    assert {res["total"] for res in results} == {pool_pid(20_000)["total"]}


def test_pool_timeout_kills_the_child_and_replaces_it(
    inproc: Callable[..., Any], q: echomq.Queue, qname: str, tmp_path: Path
) -> None:
    app: App = inproc.make_app()  # type: ignore[attr-defined]
    hang = app.task(name="hang", queue=qname, pool="process", timeout=1.0, max_attempts=1)(
        pool_hang
    )
    cpu = app.task(name="cpu", queue=qname, pool="process", keep_result_ms=60_000)(pool_pid)
    handle = inproc(app, concurrency=2, pool_size=1)
    # The child imports this module on its first job (seconds on a loaded machine): that
    # first job is not the one whose 1 s timeout is under test.
    hung = cpu.enqueue(10).wait(30.0)["pid"]
    pid_file = tmp_path / "child.pid"
    job = hang.enqueue(str(pid_file))
    wait_for(pid_file.exists, 60)
    assert int(pid_file.read_text()) == hung  # the same, persistent child
    wait_for(lambda: q.job_state(job.id) == "dead", timeout=60)
    assert q.errors(job.id)[-1].endswith("TimeoutError: the run took longer than 1.0s")
    wait_for(lambda: pid_gone(hung), timeout=60)  # killed
    replacement = cpu.enqueue(10).wait(20.0)["pid"]
    assert replacement != hung and handle.worker.pool is not None
    assert handle.worker.pool.pids() == [replacement]
    assert handle.worker.stats.stranded_threads == 0


def test_cancel_reaches_the_pool_child(
    inproc: Callable[..., Any], q: echomq.Queue, qname: str, tmp_path: Path
) -> None:
    app: App = inproc.make_app()  # type: ignore[attr-defined]
    hang = app.task(name="hang", queue=qname, pool="process", lease_ms=600)(pool_hang)
    handle = inproc(app, concurrency=1, pool_size=1)
    pid_file = tmp_path / "child.pid"
    job = hang.enqueue(str(pid_file))
    wait_for(pid_file.exists, 60)
    child = int(pid_file.read_text())
    assert q.cancel(job.id) == "signalled"
    wait_for(lambda: pid_gone(child), timeout=60)  # the cancel killed the child
    wait_for(lambda: q.job_state(job.id) == "dead", timeout=60)
    assert (q.get_job(job.id) or {}).get("last_error") == "cancelled"
    assert handle.worker.pool is not None
    wait_for(lambda: handle.worker.pool.pids() not in ([], [child]), timeout=60)


def test_pool_options_are_checked(url: str) -> None:
    app = App(url=url)
    try:

        async def coro() -> None:
            return None

        def local() -> None:
            return None

        with pytest.raises(InvalidArgument, match="pool must be None or 'process'"):
            app.task(name="a", pool="thread")(pool_pid)
        with pytest.raises(InvalidArgument, match="pool='process' is for sync"):
            app.task(name="b", pool="process")(coro)
        with pytest.raises(InvalidArgument, match="pool='process' is for sync"):
            app.task(name="c", pool="process", isolate=True)(pool_pid)
        with pytest.raises(InvalidArgument, match="not importable"):
            app.task(name="d", pool="process")(local)
        app.task(name="ok", pool="process")(pool_pid)
        with pytest.raises(InvalidArgument, match="pool_size"):
            Worker(app, pool_size=0)
        assert app.tasks == {"ok": app.tasks["ok"]}  # nothing registered by a refusal
    finally:
        app.close()
