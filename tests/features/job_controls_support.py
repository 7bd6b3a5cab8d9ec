"""Helpers shared by test_job_controls.py and the files split from it."""

from __future__ import annotations

from typing import Any

import redis


def _p(queue: str) -> str:
    return f"emq:{{{queue}}}:"


_fires = iter(range(1_000, 10**9, 1_000))


def _fire_now(q: Any, r: redis.Redis, name: str) -> int:
    """Make the repeat due now and fire it: the test drives the clock through the score (a
    new past fire time each call, so each is a new occurrence)."""
    r.zadd(_p(q.name) + "repeat", {name: next(_fires)}, xx=True)
    return int(q.fire_due())
