"""Clients that were in use before a failover follow it (issue 29).

Each test starts its own small cluster (1 s node timeout), SIGKILLs a primary and checks
that a client already holding the old slot map goes on within ``retry_for``: a durable
writer that only writes, native clients whose default node dies, a promotion to a replica
without the module (``auto`` and ``native``), ``wait()`` keeping its deadline, and a worker
fleet on the native executor.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import echomq
from conftest import wait_for
from echomq import keyspace
from echomq.errors import ExecutorUnavailable
from echomq.server import EmbeddedServer, free_port
from echomq.testing import EmbeddedCluster

pytestmark = [pytest.mark.cluster, pytest.mark.module]

ERRORS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, echomq.EchoMQError)


@pytest.fixture
def cluster(module_so: Path, tmp_path: Path) -> Iterator[EmbeddedCluster]:
    """3 primaries, 1 replica each, every node loading trafikey."""
    c = EmbeddedCluster(
        tmp_path / "cluster", node_timeout_ms=1000, args=["--loadmodule", str(module_so)]
    ).start(timeout=120)  # six nodes meeting and syncing: slow on a loaded CI box
    yield c
    c.stop()


def _slots(cluster: EmbeddedCluster) -> list[Any]:
    for node in cluster.nodes:
        if node.proc is None or node.proc.poll() is not None:
            continue
        try:
            with redis.Redis(port=node.port) as c:
                return list(c.execute_command("CLUSTER", "SLOTS"))
        except redis.exceptions.RedisError:
            continue
    raise AssertionError("no live node answers CLUSTER SLOTS")


def _owner_port(cluster: EmbeddedCluster, queue: str) -> int:
    """The port of the primary serving the queue's slot, as the cluster sees it now."""
    slot = keyspace.slot(keyspace.queue_key(queue, "pending"))
    for start, end, primary, *_ in _slots(cluster):
        if start <= slot <= end:
            return int(primary[1])
    raise AssertionError(f"slot {slot} not covered")


def _node(cluster: EmbeddedCluster, port: int) -> EmbeddedServer:
    return next(n for n in cluster.nodes if n.port == port)


def _queue_on(cluster: EmbeddedCluster, port: int, prefix: str) -> str:
    """A queue name whose slot the primary on ``port`` serves."""
    return next(
        f"{prefix}-{i}" for i in range(1000) if _owner_port(cluster, f"{prefix}-{i}") == port
    )


def _replica_of(cluster: EmbeddedCluster, primary: EmbeddedServer) -> EmbeddedServer:
    with redis.Redis(port=primary.port) as c:
        info = c.info("replication")
    return _node(cluster, int(info["slave0"]["port"]))


def _kill_and_wait_promotion(cluster: EmbeddedCluster, queue: str, timeout: float = 30) -> int:
    """SIGKILL the primary of the queue's slot; return the promoted replica's port."""
    victim = _node(cluster, _owner_port(cluster, queue))
    victim.kill()
    deadline = time.monotonic() + timeout
    while True:
        try:
            port = _owner_port(cluster, queue)
        except (AssertionError, redis.exceptions.RedisError):
            port = victim.port
        if port != victim.port:
            return port
        assert time.monotonic() < deadline, "no replica was promoted"
        time.sleep(0.1)


def _add_replica(cluster: EmbeddedCluster, primary: EmbeddedServer) -> EmbeddedServer:
    """One more replica of ``primary`` (so it keeps one once its first replica is promoted)."""
    node = EmbeddedServer(
        cluster.dir / f"node{len(cluster.nodes)}",
        port=free_port(cluster=True),
        appendonly=False,
        unix_socket=False,
        args=[
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(cluster.node_timeout_ms),
            "--repl-diskless-sync-delay", "0",
            *cluster.args,
        ],
    ).start()  # fmt: skip
    cluster.nodes.append(node)
    with redis.Redis(port=primary.port) as p, redis.Redis(port=node.port) as c:
        primary_id = p.execute_command("CLUSTER", "MYID").decode()
        c.execute_command("CLUSTER", "MEET", "127.0.0.1", primary.port)

        def knows() -> bool:
            return primary_id in c.execute_command("CLUSTER", "NODES").decode()

        wait_for(knows, timeout=15, interval=0.05)
        c.execute_command("CLUSTER", "REPLICATE", primary_id)

        def synced() -> bool:
            info = c.info("replication")
            return bool(info.get("master_link_status") == "up")

        wait_for(synced, timeout=15, interval=0.05)
    return node


# --------------------------------------------------------------------------- durable writers


