"""The per-verb integration tests of the edges: stale tokens after a reap, settling a
settled or released lease, script flush and error mapping on EVAL and EVALSHA, the
version fence, the settle/complete_many calls and the kept errors of a job.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from queue_verbs_support import (
    LANE,
    K,
    assert_lease,
    make_dead,
    places,
    queue_keys,
    ring,
    row,
    smembers,
    spy_commands,
)

import echomq
from conftest import SyncOverAsync, server_ms, snapshot, wait_for
from echomq import ids
from echomq.errors import (
    JobGone,
    KindError,
    StaleToken,
    VersionFenceError,
)
from echomq.protocol.scripts import SCRIPTS
from echomq.server import EmbeddedServer

# Every test that reaches a server runs on both executors (tests/conftest.py).
pytestmark = pytest.mark.executors


def test_stale_token_after_reap_and_reclaim(anyq: Any, r: redis.Redis, qname: str) -> None:
    anyq.enqueue(b"x")
    old = anyq.claim(lease_ms=40)
    assert wait_for(anyq.reap) == 1
    new = anyq.claim(lease_ms=60_000)
    assert new.id == old.id and new.token == old.token + 1
    before = snapshot(r, qname)
    with pytest.raises(StaleToken, match="complete token mismatch"):
        anyq.complete(old.id, old.token)
    with pytest.raises(StaleToken, match="retry token mismatch"):
        anyq.retry(old.id, old.token, delay_ms=0, max_attempts=1, error="late")
    with pytest.raises(StaleToken, match="delay token mismatch"):
        anyq.delay(old.id, old.token, 0)
    with pytest.raises(StaleToken, match="extend token mismatch"):
        anyq.extend(old.id, old.token, lease_ms=1_000)
    assert anyq.extend_many([(old.id, old.token)], lease_ms=1_000) == [old.id]
    assert snapshot(r, qname) == before
    anyq.complete(new.id, new.token)
    assert anyq.check() == []


@pytest.mark.parametrize("grouped", [False, True], ids=["flat", "lane"])
@pytest.mark.parametrize("verb", ["complete", "retry", "delay-0", "delay", "extend", "extend_many"])
def test_settle_a_reaped_unclaimed_job(
    anyq: Any, r: redis.Redis, qname: str, verb: str, grouped: bool
) -> None:
    group = LANE if grouped else None
    waiting = f"lane {LANE}" if grouped else "pending"
    jid = anyq.enqueue(b"x", group=group).id
    job = anyq.claim(lease_ms=40)
    assert wait_for(anyq.reap) == 1
    assert places(r, qname, jid) == [waiting]
    if verb == "complete":
        anyq.complete(jid, job.token)
        expected: list[str] = []
    elif verb == "retry":
        assert anyq.retry(jid, job.token, delay_ms=60_000, max_attempts=5, error="e") == (
            "scheduled"
        )
        expected = ["schedule"]
    elif verb == "delay-0":
        anyq.delay(jid, job.token, 0)
        expected = [waiting]
    elif verb == "delay":
        anyq.delay(jid, job.token, 60_000)
        expected = ["schedule"]
    else:
        t0 = server_ms(r)
        if verb == "extend":
            anyq.extend(jid, job.token, lease_ms=60_000)
        else:
            assert anyq.extend_many([(jid, job.token)], lease_ms=60_000) == []
        t1 = server_ms(r)
        assert_lease(r, qname, jid, t0, t1, 60_000)
        assert row(r, qname, jid)["state"] == b"active"  # re-armed
        expected = ["active"]
    assert places(r, qname, jid) == expected  # exactly one place (or none once completed)
    gactive = r.hget(K(qname, "gactive"), LANE)
    assert gactive == (b"1" if grouped and expected == ["active"] else None)
    if expected == [waiting]:
        assert ring(r, qname) == [LANE if grouped else "*"]
    else:
        assert ring(r, qname) == []
        assert smembers(r, K(qname, "lanes")) == set()
    assert anyq.check() == []


def test_settling_a_settled_lease_is_stale(anyq: Any, r: redis.Redis, qname: str) -> None:
    anyq.enqueue(b"x")
    job = anyq.claim()
    anyq.retry(job.id, job.token, delay_ms=60_000, max_attempts=5, error="e")
    before = snapshot(r, qname)
    with pytest.raises(StaleToken, match="complete lease settled"):
        anyq.complete(job.id, job.token)
    with pytest.raises(StaleToken, match="extend lease settled"):
        anyq.extend(job.id, job.token, lease_ms=1_000)
    with pytest.raises(StaleToken, match="retry lease settled"):
        anyq.retry(job.id, job.token, delay_ms=0, max_attempts=5, error="e")
    with pytest.raises(StaleToken, match="delay lease settled"):
        anyq.delay(job.id, job.token, 0)
    assert snapshot(r, qname) == before
    dead = make_dead(anyq)
    with pytest.raises(StaleToken, match="complete lease settled"):
        anyq.complete(dead, 1)
    assert places(r, qname, dead) == ["dead"]


@pytest.mark.parametrize("grouped", [False, True], ids=["flat", "lane"])
@pytest.mark.parametrize("route", ["retry-promote", "delay-0", "dead-reprocess", "stall-reprocess"])
def test_a_released_lease_never_settles_again(
    anyq: Any, r: redis.Redis, qname: str, route: str, grouped: bool
) -> None:
    """Regression (D5 vs D13): a job back in pending because its holder released it (not
    because its lease lapsed) keeps its attempts, but the holder's token must not settle it
    a second time: each lease generation settles at most once."""
    jid = anyq.enqueue(b"x", group=LANE if grouped else None).id
    job = anyq.claim(lease_ms=60_000 if route != "stall-reprocess" else 40)
    if route == "retry-promote":
        assert anyq.retry(jid, job.token, delay_ms=0, max_attempts=5, error="e") == "scheduled"
        assert wait_for(anyq.promote) == 1
    elif route == "delay-0":
        anyq.delay(jid, job.token, 0)
    elif route == "dead-reprocess":
        assert anyq.retry(jid, job.token, delay_ms=0, max_attempts=1, error="e") == "dead"
        anyq.reprocess(jid)
    else:
        assert wait_for(lambda: anyq.sweep_stalled(max_stalled=1)[1]) == [jid]
        anyq.reprocess(jid)
    assert anyq.job_state(jid) == "pending"
    before = snapshot(r, qname)
    for verb in ("complete", "retry", "delay", "extend"):
        with pytest.raises(StaleToken, match=f"{verb} lease settled"):
            if verb == "complete":
                anyq.complete(jid, job.token)
            elif verb == "retry":
                anyq.retry(jid, job.token, delay_ms=0, max_attempts=9, error="late")
            elif verb == "delay":
                anyq.delay(jid, job.token, 0)
            else:
                anyq.extend(jid, job.token, lease_ms=1_000)
    assert anyq.extend_many([(jid, job.token)], lease_ms=1_000) == [jid]
    assert snapshot(r, qname) == before
    again = anyq.claim(lease_ms=60_000)
    assert again.id == jid and again.token == job.token + 1
    anyq.complete(jid, again.token)
    counts = anyq.counts()
    assert counts["completed"] == 1
    assert anyq.check() == []


def test_a_never_claimed_job_cannot_be_settled(anyq: Any, r: redis.Redis, qname: str) -> None:
    jid = anyq.enqueue(b"x").id
    before = snapshot(r, qname)
    with pytest.raises(StaleToken):
        anyq.complete(jid, 1)
    with pytest.raises(StaleToken):
        anyq.extend(jid, 1, lease_ms=1_000)
    assert snapshot(r, qname) == before


def test_script_flush_between_calls(anyq: Any, r: redis.Redis, qname: str) -> None:
    anyq.enqueue(b"a")
    r.script_flush()
    job = anyq.claim(lease_ms=5_000)
    r.script_flush()
    out = anyq.enqueue_many([b"b", b"c"])  # the pipeline path
    assert [e.status for e in out] == ["enqueued", "enqueued"]
    r.script_flush()
    anyq.complete(job.id, job.token)
    r.script_flush()
    assert len(anyq.claim_batch(5)) == 2
    r.script_flush()
    assert anyq.counts()["active"] == 2
    assert anyq.check() == []


@pytest.mark.executors("lua")  # about EVALSHA -> NOSCRIPT -> EVAL itself
def test_error_mapping_is_identical_on_eval_and_evalsha(
    anyq: Any, r: redis.Redis, qname: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    anyq.enqueue(b"x")
    job = anyq.claim()
    seen = spy_commands(monkeypatch, anyq)
    sha = SCRIPTS["complete"].sha
    r.script_flush()
    assert r.script_exists(sha) == [False]
    with pytest.raises(StaleToken) as cold:
        anyq.complete(job.id, job.token + 1)
    assert seen == ["EVALSHA", "EVAL"]  # NOSCRIPT, then EVAL
    assert r.script_exists(sha) == [True]
    with pytest.raises(StaleToken) as warm:
        anyq.complete(job.id, job.token + 1)
    assert seen == ["EVALSHA", "EVAL", "EVALSHA"]
    assert str(cold.value) == str(warm.value) == "EMQSTALE complete token mismatch"
    oid = ids.mint("ORD")
    r.script_flush()
    with pytest.raises(KindError) as cold_kind:
        anyq.enqueue(b"x", id=oid)
    with pytest.raises(KindError) as warm_kind:
        anyq.enqueue(b"x", id=oid)
    assert str(cold_kind.value) == str(warm_kind.value)
    # The pipeline path: per-item verdicts, cold and warm.
    r.script_flush()
    cold_many = anyq.enqueue_many([(oid, b"x")])
    warm_many = anyq.enqueue_many([(oid, b"x")])
    assert isinstance(cold_many[0], KindError) and isinstance(warm_many[0], KindError)
    assert str(cold_many[0]) == str(warm_many[0]) == str(cold_kind.value)


@pytest.fixture(scope="module")
def fence_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A dedicated server: {emq}:version is global, so these tests must not share one."""
    srv = EmbeddedServer(Path(tmp_path_factory.mktemp("fence")), appendonly=False).start()
    yield srv.url
    srv.stop()


