"""Executor hardening (issue 10): connections of short-lived threads go back to the pool
(finding 6); an idle connection the server closed is reconnected before a command is sent
on it (finding 9); durable mode's error carries the applied reply and the job id, and the
enqueue retry it documents is idempotent (findings 4 and 8, executor half).

Public API only, so each test also runs against an older echomq to show it failed there.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import echomq
from echomq import DurabilityError, StaleToken
from echomq.server import EmbeddedServer


def _clients(r: redis.Redis) -> int:
    return int(r.info("clients")["connected_clients"])


# --------------------------------------------------------------------------- finding 6


def test_short_lived_threads_give_their_connections_back(
    url: str, qname: str, r: redis.Redis
) -> None:
    before = _clients(r)
    errors: list[BaseException] = []
    # retry_for=0: a pool exhausted by leaked connections fails at once (an error below)
    # instead of riding out MaxConnectionsError for 10 s per call: the errors say it, where
    # the slowest call's and the whole run's times did (issue 36).
    with echomq.Queue(qname, url=url, retry_for=0) as q:

        def one(i: int) -> None:
            try:
                q.enqueue(b"x")
            except BaseException as exc:  # collected: the assertion below names it
                errors.append(exc)

        for batch in range(30):  # 300 threads, 10 alive at a time
            threads = [threading.Thread(target=one, args=(batch * 10 + i,)) for i in range(10)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            # The server never sees more connections than threads alive at once, twice over
            # for the first batch (+ slack): each first enqueue also leases the mint node
            # (D2) on a connection of its own while its plan holds one. A leak would grow
            # with every batch of the 30.
            assert _clients(r) <= before + 2 * 10 + 5
        assert errors == []
        assert q.pending_size() == 300


def test_app_queues_share_a_pool_that_short_lived_threads_do_not_starve(
    url: str, qname: str
) -> None:
    app = echomq.App(url)
    errors: list[BaseException] = []
    try:
        app.queue(qname)._x.retry_for = 0  # fail fast rather than wait out an exhausted pool

        def one() -> None:
            try:
                app.queue(qname).enqueue(b"x")
            except BaseException as exc:  # collected: the assertion below names it
                errors.append(exc)

        for _ in range(150):
            t = threading.Thread(target=one)
            t.start()
            t.join()
        assert errors == []
        assert app.queue(qname).pending_size() == 150
    finally:
        app.close()


# --------------------------------------------------------------------------- finding 9


@pytest.fixture(scope="module")
def idle_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    """A server that closes connections idle for 1 s (its ``timeout`` setting)."""
    srv = EmbeddedServer(
        Path(tmp_path_factory.mktemp("idle")), appendonly=False, args=["--timeout", "1"]
    ).start()
    yield srv
    srv.stop()


def test_a_settle_after_the_servers_idle_timeout_reconnects_first(
    idle_server: EmbeddedServer, qname: str
) -> None:
    with echomq.Queue(qname, url=idle_server.url) as q:
        q.enqueue_many([b"a", b"b"])
        first = q.claim()
        second = q.claim()
        assert first is not None and second is not None
        time.sleep(2.5)  # the server closes the idle connection meanwhile
        q.complete(first.id, first.token)  # never replayed: it must not fail unsent
        time.sleep(2.5)
        assert q.retry(second.id, second.token, delay_ms=0, max_attempts=5, error="e") == (
            "scheduled"
        )
        time.sleep(2.5)
        q.remove(second.id)  # never resent either
        counts = q.counts()
        assert counts["active"] == 0
        assert counts.get("schedule", 0) + counts.get("scheduled", 0) == 0


def test_async_settles_after_the_servers_idle_timeout(
    idle_server: EmbeddedServer, qname: str
) -> None:
    # The asyncio pool checks a connection before lending it; this keeps that promise
    # covered on the same server setting.
    async def main() -> None:
        async with echomq.AsyncQueue(qname, url=idle_server.url) as aq:
            await aq.enqueue(b"a")
            job = await aq.claim()
            assert job is not None
            await asyncio.sleep(2.5)
            await aq.complete(job.id, job.token)
            assert (await aq.counts())["active"] == 0

    asyncio.run(main())


# --------------------------------------------------------------------------- findings 4 and 8


@pytest.fixture
def dq(url: str, qname: str) -> Iterator[echomq.Queue]:
    """A durable queue on a server with no replica: every write applies, none is acked."""
    queue = echomq.Queue(qname, url=url, durable=1)
    queue._x.durable_timeout_ms = 20  # WAIT gives up fast: there is no replica to wait for
    yield queue
    queue.close()


def test_durability_error_carries_the_job_id_and_the_retry_is_idempotent(
    dq: echomq.Queue,
) -> None:
    with pytest.raises(DurabilityError) as info:
        dq.enqueue(b"payload")
    err = info.value
    assert err.acked == 0 and err.wanted == 1
    assert err.job_id is not None and err.job_id.startswith("JOB")
    assert err.reply == "enqueued"  # the write applied
    assert dq.pending_size() == 1
    # The documented retry: the same id. It never makes a second job.
    with pytest.raises(DurabilityError) as again:
        dq.enqueue(b"payload", id=err.job_id)
    assert again.value.job_id == err.job_id
    assert again.value.reply == "duplicate"
    assert dq.pending_size() == 1


def test_durability_error_carries_what_a_claim_and_a_settle_applied(
    dq: echomq.Queue,
) -> None:
    with pytest.raises(DurabilityError):
        dq.enqueue_many([b"1", b"2", b"3"])
    with pytest.raises(DurabilityError) as claimed:
        dq.claim()
    job = claimed.value.reply
    assert isinstance(job, echomq.Job) and job.token == 1  # the claim landed: run it
    with pytest.raises(DurabilityError) as settled:
        dq.settle(completed=[(job.id, job.token)], n=2)
    out = settled.value.reply
    assert out.completed == [None] and len(out.jobs) == 2
    with pytest.raises(DurabilityError) as done:
        dq.complete(out.jobs[0].id, out.jobs[0].token)
    assert done.value.job_id == out.jobs[0].id and done.value.reply is None
    # A refusal wrote nothing to acknowledge: it is raised as itself.
    with pytest.raises(StaleToken):
        dq.complete(out.jobs[1].id, out.jobs[1].token + 1)
    counts = dq.counts()
    assert counts["active"] == 1 and counts["pending"] == 0


def test_async_durability_error_carries_the_reply(url: str, qname: str) -> None:
    async def main() -> None:
        aq = echomq.AsyncQueue(qname, url=url, durable=1)
        aq._x.durable_timeout_ms = 20
        try:
            with pytest.raises(DurabilityError) as info:
                await aq.enqueue(b"x")
            assert info.value.reply == "enqueued" and info.value.job_id is not None
            with pytest.raises(DurabilityError) as claimed:
                await aq.claim()
            assert isinstance(claimed.value.reply, echomq.Job)
            assert claimed.value.reply.id == info.value.job_id
        finally:
            await aq.aclose()

    asyncio.run(main())
