"""Backoff policies: how long a failed attempt waits before the next one.

The protocol's ``retry`` takes a literal delay; the curve lives here, above the wire
(PROTOCOL §3.8). ``attempt`` is the attempt that just failed (1 for the first).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, Union, runtime_checkable

from echomq.errors import InvalidArgument

__all__ = ["Backoff", "BackoffLike", "exponential", "fixed", "jitter", "resolve_backoff"]


@runtime_checkable
class Backoff(Protocol):
    """Anything with ``delay_ms(attempt) -> int`` is a backoff policy."""

    def delay_ms(self, attempt: int) -> int: ...


def _ms(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(f"{name} must be a non-negative int of ms, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class fixed:
    """The same delay after every failure."""

    ms: int

    def __post_init__(self) -> None:
        _ms("ms", self.ms)

    def delay_ms(self, attempt: int) -> int:
        return self.ms


@dataclass(frozen=True, slots=True)
class exponential:
    """``min(base_ms * 2**(attempt-1), cap_ms)``."""

    base_ms: int
    cap_ms: int

    def __post_init__(self) -> None:
        _ms("base_ms", self.base_ms)
        _ms("cap_ms", self.cap_ms)

    def delay_ms(self, attempt: int) -> int:
        exp = max(attempt - 1, 0)
        if exp >= 62:
            return self.cap_ms
        return int(min(self.base_ms * (1 << exp), self.cap_ms))


@dataclass(frozen=True, slots=True)
class jitter:
    """Full jitter over another policy: uniform in ``[0, inner.delay_ms(attempt)]``."""

    policy: Backoff

    def delay_ms(self, attempt: int) -> int:
        return random.randint(0, max(self.policy.delay_ms(attempt), 0))


@dataclass(frozen=True, slots=True)
class _custom:
    fn: Callable[[int], int]

    def delay_ms(self, attempt: int) -> int:
        return _ms("custom backoff result", self.fn(attempt))


BackoffLike = Union[Backoff, Callable[[int], int], int]  # noqa: UP007 - runtime alias on 3.10


def resolve_backoff(value: BackoffLike) -> Backoff:
    """A policy from a policy, a callable ``attempt -> ms`` (custom) or an int (fixed ms)."""
    if isinstance(value, Backoff):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return fixed(value)
    if callable(value):
        return _custom(value)
    raise InvalidArgument(f"backoff must be a policy, a callable or ms, got {value!r}")
