"""The worker fleet (issue 25): ``echomq worker -p N`` (a supervisor and its worker children,
as real processes, pids checked), the worker registry (``Queue.workers()``, ``echomq
workers``), the process pool (``@app.task(pool="process")``) and metrics without double
counting. Short beats and leases keep each test to seconds.

The process pool tests are in test_fleet_pool.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fleet_support
import pytest
import redis
from worker_support import InProcWorker

import echomq
from conftest import server_ms, wait_for
from echomq import App, Worker
from echomq.client import layout as _layout
from echomq.protocol.registry import WorkerInfo
from procs import Proc, Spawner, pid_gone, wait_log

# Shared fixtures (bound here so pytest finds them in this module).
inproc = fleet_support.inproc


pytestmark = pytest.mark.executors


def call(task: str, *args: object) -> bytes:
    return json.dumps({"task": task, "args": list(args), "kwargs": {}}).encode()


def done(r: redis.Redis, queue: str) -> dict[str, int]:
    raw = r.hgetall(f"emqtest:{queue}:done")
    return {k.decode(): int(v) for k, v in raw.items()}


def ppid_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rpartition(")")[2].split()[1])


def supervisor(
    spawn: Spawner, queue: str, *options: str, lease_ms: int = 30_000, **extra: str
) -> Proc:
    """``echomq worker apps.fleet:app -p ...`` on ``queue``."""
    env = spawn.env(
        EMQ_TEST_QUEUE=queue,
        EMQ_TEST_LEASE_MS=str(lease_ms),
        # The handlers' bookkeeping client takes no echomq option (executor=native).
        EMQ_TEST_BOOKS_URL=spawn.url.partition("?")[0],
        **extra,
    )
    return spawn.start("worker", "apps.fleet:app", *options, env=env)


def fleet(q: echomq.Queue, n: int, timeout: float = 120.0) -> list[WorkerInfo]:
    """Wait until ``n`` workers are registered on ``q``; their entries."""
    found: list[WorkerInfo] = []

    def ready() -> bool:
        nonlocal found
        found = q.workers()
        return len(found) == n

    wait_for(ready, timeout=timeout)
    return found


def test_sigkilled_child_is_restarted_and_its_jobs_come_back_once(
    spawn: Spawner, q: echomq.Queue, qname: str, r: redis.Redis
) -> None:
    sup = supervisor(spawn, qname, "-p", "2", "-c", "2", "--beat-ms", "100", lease_ms=1000)
    workers = fleet(q, 2)
    assert {w.supervisor for w in workers} == {workers[0].supervisor} != {None}
    assert all(ppid_of(w.pid) == sup.pid for w in workers)  # both are the supervisor's
    # 4 slots, 4 jobs: each child holds two; the first attempt runs 3 s, a retry 0.1 s.
    ids = [q.enqueue(call("hold", 3.0, 0.1)).id for _ in range(4)]
    held: list[WorkerInfo] = []

    def both_hold() -> bool:
        nonlocal held
        held = q.workers()
        return len(held) == 2 and all(w.held == 2 for w in held)

    wait_for(both_hold, timeout=60)
    # The registry lists the jobs each child holds, by id and task.
    assert sorted(j.id for w in held for j in w.jobs) == sorted(ids)
    assert {j.task for w in held for j in w.jobs} == {"hold"}
    victim = held[0]
    last = next(w for w in q.workers() if w.id == victim.id)
    os.kill(victim.pid, signal.SIGKILL)
    wait_for(lambda: pid_gone(victim.pid), timeout=60)
    # Restarted: a new child of the same supervisor; the dead one's entry lapses in its TTL.
    after: list[WorkerInfo] = []

    def replaced() -> bool:
        nonlocal after
        after = q.workers()
        return len(after) == 2 and victim.id not in {w.id for w in after}

    wait_for(replaced, timeout=60)
    # Gone within one TTL of its last beat (at most one more beat came after our read): once
    # the server's clock is past that, it is not listed. (It was "the replacement was seen
    # within 600 ms of the lapse", which a slow child start on a busy machine failed.)
    wait_for(lambda: server_ms(r) > last.lapses_ms + 100 + 500, timeout=60)
    assert victim.id not in {w.id for w in q.workers()}
    assert {w.supervisor for w in after} == {victim.supervisor}
    assert all(ppid_of(w.pid) == sup.pid for w in after)
    wait_log(sup, f"(pid {victim.pid}) exited")
    assert "killed by SIGKILL" in sup.text()
    # Its two jobs come back through the stall sweep (lease 1 s) and run again: every job
    # settled once, and each handler's run that returned counted once.
    wait_for(lambda: q.counts()["completed"] == 4, timeout=60)
    assert done(r, qname) == dict.fromkeys(ids, 1)
    counts = q.counts()
    assert counts == {**counts, "pending": 0, "active": 0, "dead": 0}
    sup.signal(signal.SIGTERM)
    assert sup.wait(60) == 0, sup.text()[-3000:]
    assert all(pid_gone(w.pid) for w in after)
    assert q.workers() == []  # a graceful stop removes the entries at once


def test_sigterm_mid_run_finishes_or_hands_back_and_leaves_no_child(
    spawn: Spawner, q: echomq.Queue, qname: str, r: redis.Redis
) -> None:
    # A grace far past the short runs, however slow the machine; long runs past any wait.
    sup = supervisor(spawn, qname, "-p", "2", "-c", "2", "--beat-ms", "100", "--grace", "15")
    workers = fleet(q, 2)
    pids = [w.pid for w in workers]
    short = [q.enqueue(call("hold", 0.5, 0.5)).id for _ in range(2)]
    long = [q.enqueue(call("hold", 300.0, 300.0)).id for _ in range(2)]
    try:
        wait_for(lambda: sum(w.held for w in q.workers()) == 4, timeout=60)
    except AssertionError:
        raise AssertionError(f"{q.workers()} {q.counts()}\n{sup.text()}") from None
    sup.signal(signal.SIGTERM)
    assert sup.wait(60) == 0, sup.text()[-3000:]  # the grace, then the hand-back
    for pid in pids:
        assert pid_gone(pid), f"child {pid} left behind"
    # The short jobs finished within the grace; the hung ones went back to pending at once.
    assert done(r, qname) == dict.fromkeys(short, 1)
    assert sorted(q.browse("pending")) == sorted(long)
    counts = q.counts()
    assert counts == {**counts, "active": 0, "completed": 2, "pending": 2}
    assert q.workers() == []
    assert "handed 1 unfinished jobs" in sup.text() or "handed 2 unfinished jobs" in sup.text()


def test_sigterm_to_every_process_stops_gracefully_once(
    spawn: Spawner, q: echomq.Queue, qname: str
) -> None:
    """systemd's default KillMode=control-group signals every process of the unit: a child
    gets SIGTERM itself and through its supervisor's pipe, and still stops gracefully."""
    sup = supervisor(spawn, qname, "-p", "2", "-c", "1", "--beat-ms", "100", "--grace", "1")
    pids = [w.pid for w in fleet(q, 2)]
    long = [q.enqueue(call("hold", 30.0, 30.0)).id for _ in range(2)]
    wait_for(lambda: sum(w.held for w in q.workers()) == 2, timeout=60)
    for pid in (*pids, sup.pid):
        os.kill(pid, signal.SIGTERM)
    assert sup.wait(60) == 0, sup.text()[-3000:]
    assert "second signal" not in sup.text()
    assert all(pid_gone(p) for p in pids)
    assert sorted(q.browse("pending")) == sorted(long)  # handed back, not left to lapse


