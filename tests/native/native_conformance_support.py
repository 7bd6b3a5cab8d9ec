"""Helpers shared by test_native_conformance.py and the files split from it."""

from __future__ import annotations

from typing import Any

from native_fixtures import (
    Pair,
)

QA, QB = "natA", "natB"


def enq(
    pair: Pair,
    id: str,
    payload: str | bytes = "p",
    *,
    group: str = "",
    mode: str = "now",
    value: str = "0",
    flags: str = "",
    replay_ms: str = "0",
    nonce: str = "",
    dedup: str = "",
    dedup_mode: str = "simple",
    ttl: str = "0",
    second: str | None = None,
    priority: str | None = None,
    keep_logs: str | None = None,
) -> Any:
    args: list[str | bytes] = ["@", id, payload, group, mode, value, flags, replay_ms, nonce]
    if keep_logs is not None:  # issue 38: the named tail (the positional form has no slot)
        args += ["+opt", "keep_logs", keep_logs]
        if dedup:
            args += ["dedup", dedup, "dedup_mode", dedup_mode, "dedup_ttl_ms", ttl]
        if second is not None:
            args += ["second", second]
        if priority is not None:
            args += ["priority", priority]
        return pair.run("enqueue", ["@job:" + id, "@meta"], args)
    args += [dedup, dedup_mode, ttl]
    if second is not None or priority is not None:
        args.append(second or "0")
    if priority is not None:  # issue 24: ARGV[14]
        args.append(priority)
    return pair.run("enqueue", ["@job:" + id, "@meta"], args)


def enq_many(
    pair: Pair,
    items: list[tuple[str, str]],
    *,
    group: str = "",
    mode: str = "now",
    value: str = "0",
    replay_ms: str = "0",
    nonce: str = "",
    flags: str = "",
    priority: str = "0",
    keep_logs: str | None = None,
) -> Any:
    args: list[str | bytes] = ["@", group, mode, value, replay_ms, nonce, flags, priority, ""]
    if keep_logs is not None:  # issue 38: the named tail
        args[7:] = ["+opt", "2", "keep_logs", keep_logs, "priority", priority]
    for i, p in items:
        args += [i, p]
    return pair.run("enqueue_many", ["@meta"], args)


def ext(pair: Pair, id: str, token: int | str, lease: int = 30000) -> Any:
    return pair.run("extend", ["@active", "@job:" + id], ["@", id, str(token), str(lease)])


def ext_many(pair: Pair, pairs: list[tuple[str, int]], lease: int = 30000) -> Any:
    args: list[str | bytes] = ["@", str(lease)]
    for i, t in pairs:
        args += [i, str(t)]
    return pair.run("extend_many", ["@active"], args)


def repro(pair: Pair, id: str) -> Any:
    return pair.run("reprocess", ["@job:" + id, "@dead"], ["@", id])