def test_a_write_only_durable_producer_follows_a_failover(
    cluster: EmbeddedCluster, qname: str
) -> None:
    """Repro 1: a durable Queue and AsyncQueue that only enqueue, in use before the primary
    is SIGKILLed (and never restarted), go on writing to the promoted replica; nothing they
    were told was enqueued is lost."""
    victim = _node(cluster, _owner_port(cluster, qname))
    _add_replica(cluster, victim)  # the promoted replica keeps one: durable writes can ack
    url = cluster.url + "?durable=1"
    acked: dict[str, list[str]] = {"sync": [], "async": []}  # acknowledged enqueues
    after: dict[str, list[str]] = {"sync": [], "async": []}  # ... once the replica took over
    promoted = threading.Event()
    stop = threading.Event()
    errors: list[BaseException] = []

    def record(who: str, job: str) -> None:
        acked[who].append(job)
        if promoted.is_set():
            after[who].append(job)

    def sync_producer() -> None:
        with echomq.Queue(qname, url=url, retry_for=15) as q:
            while not stop.is_set():
                try:
                    record("sync", q.enqueue(b"s").id)
                except ERRORS as exc:
                    errors.append(exc)
                    time.sleep(0.05)
                time.sleep(0.005)

    async def async_producer() -> None:
        async with echomq.AsyncQueue(qname, url=url, retry_for=15) as q:
            while not stop.is_set():
                try:
                    record("async", (await q.enqueue(b"a")).id)
                except ERRORS as exc:
                    errors.append(exc)
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.005)

    threads = [
        threading.Thread(target=sync_producer),
        threading.Thread(target=lambda: asyncio.run(async_producer())),
    ]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: min(map(len, acked.values())) > 30, timeout=15)
        _kill_and_wait_promotion(cluster, qname)
        promoted.set()
        # Both producers go on within their retry budget: their next enqueues land.
        wait_for(lambda: min(map(len, after.values())) > 30, timeout=20)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not any(t.is_alive() for t in threads)
    every = acked["sync"] + acked["async"]
    with echomq.Queue(qname, url=cluster.url) as q:
        assert q.pending_size() == len(set(every)) == len(every)  # none lost, none twice
        assert q.check() == []
    assert not [e for e in errors if isinstance(e, echomq.ServerUnreachable)], errors[:3]


# --------------------------------------------------------------------------- native routing


async def test_native_clients_outlive_their_default_node(
    cluster: EmbeddedCluster, qname: str
) -> None:
    """Repro 2: EMQ.* commands are routed by their keys, not by COMMAND GETKEYS on the
    client's default node: when that node's primary dies, the client's queues on live
    primaries go on at once, and its queue on the dead shard once the replica took over."""
    url = cluster.url + "?executor=native"
    rc = echomq.client.connect.sync_client(url)
    ac = echomq.client.connect.async_client(url)
    try:
        await ac.initialize()
        default = rc.get_default_node().port
        assert ac.get_default_node().port == default
        live_port = next(n.port for n in cluster.primaries() if n.port != default)
        live, moved = _queue_on(cluster, live_port, qname), _queue_on(cluster, default, qname)
        queues = [echomq.Queue(n, client=rc, executor="native") for n in (live, moved)]
        aqueues = [echomq.AsyncQueue(n, client=ac, executor="native") for n in (live, moved)]
        for q, aq in zip(queues, aqueues, strict=True):
            q.enqueue(b"before")
            await aq.enqueue(b"before")
            assert q.executor == aq.executor == "native"
        _node(cluster, default).kill()
        started = time.monotonic()
        # The live shard serves at once: no call of the client goes to the dead node.
        job = queues[0].enqueue(b"live")
        ajob = await aqueues[0].enqueue(b"live")
        many = [e.id for e in queues[0].enqueue_many([b"m1", b"m2"])]  # a pipeline of EMQ.*
        amany = [e.id for e in await aqueues[0].enqueue_many([b"m3", b"m4"])]
        claimed = queues[0].claim_batch(10, lease_ms=60_000)
        assert {job.id, ajob.id, *many, *amany} <= {j.id for j in claimed}
        for j in claimed:
            queues[0].complete(j.id, j.token)
        assert time.monotonic() - started < 3.0
        # The dead shard's queue follows the promotion within retry_for.
        queues[1].enqueue(b"moved")
        await aqueues[1].enqueue(b"moved")
        assert queues[1].pending_size() == await aqueues[1].pending_size() == 4
        assert all(q.executor == "native" for q in (*queues, *aqueues))
        for q in queues:
            assert q.check() == []
    finally:
        rc.close()
        await ac.aclose()


# --------------------------------------------------------------------------- executor choice


def _without_module(node: EmbeddedServer) -> None:
    """Restart a replica without ``--loadmodule`` (it rejoins its primary and resyncs)."""
    node.stop()
    at = node.args.index("--loadmodule")
    del node.args[at : at + 2]
    node.start()

    def synced() -> bool:
        with redis.Redis(port=node.port) as c:
            return bool(c.info("replication").get("master_link_status") == "up")

    wait_for(synced, timeout=20, interval=0.05)


