"""A sharded queue on a real Redis Cluster (issue 43): its shards land on different primaries,
one worker process started on the logical name drains all of them and serves a shard added
by ``echomq reshard`` while it runs, and the operator commands read every shard (their
pipelines span the slots)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from redis.cluster import RedisCluster
from test_cluster import _owner
from test_cluster_follow import _owner_port

import echomq
from conftest import wait_for
from echomq.cli import main
from echomq.client.shards import layout
from echomq.testing import EmbeddedCluster

pytestmark = pytest.mark.cluster
TESTS = Path(__file__).resolve().parents[1]
JOB = b'{"task": "cluster.noop", "args": [], "kwargs": {}}'


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    c = EmbeddedCluster(tmp_path_factory.mktemp("cluster")).start()
    yield c
    c.stop()


@pytest.fixture
def rc(cluster: EmbeddedCluster) -> Iterator[RedisCluster]:
    client = RedisCluster(host="127.0.0.1", port=cluster.primaries()[0].port)
    yield client
    client.close()


def test_a_sharded_queue_on_a_cluster(
    cluster: EmbeddedCluster, rc: RedisCluster, qname: str
) -> None:
    # layout() aims at evenly spaced slots from the name's own, so about one name in 1,500
    # (its slot at a range's edge) puts two shards on one primary: take the first of this
    # test's names that does not (test_cluster_sharded_failover.py pins fixed names).
    qname = next(
        n
        for n in (f"{qname}{k}" for k in range(20))
        if len({_owner_port(cluster, s) for s in layout(n, 3)}) == 3
    )
    q = echomq.Queue(qname, client=rc)
    names = q.propose_shards(layout(qname, 3))
    shards = [echomq.Queue(n, client=rc) for n in names]
    for s in shards:
        s.enqueue_many([JOB] * 40)
    assert len({_owner(cluster, n) for n in names}) == 3  # one shard a primary
    env = {
        **os.environ,
        "ECHOMQ_URL": cluster.url,
        "PYTHONPATH": str(TESTS),
        "CLUSTER_TEST_QUEUES": qname,
    }
    args = ["worker", "apps.cluster_app:app", "-c", "4", "--beat-ms", "200"]
    proc = subprocess.Popen([sys.executable, "-m", "echomq", *args], env=env)
    runner = CliRunner(env={"COLUMNS": "300"})

    def cli(*argv: str) -> str:
        result = runner.invoke(main, ["--url", cluster.url, *argv])
        assert result.exit_code == 0, (result.output, result.exception)
        return result.stdout

    try:
        wait_for(lambda: [s.counts()["completed"] for s in shards] == [40, 40, 40], timeout=60)
        row = [line for line in cli("stats", qname, names[1]).splitlines() if qname in line]
        assert len(row) == 1, row
        cells = [c.strip() for c in row[0].split("│") if c.strip()]
        assert cells[0] == qname and cells[5] == "120", cells
        assert f"{qname}: 3 -> 4 shards" in cli("reshard", qname, "4")
        grown = q.shards()
        assert len(grown) == 4 and grown[:3] == names
        extra = echomq.Queue(grown[3], client=rc)
        extra.enqueue_many([JOB] * 10)
        wait_for(lambda: extra.counts()["completed"] == 10, timeout=60)
        assert cli("check", qname).strip() == f"{qname}: ok"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    assert proc.returncode == 0
