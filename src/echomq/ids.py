"""Branded ids (PROTOCOL D2): ``NNN`` + base62 of a 63-bit integer, always 14 bytes.

The integer is ``(ms since 2023-01-01T00:00:00Z) << 22 | 1 << 21 | node << 8 | seq`` for a
minted id (13-bit node, 8-bit sequence; before 0.6: ``node << 12 | seq``, 10 and 12 bits);
a repeat's occurrence ids keep bit 21 clear (``protocol.repeats.occurrence_id``). The base62
alphabet is in ASCII order and the width is fixed, so byte order == numeric order == mint
order: the pending set (score 0, lexical order) is FIFO without a second index.

Minting is monotonic per process: a clock that steps backwards never yields an id smaller
than the previous one, and a full sequence waits for the next millisecond. A queue mints
with a node leased from its server (``Minter``): no two live minters of a deployment share
one, a forked child leases its own, and a node taken over starts above its last holder.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time

from echomq.errors import InvalidId

__all__ = [
    "EPOCH_MS",
    "Minter",
    "decode_time_ms",
    "encode",
    "is_valid",
    "mint",
    "minter_for",
    "parse",
]

ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_INDEX = {c: i for i, c in enumerate(ALPHABET)}
WIDTH = 11
SIZE = 3 + WIDTH
MAX_INT = (1 << 63) - 1
EPOCH_MS = 1_672_531_200_000  # 2023-01-01T00:00:00Z
_NS = re.compile(r"[A-Z]{3}")
_SEQ_BITS = 8
_NODE_BITS = 13
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


# The low 22 bits of a minted id (D2): bit 21 set (the minted space: a repeat's occurrence
# ids keep it clear, protocol/repeats.py), a 13-bit node, an 8-bit sequence (256 ids a ms a minter).
MINTED_BIT = 1 << 21
NODES = 1 << _NODE_BITS
LEASE_MS = 60_000  # a node lease on the server clock (lua/node_lease.lua)
# A minter renews its lease once it is this old (one call in the plan of an enqueue that
# needs an id), and mints under it only this long after the call that took it was sent: the
# server keeps it LEASE_MS from when it ran, later still, so 20 s are left for a clock rate
# drift or a forward step of the server's clock before anyone else can take the node.
_RENEW_S = 20.0
_VALID_S = 40.0
_RENEWING_S = 5.0  # one plan renews at a time; another tries if no answer came in this long


def _wall_ms() -> int:
    return int(time.time() * 1000) - EPOCH_MS


class _Clock:
    """The (ms, seq) state of one node: monotonic, a full sequence waits for the next ms."""

    def __init__(self) -> None:
        self.last_ms = -1
        self.seq = 0

    def tick(self) -> int:
        """The next (ms << 8 | seq); never below the previous one."""
        now = _wall_ms()
        if now > self.last_ms:
            self.last_ms, self.seq = now, 0
        elif self.seq < _SEQ_MAX:
            # Same millisecond, or the clock stepped back: keep the last ms so ids only grow.
            self.seq += 1
        else:
            # Sequence exhausted: wait for the next ms; if the clock went backwards, run the
            # logical clock forward instead of waiting for the wall clock to catch up.
            while now <= self.last_ms and self.last_ms - now < 2:
                time.sleep(0.0001)
                now = _wall_ms()
            self.last_ms = max(now, self.last_ms + 1)
            self.seq = 0
        return self.last_ms

    def skip_to(self, floor: int) -> None:
        """Mint only ms above ``floor`` (and above every id minted so far) from now on."""
        self.last_ms = max(self.last_ms, floor)
        self.seq = _SEQ_MAX


def _id(ms: int, node: int, seq: int) -> int:
    return (ms << 22) | MINTED_BIT | (node << _SEQ_BITS) | seq


class _Local:
    """``mint()``'s process-local state: a random node, re-drawn in a forked child. Its ids
    are unique only by luck across processes: for ids a caller names itself."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reseed()

    def reseed(self) -> None:
        env = os.environ.get("ECHOMQ_NODE")
        node = int(env) if env and env.isdigit() else random.getrandbits(_NODE_BITS)
        self.node = node & (NODES - 1)
        self.clock = _Clock()

    def next(self) -> int:
        with self.lock:
            ms = self.clock.tick()
            return _id(ms, self.node, self.clock.seq)


