"""A sharded queue (issue 43) on a real 3-primary cluster: where its shards land, and a
primary failed over under producers and a worker, losing and doubling no job.

``Queue(name, shards=N)`` is N ordinary queues (``echomq.client.shards.layout``), so each
shard follows a failover as any queue does (test_cluster_failover.py); what these tests add
is the logical queue's view: every job of it, on whichever shard, completes once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from test_cluster_follow import _kill_and_wait_promotion, _owner_port
from worker_support import InProcWorker

import echomq
from conftest import wait_for
from echomq import keyspace
from echomq.testing import EmbeddedCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ERRORS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, echomq.EchoMQError)
# Fixed names, so where their shards land does not depend on the test's pid.
NAMES = ("orders", "emails", "reports", "billing", "t43-sharded-queue")


def _holder(cluster: EmbeddedCluster, queue: str) -> int:
    """The port of the primary that holds the queue's keys (asked of each server's data)."""
    slot = keyspace.slot(keyspace.queue_key(queue, "pending"))
    found = []
    for node in cluster.primaries():
        with redis.Redis(port=node.port) as c:
            if c.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) > 0:
                found.append(node.port)
    assert len(found) == 1, (queue, slot, found)
    return found[0]


def _payload(task: str, i: int) -> bytes:
    return f'{{"task": "{task}", "args": [{i}], "kwargs": {{}}}}'.encode()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmbeddedCluster]:
    """3 primaries with a replica each, a 1 s node timeout (a prompt failover)."""
    c = EmbeddedCluster(tmp_path / "cluster", node_timeout_ms=1000).start(timeout=120)
    yield c
    c.stop()


def test_three_shards_land_on_three_primaries_and_six_on_two_each(
    cluster: EmbeddedCluster,
) -> None:
    ports = {n.port for n in cluster.primaries()}
    for name in NAMES:
        for n in (3, 6):
            with echomq.Queue(f"{name}-{n}", shards=n, url=cluster.url) as q:
                # Jobs spread by id: with 300 jobs, every shard gets some (each server can
                # then say what it holds); (5/6)**300 is the chance one of 6 gets none.
                q.enqueue_many([b"x"] * 300)
                shards = q.shards()
                assert len(shards) == n and q.counts()["pending"] == 300
            holders = [_holder(cluster, s) for s in shards]
            assert holders == [_owner_port(cluster, s) for s in shards]
            per_primary = sorted(holders.count(p) for p in ports)
            assert per_primary == [n // 3] * 3, (name, n, shards, holders)


def test_a_primary_failover_under_load_loses_and_doubles_no_job(
    cluster: EmbeddedCluster, qname: str
) -> None:
    """Two producers and a worker on a 3-shard queue; the primary of shard 0 (the base
    queue) is SIGKILLed mid-run, its replica promoted, and it comes back as the new
    primary's replica. Every job the producers made ran, and the shards' completed counts
    sum to exactly the jobs made: a job completed twice (or on two shards) would count one
    more. Durable mode (test_cluster_failover.py): without it, a write the dead primary
    acknowledged but had not yet replicated is lost, and on a loaded box that window is
    long enough to lose an enqueue now and then."""
    url = cluster.url + "?durable=1"
    app = echomq.App(url=url)
    runs: dict[str, int] = {}
    lock = threading.Lock()

    @app.task(name="sharded", queue=qname, lease_ms=2_000)
    def work(i: int) -> None:
        job_id = echomq.current_job().id
        with lock:
            runs[job_id] = runs.get(job_id, 0) + 1
        time.sleep(0.002)

    with echomq.Queue(qname, shards=3, url=url) as q:
        shards = q.shards()  # the layout, stored before any worker reads it
    made: list[str] = []
    stop = threading.Event()

    def produce() -> None:
        # Each id is minted here and recorded before its enqueue, which is asked again until
        # it answers (a reply lost in the failover answers `duplicate` the second time): the
        # test knows every job it made exactly once. The id routes the job (issue 43, 4).
        with echomq.Queue(qname, shards=3, url=url, retry_for=30) as q:
            i = 0
            while not stop.is_set():
                if len(made) - len(runs) > 300:  # enough waiting
                    time.sleep(0.01)
                    continue
                jid = echomq.ids.mint()
                with lock:
                    made.append(jid)
                while True:
                    try:
                        q.enqueue(_payload("sharded", i), id=jid)
                        break
                    except ERRORS:
                        time.sleep(0.05)
                i += 1

    worker = InProcWorker(echomq.Worker(app, queues=[qname], concurrency=16, beat_ms=100))
    producers = [threading.Thread(target=produce, daemon=True) for _ in range(2)]
    try:
        for p in producers:
            p.start()
        wait_for(lambda: len(runs) > 300, timeout=30)
        victim = next(n for n in cluster.nodes if n.port == _owner_port(cluster, shards[0]))
        _kill_and_wait_promotion(cluster, shards[0])
        # The failed node rejoins as the new primary's replica: until it has synced, the
        # shard's durable writes are refused (DurabilityError) and asked again.
        victim.start()
        ran_at_promotion = len(runs)
        wait_for(lambda: len(runs) > ran_at_promotion + 300, timeout=30)  # served again
        stop.set()
        for p in producers:
            p.join(timeout=40)
            assert not p.is_alive()
        counts = {}
        for shard in shards:
            with echomq.Queue(shard, url=cluster.url, retry_for=30) as q:

                def drained(q: echomq.Queue = q) -> bool:
                    c = q.counts()
                    return c["pending"] == c["active"] == c["schedule"] == 0

                wait_for(drained, timeout=60, interval=0.2)
                counts[shard] = q.counts()
                assert q.check() == [], shard
        with echomq.Queue(qname, shards=3, url=cluster.url, retry_for=30) as q:
            assert q.check() == []
            assert q.counts()["completed"] == sum(c["completed"] for c in counts.values())
    finally:
        stop.set()
        worker.stop()
        app.close()
    assert len(made) == len(set(made)) > 600
    missing, extra = set(made) - set(runs), set(runs) - set(made)
    assert not missing and not extra, (sorted(missing)[:5], sorted(extra)[:5], counts)
    assert sum(c["completed"] for c in counts.values()) == len(made), counts
    assert all(c["dead"] == c["failed"] == 0 for c in counts.values()), counts
    assert all(c["completed"] > 0 for c in counts.values()), counts  # the jobs spread
    print(
        f"\n{len(made)} jobs over {len(shards)} shards, "
        f"{sum(n > 1 for n in runs.values())} ran again after a settle lost in the failover"
    )
