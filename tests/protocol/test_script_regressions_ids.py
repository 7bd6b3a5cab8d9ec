"""Regressions about ids and memory: ids given twice, branded ids and collating locales,
the retired record's generations, and maxmemory refusals (Lua and native).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from script_regressions_support import (
    K,
    sound,
)

import echomq
from echomq import Enqueued, ids
from echomq.server import EmbeddedServer, find_binary, free_port


@pytest.fixture
def small_server(tmp_path: Path) -> Any:
    srv = EmbeddedServer(tmp_path / "small", appendonly=False, args=["--maxmemory", "4mb"]).start()
    yield srv
    srv.stop()


def test_enqueue_is_refused_at_maxmemory(small_server: EmbeddedServer) -> None:
    r = redis.Redis.from_url(small_server.url)
    # The default retry_for: enqueues carry a nonce and leave replay markers.
    q = echomq.Queue("oom", url=small_server.url)
    limit = int(r.config_get("maxmemory")["maxmemory"])
    big = b"x" * 100_000
    refused = 0
    try:
        # The first write of an enqueue is the row's HSET: were any other write first (the
        # old script dropped expired replay markers first), Redis would let every later
        # write of the script through at maxmemory.
        for _ in range(200):
            try:
                q.enqueue(big)
            except redis.exceptions.OutOfMemoryError:
                # The server's OOM reply, left as the driver's error (a ResponseError).
                refused += 1
        assert refused > 100
        used = int(r.info("memory")["used_memory"])
        assert used < limit + 2 * len(big), f"used {used} against a limit of {limit}"
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            q.enqueue_many([big, big])
        assert int(r.info("memory")["used_memory"]) < limit + 2 * len(big)
        # A refused call wrote nothing; settling and removing still work and free memory.
        n = q.counts()["pending"]
        job = q.claim()
        assert job is not None
        q.complete(job.id, job.token)
        assert q.counts()["pending"] == n - 1
        assert q.check() == []
    finally:
        q.close()
        r.close()


def test_enqueue_many_with_an_id_twice_far_apart(q: echomq.Queue, r: redis.Redis) -> None:
    jid = ids.mint()
    items: list[Any] = [(jid, b"first")] + [b"filler"] * 1500 + [(jid, b"second")]
    out = q.enqueue_many(items)
    assert out[0] == Enqueued(jid, "enqueued")
    assert out[-1] == Enqueued(jid, "duplicate")
    assert q.get_job(jid)["payload"] == b"first"  # type: ignore[index]
    sound(r, q)


@pytest.mark.parametrize(
    ("suffix", "ok"),
    [
        ("AZz00000000", True),  # 'Z' < 'z' in bytes; a collation may say otherwise
        ("AzL8n0Y58m7", True),  # the largest legal value (2**63 - 1)
        ("AzL8n0Y58m8", False),
        ("AzL8n0Y58mZ", False),
        ("AzZ00000000", False),
        ("A0000000000", True),
    ],
)
def test_branded_ids_compare_by_bytes(
    q: echomq.Queue, r: redis.Redis, suffix: str, ok: bool
) -> None:
    jid = "JOB" + suffix
    r.hset(K(q.name, "job:" + jid), mapping={"state": "pending", "attempts": "0", "payload": "p"})
    r.zadd(K(q.name, "pending"), {jid: 0})
    r.rpush(K(q.name, "ring"), "*")
    r.sadd(K(q.name, "inring"), "*")
    job = q.claim()
    if ok:
        assert job is not None and job.id == jid
    else:
        assert job is None
        assert (r.zscore(K(q.name, "dead"), jid) or 0) > 0  # dead-lettered, at its time of death
        assert b"branded" in r.hget(K(q.name, "job:" + jid), "last_error")  # type: ignore[operator]


def test_branded_is_locale_independent_in_the_source() -> None:
    # Under LC_COLLATE=en_US.UTF-8 Lua's string `<=` is strcoll; the check must compare bytes.
    src = (Path(echomq.__file__).parent / "lua" / "include" / "lease.lua").read_text()
    body = src.split("local function branded", 1)[1].split("\nend", 1)[0]
    assert "string.byte" in body and "<= '" not in body


def _has_locale(name: str) -> bool:
    out = subprocess.run(["locale", "-a"], check=False, capture_output=True, text=True).stdout
    return name.lower().replace("-", "") in out.lower().replace("-", "").split()


@pytest.mark.skipif(
    not _has_locale("en_US.utf8") and not os.environ.get("CI"),
    reason="en_US.UTF-8 is not generated here (scripts/check generates it)",
)
def test_a_valid_id_is_served_under_a_collating_locale(tmp_path: Path) -> None:
    """Issue 10 #11, live: a redis-server started under en_US.UTF-8 collates Lua strings
    with strcoll, where `JOBAZz00000000` sorted outside the byte range of a branded id and
    was dead-lettered at claim. It must be served."""
    assert _has_locale("en_US.utf8"), "CI generates en_US.UTF-8 (scripts/check)"
    port = free_port()
    env = dict(os.environ, LC_ALL="en_US.UTF-8")
    args = ["--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(tmp_path)]
    proc = subprocess.Popen([find_binary(), *args], env=env, stdout=subprocess.DEVNULL)
    try:
        url = f"redis://127.0.0.1:{port}/0"
        r = redis.Redis.from_url(url)
        deadline = time.monotonic() + 10
        while True:
            try:
                r.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        q = echomq.Queue("locale", url=url)
        q.enqueue(b"x", id="JOBAZz00000000")
        job = q.claim()
        assert job is not None and job.id == "JOBAZz00000000"
        assert q.job_state(job.id) == "active"
        q.close()
        r.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_the_retired_record_keeps_two_generations(q: echomq.Queue, r: redis.Redis) -> None:
    """25,000 retirements fill a generation: it becomes retired:old and is still read; the
    next 25,000 drop it once it was closed ID_REPLAY_MS ago (a resend may still look for a
    minted id in it: issue 28), and an id retired that long ago restarts at 0."""

    def retire_batch(n: int) -> list[str]:
        jids = [ids.mint() for _ in range(n)]
        q.enqueue_many([(j, b"x") for j in jids])
        held: list[Any] = []
        while len(held) < n:
            held += q.claim_batch(1000)
        for i in range(0, n, 1000):
            assert q.complete_many((j.id, j.token) for j in held[i : i + 1000]) == []
        return jids

    first = retire_batch(25_000)
    assert r.hlen(K(q.name, "retired:old")) == 25_000
    assert r.hlen(K(q.name, "retired")) == 0
    q.enqueue(b"again", id=first[0])
    job = q.claim()
    assert job is not None and job.id == first[0] and job.token == 2  # continued, not 1
    q.complete(job.id, job.token)
    retire_batch(24_999)  # with the one above the current generation is full, but the one
    # before was closed less than ID_REPLAY_MS ago: it stays, the current one grows on
    assert r.hexists(K(q.name, "retired:old"), first[1])
    assert r.hlen(K(q.name, "retired")) == 25_000
    closed = int(r.hget(K(q.name, "meta"), "retired_closed") or 0)
    assert closed > 0
    r.hset(K(q.name, "meta"), "retired_closed", closed - 70_001)  # as if 70 s went by
    retire_batch(1000)
    assert r.hlen(K(q.name, "retired:old")) == 26_000 and r.hlen(K(q.name, "retired")) == 0
    assert not r.hexists(K(q.name, "retired:old"), first[1])
    q.enqueue(b"fresh again", id=first[1])
    job = q.claim()
    assert job is not None and job.id == first[1] and job.token == 1
    sound(r, q)


@pytest.fixture
def small_native_server(tmp_path: Path, module_so: Path) -> Any:
    srv = EmbeddedServer(
        tmp_path / "small-native",
        appendonly=False,
        args=["--maxmemory", "4mb", "--loadmodule", str(module_so)],
    ).start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("executor_name", ["lua", "native"])
def test_at_maxmemory_only_the_enqueue_is_refused(
    small_native_server: EmbeddedServer, executor_name: str
) -> None:
    # Issue 22 #7: every EMQ.* command was registered deny-oom, so a native fleet could not
    # complete (what frees memory), retry, heartbeat or claim at maxmemory while the Lua
    # scripts could; and the Lua heartbeat (its first write a ZADD) was refused too, letting
    # running jobs' leases lapse. Only an admission grows memory; only it is refused.
    url = small_native_server.url
    q = echomq.Queue("oom-" + executor_name, url=f"{url}?executor={executor_name}")
    filler = echomq.Queue("filler", url=url + "?executor=lua")
    try:
        q.enqueue_many([b"s"] * 4)
        q.enqueue(b"d", delay_ms=0)
        lapsing = q.claim(lease_ms=30)
        held = [q.claim(lease_ms=60_000) for _ in range(3)]
        assert lapsing is not None and all(held)
        a, b, c = (j for j in held if j is not None)
        big = b"x" * 100_000
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            for _ in range(200):
                filler.enqueue(big)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            q.enqueue(big)
        q.extend(a.id, a.token, lease_ms=60_000)
        assert q.extend_many([(a.id, a.token)], lease_ms=60_000) == []
        q.complete(a.id, a.token)
        assert q.retry(b.id, b.token, delay_ms=0, max_attempts=1, error="x") == "dead"
        settled = q.settle(completed=[(c.id, c.token)], n=1)
        assert settled.completed == [None] and len(settled.jobs) == 1
        time.sleep(0.05)
        assert q.sweep_stalled(max_stalled=5)[0] == [lapsing.id]
        q.reprocess(b.id)
        assert q.claim(lease_ms=1000) is not None
        assert q.executor == executor_name
    finally:
        filler.drain()
        filler.close()
        q.close()
