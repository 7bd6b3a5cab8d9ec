"""Helpers shared by test_script_regressions.py and the files split from it."""

from __future__ import annotations

import redis

import echomq
from echomq import keyspace
from reliability import raw_violations


def K(q: str, suffix: str) -> str:
    return keyspace.queue_key(q, suffix)


def sound(r: redis.Redis, q: echomq.Queue) -> None:
    assert q.check() == []
    assert raw_violations(r, q.name) == []