@pytest.fixture
def fr(fence_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(fence_url)
    yield client
    client.close()


def _queue(kind: str, name: str, url: str) -> Any:
    if kind == "sync":
        return echomq.Queue(name, url=url)
    return SyncOverAsync(echomq.AsyncQueue(name, url=url))


VERSION = "{emq}:version"


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_fence_claims_an_absent_version(fr: redis.Redis, fence_url: str, kind: str) -> None:
    fr.delete(VERSION)
    queue = _queue(kind, f"fence-absent-{kind}", fence_url)
    try:
        assert queue.pending_size() == 0
        assert fr.get(VERSION) == echomq.WIRE_VERSION.encode()
    finally:
        queue.close()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_fence_refuses_a_foreign_version(fr: redis.Redis, fence_url: str, kind: str) -> None:
    name = f"fence-foreign-{kind}"
    fr.set(VERSION, "echomq:2.4.2")
    queue = _queue(kind, name, fence_url)
    try:
        with pytest.raises(VersionFenceError) as info:
            queue.enqueue(b"x")
        assert info.value.found == "echomq:2.4.2"
        assert info.value.expected == echomq.WIRE_VERSION
        with pytest.raises(VersionFenceError):
            queue.pending_size()
        assert fr.get(VERSION) == b"echomq:2.4.2"  # never overwritten
        assert queue_keys(fr, name) == []
    finally:
        queue.close()
        fr.set(VERSION, echomq.WIRE_VERSION)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_fence_reruns_after_a_reconnect(fr: redis.Redis, fence_url: str, kind: str) -> None:
    name = f"fence-reconnect-{kind}"
    fr.set(VERSION, echomq.WIRE_VERSION)
    queue = _queue(kind, name, fence_url)
    try:
        queue.enqueue(b"x")
        fr.set(VERSION, "echomq:9.9.9")
        # The fence runs per connection: the live one keeps serving...
        assert queue.pending_size() == 1
        # ...until it is gone; the reconnect fences again and refuses.
        assert fr.client_kill_filter(_type="normal", skipme=True) >= 1
        with pytest.raises((VersionFenceError, redis.ConnectionError)) as info:
            queue.pending_size()
        if kind == "async" and isinstance(info.value, redis.ConnectionError):
            # redis-py's asyncio pool may hand out the dead connection once; the driver's
            # error propagates (never replayed) and the next call reconnects, fenced.
            with pytest.raises(VersionFenceError) as info:
                queue.pending_size()
        assert isinstance(info.value, VersionFenceError)
        assert info.value.found == "echomq:9.9.9"
        with pytest.raises(VersionFenceError):
            queue.enqueue(b"y")
        assert fr.get(VERSION) == b"echomq:9.9.9"
        assert fr.zcard(K(name, "pending")) == 1
        fr.set(VERSION, echomq.WIRE_VERSION)
        assert queue.pending_size() == 1
    finally:
        queue.close()
        fr.set(VERSION, echomq.WIRE_VERSION)


def test_fence_server_runs_apart(fence_url: str, redis_url: str) -> None:
    # The fence tests above must never touch the session server's version key.
    assert fence_url != redis_url
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.get(VERSION) in (None, echomq.WIRE_VERSION.encode())
    finally:
        client.close()


def test_settle_completes_retries_and_claims_in_one_call(
    anyq: Any, r: redis.Redis, qname: str
) -> None:
    ids_ = [e.id for e in anyq.enqueue_many([b"a", b"b", b"c", b"d", b"e"])]
    a, b, c = anyq.claim_batch(3, lease_ms=60_000)
    out = anyq.settle(
        completed=[(a.id, a.token), (b.id, b.token + 1)],
        retried=[(c.id, c.token, 60_000, 5, "boom"), (ids_[4], 1, 0, 5, "never claimed")],
        n=5,
        lease_ms=60_000,
    )
    assert out.completed[0] is None
    assert isinstance(out.completed[1], StaleToken)
    assert out.retried[0] == "scheduled"
    assert isinstance(out.retried[1], StaleToken)  # a pending, never-claimed job
    assert [j.id for j in out.jobs] == ids_[3:]  # claimed after the settles, oldest first
    assert all(j.token == 1 for j in out.jobs)
    assert places(r, qname, a.id) == []
    assert places(r, qname, b.id) == ["active"]
    assert places(r, qname, c.id) == ["schedule"]
    assert row(r, qname, c.id)["last_error"] == b"boom"
    counts = anyq.counts()
    assert counts["completed"] == 1 and counts["active"] == 3 and counts["schedule"] == 1
    assert anyq.check() == []


def test_settle_dead_letters_at_the_ceiling_and_reports_gone(anyq: Any, qname: str) -> None:
    anyq.enqueue(b"x")
    job = anyq.claim()
    gone = ids.mint()
    out = anyq.settle(retried=[(job.id, job.token, 0, 1, "fatal"), (gone, 1, 0, 1, "x")])
    assert out.retried[0] == "dead"
    assert isinstance(out.retried[1], JobGone)
    assert out.jobs == []
    assert anyq.counts()["failed"] == 1
    assert anyq.check() == []


def test_settle_claim_respects_pause_and_lanes(anyq: Any, qname: str) -> None:
    anyq.enqueue_many([b"1", b"2"], group="A")
    anyq.enqueue_many([b"3", b"4"], group="B")
    anyq.pause()
    assert anyq.settle(n=4).jobs == []
    anyq.resume()
    groups = [j.group for j in anyq.settle(n=4).jobs]
    assert groups == ["A", "B", "A", "B"]
    assert anyq.check() == []


def test_complete_many_returns_the_refused_ids(anyq: Any, qname: str) -> None:
    anyq.enqueue_many([b"1", b"2", b"3"])
    a, b, c = anyq.claim_batch(3)
    gone = ids.mint()
    assert anyq.complete_many([(a.id, a.token), (b.id, 99), (gone, 1), (c.id, c.token)]) == [
        b.id,
        gone,
    ]
    assert anyq.complete_many([]) == []
    assert anyq.counts()["completed"] == 2
    assert anyq.check() == []


def test_errors_keep_each_failed_attempt_and_go_with_the_row(anyq: Any, r: redis.Redis) -> None:
    jid = anyq.enqueue(b"e").id
    for n in range(1, 13):
        job = anyq.claim()
        assert job.id == jid
        verdict = anyq.retry(jid, job.token, delay_ms=0, max_attempts=12, error=f"boom {n}")
        if verdict == "scheduled":
            anyq.promote()
    assert verdict == "dead"
    errors = anyq.errors(jid)
    assert errors == [f"attempt {n}: boom {n}" for n in range(3, 13)]  # the last 10
    anyq.remove(jid)
    assert not r.exists(f"emq:{{{anyq.name}}}:job:{jid}:errors")
    with pytest.raises(JobGone):
        anyq.errors(jid)


def test_a_completed_job_takes_its_errors_with_it(anyq: Any, r: redis.Redis) -> None:
    """Both completion paths (complete, and the worker's batch settle) delete <row>:errors."""
    for batch in (False, True):
        jid = anyq.enqueue(b"e").id
        job = anyq.claim()
        assert anyq.retry(jid, job.token, delay_ms=0, max_attempts=3, error="once") == "scheduled"
        anyq.promote()
        job = anyq.claim()
        assert anyq.errors(jid) == ["attempt 1: once"]
        if batch:
            assert anyq.settle(completed=[(jid, job.token)]).completed == [None]
        else:
            anyq.complete(jid, job.token)
        row = f"emq:{{{anyq.name}}}:job:{jid}"
        assert not r.exists(row, row + ":errors")
