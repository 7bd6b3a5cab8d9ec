"""Old keyword spellings kept working for a deprecation period.

``@renamed(g="lane")`` lets ``q.pause_lane(g="x")`` still run as ``q.pause_lane(lane="x")``
with a ``DeprecationWarning`` naming the new spelling; the wrapped function keeps its own
signature (``inspect.signature`` follows ``__wrapped__``), so the verb lists the tests derive
from signatures see only the new word. Coroutine functions stay coroutine functions.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any, TypeVar, cast

__all__ = ["renamed", "respelled"]

F = TypeVar("F", bound=Callable[..., Any])


def _respell(where: str, old_to_new: dict[str, str], kwargs: dict[str, Any]) -> dict[str, Any]:
    for old, new in old_to_new.items():
        if old not in kwargs:
            continue
        if new in kwargs:  # both spellings: refuse rather than pick one silently
            raise TypeError(f"{where}() got both {old}= and {new}= (pass only {new}=)")
        # stacklevel 3: the warning points at the caller, not at this helper or the wrapper
        warnings.warn(
            f"{where}({old}=...) is deprecated; pass {new}=... instead",
            DeprecationWarning,
            stacklevel=3,
        )
        kwargs[new] = kwargs.pop(old)
    return kwargs


def renamed(**old_to_new: str) -> Callable[[F], F]:
    """Accept each old keyword (``g=``) as its new one (``lane=``), with a warning."""

    def wrap(fn: F) -> F:
        where = fn.__qualname__

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def coro(*args: Any, **kwargs: Any) -> Any:
                return await fn(*args, **_respell(where, old_to_new, kwargs))

            return cast(F, coro)

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **_respell(where, old_to_new, kwargs))

        return cast(F, call)

    return wrap


def respelled(where: str, param: str, value: str, old: str, new: str) -> str:
    """``new`` for the old value ``old`` of ``param`` (with a warning), else ``value``.

    Called from the body of the public verb, so the warning points at that verb's caller
    (for a coroutine: the frame awaiting it)."""
    if value != old:
        return value
    warnings.warn(
        f"{where}({param}={old!r}) is deprecated; pass {param}={new!r} instead",
        DeprecationWarning,
        stacklevel=3,
    )
    return new