async def test_a_promoted_replica_without_the_module(
    cluster: EmbeddedCluster, qname: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Repro 3: a primary fails over to a replica that does not load trafikey. ``auto``
    clients go on with Lua (one WARNING each), ``native`` ones raise ExecutorUnavailable
    naming the node, never a raw "unknown command"."""
    primary = _node(cluster, _owner_port(cluster, qname))
    replica = _replica_of(cluster, primary)
    _without_module(replica)
    url = cluster.url
    auto = echomq.Queue(qname, url=url, retry_for=15)
    aauto = echomq.AsyncQueue(qname, url=url, retry_for=15)
    native = echomq.Queue(qname, url=url, retry_for=15, executor="native")
    anative = echomq.AsyncQueue(qname, url=url, retry_for=15, executor="native")
    try:
        auto.enqueue(b"a")
        await aauto.enqueue(b"b")
        native.enqueue(b"c")
        await anative.enqueue(b"c2")
        assert auto.executor == aauto.executor == native.executor == anative.executor
        assert auto.executor == "native"
        assert _kill_and_wait_promotion(cluster, qname) == replica.port
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="echomq"):
            jobs = [auto.enqueue(b"d"), await aauto.enqueue(b"e"), auto.enqueue(b"f")]
            assert auto.executor == aauto.executor == "lua"
            claimed = auto.claim_batch(10, lease_ms=60_000)
            for j in claimed:
                auto.complete(j.id, j.token)
            assert {j.id for j in jobs} <= {j.id for j in claimed}
            got = await aauto.claim(lease_ms=60_000)
            assert got is None  # every job was claimed above
        warnings = [r for r in caplog.records if "trafikey" in r.getMessage()]
        assert len(warnings) == 2, [r.getMessage() for r in warnings]  # one per client
        assert all(str(replica.port) in r.getMessage() for r in warnings)
        with pytest.raises(ExecutorUnavailable, match=f"127.0.0.1:{replica.port}"):
            native.enqueue(b"g")
        with pytest.raises(ExecutorUnavailable, match=f"127.0.0.1:{replica.port}"):
            await anative.claim(lease_ms=1_000)
        fresh = echomq.Queue(qname, url=cluster.url, executor="native")  # a live node
        with pytest.raises(ExecutorUnavailable, match=f"127.0.0.1:{replica.port} does not"):
            fresh.enqueue(b"h")
        fresh.close()
        assert auto.check() == []
        assert auto.counts()["pending"] == 0
    finally:
        auto.close()
        await aauto.aclose()
        native.close()
        await anative.aclose()


# --------------------------------------------------------------------------- wait()


async def test_wait_keeps_its_deadline_across_a_failover(
    cluster: EmbeddedCluster, qname: str
) -> None:
    """Repro 4: ``wait(timeout_s=4)`` raises its TimeoutError at 4 s (± 1 s) across a
    failover: the sync waiter is in its BLPOP when the primary dies, the async one starts
    right after (its first steps meet the dead node); neither retries past its deadline."""
    with echomq.Queue(qname, url=cluster.url) as q:
        job = q.enqueue(b"nobody runs this")
    sync_q = echomq.Queue(qname, url=cluster.url, retry_for=15)
    async_q = echomq.AsyncQueue(qname, url=cluster.url, retry_for=15)
    try:
        assert sync_q.pending_size() == await async_q.pending_size() == 1  # both in use
        took: dict[str, float | BaseException] = {}

        def sync_wait() -> None:
            start = time.monotonic()
            try:
                sync_q.wait(job.id, timeout_s=4)
                took["sync"] = AssertionError("a result appeared")
            except TimeoutError:
                took["sync"] = time.monotonic() - start
            except BaseException as exc:
                took["sync"] = exc

        waiter = threading.Thread(target=sync_wait)
        waiter.start()
        await asyncio.sleep(0.5)  # the sync waiter blocks in BLPOP on the primary
        _node(cluster, _owner_port(cluster, qname)).kill()
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            await async_q.wait(job.id, timeout_s=4)
        took["async"] = time.monotonic() - start
        waiter.join(30)
        assert not waiter.is_alive()
        late = {w: v for w, v in took.items() if not (isinstance(v, float) and 3.0 <= v <= 5.0)}
        assert late == {}, took
        # The waiters' queue still works on the promoted replica.
        assert sync_q.pending_size() == 1
    finally:
        sync_q.close()
        await async_q.aclose()


# --------------------------------------------------------------------------- a worker fleet


@pytest.mark.parametrize("executor", ["native", "lua"])
def test_a_worker_fleet_rides_out_a_failover(
    cluster: EmbeddedCluster, qname: str, executor: str
) -> None:
    """Two in-process workers (on the native executor, and on Lua) serve two queues: one on
    the primary that is also their clients' default node, SIGKILLed mid-run, one on a primary
    that lives (with work left through the whole failover). Every job of both is settled
    once."""
    from worker_support import InProcWorker

    slot0 = next(int(p[1]) for start, _, p, *_ in _slots(cluster) if start == 0)
    live_port = next(n.port for n in cluster.primaries() if n.port != slot0)
    names = {"dead": _queue_on(cluster, slot0, qname), "live": _queue_on(cluster, live_port, qname)}
    app = echomq.App(url=cluster.url + f"?executor={executor}")
    runs: dict[str, int] = {}
    ran_at: dict[str, list[float]] = {"dead": [], "live": []}
    tasks = {}
    for which, name in names.items():

        def work(i: int, which: str = which) -> None:
            job_id = echomq.current_job().id
            runs[job_id] = runs.get(job_id, 0) + 1
            time.sleep(0.004)
            ran_at[which].append(time.monotonic())

        tasks[which] = app.task(name=f"follow.{which}", queue=name, lease_ms=2_000)(work)
    n = {"dead": 500, "live": 1000}
    ids = []
    for which, task in tasks.items():
        found = task.enqueue_many([((i,), {}) for i in range(n[which])])
        ids += [e.id for e in found if isinstance(e, echomq.Enqueued)]
    assert len(ids) == sum(n.values())
    # The live queue has work through the whole failover, however long it takes on a loaded
    # machine: a feeder tops it up until the promotion is seen.
    promoted = threading.Event()
    fed: list[str] = []

    def feed() -> None:
        # Each id is minted here and recorded before its enqueue, which is asked again until
        # it answers (a reply lost in the failover answers `duplicate` the second time): the
        # test knows every fed job exactly once.
        while not promoted.is_set():
            if n["live"] + len(fed) - len(ran_at["live"]) > 400:  # enough waiting
                time.sleep(0.01)
                continue
            for _ in range(50):
                jid = echomq.ids.mint()
                fed.append(jid)
                while True:
                    try:
                        tasks["live"].options(id=jid).enqueue(0)
                        break
                    except (redis.exceptions.RedisError, OSError):
                        time.sleep(0.05)
            time.sleep(0.01)

    workers = [InProcWorker(echomq.Worker(app, concurrency=8, beat_ms=100)) for _ in range(2)]
    feeder = threading.Thread(target=feed, daemon=True)
    try:
        wait_for(lambda: min(map(len, ran_at.values())) > 50, timeout=20)
        feeder.start()
        _kill_and_wait_promotion(cluster, names["dead"])
        promoted.set()
        feeder.join(timeout=30)
        assert not feeder.is_alive()
        ids += fed
        n["live"] += len(fed)
        counts = {}
        for which, name in names.items():
            with echomq.Queue(name, url=cluster.url) as q:

                def drained(q: echomq.Queue = q) -> bool:
                    c = q.counts()
                    return c["pending"] == c["active"] == c["schedule"] == 0

                wait_for(drained, timeout=60, interval=0.2)
                counts[which] = q.counts()
                assert q.check() == []
    finally:
        for w in workers:
            w.stop()
        app.close()
    assert set(runs) == set(ids)  # every job ran
    for which in names:  # settled once each: a second completion would count n + 1
        c = counts[which]
        assert c["completed"] == n[which] and c["dead"] == c["failed"] == 0, (which, c)


# --------------------------------------------------------------------------- operator views


def test_the_dashboard_and_stats_ride_out_a_failover(cluster: EmbeddedCluster, qname: str) -> None:
    """``/api/queues`` and ``echomq stats`` right after a primary dies answer the overview
    (having re-read the slot map), never a 500 or a traceback."""
    import warnings

    from click.testing import CliRunner

    from echomq.cli import main
    from echomq.web import create_app

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Starlette's TestClient prefers httpx2
        from starlette.testclient import TestClient

    names = [_queue_on(cluster, n.port, qname) for n in cluster.primaries()]
    url = cluster.url
    for name in names:
        with echomq.Queue(name, url=url) as q:
            q.enqueue(b"x")
    runner = CliRunner(env={"COLUMNS": "250"})
    with TestClient(create_app(url)) as web:
        assert web.get("/api/queues").status_code == 200
        _node(cluster, _owner_port(cluster, names[0])).kill()
        # A fresh `echomq stats` while the dead node is still in the slot map ...
        stats = runner.invoke(main, ["--url", cluster.url, "stats"])
        assert stats.exit_code == 0, stats.output
        assert all(name in stats.output for name in names), stats.output
        # ... and the dashboard, whose client still has the old map.
        res = web.get("/api/queues")
        assert res.status_code == 200, res.text
        assert sorted(v["name"] for v in res.json()["queues"]) == sorted(names)