def test_a_second_signal_stops_the_children_at_once(
    spawn: Spawner, q: echomq.Queue, qname: str
) -> None:
    # A grace and runs past the wait below: the supervisor exits within it only if the
    # second signal stops the children (an outcome, where "< 10 s" was, issue 36).
    sup = supervisor(spawn, qname, "-p", "2", "-c", "1", "--beat-ms", "100", "--grace", "300")
    pids = [w.pid for w in fleet(q, 2)]
    for _ in range(2):
        q.enqueue(call("hold", 300.0, 300.0))
    wait_for(lambda: sum(w.held for w in q.workers()) == 2, timeout=60)
    sup.signal(signal.SIGTERM)
    wait_log(sup, "stopping 2 workers")
    sup.signal(signal.SIGTERM)
    sup.wait(60)
    assert "second signal (SIGTERM): stopping the workers now" in sup.text()
    assert all(pid_gone(p) for p in pids)
    assert q.counts()["active"] == 2  # nothing handed back: the leases lapse and are swept


def test_each_child_serves_its_own_metrics(spawn: Spawner, q: echomq.Queue, qname: str) -> None:
    pytest.importorskip("prometheus_client")
    import httpx

    port = 0
    for _ in range(100):  # two consecutive free ports (another test may hold the next one)
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            try:
                b.bind(("127.0.0.1", a.getsockname()[1] + 1))
            except OSError:
                continue
            port = a.getsockname()[1]
            break
    assert port, "no two consecutive free ports"
    sup = supervisor(
        spawn, qname, "-p", "2", "-c", "2", "--beat-ms", "100",
        "--metrics-port", str(port), "--metrics-host", "127.0.0.1",
    )  # fmt: skip
    fleet(q, 2)
    ids = [q.enqueue(call("count", n)).id for n in range(20)]
    wait_for(lambda: q.counts()["completed"] == len(ids), timeout=60)

    def scrape(p: int) -> str:
        return httpx.get(f"http://127.0.0.1:{p}/metrics", timeout=5).text

    first, second = scrape(port), scrape(port + 1)
    # The server-wide gauges once (the first child), each child's own series on its port.
    assert f'echomq_jobs{{queue="{qname}",state="pending"}}' in first
    assert "echomq_jobs{" not in second

    def finished(text: str) -> float:
        found = re.findall(
            rf'echomq_jobs_finished_total{{outcome="completed",queue="{qname}",task="count"}} '
            r"([\d.]+)",
            text,
        )
        return float(found[0]) if found else 0.0

    assert finished(first) + finished(second) == 20  # no double counting
    sup.signal(signal.SIGTERM)
    assert sup.wait(60) == 0


