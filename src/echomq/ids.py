"""Branded ids (PROTOCOL D2): ``NNN`` + base62 of a 63-bit integer, always 14 bytes.

The integer is ``(ms since 2023-01-01T00:00:00Z) << 22 | node << 12 | seq``. The base62
alphabet is in ASCII order and the width is fixed, so byte order == numeric order == mint
order: the pending set (score 0, lexical order) is FIFO without a second index.

Minting is monotonic per process: a clock that steps backwards never yields an id smaller
than the previous one, and a full 12-bit sequence waits for the next millisecond. A forked
child takes a fresh node number so parent and child never mint the same id.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time

from echomq.errors import InvalidId

__all__ = ["EPOCH_MS", "decode_time_ms", "encode", "is_valid", "mint", "parse"]

ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_INDEX = {c: i for i, c in enumerate(ALPHABET)}
WIDTH = 11
SIZE = 3 + WIDTH
MAX_INT = (1 << 63) - 1
EPOCH_MS = 1_672_531_200_000  # 2023-01-01T00:00:00Z
_NS = re.compile(r"[A-Z]{3}")
_SEQ_BITS = 12
_NODE_BITS = 10
_SEQ_MAX = (1 << _SEQ_BITS) - 1


_PAIRS = [a + b for a in ALPHABET for b in ALPHABET]  # 62**2 two-digit strings


def _base62(n: int) -> str:
    """The 11 base62 digits of 0 <= n < 2**63 (< 62**11): one digit and five pairs."""
    n, e = divmod(n, 3844)
    n, d = divmod(n, 3844)
    n, c = divmod(n, 3844)
    n, b = divmod(n, 3844)
    n, a = divmod(n, 3844)
    return ALPHABET[n] + _PAIRS[a] + _PAIRS[b] + _PAIRS[c] + _PAIRS[d] + _PAIRS[e]


def _check_ns(ns: object) -> str:
    if ns in _CHECKED_NS:
        return ns
    if not isinstance(ns, str) or not _NS.fullmatch(ns):
        raise InvalidId(f"namespace must be 3 ASCII uppercase letters, got {ns!r}")
    _CHECKED_NS.add(ns)
    return ns


_CHECKED_NS: set[str] = set()


def encode(ns: str, n: int) -> str:
    """Brand the integer ``n`` (0 <= n < 2**63) with the 3-letter namespace ``ns``."""
    _check_ns(ns)
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_INT:
        raise InvalidId(f"branded id integer must be in [0, 2**63), got {n!r}")
    return ns + _base62(n)


def parse(s: str) -> tuple[str, int]:
    """Split a branded id into ``(namespace, integer)``; raises :class:`InvalidId`."""
    if not isinstance(s, str) or len(s) != SIZE or not s.isascii():
        raise InvalidId(f"a branded id is 14 ASCII bytes, got {s!r}")
    ns = s[:3]
    if not _NS.fullmatch(ns):
        raise InvalidId(f"a branded id starts with 3 uppercase letters, got {s!r}")
    n = 0
    for c in s[3:]:
        d = _INDEX.get(c)
        if d is None:
            raise InvalidId(f"a branded id ends with 11 base62 characters, got {s!r}")
        n = n * 62 + d
    if n > MAX_INT:
        raise InvalidId(f"a branded id encodes at most 2**63-1, got {s!r}")
    return ns, n


_SHAPE = re.compile(r"[A-Z]{3}[0-9A-Za-z]{11}")
_MAX_DIGITS = "AzL8n0Y58m7"  # 2**63-1 in base62: with a fixed width, text order is number order


def is_valid(s: object) -> bool:
    """True when ``s`` is a well-formed branded id (any namespace)."""
    return (
        isinstance(s, str)
        and len(s) == SIZE
        and _SHAPE.fullmatch(s) is not None
        and s[3:] <= _MAX_DIGITS
    )


def decode_time_ms(s: str) -> int:
    """Unix milliseconds at which the id was minted (the mint clock, i.e. the producer's)."""
    return (parse(s)[1] >> 22) + EPOCH_MS


class _Minter:
    """Snowflake state for this process; guarded by a lock so threads never share a slot."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reseed()

    def reseed(self) -> None:
        env = os.environ.get("ECHOMQ_NODE")
        node = int(env) if env and env.isdigit() else random.getrandbits(_NODE_BITS)
        self.node = node & ((1 << _NODE_BITS) - 1)
        self.last_ms = -1
        self.seq = 0

    def next(self) -> int:
        with self.lock:
            now = int(time.time() * 1000) - EPOCH_MS
            if now > self.last_ms:
                self.last_ms, self.seq = now, 0
            elif self.seq < _SEQ_MAX:
                # Same millisecond, or the clock stepped back: keep the last ms so ids only grow.
                self.seq += 1
            else:
                # Sequence exhausted: wait for the next ms; if the clock went backwards, run
                # the logical clock forward instead of waiting for the wall clock to catch up.
                while now <= self.last_ms and self.last_ms - now < 2:
                    time.sleep(0.0001)
                    now = int(time.time() * 1000) - EPOCH_MS
                self.last_ms = max(now, self.last_ms + 1)
                self.seq = 0
            return (self.last_ms << 22) | (self.node << _SEQ_BITS) | self.seq


_minter = _Minter()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_minter.reseed)


def mint(ns: str = "JOB") -> str:
    """Mint a new branded id; monotonic within this process."""
    return _check_ns(ns) + _base62(_minter.next())
