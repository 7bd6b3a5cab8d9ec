"""Every key name echomq uses comes from here; names and ids are gated here (PROTOCOL §1, D3).

A queue's keys all carry the queue name as the cluster hash tag (``emq:{orders}:pending``),
so every script touches one slot and runs unchanged on Redis/Valkey Cluster. The reserve
``{emq}:`` holds deployment-wide keys (the wire version). Anything malformed raises
:class:`~echomq.errors.InvalidId` before a byte goes on the wire.
"""

from __future__ import annotations

import re

from echomq import ids
from echomq.errors import InvalidId

__all__ = [
    "LAYOUT_KEY",
    "MIGRATIONS_KEY",
    "NODES_KEY",
    "QUEUE_PREFIXES",
    "QUEUE_TAILS",
    "QUEUE_TYPES",
    "RESERVE_TYPES",
    "VERSION_KEY",
    "base",
    "check_lane",
    "check_queue",
    "hashtag",
    "job_key",
    "lane_key",
    "queue_key",
    "queue_of",
    "session_key",
    "slot",
]

_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")
VERSION_KEY = "{emq}:version"
# The data layout (issue 39, echomq.client.layout) and the migrations' progress
# (echomq.ops.migrate).
LAYOUT_KEY = "{emq}:layout"
MIGRATIONS_KEY = "{emq}:migrations"
# The mint nodes leased to the deployment's minters (D2, lua/node_lease.lua).
NODES_KEY = "{emq}:nodes"
# The deployment-wide keys under the reserve (PROTOCOL §1.4): the wire version, the
# dashboard's signed-in sessions (`{emq}:session:<sha256 of the session id>`), the mint nodes.
RESERVE_TYPES = frozenset({"version", "session", "nodes", "layout", "migrations"})
_DIGEST = re.compile(r"[0-9a-f]{64}")

# The closed registry of per-queue key types (PROTOCOL §1.3) that echomq writes.
QUEUE_TYPES = frozenset(
    {
        "pending",
        "active",
        "schedule",
        "dead",
        "completed",
        "meta",
        "ring",
        "inring",
        "ringstale",
        "wake",
        "lanes",
        "paused",
        "glimit",
        "gactive",
        "gweight",
        "events",
        "metrics:completed",
        "metrics:failed",
        "metrics:completed:data",
        "metrics:failed:data",
        "recent",
        "retired",
        "retired:old",
        "repeat",
        "repeatfree",
        "flow:outbox",
        "limiter",
        "grate",
        "ratewait",
        "workers",
        "workers:ttl",
    }
)

# The id- and name-shaped per-queue keys (PROTOCOL §1.1): one of these prefixes, then a job
# id, lane, dedup id, repeat name or replay marker's name.
QUEUE_PREFIXES = frozenset(
    {"job:", "g:", "result:", "notify:", "want:", "de:", "repeat:", "limiter:", "recent:"}
)
# What may follow a job id (``job:<id>:logs``) or a lane (``g:<lane>:pending``).
QUEUE_TAILS = frozenset(
    {":logs", ":errors", ":lock", ":deps", ":processed", ":failed", ":unsuccessful", ":pending"}
)
# QUEUE_TYPES, QUEUE_PREFIXES and QUEUE_TAILS are the registry that the Lua scripts and the C
# module spell their key suffixes from (scripts/gen-native writes native/keyspace.gen.h from
# it; tests/protocol/test_key_suffixes.py ties every suffix spelled in lua/ and native/ to it).


def check_queue(name: object) -> str:
    """Return ``name`` if it is a legal queue name (D3), else raise :class:`InvalidId`."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidId(f"a queue name matches [A-Za-z0-9._-]{{1,128}}, got {name!r}")
    if name == "emq":
        raise InvalidId("a queue may not be named 'emq' (it is the reserve's hash tag)")
    return name


def check_lane(name: object) -> str:
    """Return ``name`` if it is a legal lane (group) name (D3), else raise :class:`InvalidId`."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidId(f"a lane name matches [A-Za-z0-9._-]{{1,128}}, got {name!r}")
    return name


def check_id(job_id: object) -> str:
    """Return ``job_id`` if it is a well-formed branded id (any namespace), else raise."""
    if not ids.is_valid(job_id):
        raise InvalidId(
            f"job_key requires a valid branded id, got {job_id!r}: an id is 3 uppercase "
            "letters and 11 base62 characters, such as JOB0cHOKr82zgG (echomq.ids.mint(), or "
            "echomq.ids.encode('JOB', n) for an integer of yours); for one job per key of "
            "your own, such as an order number, pass it as dedup= instead"
        )
    assert isinstance(job_id, str)
    return job_id


def session_key(digest: str) -> str:
    """A dashboard session, ``{emq}:session:<digest>`` (the SHA-256 hex of its id, so the
    key never holds the cookie's secret); raises :class:`InvalidId` for anything else."""
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise InvalidId(f"a session digest is 64 lowercase hex digits, got {digest!r}")
    return "{emq}:session:" + digest


def queue_key(queue: str, type: str) -> str:
    """``emq:{queue}:type``; ``queue_key(q, "")`` is the queue base scripts append to."""
    return "emq:{" + check_queue(queue) + "}:" + type


def base(queue: str) -> str:
    """The queue base ``emq:{queue}:`` every script receives and appends suffixes to."""
    return queue_key(queue, "")


def job_key(queue: str, job_id: str) -> str:
    """The row key ``emq:{queue}:job:<id>``; raises :class:`InvalidId` before any I/O."""
    return queue_key(queue, "job:") + check_id(job_id)


def lane_key(queue: str, group: str) -> str:
    """A lane: ``emq:{queue}:g:<group>:pending``."""
    return queue_key(queue, "g:") + check_lane(group) + ":pending"


def hashtag(key: str) -> str:
    """The part of ``key`` that Redis Cluster hashes: between the first ``{`` and next ``}``."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def _crc16_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
        table.append(crc & 0xFFFF)
    return table


_CRC16 = _crc16_table()


def slot(key: str) -> int:
    """The cluster slot of ``key``: CRC16-XMODEM of its hash tag, mod 16384."""
    crc = 0
    for byte in hashtag(key).encode():
        crc = ((crc << 8) & 0xFFFF) ^ _CRC16[((crc >> 8) ^ byte) & 0xFF]
    return crc % 16384


def queue_of(key: str | bytes) -> str | None:
    """The queue a key belongs to — ``orders`` for ``emq:{orders}:pending`` — or None for a
    key outside any queue's keyspace (the ``{emq}:`` reserve, another application's key, a
    name no queue may have)."""
    text = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
    if not text.startswith("emq:{"):
        return None
    end = text.find("}:", 5)
    if end < 0:
        return None
    name = text[5:end]
    return name if _NAME.fullmatch(name) and name != "emq" else None
