"""Helpers shared by test_native_settle_cmd.py and the files split from it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from native_fixtures import (
    TOLERANCE_MS,
    Pair,
    Reply,
    base,
    call_native,
    call_script,
    expand,
    expand_args,
)

QA, QB = "stlA", "stlB"


SETTLE_KEYS = ["@meta", "@ring", "@active", "@schedule", "@dead"]


# (id, token) of a held job; a retry is (id, token, delay_ms, max_attempts['max:keep'], error).
Held = tuple[str, int | str]


Retry = tuple[str, int | str, int | str, str, str]


def enq(pair: Pair, id: str, *, group: str = "", dedup: str = "") -> Reply:
    args: list[str | bytes] = ["@", id, "p" + id, group, "now", "0", "", "0", "", dedup, "simple"]
    return pair.run("enqueue", ["@job:" + id, "@meta"], [*args, "0"])


def enq_many(pair: Pair, ids: list[str], *, group: str = "") -> Reply:
    args: list[str | bytes] = ["@", group, "now", "0", "0", "", "", "0", ""]
    for i in ids:
        args += [i, "p" + i]
    return pair.run("enqueue_many", ["@meta"], args)


def settle_args(
    n: int | str,
    completes: Sequence[Held] = (),
    kept: Sequence[tuple[str | bytes, int | str]] = (),
    retries: Sequence[Retry] = (),
    lease: int | str = 30000,
) -> list[str | bytes]:
    """settle.lua's ARGV: the last len(kept) completes keep a result ('c:r')."""
    spec = f"{len(completes)}:{len(kept)}" if kept else str(len(completes))
    args: list[str | bytes] = ["@", str(lease), str(n), spec]
    for i, t in completes:
        args += [i, str(t)]
    for res, keep in kept:
        args += [res, str(keep)]
    for i, t, d, m, err in retries:
        args += [i, str(t), str(d), m, err]
    return args


def run_settle(pair: Pair, args: list[str | bytes]) -> Reply:
    """One settle on both queues: replies equal (wait within the tolerance), keyspaces equal."""
    ra = call_script(pair.r, "settle", expand(SETTLE_KEYS, pair.a), expand_args(args, pair.a))
    rb = call_native(pair.r, "settle", expand(SETTLE_KEYS, pair.b), expand_args(args, pair.b))
    pair.calls += 1
    if ra[0] == rb[0] == "ok":
        assert ra[1][:3] == rb[1][:3], f"settle {args}: script {ra!r} != native {rb!r}"
        assert abs(ra[1][3] - rb[1][3]) <= TOLERANCE_MS, (ra, rb)
        assert (ra[1][3] == 0) == (rb[1][3] == 0), (ra, rb)
    else:
        assert ra == rb, f"settle {args}: script {ra!r} != native {rb!r}"
    pair.check(f"after settle {args[:12]!r}")
    return ra


def settle(pair: Pair, n: int | str, **kw: Any) -> Any:
    kind, value = run_settle(pair, settle_args(n, **kw))
    assert kind == "ok", value
    return value


def held_of(value: Any) -> list[Held]:
    return [(j[0].decode(), j[2]) for j in value[2]]


def want(r: redis.Redis, id: str) -> None:
    """What a waiter does before it blocks: the marker want:<id>."""
    for q in (QA, QB):
        r.set(base(q) + "want:" + id, "1", px=60000)
