"""Server crash: the queue's redis-server (AOF on) is SIGKILLed mid-run and restarted on the
same directory and port while producers (``Queue(retry_for=30)``) and worker processes run.

Producers and workers reconnect with backoff and pass the version fence again; no enqueue
that returned is lost, and the run completes. Under ``appendfsync always`` every
acknowledged write is on disk before its reply; under ``everysec`` the test measures how many
acknowledged enqueues a process kill loses. The workers keep their bookkeeping on the
session server, which does not crash, so the measurement does not depend on the AOF it
measures.

Also here: the warning echomq logs when the server may evict keys (maxmemory-policy).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import echomq
from conftest import wait_for
from echomq.server import EmbeddedServer
from procs import Proc, Spawner, wait_log
from reliability import leftover_keys, payload, read_books

PRODUCERS = 2
PER_PRODUCER = 1500
WORKERS = 2

pytestmark = [pytest.mark.chaos]


@pytest.fixture
def crashing_server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[EmbeddedServer]:
    srv = EmbeddedServer(tmp_path / "aof", appendonly=True, fsync=request.param)
    srv.start()
    yield srv
    srv.stop()


class Producer(threading.Thread):
    """Enqueues ``chaos.run(n)`` for its range of n, one call at a time, and remembers what
    each call answered."""

    def __init__(self, url: str, queue: str, first: int, count: int) -> None:
        super().__init__(daemon=True)
        self.q = echomq.Queue(queue, url=url, retry_for=30)
        self.todo = range(first, first + count)
        self.acked: dict[str, int] = {}
        self.errors: list[BaseException] = []
        self.slowest = 0.0

    def run(self) -> None:
        try:
            for n in self.todo:
                t0 = time.monotonic()
                try:
                    e = self.q.enqueue(payload(n))
                except (redis.RedisError, echomq.EchoMQError) as exc:
                    self.errors.append(exc)  # not acknowledged: it may or may not exist
                    continue
                self.slowest = max(self.slowest, time.monotonic() - t0)
                assert e.status == "enqueued"
                self.acked[e.id] = n
                time.sleep(0.002)
        finally:
            self.q.close()


def worker(spawn: Spawner, srv: EmbeddedServer, queue: str) -> Proc:
    env = spawn.env(
        ECHOMQ_URL=srv.url,  # the crashing server
        EMQ_TEST_HISTORY_URL=spawn.url,  # the bookkeeping stays on the session server
        EMQ_TEST_QUEUE=queue,
        EMQ_TEST_LEASE_MS="3000",
        EMQ_TEST_RUN_MS="5",
    )
    args = ["-c", "16", "--beat-ms", "200", "--max-stalled", "1000000"]
    return spawn.start("worker", "apps.chaos:app", *args, env=env)


@pytest.mark.parametrize("crashing_server", ["always", "everysec"], indirect=True)
def test_server_sigkill_mid_run(
    crashing_server: EmbeddedServer, spawn: Spawner, r: redis.Redis, qname: str
) -> None:
    srv = crashing_server
    q = echomq.Queue(qname, url=srv.url, retry_for=30)
    workers = [worker(spawn, srv, qname) for _ in range(WORKERS)]
    for w in workers:
        wait_log(w, "serving", timeout=60)
    producers = [Producer(srv.url, qname, i * PER_PRODUCER, PER_PRODUCER) for i in range(PRODUCERS)]
    for p in producers:
        p.start()
    total = PRODUCERS * PER_PRODUCER
    wait_for(lambda: sum(len(p.acked) for p in producers) >= total * 0.4, timeout=60)

    acked_before_kill = sum(len(p.acked) for p in producers)
    srv.kill()  # SIGKILL: no shutdown, no final fsync
    killed_at = time.monotonic()
    time.sleep(1.0)
    srv.start()  # the same directory (the AOF) and port
    restarted = time.monotonic() - killed_at

    for p in producers:
        p.join(120)
        assert not p.is_alive(), "a producer is stuck"
    acked = {i: n for p in producers for i, n in p.acked.items()}
    unacked = sum(len(p.errors) for p in producers)
    assert unacked == 0, [e for p in producers for e in p.errors][:3]  # retry_for rode it out
    assert len(acked) == total

    def drained() -> bool:
        c = q.counts()
        return c["pending"] + c["active"] + c["schedule"] == 0

    wait_for(drained, timeout=120)
    books = read_books(r, qname)
    ran = {job_id for job_id, _, _, _ in books.history}
    lost = [i for i in acked if i not in ran]
    counts = q.counts()
    print(
        f"\ncrash ({srv.fsync}): {total} acknowledged enqueues ({acked_before_kill} before the "
        f"SIGKILL), server back after {restarted:.1f}s, slowest enqueue "
        f"{max(p.slowest for p in producers):.2f}s; lost acknowledged enqueues: {len(lost)}; "
        f"runs {len(books.history)} (redeliveries {len(books.history) - len(ran)}), "
        f"completed metric {counts['completed']}, settles refused {len(books.refused)}"
    )
    # SIGKILL of the process: the AOF write(2) happens before the reply in both modes, so the
    # kernel has every acknowledged write (everysec's window is an OS crash or power loss).
    assert lost == []
    assert counts["dead"] == 0
    assert ran == set(acked)  # nothing unacknowledged got in either (every call returned)
    if srv.fsync == "always":
        assert counts["completed"] == len(ran)  # each job completed exactly once
    assert q.check() == []
    assert leftover_keys(r, qname) == []  # r is the session server: nothing of ours there
    with redis.Redis.from_url(srv.url) as c:
        assert leftover_keys(c, qname) == []
        # Every reconnect passed the version fence again: its GET of {emq}:version is the
        # only GET anyone sends to this server (since the restart's fresh counters).
        gets = int(c.info("commandstats").get("cmdstat_get", {}).get("calls", 0))
        assert gets >= WORKERS + PRODUCERS, gets
        assert c.get("{emq}:version") == b"echomq:3.0.0"
    for w in workers:
        assert w.popen.poll() is None, w.text()[-3000:]
        w.signal(15)
        assert w.wait(30) == 0, w.text()[-3000:]
        assert "Traceback" not in w.text(), w.text()[-3000:]
    q.close()


# --------------------------------------------------------------------------- eviction


def test_eviction_policy_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, url: str, qname: str
) -> None:
    """echomq requires maxmemory-policy noeviction: an evicting server silently loses rows
    and set members, i.e. jobs. It says so once, at the first fence."""
    lru = EmbeddedServer(
        tmp_path / "lru", appendonly=False, args=["--maxmemory-policy", "allkeys-lru"]
    ).start()
    try:
        with caplog.at_level(logging.WARNING, logger="echomq"):
            q = echomq.Queue(qname, url=lru.url)
            q.counts()
            q.counts()
            q.close()
        warnings = [r for r in caplog.records if "maxmemory-policy" in r.getMessage()]
        assert len(warnings) == 1, caplog.text
        assert "allkeys-lru" in warnings[0].getMessage()
        assert "noeviction" in warnings[0].getMessage()
    finally:
        lru.stop()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="echomq"):
        q = echomq.Queue(qname, url=url)  # the session server: noeviction
        q.counts()
        q.close()
    assert not [r for r in caplog.records if "maxmemory-policy" in r.getMessage()]


# --------------------------------------------------------------------------- startup


def test_worker_started_before_the_server_waits_for_it(
    tmp_path: Path, spawn: Spawner, r: redis.Redis, qname: str
) -> None:
    """A worker whose server is restarting (or whose first connection drops) rides it out
    like any call (DEFAULT_RETRY_FOR, 10 s) instead of exiting on its first fence."""
    srv = EmbeddedServer(tmp_path / "late", appendonly=False)  # a free port, not started yet
    env = spawn.env(ECHOMQ_URL=srv.url, EMQ_TEST_HISTORY_URL=spawn.url, EMQ_TEST_QUEUE=qname)
    w = spawn.start("worker", "apps.chaos:app", "--beat-ms", "200", env=env)
    try:
        wait_log(w, "server unreachable at startup", timeout=30)
        srv.start()
        wait_log(w, "serving", timeout=30)
        q = echomq.Queue(qname, url=srv.url)
        job = q.enqueue(payload(7)).id
        wait_for(lambda: q.counts()["completed"] == 1, timeout=30)
        assert read_books(r, qname).history[0][0] == job
        q.close()
        w.signal(15)
        assert w.wait(30) == 0, w.text()
    finally:
        srv.stop()
