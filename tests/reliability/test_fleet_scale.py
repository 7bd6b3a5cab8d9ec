"""Minted ids at fleet scale (issue 37): 64 producer processes (forked from one launcher,
``apps.fleet_producer``), each with its own node leased from the server, wake on one
wall-clock millisecond and make 1,000 single enqueues each (64,000 jobs) through a loopback
proxy that drops replies (``test_proxy.Proxy``: the command ran, its reply is lost, the
client resends with the same id and no nonce -- the id is the marker). A worker loop in
the test runs them. Every acknowledged job runs exactly once (each payload is its producer
and sequence number), no job runs that was not acknowledged, and no two producers minted on
one node.

Lua executor only: the proxy recognises script calls (EVAL/EVALSHA) to drop their replies;
the resend rule on the native executor is covered by tests/protocol/test_fleet_ids.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import redis
from test_proxy import Proxy, children, proxies, server_port  # noqa: F401

import echomq
from echomq import ids
from procs import TESTS_DIR, Spawner

pytestmark = [pytest.mark.slow, pytest.mark.chaos]

PRODUCERS = 64
PER_PRODUCER = 1_000


@pytest.mark.timeout(900)
def test_64_producers_on_one_millisecond_through_a_lossy_proxy(
    spawn: Spawner,
    proxies: list[Proxy],  # noqa: F811
    children: list[subprocess.Popen[bytes]],  # noqa: F811
    server_port: int,  # noqa: F811
    url: str,
    r: redis.Redis,
    qname: str,
    tmp_path: Path,
) -> None:
    proxy = Proxy(server_port, drop_reply=0.01, seed=37).start()
    proxies.append(proxy)
    env = spawn.env(ECHOMQ_URL=proxy.url)
    t0 = time.monotonic()
    # The barrier: a wall-clock millisecond far enough ahead for every process to start and
    # lease its node on this loaded box; each producer sleeps until it.
    start_ms = int(time.time() * 1000) + 15_000
    cmd = [sys.executable, "-m", "apps.fleet_producer", qname, str(PRODUCERS)]
    cmd += [str(PER_PRODUCER), str(start_ms), str(tmp_path)]
    log_path = tmp_path / "fleet.log"
    with open(log_path, "wb") as log:
        children.append(subprocess.Popen(cmd, cwd=TESTS_DIR, env=env, stdout=log, stderr=log))
    outs = [tmp_path / f"producer-{p}.jsonl" for p in range(PRODUCERS)]

    # The worker: runs (claims and completes) whatever is waiting while the fleet produces.
    q = echomq.Queue(qname, url=url, executor="lua")
    runs: Counter[bytes] = Counter()

    def work() -> int:
        jobs = q.claim_batch(500, lease_ms=600_000)
        for job in jobs:
            runs[job.payload] += 1
        if jobs:
            assert q.complete_many([(j.id, j.token) for j in jobs]) == []
        return len(jobs)

    deadline = time.monotonic() + 600
    while any(p.poll() is None for p in children):
        assert time.monotonic() < deadline, "the producers did not finish"
        if not work():
            time.sleep(0.05)
    assert children[0].wait(10) == 0, log_path.read_text()[-3000:]
    while work():
        pass
    took = time.monotonic() - t0

    acked: dict[bytes, str] = {}
    first_ms: list[int] = []
    nodes: dict[int, set[int]] = defaultdict(set)
    for p, out in enumerate(outs):
        lines = [json.loads(x) for x in out.read_text().splitlines()]
        assert [x[0] for x in lines] == list(range(PER_PRODUCER)), p
        failed = [x for x in lines if x[1] is None]
        assert failed == [], failed[:3]  # retry_for rode out every dropped reply
        for seq, jid, status in lines:
            assert status == "enqueued", (p, seq, jid, status)
            acked[f"{p}:{seq}".encode()] = jid
            n = ids.parse(jid)[1]
            nodes[(n >> 8) & (ids.NODES - 1)].add(p)
        first_ms.append(ids.decode_time_ms(lines[0][1]))
    assert len(acked) == PRODUCERS * PER_PRODUCER
    # Every acknowledged job ran exactly once; nothing else ran.
    assert set(runs) == set(acked), sorted(set(runs) ^ set(acked))[:5]
    twice = [k for k, n in runs.items() if n != 1]
    assert twice == [], twice[:5]
    assert len(set(acked.values())) == len(acked)
    # One leased node per producer: none shared.
    assert all(len(ps) == 1 for ps in nodes.values()), {
        n: ps for n, ps in nodes.items() if len(ps) > 1
    }
    assert len(nodes) >= PRODUCERS
    # The fleet did start together: most first ids are minted within a few ms of the barrier.
    assert sum(1 for ms in first_ms if ms - start_ms < 1000) >= PRODUCERS // 2, first_ms
    assert proxy.dropped > 100, proxy.dropped
    assert q.counts()["pending"] == 0 and q.check() == []
    q.close()
    print(
        f"\nfleet: {len(acked)} jobs from {PRODUCERS} producers in {took:.1f}s, "
        f"{proxy.dropped} replies dropped, {len(nodes)} nodes; first ids minted in the "
        f"barrier's ms: {sum(ms == start_ms for ms in first_ms)}, within 10 ms: "
        f"{sum(ms - start_ms < 10 for ms in first_ms)}, last {max(first_ms) - start_ms} ms after"
    )