def test_children_stop_when_the_supervisor_is_sigkilled(
    spawn: Spawner, q: echomq.Queue, qname: str
) -> None:
    sup = supervisor(spawn, qname, "-p", "2", "--beat-ms", "100", "--grace", "1")
    pids = [w.pid for w in fleet(q, 2)]
    sup.signal(signal.SIGKILL)
    sup.wait(60)
    # The control pipe's EOF: each child stops gracefully on its own and leaves the registry.
    wait_for(lambda: all(pid_gone(p) for p in pids), timeout=60)
    assert q.workers() == []


def test_a_crash_loop_backs_off_then_exits_non_zero(spawn: Spawner, qname: str) -> None:
    env = spawn.env(EMQ_TEST_QUEUE=qname, EMQ_TEST_CRASH="7")
    t0 = time.monotonic()
    sup = spawn.start("worker", "apps.fleet:app", "-p", "2", env=env)
    assert sup.wait(30) == 3, sup.text()[-3000:]
    elapsed = time.monotonic() - t0
    text = sup.text()
    delays = [float(d) for d in re.findall(r"worker 0 .*restarting in ([\d.]+)s", text)]
    assert delays == [0.25, 0.5, 1.0, 2.0], text  # exponential backoff, then it gives up
    assert elapsed >= sum(delays)
    assert "exit status 7" in text
    assert "failed to start 5 times in a row" in text
    # Nothing is left running: every child the supervisor started is gone.
    started = [int(p) for p in re.findall(r"worker \d started \(pid (\d+)\)", text)]
    assert len(started) >= 5 and all(pid_gone(p) for p in started)


def test_spawned_children_register_and_stop(spawn: Spawner, q: echomq.Queue, qname: str) -> None:
    sup = supervisor(
        spawn, qname, "-p", "2", "-c", "3", "--beat-ms", "100", ECHOMQ_START_METHOD="spawn"
    )
    workers = fleet(q, 2)
    assert "2 worker processes (spawn)" in sup.text()
    assert {w.concurrency for w in workers} == {3}
    assert all(ppid_of(w.pid) == sup.pid for w in workers)
    ids = [q.enqueue(call("count", n)).id for n in range(20)]
    wait_for(lambda: q.counts()["completed"] == len(ids), timeout=60)
    sup.signal(signal.SIGTERM)
    assert sup.wait(60) == 0, sup.text()[-3000:]
    assert all(pid_gone(w.pid) for w in workers)


