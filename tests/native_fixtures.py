"""Helpers for the native-module conformance tests: build trafikey, and run one transition
through both executors (the Lua script on queue A, the EMQ.* command on queue B of the same
server) so replies and keyspaces can be compared."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import redis

from echomq._scripts import SCRIPTS

ROOT = Path(__file__).resolve().parent.parent
NATIVE = ROOT / "native"

# The EMQ verb that runs each script (the "many" forms are told apart by numkeys).
VERB = {
    "enqueue": "EMQ.ENQUEUE",
    "enqueue_many": "EMQ.ENQUEUE",
    "extend": "EMQ.EXTEND",
    "extend_many": "EMQ.EXTEND",
    "reprocess": "EMQ.REPROCESS",
    "complete": "EMQ.COMPLETE",
    "retry": "EMQ.RETRY",
    "sweep_stalled": "EMQ.SWEEP",
    "claim": "EMQ.CLAIM",
    "claim_batch": "EMQ.CLAIM",
    "settle": "EMQ.SETTLE",
}

# Scores that are server-clock times (leases, delays, rate windows): compared within this.
TOLERANCE_MS = 2000


def build(target: str = "all") -> Path:
    """make -C native; a failed build fails the caller loudly (never a skip)."""
    proc = subprocess.run(
        ["make", "-C", str(NATIVE), target], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise AssertionError(f"native build failed:\n{proc.stdout}\n{proc.stderr}")
    name = "trafikey.so" if target == "all" else "trafikey-debug.so"
    return NATIVE / name


def base(queue: str) -> str:
    return f"emq:{{{queue}}}:"


def expand(items: Sequence[str], queue: str) -> list[str]:
    """'@suffix' is the queue's base + suffix; anything else is sent as is."""
    return [base(queue) + s[1:] if s.startswith("@") else s for s in items]


Reply = tuple[str, Any]


def call_script(
    r: redis.Redis, script: str, keys: Sequence[str], args: Sequence[str | bytes]
) -> Reply:
    try:
        return ("ok", r.eval(SCRIPTS[script].source, len(keys), *keys, *args))
    except redis.ResponseError as exc:
        return ("err", str(exc))


def command(r: redis.Redis, *args: Any) -> Any:
    """A raw command (redis-py's execute_command is untyped)."""
    return r.execute_command(*args)  # type: ignore[no-untyped-call]


def call_native(
    r: redis.Redis, script: str, keys: Sequence[str], args: Sequence[str | bytes]
) -> Reply:
    try:
        return ("ok", command(r, VERB[script], len(keys), *keys, *args))
    except redis.ResponseError as exc:
        return ("err", str(exc))


def _norm_key(key: bytes | str, queue: str) -> str:
    k = key.decode("latin-1") if isinstance(key, bytes) else key
    k = k.replace(f"{{{queue}}}", "{Q}")
    # A single enqueue's replay markers are keyed by the server second of the call.
    return re.sub(r"recent:(\d+):\d+:", r"recent:\1:S:", k)


def snapshot(r: redis.Redis, queue: str) -> dict[str, Any]:
    """Every key of the queue, names normalised: (type, content)."""
    out: dict[str, Any] = {}
    for key in r.scan_iter(match=f"emq:{{{queue}}}:*", count=1000):
        raw_kind = r.type(key)
        kind = raw_kind.decode() if isinstance(raw_kind, bytes) else str(raw_kind)
        name = _norm_key(key, queue)
        value: Any
        if kind == "hash":
            value = r.hgetall(key)
        elif kind == "zset":
            value = dict(cast(list[tuple[bytes, float]], r.zrange(key, 0, -1, withscores=True)))
        elif kind == "list":
            value = r.lrange(key, 0, -1)
        elif kind == "set":
            value = r.smembers(key)
        elif kind == "string":
            value = r.get(key)
        elif kind == "stream":
            value = [fields for _id, fields in cast(list[tuple[bytes, Any]], r.xrange(key))]
        else:
            value = r.dump(key)
        # The TTL is compared as "has one", and lets diff forgive a key that expired on one
        # side between the two snapshots.
        ttl = r.pttl(key)
        if ttl == -2 or kind == "none":
            continue  # it expired while we read it
        if kind == "hash" and ":S:" in name:
            # Replay markers of several server seconds share a normalised name: merge their
            # fields, each with its key's TTL (diff forgives one about to expire).
            kind = "markers"
            merged = dict(out[name][1]) if name in out else {}
            merged.update({f: (v, ttl) for f, v in value.items()})
            value = merged
        out[name] = (kind, value, ttl)
    return out


