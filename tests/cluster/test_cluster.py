"""echomq on a real 6-process Redis Cluster (3 primaries, 3 replicas) that the tests start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster

import echomq
from conftest import wait_for
from echomq import keyspace
from echomq.client import layout as _layout
from echomq.testing import EmbeddedCluster

pytestmark = pytest.mark.cluster
TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    c = EmbeddedCluster(tmp_path_factory.mktemp("cluster")).start()
    yield c
    c.stop()


@pytest.fixture
def rc(cluster: EmbeddedCluster) -> Iterator[RedisCluster]:
    client = RedisCluster(host="127.0.0.1", port=cluster.primaries()[0].port)
    client.execute_command("SCRIPT", "FLUSH", target_nodes=RedisCluster.PRIMARIES)
    yield client
    client.close()


def _owner(cluster: EmbeddedCluster, queue: str) -> int:
    """The port of the primary that holds the queue's slot (asked of the servers)."""
    slot = keyspace.slot(keyspace.queue_key(queue, "pending"))
    for node in cluster.primaries():
        with redis.Redis(port=node.port) as c:
            if c.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) > 0:
                return node.port
    raise AssertionError(f"no primary holds slot {slot}")


def test_queues_spread_over_every_primary(
    cluster: EmbeddedCluster, rc: RedisCluster, qname: str
) -> None:
    names = [f"{qname}-{i}" for i in range(12)]
    for name in names:
        q = echomq.Queue(name, client=rc)
        q.enqueue(b"x", group="tenant")
        q.enqueue(b"y")
    owners = {_owner(cluster, n) for n in names}
    assert owners == {n.port for n in cluster.primaries()}, owners
    for name in names:
        q = echomq.Queue(name, client=rc)
        assert q.counts()["pending"] == 2
        assert q.check() == []


def test_every_verb_family_runs_unchanged(rc: RedisCluster, qname: str) -> None:
    q = echomq.Queue(qname, client=rc)
    a = q.enqueue(b"a", group="acme")
    b = q.enqueue(b"b")
    q.enqueue(b"later", delay_ms=60_000)
    assert [r.status for r in q.enqueue_many([b"1", b"2"], group="globex")] == ["enqueued"] * 2
    jobs = q.claim_batch(3, lease_ms=5_000)
    assert len(jobs) == 3 and len({j.group for j in jobs}) == 3  # fair over acme, flat, globex
    for j in jobs:
        q.complete(j.id, j.token)
    job = q.claim(lease_ms=5_000)
    assert job is not None
    with pytest.raises(echomq.StaleToken):
        q.complete(job.id, job.token + 1)
    assert q.retry(job.id, job.token, delay_ms=0, max_attempts=1, error="boom") == "dead"
    q.reprocess(job.id)
    q.pause_lane("acme")
    q.limit_lane("globex", 1)
    q.weight_lane("globex", 2)
    assert q.lanes() == sorted(q.lanes())
    q.add_log(q.enqueue(b"log").id, "hello")
    assert q.check() == []
    counts = q.counts()
    assert counts["completed"] == 3 and counts["failed"] == 1
    q.pause()
    q.obliterate(force=True)
    assert q.counts() == dict.fromkeys(counts, 0)
    assert a.id != b.id


async def test_async_queue_on_cluster(cluster: EmbeddedCluster, qname: str) -> None:
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

    client = AsyncRedisCluster(host="127.0.0.1", port=cluster.primaries()[0].port)
    try:
        aq = echomq.AsyncQueue(qname, client=client)
        e = await aq.enqueue(b"async")
        job = await aq.claim(lease_ms=5_000)
        assert job is not None and job.id == e.id
        await aq.complete(job.id, job.token)
        assert await aq.check() == []
        assert (await aq.counts())["completed"] == 1
    finally:
        await client.aclose()


def test_cluster_url_selects_cluster_mode(cluster: EmbeddedCluster, qname: str) -> None:
    with echomq.Queue(qname, url=cluster.url) as q:
        assert isinstance(q.client, RedisCluster)
        q.enqueue(b"x")
        assert q.counts()["pending"] == 1


def test_version_fence_on_cluster(cluster: EmbeddedCluster, rc: RedisCluster, qname: str) -> None:
    echomq.Queue(qname, client=rc).pending_size()
    assert rc.get(keyspace.VERSION_KEY) == echomq.WIRE_VERSION.encode()
    # The fence reads both reserve keys (one slot); the first client recorded
    # its data layout (issue 39).
    assert rc.get(keyspace.LAYOUT_KEY) == str(_layout.LAYOUT).encode()