def test_max_jobs_per_child_recycles_gracefully(
    spawn: Spawner, q: echomq.Queue, qname: str, r: redis.Redis
) -> None:
    sup = supervisor(spawn, qname, "-c", "1", "--beat-ms", "100", "--max-jobs-per-child", "3")
    first = fleet(q, 1)[0]
    ids = [q.enqueue(call("count", n)).id for n in range(10)]
    wait_for(lambda: q.counts()["completed"] == 10, timeout=30)
    assert done(r, qname) == dict.fromkeys(ids, 1)
    assert sup.text().count("recycled itself") >= 3
    assert pid_gone(first.pid)
    sup.signal(signal.SIGTERM)
    assert sup.wait(60) == 0, sup.text()[-3000:]


def test_max_memory_per_child_recycles(spawn: Spawner, q: echomq.Queue, qname: str) -> None:
    # 1 MiB: every child is past it at once, so each recycles itself and is replaced.
    sup = supervisor(spawn, qname, "--beat-ms", "100", "--max-memory-per-child", "1")
    wait_log(sup, "recycled itself", timeout=20)
    text = wait_log(sup, "worker 0 started", timeout=20)
    assert "recycling (resident memory" in text
    wait_for(lambda: sup.text().count("recycled itself") >= 2, timeout=60)
    sup.signal(signal.SIGTERM)
    assert sup.wait(60) == 0, sup.text()[-3000:]
    started = [int(p) for p in re.findall(r"worker 0 started \(pid (\d+)\)", sup.text())]
    assert len(set(started)) >= 3 and all(pid_gone(p) for p in started)


def test_a_child_that_cannot_even_be_started_is_a_failed_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from echomq.runtime.supervisor import EXIT_FAILING, Supervisor

    def never(index: int, fd: int) -> int:
        raise AssertionError("not forked")

    sup = Supervisor(
        1, run_child=never, spawn_argv=lambda i: ["/nonexistent/python"], grace_s=1.0,
        method="spawn",
    )  # fmt: skip
    t0 = time.monotonic()
    with caplog.at_level("WARNING", logger="echomq.supervisor"):
        assert sup.run() == EXIT_FAILING
    assert time.monotonic() - t0 >= 0.25 + 0.5 + 1 + 2  # backed off between the attempts
    assert "could not be started 5 times" in caplog.text


def test_processes_auto_is_one_per_cpu(spawn: Spawner, q: echomq.Queue, qname: str) -> None:
    cpus = len(os.sched_getaffinity(0))
    sup = supervisor(spawn, qname, "-p", "auto", "--beat-ms", "100")
    workers = fleet(q, cpus)
    assert f"{cpus} worker processes" in sup.text()
    assert len({w.pid for w in workers}) == cpus
    sup.signal(signal.SIGTERM)
    assert sup.wait(60) == 0


def test_bad_processes_are_refused(spawn: Spawner, qname: str) -> None:
    env = spawn.env(EMQ_TEST_QUEUE=qname)
    for bad in ("0", "-1", "two"):
        p = spawn.start("worker", "apps.fleet:app", "-p", bad, env=env)
        assert p.wait(60) == 2
        assert "-p/--processes must be a count >= 1 or 'auto'" in p.text()


def test_registry_entry_lists_held_jobs_and_goes_at_stop(
    inproc: Callable[..., Any], q: echomq.Queue, qname: str, r: redis.Redis, url: str
) -> None:
    app: App = inproc.make_app()  # type: ignore[attr-defined]
    gate = asyncio.Event()

    @app.task(name="wait", queue=qname)
    async def wait() -> None:
        await gate.wait()

    handle = inproc(app, concurrency=3)
    jobs = [wait.enqueue().id for _ in range(2)]
    entry: list[WorkerInfo] = []

    def holds_both() -> bool:
        nonlocal entry
        entry = q.workers()
        return len(entry) == 1 and entry[0].held == 2

    wait_for(holds_both, timeout=60)
    (w,) = entry
    assert w.id == handle.worker.id and w.pid == os.getpid() and w.supervisor is None
    assert (w.queues, w.concurrency, w.version) == ([qname], 3, echomq.__version__)
    assert w.executor == ("native" if "executor=native" in url else "lua")
    assert sorted(j.id for j in w.jobs) == sorted(jobs) and {j.task for j in w.jobs} == {"wait"}
    assert all(w.last_beat_ms - 1000 <= j.since_ms <= w.last_beat_ms for j in w.jobs)
    assert w.last_beat_ms < w.lapses_ms == w.last_beat_ms + 1000  # TTL: 5 beats, >= 1 s

    # The same answer from an AsyncQueue.
    async def alist() -> list[WorkerInfo]:
        async with echomq.AsyncQueue(qname, url=url) as aq:
            return await aq.workers()

    assert [x.id for x in asyncio.run(alist())] == [w.id]
    # CLIENT SETNAME: the worker's connections carry its id.
    names = [c["name"] for c in r.client_list()]
    assert f"echomq-worker:{w.id}" in names
    handle.loop.call_soon_threadsafe(gate.set)
    wait_for(lambda: q.counts()["completed"] == 2, timeout=60)
    wait_for(lambda: q.workers()[0].held == 0, timeout=60)
    handle.stop()
    assert q.workers() == []
    assert r.exists(f"emq:{{{qname}}}:workers", f"emq:{{{qname}}}:workers:ttl") == 0


