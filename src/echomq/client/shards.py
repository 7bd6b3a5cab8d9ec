"""A sharded queue's layout: its sub-queue names, spread over the slots, and a job's shard.

A logical queue ``orders`` with N shards is N ordinary queues. Shard 0 *is* ``orders`` (so
``shards=1`` is today's queue byte for byte, and a client that knows nothing of shards —
an older release, a plain ``Queue("orders")`` — reads and writes shard 0, which every
sharded worker serves). Shard i > 0 is ``orders.shard<i>.<k>``: the first ``k`` whose slot
lies at most ``_TOLERANCE`` slots from the shard's target, so the shards spread over the
slot space and, on a cluster whose slots are split evenly, over the primaries.

The targets: at creation, shard i aims at ``slot(orders) + i * 16384 / N`` (evenly spaced,
so N shards on N primaries land one per primary); on growth each new shard aims at the middle
of the widest gap the existing shards leave. The names are stored on the server (the base
queue's meta field ``shards``), so every client uses the same list whatever it would compute.
"""

from __future__ import annotations

import binascii
import zlib
from collections.abc import Sequence

from echomq import keyspace
from echomq.errors import InvalidArgument
from echomq.protocol.admin import MAX_SHARDS

__all__ = ["MAX_SHARDS", "MAX_SHARDED_NAME", "grow", "layout", "shard_of", "slot_of"]

SLOTS = 16384
# ``.shard255.`` plus a search counter of up to 6 digits still fits the 128-character name.
MAX_SHARDED_NAME = 110
_TOLERANCE = 2
_TRIES = 200_000


def slot_of(queue: str) -> int:
    """The cluster slot of a queue's keys (CRC16-XMODEM of its name, the hash tag)."""
    return binascii.crc_hqx(queue.encode(), 0) % SLOTS


def _distance(a: int, b: int) -> int:
    d = abs(a - b) % SLOTS
    return min(d, SLOTS - d)


def _name_near(name: str, i: int, target: int) -> str:
    """The shard name ``<name>.shard<i>.<k>`` with the smallest k whose slot is within
    _TOLERANCE of ``target`` (the closest one found if none is, after _TRIES)."""
    best, best_d = "", SLOTS
    stem = f"{name}.shard{i}."
    for k in range(_TRIES):
        cand = stem + str(k)
        d = _distance(slot_of(cand), target)
        if d <= _TOLERANCE:
            return cand
        if d < best_d:
            best, best_d = cand, d
    return best


def _check(name: str, n: object) -> int:
    keyspace.check_queue(name)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SHARDS:
        raise InvalidArgument(f"shards is an int in 1..{MAX_SHARDS}, got {n!r}")
    if n > 1 and len(name) > MAX_SHARDED_NAME:
        raise InvalidArgument(
            f"a sharded queue's name is at most {MAX_SHARDED_NAME} characters "
            f"(its shards add a suffix), got {len(name)}"
        )
    return n


def layout(name: str, n: int) -> list[str]:
    """The N sub-queue names of a new logical queue ``name``: ``[name, …]``, evenly spread."""
    n = _check(name, n)
    s0 = slot_of(name)
    return [name] + [_name_near(name, i, (s0 + i * SLOTS // n) % SLOTS) for i in range(1, n)]


def grow(name: str, existing: Sequence[str], n: int) -> list[str]:
    """``existing`` followed by the shards that bring it to N, each aimed at the middle of
    the widest gap the shards before it leave. Shrinking is not a layout (see ShardsError)."""
    n = _check(name, n)
    if not existing or existing[0] != name:
        raise InvalidArgument(f"a layout of {name!r} starts with {name!r}, got {existing!r}")
    if n < len(existing):
        raise InvalidArgument(f"grow() adds shards: {len(existing)} -> {n}")
    if len(existing) == 1:
        return layout(name, n)
    names = list(existing)
    slots = sorted(slot_of(s) for s in names)
    for i in range(len(names), n):
        gaps = [
            ((slots[(j + 1) % len(slots)] - slots[j]) % SLOTS or SLOTS, j)
            for j in range(len(slots))
        ]
        width, j = max(gaps)
        target = (slots[j] + width // 2) % SLOTS
        shard = _name_near(name, i, target)
        names.append(shard)
        slots = sorted([*slots, slot_of(shard)])
    return names


def shard_of(key: str, n: int) -> int:
    """The shard index of a routing key (a lane, a dedup id, a job id): CRC32 mod N, the
    same in every process and every release."""
    return zlib.crc32(key.encode()) % n if n > 1 else 0
