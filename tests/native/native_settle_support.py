"""Helpers shared by test_native_settle.py and the files split from it."""

from __future__ import annotations

import time

import redis

from native_fixtures import (
    Pair,
    Reply,
    base,
)

QA, QB = "setA", "setB"


def enq(pair: Pair, id: str, *, group: str = "", dedup: str = "") -> Reply:
    args: list[str | bytes] = ["@", id, "p", group, "now", "0", "", "0", "", dedup, "simple", "0"]
    return pair.run("enqueue", ["@job:" + id, "@meta"], args)


def comp(
    pair: Pair, id: str, token: int | str, result: str | bytes = "res", keep: int | None = None
) -> Reply:
    args: list[str | bytes] = ["@", id, str(token), result]
    if keep is not None:
        args.append(str(keep))
    return pair.run("complete", ["@active", "@job:" + id], args)


def retr(
    pair: Pair,
    id: str,
    token: int | str,
    *,
    delay: int = 0,
    max_attempts: int = 3,
    error: str = "boom",
    keep: int | None = None,
) -> Reply:
    args: list[str | bytes] = ["@", id, str(token), str(delay), str(max_attempts), error]
    if keep is not None:
        args.append(str(keep))
    return pair.run("retry", ["@active", "@schedule", "@dead", "@job:" + id], args)


def sweep(pair: Pair, max_stalled: int = 1, limit: int = 100) -> Reply:
    return pair.run("sweep_stalled", ["@active", "@dead"], ["@", str(max_stalled), str(limit)])


def want(r: redis.Redis, id: str) -> None:
    """What a waiter does before it blocks (echomq.protocol.control.want): the marker want:<id>."""
    for q in (QA, QB):
        r.set(base(q) + "want:" + id, "1", px=60000)


def lapse() -> None:
    """Let the 1 ms leases just handed out lapse."""
    time.sleep(0.02)