def test_a_worker_whose_user_may_not_name_connections_still_runs(
    q: echomq.Queue, qname: str, r: redis.Redis, redis_url: str, url: str
) -> None:
    """An ACL user without ``client|setname`` (the rule set before the registry): the
    worker's connections stay unnamed, it serves and registers as usual."""
    user = f"fleet-{os.getpid()}"
    r.execute_command("ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", "-client|setname")
    try:
        host_url = url.replace("redis://", f"redis://{user}:pw@", 1)
        app = App(url=host_url)
        seen: list[str] = []

        @app.task(name="one", queue=qname)
        async def one() -> None:
            seen.append("ran")

        handle = InProcWorker(Worker(app, beat_ms=100))
        try:
            one.enqueue()
            wait_for(lambda: seen == ["ran"], timeout=60)
            wait_for(lambda: len(q.workers()) == 1, timeout=60)
            names = [c["name"] for c in r.client_list() if c.get("user") == user]
            assert names and not any(n.startswith("echomq-worker:") for n in names)
        finally:
            handle.stop()
            app.close()
    finally:
        r.execute_command("ACL", "DELUSER", user)


def test_durable_mode_without_replicas_still_registers(
    q: echomq.Queue, qname: str, url: str
) -> None:
    """A beat that applied but too few replicas acknowledged (DurabilityError) is a beat: the
    registry is a visibility record, not a job's state."""
    from echomq.client.connect import async_client
    from echomq.client.executor import AsyncExecutor
    from echomq.protocol.kernel import Keys
    from echomq.runtime.queueloop import QueueLoop
    from echomq.runtime.worker_registry import Registry

    async def beat() -> None:
        # The test server has no replica: every write's WAIT falls short.
        x = AsyncExecutor(async_client(url), owned=True, durable=1)
        try:
            # A 2 s beat: its 10 s TTL outlives the WAIT's own timeout.
            await Registry([qname], 1, 2000).beat(x, [QueueLoop(Keys(qname), 1000)])
        finally:
            await x.close()

    asyncio.run(beat())
    assert len(q.workers()) == 1


def test_a_lapsed_entry_is_gone_within_its_ttl_and_pruned(
    q: echomq.Queue, qname: str, r: redis.Redis
) -> None:
    """A worker that stops beating (SIGKILL) drops out of listings at its lapse, its entry is
    pruned by any other worker's beat, and the keys expire with the last entry."""
    from echomq.protocol import registry as _registry
    from echomq.protocol.kernel import Keys
    from echomq.runtime import worker_registry as _worker_registry

    k = Keys(qname)
    dead, live = echomq.ids.mint("WRK"), echomq.ids.mint("WRK")
    entry = _worker_registry.Registry([qname], 1, 100).entry([], "lua")
    workers = f"emq:{{{qname}}}:workers"
    # TTLs of seconds, not 300 ms: each must outlast the reads that expect it alive on a busy
    # machine; its lapse is waited for (issue 36).
    q._x.run(_registry.beat(k, live, entry, 120_000))
    q._x.run(_registry.beat(k, dead, entry, 3000))
    assert {w.id for w in q.workers()} == {dead, live}
    wait_for(lambda: [w.id for w in q.workers()] == [live])  # lapsed: not listed,
    assert r.hexists(workers, dead)  # though not yet pruned
    q._x.run(_registry.beat(k, live, entry, 3000))
    assert [w.id for w in q.workers()] == [live]
    assert not r.hexists(workers, dead)  # pruned by the live beat
    # The keys live as long as the last entry: here 3 s.
    assert 0 < r.pttl(workers) <= 3000 and 0 < r.pttl(workers + ":ttl") <= 3000
    wait_for(lambda: r.exists(workers, workers + ":ttl") == 0)
    assert q.workers() == []


