"""Both executors beyond one plain server: native behind a cutting proxy, a replica
without the module, an AOF restart of a module server, and the cluster (refusals and a
failover).
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import executors_support
import pytest
import redis
from executors_support import (
    STEPS,
    Driver,
    assert_used,
    emq_calls,
    worker_twins,
)
from test_cluster_failover import _losses, _run_failover
from test_proxy import Proxy

import echomq
from conftest import wait_for
from echomq import keyspace
from echomq.protocol.scripts import SCRIPTS
from echomq.server import EmbeddedServer
from echomq.testing import EmbeddedCluster
from procs import TESTS_DIR, Spawner, wait_log
from reliability import leftover_keys, read_books, verify

# Shared fixtures (bound here so pytest finds them in this module).
nr = executors_support.nr


pytestmark = pytest.mark.module


class NativeProxy(Proxy):
    """test_proxy's Proxy, whose dropped replies are those of EMQ.* calls as well as
    EVAL/EVALSHA (its own check looks for EVAL only, so on the native executor it would
    never drop a transition's reply)."""

    async def _pump(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        other: asyncio.StreamWriter,
        script: list[bool],
        *,
        replies: bool,
    ) -> None:
        try:
            while data := await src.read(65536):
                if not replies:
                    head = data[:24].upper()
                    script[0] = b"\r\nEVAL" in head or b"\r\nEMQ." in head
                elif script[0] and self.drop_reply and self.rng.random() < self.drop_reply:
                    self.dropped += 1
                    self._cut(dst, other)  # the command ran; its reply never arrives
                    return
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            return


def test_run_through_a_cutting_proxy_on_native(
    module_server: EmbeddedServer, nr: redis.Redis, tmp_path: Path, qname: str
) -> None:
    """test_proxy.py's run, scaled down, on the native executor: producer processes and
    workers reach the module server through a proxy that resets every connection after
    50..500 ms and drops the reply of 1 in 200 EMQ.*/EVAL calls (the call ran)."""
    proxy = NativeProxy(module_server.port, life_ms=(50, 500), drop_reply=0.005, seed=3).start()
    spawn = Spawner(tmp_path, proxy.url)
    children: list[subprocess.Popen[bytes]] = []
    per, producers, total = 1000, 2, 2000
    env = spawn.env(
        ECHOMQ_EXECUTOR="native",
        EMQ_TEST_HISTORY_URL=module_server.url,  # the bookkeeping is never cut
        EMQ_TEST_QUEUE=qname,
        EMQ_TEST_LEASE_MS="2000",
        EMQ_TEST_FAIL_EVERY="50",
        EMQ_TEST_RUN_MS="2",
        EMQ_TEST_PRODUCE_PAUSE_MS="3",
    )
    emq0 = emq_calls(nr)
    q = echomq.Queue(qname, url=module_server.url, executor="native")
    try:
        args = ["-c", "16", "--beat-ms", "200", "--max-stalled", "1000000"]
        workers = [spawn.start("worker", "apps.chaos:app", *args, env=env) for _ in range(2)]
        outs = [tmp_path / f"producer-{i}.jsonl" for i in range(producers)]
        for i, out in enumerate(outs):
            cmd = [sys.executable, "-m", "apps.producer", qname, str(i * per), str(per), str(out)]
            with open(tmp_path / f"producer-{i}.log", "wb") as log:
                children.append(
                    subprocess.Popen(cmd, cwd=TESTS_DIR, env=env, stdout=log, stderr=log)
                )
        for p in children:
            assert p.wait(60) == 0, (tmp_path / "producer-0.log").read_text()
        calls = [json.loads(line) for out in outs for line in out.read_text().splitlines()]
        assert [c for c in calls if "error" in c] == []
        enqueued: dict[str, int] = {}
        for c in calls:
            assert c["statuses"] == ["enqueued"] * len(c["ns"]), c
            enqueued.update(zip(c["ids"], c["ns"], strict=True))
        assert sorted(enqueued.values()) == list(range(total))  # one id per job asked for

        def drained() -> bool:
            c = q.counts()
            return c["pending"] + c["active"] + c["schedule"] == 0 and c["completed"] >= total

        wait_for(drained, timeout=60)
        for w in workers:
            assert w.popen.poll() is None, w.text()[-3000:]
            wait_log(w, "serving")
            w.signal(signal.SIGTERM)
        for w in workers:
            assert w.wait(60) == 0, w.text()[-3000:]
        counts = q.counts()
        assert counts == {**counts, "pending": 0, "active": 0, "schedule": 0, "dead": 0}
        assert counts["completed"] == total  # no enqueue made two jobs, none was lost
        assert q.check() == []
        assert leftover_keys(nr, qname) == []
        v = verify(read_books(nr, qname), enqueued, killed=set())
        assert v.errors == [], "\n".join(v.errors[:20])
        assert proxy.cuts > 20 and proxy.dropped > 0, (proxy.cuts, proxy.dropped)
        assert_used(
            emq0, emq_calls(nr), worker_twins("enqueue_many", "extend_many", "sweep_stalled")
        )
    finally:
        for p in children:
            if p.poll() is None:
                p.kill()
            p.wait(60)
        spawn.stop_all()
        proxy.stop()
        q.close()


def keyspace_of(client: redis.Redis) -> dict[bytes, Any]:
    """Every key with its type, content (sets and hashes by content) and whether it has a
    TTL (the remaining time differs between two reads)."""
    out: dict[bytes, Any] = {}
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        value: Any
        if kind == b"hash":
            value = client.hgetall(key)
        elif kind == b"zset":
            value = client.zrange(key, 0, -1, withscores=True)
        elif kind == b"list":
            value = client.lrange(key, 0, -1)
        elif kind == b"set":
            value = client.smembers(key)
        elif kind == b"string":
            value = client.get(key)
        elif kind == b"stream":
            value = client.xrange(key)
        else:
            value = client.dump(key)
        out[key] = (kind, value, client.pttl(key) >= 0)
    return out


def native_mix(url: str, queue: str, seed: int, steps: int = 120) -> int:
    """A seeded random mix of every twin through a native Queue (the cross-executor driver
    with the native queue on both sides); returns the EMQ.* calls it made."""
    q = echomq.Queue(queue, url=url, executor="native")
    raw = redis.Redis.from_url(url)
    try:
        before = sum(emq_calls(raw).values())
        d = Driver(q, q, raw, seed)
        verbs = list(STEPS)
        for _ in range(steps):
            getattr(d, d.rng.choices(verbs, [STEPS[v] for v in verbs])[0])()
        assert q.check() == []
        assert q.executor == "native"
        return sum(emq_calls(raw).values()) - before
    finally:
        q.close()
        raw.close()


def test_replica_without_the_module_ends_identical(
    module_so: Path, tmp_path: Path, qname: str
) -> None:
    primary = EmbeddedServer(
        tmp_path / "primary",
        appendonly=False,
        # The full sync starts at once (the default waits 5 s for more replicas).
        args=["--loadmodule", str(module_so), "--repl-diskless-sync-delay", "0"],
    ).start()
    replica = EmbeddedServer(
        tmp_path / "replica",
        appendonly=False,
        args=["--replicaof", "127.0.0.1", str(primary.port)],
    ).start()
    try:
        with redis.Redis.from_url(replica.url) as rr, redis.Redis.from_url(primary.url) as pr:
            wait_for(lambda: rr.info("replication").get("master_link_status") == "up")
            assert b"trafikey" not in repr(rr.execute_command("MODULE", "LIST")).encode()
            assert native_mix(primary.url, qname, seed=11) > 50
            assert native_mix(primary.url, qname + "-b", seed=12) > 50
            assert pr.execute_command("WAIT", 1, 5000) == 1
            mine = keyspace_of(pr)
            assert len(mine) > 10
            assert keyspace_of(rr) == mine
    finally:
        replica.stop()
        primary.stop()


def test_aof_restart_of_a_module_server_keeps_the_keyspace(
    module_so: Path, tmp_path: Path, qname: str
) -> None:
    srv = EmbeddedServer(
        tmp_path / "aof", appendonly=True, fsync="always", args=["--loadmodule", str(module_so)]
    ).start()
    try:
        assert native_mix(srv.url, qname, seed=21) > 50
        with redis.Redis.from_url(srv.url) as c:
            before = keyspace_of(c)
        assert len(before) > 10
        srv.kill()  # no shutdown, no rewrite: what the AOF holds is what comes back
        srv.start()
        with redis.Redis.from_url(srv.url) as c:
            assert keyspace_of(c) == before
        aof = b"".join(p.read_bytes() for p in (srv.dir).rglob("*.aof*") if p.is_file())
        assert aof and b"EMQ." not in aof.upper()  # the plain commands, never EMQ.*
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def native_cluster(
    module_so: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EmbeddedCluster]:
    c = EmbeddedCluster(
        tmp_path_factory.mktemp("native-cluster"),
        node_timeout_ms=1000,
        args=["--loadmodule", str(module_so)],
    ).start()
    yield c
    c.stop()


def _slot_owner(cluster: EmbeddedCluster, queue: str) -> int:
    slot = keyspace.slot(keyspace.queue_key(queue, "pending"))
    for node in cluster.primaries():
        with redis.Redis(port=node.port) as c:
            for start, end, primary, *_ in c.execute_command("CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    return int(primary[1])
    raise AssertionError(f"slot {slot} not covered")


def _cluster_emq(cluster: EmbeddedCluster) -> dict[int, int]:
    out = {}
    for node in cluster.primaries():
        with redis.Redis(port=node.port) as c:
            out[node.port] = sum(emq_calls(c).values())
    return out


def _eval_and_emq(port: int, keys: list[str], args: list[Any]) -> tuple[str, str]:
    """The error of the same complete call sent to one node as EVAL of complete.lua and
    as EMQ.COMPLETE ("ok" when it was not refused)."""
    out = []
    with redis.Redis(port=port) as c:
        for head in (("EVAL", SCRIPTS["complete"].source), ("EMQ.COMPLETE",)):
            try:
                c.execute_command(*head, len(keys), *keys, *args)
                out.append("ok")
            except redis.ResponseError as exc:  # MovedError is one; its prefix is its type
                out.append(f"{type(exc).__name__}: {exc}")
    return out[0], out[1]


@pytest.mark.cluster
def test_cluster_refuses_emq_calls_as_it_refuses_eval(
    native_cluster: EmbeddedCluster, qname: str
) -> None:
    """A node must refuse an EMQ.* call the way it refuses the script's EVAL: keys of two
    queues (two slots) -> CROSSSLOT; keys of a slot it does not serve -> MOVED (so a client
    with an old slot map, e.g. after a failover, is redirected and refreshes it). Nothing
    is written either way."""
    cluster = native_cluster
    node = cluster.primaries()[0]
    a = next(
        f"{qname}-a{i}" for i in range(100) if _slot_owner(cluster, f"{qname}-a{i}") == node.port
    )
    b = next(
        f"{qname}-b{i}" for i in range(100) if _slot_owner(cluster, f"{qname}-b{i}") != node.port
    )
    jid = echomq.ids.mint()
    cross = _eval_and_emq(
        node.port,
        [keyspace.queue_key(a, "active"), keyspace.queue_key(b, "job:" + jid)],
        [keyspace.queue_key(a, ""), jid, 1, 0],
    )
    foreign = _eval_and_emq(
        node.port,
        [keyspace.queue_key(b, "active"), keyspace.queue_key(b, "job:" + jid)],
        [keyspace.queue_key(b, ""), jid, 1, 0],
    )
    with redis.Redis(port=node.port) as c:
        assert c.execute_command("DBSIZE") == 0  # neither call wrote anything here
    assert "hash to the same slot" in cross[0] and foreign[0].startswith("MovedError"), (
        cross,
        foreign,
    )
    # (EMQ.COMPLETE answers, EVAL answers) for keys of two slots, and of a foreign slot.
    assert (cross[1], foreign[1]) == (cross[0], foreign[0])


@pytest.mark.cluster
def test_native_on_the_cluster_with_a_failover(native_cluster: EmbeddedCluster, qname: str) -> None:
    cluster = native_cluster
    url = cluster.url + "?executor=native"
    names = [f"{qname}-{i}" for i in range(9)]
    owners = {_slot_owner(cluster, n) for n in names}
    assert owners == {n.port for n in cluster.primaries()}, owners  # every shard serves
    before = _cluster_emq(cluster)
    for name in names:
        with echomq.Queue(name, url=url) as q:
            q.enqueue(b"a")
            q.enqueue_many([b"b", b"c"], group="lane")
            q.enqueue(b"d", delay_ms=10)
            jobs = q.claim_batch(3, lease_ms=60_000)
            assert len(jobs) == 3
            q.extend(jobs[0].id, jobs[0].token, lease_ms=60_000)
            q.complete(jobs[0].id, jobs[0].token)
            assert q.retry(jobs[1].id, jobs[1].token, delay_ms=0, max_attempts=1, error="e") == (
                "dead"
            )
            q.reprocess(jobs[1].id)
            short = q.claim(lease_ms=20)
            assert short is not None

            def swept(queue: echomq.Queue = q) -> bool:  # q bound now: the loop moves on
                return queue.sweep_stalled(max_stalled=5) != ([], [])

            wait_for(swept, timeout=60)
            assert q.executor == "native"
            assert q.check() == []
    after = _cluster_emq(cluster)
    assert all(after[p] > before[p] for p in before), (before, after)  # on every primary

    # The failover of test_cluster_failover.py, on the native executor.
    run, q = _run_failover(cluster, url, qname + "-fo")
    try:
        lost, undone = _losses(run)
        assert q.check() == []
        assert len(run.enqueued) > 100
        assert q.counts()["dead"] == 0
        assert q.executor == "native"
        owner = _slot_owner(cluster, q.name)
        with redis.Redis(port=owner) as c:
            n0 = sum(emq_calls(c).values())
        job = q.enqueue(b"after")
        got = q.claim(lease_ms=60_000)
        assert got is not None and got.id == job.id
        q.complete(got.id, got.token)
        with redis.Redis(port=owner) as c:
            assert sum(emq_calls(c).values()) >= n0 + 3  # the new primary runs EMQ.*
        assert q.check() == []
        print(f"native failover: lost {len(lost)} enqueues, undid {len(undone)} completions")
    finally:
        q.close()
