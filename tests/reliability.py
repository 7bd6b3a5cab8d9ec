"""Bookkeeping of the reliability tests: read what ``apps.chaos`` recorded (runs and settle
verdicts) and check the delivery invariants against it.

The invariants (docs/RELIABILITY.md):

- every job ran at least once (at-least-once delivery);
- no lease generation ran twice: each (id, token) starts at most one run;
- at most one settle is accepted per lease generation, and exactly one completion per job;
- an accepted completion carries the job's newest token (a stale token never settles), and
  an accepted retry an older one;
- a completion the worker did not get to record belongs to a run on a process the test
  SIGKILLed (the verdict and the process died together; the server's metric still counts it),
  or was refused as gone when resent after a lost reply (its first send had landed).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import redis


def payload(n: int) -> bytes:
    """The wire payload of ``chaos.run(n)``."""
    return json.dumps({"task": "chaos.run", "args": [n], "kwargs": {}}).encode()


@dataclass
class Books:
    """What the workers of one queue recorded."""

    history: list[tuple[str, int, int, int]]  # run starts: id, token, pid, n
    settled: list[tuple[str, int, str, int]]  # accepted settles: id, token, kind, pid
    refused: list[tuple[str, int, str, int, str]]  # refused settles: ..., "stale" | "gone"


def _split(raw: bytes, kinds: tuple[type, ...]) -> tuple[Any, ...]:
    parts = raw.decode().split(":")
    return tuple(k(p) for k, p in zip(kinds, parts, strict=True))


def read_books(r: redis.Redis, queue: str) -> Books:
    prefix = f"emqtest:{queue}:"
    return Books(
        [_split(x, (str, int, int, int)) for x in r.lrange(prefix + "history", 0, -1)],
        [_split(x, (str, int, str, int)) for x in r.lrange(prefix + "settled", 0, -1)],
        [_split(x, (str, int, str, int, str)) for x in r.lrange(prefix + "refused", 0, -1)],
    )


@dataclass
class Verdict:
    """The figures of one run (printed by the tests, copied into docs/RELIABILITY.md)."""

    jobs: int
    runs: int
    redelivered_jobs: int
    settles_accepted: int
    settles_refused: int
    retries_accepted: int
    unrecorded_completions: int  # accepted, but the worker was SIGKILLed before recording
    errors: list[str] = field(default_factory=list)

    @property
    def redeliveries(self) -> int:
        return self.runs - self.jobs


def verify(books: Books, enqueued: dict[str, int], killed: set[int]) -> Verdict:
    """Check the invariants; ``enqueued`` maps each job id to its ``n``. Every violation is
    listed in ``.errors`` (empty when sound)."""
    errors: list[str] = []
    runs: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for job_id, token, pid, n in books.history:
        runs[job_id].append((token, pid))
        if job_id not in enqueued:
            errors.append(f"run of a job nobody enqueued: {job_id}")
        elif enqueued[job_id] != n:
            errors.append(f"{job_id} ran with n={n}, enqueued with n={enqueued[job_id]}")
    never = [j for j in enqueued if j not in runs]
    if never:
        errors.append(f"{len(never)} jobs never ran, e.g. {never[:3]}")
    twice = [k for k, c in Counter((j, t) for j, t, _, _ in books.history).items() if c > 1]
    if twice:
        errors.append(f"{len(twice)} lease generations ran twice, e.g. {twice[:3]}")

    per_generation = Counter((j, t) for j, t, _, _ in books.settled)
    doubled = [k for k, c in per_generation.items() if c > 1]
    if doubled:
        errors.append(f"{len(doubled)} lease generations settled twice, e.g. {doubled[:3]}")
    completed: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for job_id, token, kind, pid in books.settled:
        if kind == "completed":
            completed[job_id].append((token, pid))
    for job_id, done in completed.items():
        if len(done) > 1:
            errors.append(f"{job_id} completed {len(done)} times: {done}")
        newest = max((t for t, _ in runs.get(job_id, [])), default=0)
        token, pid = done[-1]
        if token != newest:
            errors.append(f"{job_id} completed with token {token}, its newest run has {newest}")
        if (token, pid) not in runs.get(job_id, []):
            errors.append(f"{job_id} completed by pid {pid} token {token} without such a run")
    retries = 0
    for job_id, token, kind, _ in books.settled:
        if kind != "completed":
            retries += 1
            done = completed.get(job_id)
            if done and token >= done[-1][0]:
                errors.append(f"{job_id} retried with token {token} at/after its completion")
    unrecorded = [j for j in enqueued if j not in completed]
    resent = {(j, t) for j, t, k, _, why in books.refused if (k, why) == ("completed", "gone")}
    for job_id in unrecorded:
        newest = max(runs.get(job_id, [(0, 0)]))
        if newest[1] not in killed and (job_id, newest[0]) not in resent:
            errors.append(
                f"{job_id}: no accepted completion recorded, and its newest run "
                f"(token {newest[0]}, pid {newest[1]}) was not on a killed process, nor "
                "refused as gone on a resend"
            )
    return Verdict(
        jobs=len(enqueued),
        runs=len(books.history),
        redelivered_jobs=sum(1 for j in enqueued if len(runs.get(j, [])) > 1),
        settles_accepted=len(books.settled),
        settles_refused=len(books.refused),
        retries_accepted=retries,
        unrecorded_completions=len(unrecorded),
        errors=errors,
    )


def leftover_keys(r: redis.Redis, queue: str) -> list[bytes]:
    """Keys of the queue other than its metrics, meta, wake list, enqueue replay markers
    and the retired-id record (which expire): after a complete run, none (no row, no set
    member, no lane)."""
    names = ("metrics:completed", "metrics:failed", "meta", "wake")
    # The retired ids' last tokens stay too (bounded, see lua/README.md).
    names += ("retired", "retired:old")
    # The per-minute series (D16) are history, not leftovers.
    names += ("metrics:completed:data", "metrics:failed:data")
    # The worker registry: a SIGKILLed worker's entry lapses (and both keys expire) one TTL
    # after its last beat.
    names += ("workers", "workers:ttl")
    keep = {f"emq:{{{queue}}}:{s}".encode() for s in names}
    markers = f"emq:{{{queue}}}:recent:".encode()  # replay markers, which expire
    return sorted(
        k
        for k in r.scan_iter(match=f"emq:{{{queue}}}:*", count=1000)
        if k not in keep and not k.startswith(markers)
    )


def _text(x: bytes | str | None) -> str | None:
    return x.decode() if isinstance(x, bytes) else x


def raw_violations(r: redis.Redis, queue: str) -> list[str]:
    """An invariant checker independent of ``check()`` (which is Lua the tests also test):
    it reads the raw keys of ``queue`` and answers the violations it finds (empty when sound).

    Every row is in exactly one set, the one its state names (its lane's when pending in a
    lane), and every set member has a row; the lane registry lists exactly the non-empty
    lanes; the ring's live entries (``inring``) are exactly the serviceable waiting sets and
    each ring entry is live or stale, once; ``gactive`` counts the active lane jobs; an active
    row's lease_epoch is its attempts; the retired record (two HASH generations) names no
    id that has a row. Run it on a quiet queue (it is not atomic)."""
    p = f"emq:{{{queue}}}:"
    out: list[str] = []
    rows: dict[str, dict[str, str]] = {}
    lanes: dict[str, set[str]] = {}
    sides: list[str] = []  # a row's logs and errors: they go with the row
    for raw in r.scan_iter(match=p + "*", count=1000):
        key = raw.decode()
        rest = key[len(p) :]
        if rest.startswith("job:") and rest.endswith((":logs", ":errors")):
            sides.append(rest[4:].rsplit(":", 1)[0])
        elif rest.startswith("job:") and rest.count(":") == 1:
            if r.type(key) != b"hash":
                out.append(f"{key} is not a hash")
                continue
            rows[rest[4:]] = {k.decode(): v.decode("latin-1") for k, v in r.hgetall(key).items()}
        elif rest.startswith("g:") and rest.endswith(":pending"):
            lanes[rest[2:-8]] = {m.decode() for m in r.zrange(key, 0, -1)}
    out += [f"logs or errors of {jid}, which has no row" for jid in sides if jid not in rows]
    places: dict[str, list[str]] = {}

    def place(name: str, members: set[str]) -> None:
        for m in members:
            places.setdefault(m, []).append(name)

    flat = {m.decode() for m in r.zrange(p + "pending", 0, -1)}
    active = {m.decode() for m in r.zrange(p + "active", 0, -1)}
    place("pending", flat)
    place("active", active)
    place("schedule", {m.decode() for m in r.zrange(p + "schedule", 0, -1)})
    place("dead", {m.decode() for m in r.zrange(p + "dead", 0, -1)})
    place("completed", {m.decode() for m in r.zrange(p + "completed", 0, -1)})  # kept (D25)
    for g, members in lanes.items():
        place("lane " + g, members)
    want = {"pending": "pending", "active": "active", "schedule": "scheduled", "dead": "dead"}
    want["completed"] = "completed"
    for jid, where in places.items():
        if len(where) > 1:
            out.append(f"{jid} is in {len(where)} places: {where}")
        row = rows.get(jid)
        if row is None:
            out.append(f"{jid} in {where[0]} has no row")
            continue
        name = where[0]
        expect = "pending" if name.startswith("lane ") else want[name]
        if row.get("state") != expect:
            out.append(f"{jid} in {name} has state {row.get('state')}")
        if name.startswith("lane ") and row.get("group") != name[5:]:
            out.append(f"{jid} in {name} has group {row.get('group')}")
        if name == "pending" and "group" in row:
            out.append(f"{jid} in the flat set has group {row['group']}")
    for jid, row in rows.items():
        if jid not in places and row.get("state") != "awaiting_children":
            out.append(f"{jid} (state {row.get('state')}) is in no set")
        if row.get("state") == "active" and row.get("lease_epoch") != row.get("attempts"):
            out.append(f"{jid} is active with lease_epoch {row.get('lease_epoch')}")
        if int(row.get("floor", "0")) > int(row.get("attempts", "0")):
            out.append(f"{jid} has floor {row.get('floor')} above attempts {row.get('attempts')}")
    registry = {m.decode() for m in r.smembers(p + "lanes")}
    nonempty = {g for g, m in lanes.items() if m}
    if registry != nonempty:
        out.append(
            f"the lane registry is {sorted(registry)}, the non-empty lanes {sorted(nonempty)}"
        )
    paused = {m.decode() for m in r.smembers(p + "paused")}
    limits = {k.decode(): int(v) for k, v in r.hgetall(p + "glimit").items()}
    gactive = {k.decode(): int(v) for k, v in r.hgetall(p + "gactive").items()}
    counted: dict[str, int] = {}
    for jid in active:
        g = rows.get(jid, {}).get("group")
        if g is not None:
            counted[g] = counted.get(g, 0) + 1
    if gactive != counted:
        out.append(f"gactive is {gactive}, the active lane jobs {counted}")
    serviceable = {"*"} if flat else set()
    for g, members in lanes.items():
        if members and g not in paused and counted.get(g, 0) < limits.get(g, 1 << 62):
            serviceable.add(g)
    entries = [m.decode() for m in r.lrange(p + "ring", 0, -1)]
    live = {m.decode() for m in r.smembers(p + "inring")}
    stale = {m.decode() for m in r.smembers(p + "ringstale")}
    if len(entries) != len(set(entries)):
        out.append(f"the ring holds an entry twice: {entries}")
    if live & stale or live | stale != set(entries):
        out.append(f"ring {entries} vs inring {sorted(live)} and ringstale {sorted(stale)}")
    if live != serviceable:
        out.append(f"the live ring is {sorted(live)}, the serviceable sets {sorted(serviceable)}")
    retired = {k.decode() for k in r.hkeys(p + "retired")}
    retired |= {k.decode() for k in r.hkeys(p + "retired:old")}
    if retired & set(rows):
        out.append(f"retired ids with a live row: {sorted(retired & set(rows))}")
    return out