def test_echomq_workers_with_none(spawn: Spawner, q: echomq.Queue, qname: str) -> None:
    q.enqueue(b"x")
    listing = spawn.start("workers", qname)
    assert listing.wait(60) == 0 and listing.text().strip() == f"no live workers on {qname}"


def test_obliterate_removes_the_registry(q: echomq.Queue, qname: str, r: redis.Redis) -> None:
    from echomq.protocol import registry as _registry
    from echomq.protocol.kernel import Keys
    from echomq.runtime import worker_registry as _worker_registry

    entry = _worker_registry.Registry([qname], 1, 100).entry([], "lua")
    q._x.run(_registry.beat(Keys(qname), echomq.ids.mint("WRK"), entry, 60_000))
    assert len(q.workers()) == 1
    q.pause()
    q.obliterate()
    assert r.exists(f"emq:{{{qname}}}:workers", f"emq:{{{qname}}}:workers:ttl") == 0


def test_echomq_workers_and_stats_show_the_fleet(
    spawn: Spawner, q: echomq.Queue, qname: str
) -> None:
    sup = supervisor(spawn, qname, "-p", "2", "-c", "2", "--beat-ms", "100")
    workers = fleet(q, 2)
    q.enqueue(call("hold", 30.0, 30.0))
    wait_for(lambda: sum(w.held for w in q.workers()) == 1, timeout=60)
    listing = spawn.start("workers", qname)
    assert listing.wait(60) == 0, listing.text()
    text = listing.text()
    for w in workers:
        assert f"{w.id} " in text and f"pid={w.pid}" in text
        assert f"supervisor={w.supervisor}" in text
        # Issue 39: each line says the worker's release and the data layouts it serves.
        serves = f"{_layout.MIN_LAYOUT}..{_layout.LAYOUT}"
        assert f"{w.id} version={echomq.__version__} layout={serves} {w.executor} " in text
    assert re.search(r"JOB\w+ hold for [\d.]+s", text), text
    stats = spawn.start("stats", qname)
    assert stats.wait(60) == 0, stats.text()
    # A table, or (the test's queue name is long) one block per queue: "workers 2" either way.
    lines = [ln for ln in stats.text().splitlines() if qname in ln and "│" in ln]
    if lines:
        cells = [c.strip() for c in lines[0].split("│") if c.strip()]
        assert cells[8] == "2", cells  # the workers column
    else:
        assert re.search(r"\bworkers 2\b", stats.text()), stats.text()
    sup.signal(signal.SIGTERM)
    assert sup.wait(60) == 0


def test_lane_labels_are_bounded_and_server_gauges_optional(
    q: echomq.Queue, qname: str, url: str
) -> None:
    pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    from echomq import prometheus

    for lane, depth in (("deep", 3), ("mid", 2), ("low", 1), ("tiny", 1)):
        for _ in range(depth):
            q.enqueue(b"x", group=lane)

    def samples(registry: Any) -> dict[tuple[str, str], float]:
        text = prometheus.exposition(registry).decode()
        out = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.labels.get("queue") == qname and "lane" in s.labels:
                    out[(s.name, s.labels["lane"])] = s.value
        return out

    s = samples(prometheus.registry_for(url, queues=[qname], lanes=2, worker_metrics=False))
    depth = {lane: v for (name, lane), v in s.items() if name == "echomq_lane_depth"}
    assert depth == {"deep": 3, "mid": 2, "~other": 2}  # the two deepest, the rest summed
    assert ("echomq_lane_weight", "~other") not in s
    off = prometheus.registry_for(url, queues=[qname], server_metrics=False)
    assert "echomq_jobs{" not in prometheus.exposition(off).decode()
    assert "echomq_jobs_finished" in prometheus.exposition(off).decode()