def _close(a: Any, b: Any) -> bool:
    try:
        return abs(float(a) - float(b)) <= TOLERANCE_MS
    except (TypeError, ValueError):
        return False


def diff(sa: dict[str, Any], sb: dict[str, Any]) -> list[str]:
    """Differences between two snapshots (empty when they match within the tolerance)."""
    out: list[str] = []
    for name in sorted(set(sa) | set(sb)):
        if name not in sa or name not in sb:
            kind, value, ttl = sa.get(name) or sb[name]
            if kind == "markers":
                ttl = max(t for _v, t in value.values())
            if not 0 <= ttl <= TOLERANCE_MS:
                out.append(f"{name}: only in {'script' if name in sa else 'native'}")
            continue
        (ka, va, ta), (kb, vb, tb) = sa[name], sb[name]
        if (ta >= 0) != (tb >= 0):
            out.append(f"{name}: TTL {ta} vs {tb}")
        elif ka != kb:
            out.append(f"{name}: type {ka} != {kb}")
        elif ka == "zset":
            if set(va) != set(vb) or any(not _close(va[m], vb[m]) for m in va):
                out.append(f"{name}: {va} != {vb}")
        elif ka == "markers":
            for f in set(va) | set(vb):
                if f in va and f in vb:
                    if va[f][0] != vb[f][0]:
                        out.append(f"{name}: {f!r} {va[f]} != {vb[f]}")
                elif not 0 <= (va.get(f) or vb[f])[1] <= TOLERANCE_MS:
                    out.append(f"{name}: {f!r} only in {'script' if f in va else 'native'}")
        elif ka == "stream":
            if len(va) != len(vb):
                out.append(f"{name}: {va} != {vb}")
                continue
            for ea, eb in zip(va, vb, strict=True):
                same = set(ea) == set(eb) and all(
                    ea[f] == eb[f] or (f == b"run_at" and _close(ea[f], eb[f])) for f in ea
                )
                if not same:
                    out.append(f"{name}: {ea} != {eb}")
        elif va != vb:
            out.append(f"{name}: {va} != {vb}")
    return out


class Pair:
    """Queue A runs the scripts, queue B the module; both on one server."""

    def __init__(self, r: redis.Redis, a: str, b: str) -> None:
        self.r, self.a, self.b = r, a, b
        self.calls = 0

    def run(self, script: str, keys: list[str], args: list[str | bytes]) -> Reply:
        """Run one transition on both queues; assert equal replies and keyspaces."""
        ra = call_script(self.r, script, expand(keys, self.a), expand_args(args, self.a))
        rb = call_native(self.r, script, expand(keys, self.b), expand_args(args, self.b))
        self.calls += 1
        assert ra == rb, f"{script} {keys} {args}: script {ra!r} != native {rb!r}"
        self.check(f"after {script} {args!r}")
        return ra

    def check(self, what: str = "") -> None:
        d = diff(snapshot(self.r, self.a), snapshot(self.r, self.b))
        assert not d, f"keyspaces differ {what}:\n" + "\n".join(d[:20])


def expand_args(args: Sequence[str | bytes], queue: str) -> list[str | bytes]:
    return [base(queue) + a[1:] if isinstance(a, str) and a.startswith("@") else a for a in args]
