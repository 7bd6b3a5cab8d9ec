"""The optional extras: imported only by the feature that uses one.

The optional extras (pyproject's ``[project.optional-dependencies]``) and the one check a
feature of one makes before it uses it.

A base install (``pip install echomq``) has none of them, so no module that a base install
imports (the CLI, ``App``, ``Queue``, ``Worker``, the server, the demo) imports an extra's
module at import time: the feature that needs one imports it when it is used, through
:func:`require`, and a missing one is :class:`~echomq.errors.MissingExtra`, one line naming
the extra to install. ``tests/repo/test_extras_guard.py`` holds the package to that.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from echomq.errors import MissingExtra

__all__ = ["EXTRAS", "missing", "require"]

# Each extra's top-level modules, as pyproject.toml lists its requirements (the web extra's
# rich is a base dependency too).
EXTRAS: dict[str, tuple[str, ...]] = {
    "django": ("django", "django_tasks"),
    "msgpack": ("msgpack",),
    "otel": ("opentelemetry",),
    "web": ("starlette", "uvicorn", "jinja2", "prometheus_client"),
}


def require(extra: str, feature: str, *modules: str) -> list[ModuleType]:
    """Import ``modules`` (default: all of ``extra``'s) for ``feature`` (how the message
    names what was used: "the dashboard", "the msgpack serializer"); a missing one raises
    :class:`~echomq.errors.MissingExtra`."""
    out = []
    for name in modules or EXTRAS[extra]:
        try:
            out.append(importlib.import_module(name))
        except ImportError as exc:
            raise missing(extra, feature, exc, name) from exc
    return out


def missing(extra: str, feature: str, exc: ImportError, module: str = "") -> MissingExtra:
    """The :class:`~echomq.errors.MissingExtra` for ``exc``, an import of ``extra``'s module
    that failed; an extra's own module (``echomq.web``, ``echomq.otel``...) raises it from
    its import (``raise missing(...) from exc``)."""
    return MissingExtra(extra, feature, exc.name or module or EXTRAS[extra][0])
