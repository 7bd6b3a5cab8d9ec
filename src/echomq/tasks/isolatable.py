"""Whether a handler can run in another process (checked at declaration).

Whether a handler can run in another process (``@app.task(isolate=True)`` or
``pool="process"``): checked when the task is declared, so a bad handler fails at import, not
on its first job. The child imports the handler by module and qualified name."""

from __future__ import annotations

from typing import Any

__all__ = ["check_isolatable"]


def check_isolatable(fn: Any) -> str | None:
    """Why ``fn`` cannot run isolated (None when it can): the child imports it by reference."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return "the handler has no importable module and qualified name"
    if "<locals>" in qualname or "<lambda>" in qualname:
        return f"{qualname!r} is not importable: define the task at module level"
    return None
