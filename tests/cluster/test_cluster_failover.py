"""Failover: SIGKILL the primary that owns a queue while producers and consumers run.

A replica is promoted; clients follow the new slot map and continue. Without durable mode,
async replication may lose the last acknowledged writes of the dead primary: an enqueue that
vanishes, or a completion that is undone (the job comes back and runs again). With
``durable=1`` every write waits for the replica's acknowledgement (WAIT), and nothing
acknowledged is lost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import redis

import echomq
from echomq import keyspace
from echomq.server import EmbeddedServer
from echomq.testing import EmbeddedCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    c = EmbeddedCluster(tmp_path_factory.mktemp("failover"), node_timeout_ms=1000).start()
    yield c
    c.stop()


def _owner(cluster: EmbeddedCluster, queue: str) -> EmbeddedServer:
    slot = keyspace.slot(keyspace.queue_key(queue, "pending"))
    for node in cluster.primaries():
        with redis.Redis(port=node.port) as c:
            for start, end, *_ in c.execute_command("CLUSTER", "SLOTS"):
                if start <= slot <= end and c.execute_command("CLUSTER", "MYID") == (
                    _primary_id(c, slot)
                ):
                    return node
    raise AssertionError("no primary owns the queue's slot")


def _primary_id(c: redis.Redis, slot: int) -> bytes:
    for start, end, primary, *_ in c.execute_command("CLUSTER", "SLOTS"):
        if start <= slot <= end:
            return bytes(primary[2])
    raise AssertionError("slot not covered")


@dataclass
class Run:
    enqueued: list[str] = field(default_factory=list)  # acknowledged enqueues
    completed: dict[str, int] = field(default_factory=dict)  # acknowledged completions per id
    claimed: set[str] = field(default_factory=set)  # every job a claim handed out
    errors: int = 0
    stop: threading.Event = field(default_factory=threading.Event)


def _produce(q: echomq.Queue, run: Run) -> None:
    i = 0
    while not run.stop.is_set():
        try:
            run.enqueued.append(q.enqueue(f"job-{i}".encode()).id)
            i += 1
        except (
            redis.exceptions.RedisError,
            redis.exceptions.RedisClusterException,
            echomq.EchoMQError,
        ):
            run.errors += 1
            time.sleep(0.05)


def _consume(q: echomq.Queue, run: Run, until: threading.Event) -> None:
    last_reap = 0.0
    while not until.is_set():
        try:
            if time.monotonic() - last_reap > 0.3:
                q.reap(1000)
                last_reap = time.monotonic()
            jobs = q.claim_batch(50, lease_ms=1_500)
            if not jobs:
                time.sleep(0.01)
                continue
            run.claimed.update(j.id for j in jobs)
            refused = set(q.complete_many([(j.id, j.token) for j in jobs]))
            for j in jobs:
                if j.id not in refused:
                    run.completed[j.id] = run.completed.get(j.id, 0) + 1
        except (
            redis.exceptions.RedisError,
            redis.exceptions.RedisClusterException,
            echomq.EchoMQError,
        ):
            # A settle whose reply was lost is not resent: its job comes back after its
            # lease if the settle did not land.
            run.errors += 1
            time.sleep(0.05)


def _run_failover(cluster: EmbeddedCluster, url: str, name: str) -> tuple[Run, echomq.Queue]:
    q = echomq.Queue(name, url=url, retry_for=30)
    victim = _owner(cluster, name)
    run = Run()
    drained = threading.Event()
    threads = [
        threading.Thread(target=_produce, args=(q, run)),
        threading.Thread(target=_consume, args=(q, run, drained)),
    ]
    for t in threads:
        t.start()
    try:
        time.sleep(2.0)
        before = len(run.enqueued)
        victim.kill()  # SIGKILL the primary of the queue's slot
        deadline = time.monotonic() + 30
        while _owner_or_none(cluster, name) in (None, victim.port):
            assert time.monotonic() < deadline, "no replica was promoted"
            time.sleep(0.1)
        promoted_after = len(run.enqueued)
        # The failed node comes back and rejoins as the new primary's replica (in durable
        # mode, writes wait for a replica: until it has synced they are refused).
        victim.start()
        time.sleep(2.0)
        run.stop.set()
        threads[0].join(30)
        # Let the consumer finish everything that is left (reaping lapsed leases).
        deadline = time.monotonic() + 60
        while True:
            c = q.counts()
            if c["pending"] == 0 and c["active"] == 0 and c["schedule"] == 0:
                break
            assert time.monotonic() < deadline, (
                f"the run did not drain: {c}, check: {q.check()}, "
                f"consumer alive: {threads[1].is_alive()}, errors: {run.errors}"
            )
            time.sleep(0.2)
    finally:
        run.stop.set()
        drained.set()
        for t in threads:
            t.join(30)
    print(
        f"\n{name}: {len(run.enqueued)} acknowledged enqueues ({before} before the kill, "
        f"{promoted_after - before} during the failover), {run.errors} client errors"
    )
    return run, q


def _owner_or_none(cluster: EmbeddedCluster, name: str) -> int | None:
    try:
        return _owner(cluster, name).port
    except (AssertionError, redis.exceptions.RedisError):
        return None


def _losses(run: Run) -> tuple[list[str], list[str]]:
    # The consumer drains the queue, so an acknowledged job that survived was claimed at
    # some point; one never claimed was lost. (A completion whose reply was lost is not a
    # loss: its job is simply gone or comes back, and is then claimed again.)
    lost_enqueues = [i for i in run.enqueued if i not in run.claimed]
    undone_completions = [i for i, n in run.completed.items() if n > 1]
    return lost_enqueues, undone_completions


def test_failover_without_durable_mode(cluster: EmbeddedCluster, qname: str) -> None:
    run, q = _run_failover(cluster, cluster.url, qname)
    lost, undone = _losses(run)
    print(
        f"async replication lost {len(lost)} acknowledged enqueues and undid "
        f"{len(undone)} acknowledged completions (those jobs ran again)"
    )
    # The run completes and the queue is consistent; what replication lost is reported.
    assert q.check() == []
    assert len(run.enqueued) > 100
    assert q.counts()["dead"] == 0


def test_failover_in_durable_mode_loses_nothing(cluster: EmbeddedCluster, qname: str) -> None:
    run, q = _run_failover(cluster, cluster.url + "?durable=1", qname)
    lost, undone = _losses(run)
    print(f"durable mode: lost {len(lost)} enqueues, undid {len(undone)} completions")
    assert lost == [], f"acknowledged enqueues lost across the failover: {lost[:10]}"
    assert undone == [], f"acknowledged completions undone across the failover: {undone[:10]}"
    assert q.check() == []
    assert len(run.enqueued) > 100
