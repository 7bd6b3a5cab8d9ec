"""Helpers the per-verb integration tests share (tests/protocol/test_queue_verbs*.py):
key and row readers, the place finder, lease checks and a command spy.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import redis

import echomq
from conftest import server_ms

LANE = "PRT0KHTOWnGLuC"


LANE_B = "tenant-b"


Job = echomq.Job


def K(q: str, suffix: str) -> str:
    return "emq:{" + q + "}:" + suffix


def lane_key(q: str, g: str) -> str:
    return K(q, f"g:{g}:pending")


def row(r: redis.Redis, q: str, jid: str) -> dict[str, bytes]:
    return {f.decode(): v for f, v in r.hgetall(K(q, "job:" + jid)).items()}


def ring(r: redis.Redis, q: str) -> list[str]:
    return [x.decode() for x in r.lrange(K(q, "ring"), 0, -1)]


def smembers(r: redis.Redis, key: str) -> set[str]:
    return {x.decode() for x in r.smembers(key)}


def places(r: redis.Redis, q: str, jid: str) -> list[str]:
    """Every set of the queue that holds ``jid`` (D6: a live job is in exactly one)."""
    out = [
        s for s in ("pending", "active", "schedule", "dead") if r.zscore(K(q, s), jid) is not None
    ]
    prefix = K(q, "g:")
    for key in r.scan_iter(match=prefix + "*:pending", count=1000):
        if r.zscore(key, jid) is not None:
            out.append("lane " + key.decode()[len(prefix) : -len(":pending")])
    return out


def assert_lease(r: redis.Redis, q: str, jid: str, t0: int, t1: int, lease: int) -> None:
    score = r.zscore(K(q, "active"), jid)
    assert score is not None
    assert t0 + lease <= score <= t1 + lease


def queue_keys(r: redis.Redis, q: str) -> list[bytes]:
    return sorted(r.scan_iter(match=K(q, "*"), count=1000))


def lapsed(r: redis.Redis, q: str, n: int = 1) -> bool:
    """True once at least ``n`` leases of the queue have lapsed on the server clock."""
    return len(r.zrangebyscore(K(q, "active"), "-inf", server_ms(r))) >= n


def spy_commands(monkeypatch: pytest.MonkeyPatch, queue: Any) -> list[str]:
    """Record the command names the queue's client sends (not pipelines)."""
    client = queue.client
    orig = client.execute_command
    seen: list[str] = []
    if inspect.iscoroutinefunction(orig):

        async def aspy(*args: Any, **kw: Any) -> Any:
            seen.append(str(args[0]))
            return await orig(*args, **kw)

        monkeypatch.setattr(client, "execute_command", aspy)
    else:
        # The sync executor sends single commands through its own _command (a direct
        # connection per thread on a standalone server), not the client's execute_command.
        executor = queue._x
        direct = executor._command

        def spy(*args: Any, **kw: Any) -> Any:
            seen.append(str(args[0]))
            return direct(*args, **kw)

        monkeypatch.setattr(executor, "_command", spy)
    return seen


def make_dead(q: Any, payload: bytes = b"d", group: str | None = None) -> str:
    jid = q.enqueue(payload, group=group).id
    job = q.claim(lease_ms=60_000)
    assert job.id == jid
    assert q.retry(jid, job.token, delay_ms=0, max_attempts=1, error="boom") == "dead"
    return jid