def test_worker_serves_queues_on_different_shards(
    cluster: EmbeddedCluster, rc: RedisCluster, qname: str
) -> None:
    names = [f"{qname}-{i}" for i in range(6)]
    assert len({_owner_slot(n) for n in names}) == 6
    env = {
        **os.environ,
        "ECHOMQ_URL": cluster.url,
        "PYTHONPATH": str(TESTS),
        "CLUSTER_TEST_QUEUES": ",".join(names),
    }
    for name in names:
        echomq.Queue(name, client=rc).enqueue_many(
            [b'{"task": "cluster.noop", "args": [], "kwargs": {}}'] * 50
        )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "echomq",
            "worker",
            "apps.cluster_app:app",
            "-c",
            "8",
            "--log-level",
            "WARNING",
        ],
        env=env,
    )
    try:
        queues = [echomq.Queue(n, client=rc) for n in names]
        wait_for(lambda: all(q.counts()["completed"] == 50 for q in queues), timeout=30)
        # The registry (one entry per queue, in each queue's slot): the same worker on all.
        listed = {tuple((w.id, w.pid) for w in q.workers()) for q in queues}
        assert len(listed) == 1 and [pid for _, pid in listed.pop()] == [proc.pid]
        owners = {_owner(cluster, n) for n in names}
        assert len(owners) >= 2
        for q in queues:
            assert q.check() == []
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    assert proc.returncode == 0


def _owner_slot(name: str) -> int:
    return keyspace.slot(keyspace.queue_key(name, "pending"))


def test_cli_on_a_cluster_url(cluster: EmbeddedCluster, rc: RedisCluster, qname: str) -> None:
    from click.testing import CliRunner

    from echomq.cli import main

    runner = CliRunner(env={"COLUMNS": "250"})  # rich wraps long names at 80 columns
    url = cluster.url
    names = [f"{qname}-{i}" for i in range(4)]
    for name in names:
        result = runner.invoke(main, ["--url", url, "enqueue", name, "payload", "--group", "acme"])
        assert result.exit_code == 0, result.output
    stats = runner.invoke(main, ["--url", url, "stats"])
    assert stats.exit_code == 0, stats.output
    for name in names:
        assert name in stats.output  # queues found on every primary
    checked = runner.invoke(main, ["--url", url, "check", *names])
    assert checked.exit_code == 0 and checked.output.count(": ok") == 4, checked.output
    paused = runner.invoke(main, ["--url", url, "pause", names[0], "--lane", "acme"])
    assert paused.exit_code == 0, paused.output
    assert echomq.Queue(names[0], client=rc).claim() is None


def test_repeats_and_flows_on_cluster(rc: RedisCluster, qname: str) -> None:
    """D18/D19 scripts keep to one queue's slot: repeats and a same-queue flow tree on queues
    that live on different primaries."""
    for name in [f"{qname}-{i}" for i in range(3)]:
        q = echomq.Queue(name, client=rc)
        assert q.repeat("tick", b"x", every_ms=60_000) == "registered"
        q.repeat("night", b"y", cron="0 3 * * *", tz="Europe/Berlin")
        now = int(rc.time()[0]) * 1000
        rc.zadd(keyspace.queue_key(name, "repeat"), {"tick": now - 1, "night": now - 1})
        assert q.fire_due() == 2 and q.fire_due() == 0
        added = q.add_flow(
            echomq.protocol.compose.FlowJob(b"p", children=[echomq.protocol.compose.FlowJob(b"c")])
        )
        while (job := q.claim(lease_ms=5_000)) is not None:
            q.complete(job.id, job.token, result=b"r")
            if job.id == added.child_ids[0]:
                assert q.children_values(added.parent_id) == {job.id: b"r"}
        assert q.job_state(added.parent_id) == "absent"
        assert q.check() == []
        # issue 26: pause and resume (the cron one reads its spec and TIME first)
        assert q.pause_repeat("night") and q.resume_repeat("night")
        assert all(not rep.paused and rep.next_ms for rep in q.repeats())
        assert q.unrepeat("tick") and q.unrepeat("night")


def test_cross_queue_flow_across_shards(cluster: EmbeddedCluster, rc: RedisCluster) -> None:
    """A parent on one primary, its children on others: the outbox is delivered across
    slots by the pump (D18)."""
    names: dict[int, str] = {}
    i = 0
    while len(names) < 2:  # two queues on two different primaries
        name = f"xflow-{i}"
        slot = keyspace.slot(keyspace.queue_key(name, "pending"))
        owner = rc.nodes_manager.get_node_from_slot(slot).port
        names.setdefault(owner, name)
        i += 1
    parent_q, child_q = (echomq.Queue(n, client=rc) for n in names.values())
    kids = [echomq.FlowJob(x, queue=child_q.name) for x in (b"a", b"b")]
    added = parent_q.add_flow(echomq.FlowJob(b"p", children=kids))
    while (job := child_q.claim(lease_ms=5_000)) is not None:
        child_q.complete(job.id, job.token, result=job.payload)
    assert parent_q.dependencies(added.parent_id) == 2
    assert child_q.pump() == 2
    assert parent_q.children_values(added.parent_id) == dict(
        zip(added.child_ids, [b"a", b"b"], strict=True)
    )
    assert parent_q.job_state(added.parent_id) == "pending"
    assert parent_q.check() == [] and child_q.check() == []
    for q in (parent_q, child_q):
        q.pause()
        q.obliterate(force=True)
