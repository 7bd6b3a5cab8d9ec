"""Findings of the verb-complete hostile fuzz (tests/protocol/test_hostile.py, 2026-12-04,
once its verb list was derived from ``Queue``): each fails on the code before its fix.

- obliterate deleted a replay-marker key whose TTL a producer had already set, so the
  producer's next marker there was written without one: a key that never expired (a marker
  now sets the TTL of a key that has none);
- an ``at_ms`` or a count of 16 digits (allowed by the client, refused by the scripts' integer
  guard of 15) came back as an untyped server error;
- ``wait(timeout_s=10**400)`` raised OverflowError instead of ``InvalidArgument``.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

import echomq
from conftest import snapshot
from echomq import InvalidArgument, ids
from echomq.protocol import produce as _produce
from echomq.protocol.kernel import MAX_ARG

# Every test that reaches a server runs on both executors (tests/conftest.py).
pytestmark = pytest.mark.executors


def test_a_marker_key_deleted_under_a_producer_gets_its_ttl_back(
    q: echomq.Queue, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One client-clock second for both calls, so the second call knows the key as timed.
    monkeypatch.setattr(_produce, "_second", lambda: 1_796_400_000)
    q.enqueue(b"a", id=ids.mint(), at_ms=1)  # a caller's id: the call leaves a marker
    markers = list(r.scan_iter(match=f"emq:{{{q.name}}}:recent:*"))
    assert markers and all(r.pttl(k) > 0 for k in markers)
    q.pause()
    q.obliterate(force=True)  # every key goes, the markers' too
    assert list(r.scan_iter(match=f"emq:{{{q.name}}}:*")) == []
    q.enqueue(b"b", id=ids.mint(), at_ms=1)  # the same marker key, written again
    again = list(r.scan_iter(match=f"emq:{{{q.name}}}:recent:*"))
    assert again == markers and all(r.pttl(k) > 0 for k in again)
    assert q.check() == []


CALLS: dict[str, Any] = {
    "enqueue at_ms": lambda q, n: q.enqueue(b"x", at_ms=n),
    "reschedule at_ms": lambda q, n: q.reschedule(q.enqueue(b"x", delay_ms=60_000).id, at_ms=n),
    "sweep_stalled max_stalled": lambda q, n: q.sweep_stalled(max_stalled=n),
    "sweep_stalled limit": lambda q, n: q.sweep_stalled(limit=n),
    "limit": lambda q, n: q.limit(n),
    "retry max_attempts": lambda q, n: q.retry(*_held(q), delay_ms=0, max_attempts=n, error="e"),
}


def _held(q: echomq.Queue) -> tuple[str, int]:
    q.enqueue(b"held")
    job = q.claim(lease_ms=60_000)
    assert job is not None
    return job.id, job.token


@pytest.mark.parametrize("call", sorted(CALLS))
def test_an_integer_past_the_scripts_guard_is_a_typed_refusal(
    q: echomq.Queue, r: redis.Redis, call: str
) -> None:
    CALLS[call](q, MAX_ARG)  # 15 digits: the largest the scripts take
    before = snapshot(r, q.name)
    with pytest.raises(InvalidArgument):
        CALLS[call](q, MAX_ARG + 1)
    if call not in ("reschedule at_ms", "retry max_attempts"):  # their setup writes
        assert snapshot(r, q.name) == before


def test_wait_with_a_timeout_past_a_float_is_a_typed_refusal(q: echomq.Queue) -> None:
    with pytest.raises(InvalidArgument):
        q.wait(q.enqueue(b"x").id, timeout_s=10**400)