_local = _Local()
_forks = [0]  # bumped in a forked child: every Minter drops what its parent leased


def _forked() -> None:
    _local.reseed()
    _forks[0] += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


class Minter:
    """Fleet-unique minting for one connection target (D2): ids carry a node leased from
    the server (``lua/node_lease.lua``), so no two live minters of one deployment share a
    node, and a node taken over starts above its last holder's promise. Thread-safe.

    Sans I/O: ``try_mint`` answers None when the lease must be taken or renewed first; the
    caller then sends ``lease_request()``'s arguments to ``node_lease`` and hands the reply
    to ``granted``. A forked child, or a process restarted, has a new token: a new node."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self.fork = _forks[0]
        self.token = os.urandom(8).hex()
        self.node: int | None = None
        self.clock = _Clock()
        self.valid_until = 0.0  # monotonic: no id is minted under the lease past this
        self.renew_at = 0.0
        self.renewing = -1e9  # monotonic time a plan set out to renew
        self.hw = -1  # the highest ms this minter promised the server it may mint

    def try_mint(self, ns: str = "JOB") -> str | None:
        """A new id, or None when the lease must be (re)taken first."""
        _check_ns(ns)
        with self.lock:
            if self.fork != _forks[0]:
                self._reset()
            now = time.monotonic()
            if self.node is None or now >= self.valid_until:
                return None
            if now >= self.renew_at and now - self.renewing >= _RENEWING_S:
                self.renewing = now  # this caller renews; the others mint meanwhile
                return None
            ms = self.clock.tick()
            if ms > self.hw:
                # Past its promise (a clock stepped forward, or a floor far ahead): renew,
                # which promises more. That tick's id is skipped, never reused.
                self.renewing = now
                return None
            return ns + _base62(_id(ms, self.node, self.clock.seq))

    def lease_request(self, anywhere: bool = False) -> tuple[str, int, int, int, float, int]:
        """(token, start, lease_ms, hw) for ``node_lease``, then the monotonic time before
        the call and the fork generation: ``granted`` takes both back. The search starts at
        the node held (to keep it if the lease lapsed), else (or ``anywhere``) at random."""
        with self.lock:
            if self.fork != _forks[0]:
                self._reset()
            start = random.randrange(NODES) if self.node is None or anywhere else self.node
            hw = max(_wall_ms(), self.clock.last_ms) + LEASE_MS
            return self.token, start, LEASE_MS, hw, time.monotonic(), self.fork

    def granted(self, token: str, hw: int, sent: float, node: int, floor: int) -> None:
        """The server's answer to a ``lease_request``: ``node`` is held (from ``sent``, a
        time before the call) and ids must have ms above ``floor``."""
        with self.lock:
            if token != self.token:
                return  # forked meanwhile: the parent's lease is not the child's
            if node != self.node:
                # Another node: its ids sort by ms first, so start above every id of ours
                # (mint order) and above the node's last holder (uniqueness).
                self.node = node
                self.clock.skip_to(floor)
                self.valid_until = self.renew_at = 0.0
            elif floor > self.clock.last_ms:
                self.clock.skip_to(floor)
            if sent + _VALID_S > self.valid_until:
                self.valid_until = sent + _VALID_S
                self.renew_at = sent + _RENEW_S
            self.hw = max(self.hw, hw)
            self.renewing = -1e9


_minters: dict[tuple[object, ...], Minter] = {}
_minters_lock = threading.Lock()


def minter_for(target: tuple[object, ...] | None) -> Minter:
    """The minter of a connection target (``(host, port, db, path)``): one node lease per
    target a process talks to, shared by its queues. None: a minter of its own."""
    if target is None:
        return Minter()
    with _minters_lock:
        m = _minters.get(target)
        if m is None:
            m = _minters[target] = Minter()
        return m


def mint(ns: str = "JOB") -> str:
    """Mint a new branded id; monotonic within this process. Its node is random per process
    (unique by luck): the queue mints fleet-unique ids itself (``Minter``)."""
    return _check_ns(ns) + _base62(_local.next())
