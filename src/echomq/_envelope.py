"""The task envelope: how one call of a task travels as a payload, built and parsed here only.

An envelope is a map ``{"task": name, "args": [...], "kwargs": {...}}`` encoded by the app's
serializer (JSON by default, msgpack on request, never pickle). The queue below sees opaque
bytes; ``Task.payload`` builds envelopes, the worker's runner parses them, and the CLI's
``enqueue --task`` builds them too, through :func:`build`.

The CLI does not know the worker's serializer, so it always sends JSON. A worker whose app
uses another serializer still accepts such an envelope: when its own serializer cannot read a
payload that starts with ``{``, the payload is read as JSON. A msgpack envelope is a map, and a
msgpack map never starts with the byte ``{`` (0x7b is the msgpack integer 123), so the two can
never be confused; a custom serializer gets its own try first.
"""

from __future__ import annotations

from typing import Any

import orjson

from echomq.serializers import JSON, Serializer

__all__ = ["EnvelopeError", "build", "parse", "trace_context"]

_JSON = JSON()


class EnvelopeError(ValueError):
    """A payload that is not a task envelope (the worker dead-letters its job)."""


def build(
    serializer: Serializer,
    task: str,
    args: Any = (),
    kwargs: Any = None,
    tc: dict[str, str] | None = None,
) -> bytes:
    """The payload of one call of ``task``; ``tc`` is the W3C trace context (``traceparent``,
    ``tracestate``) when tracing is on (``echomq.otel``), else the envelope has no ``tc``."""
    envelope: dict[str, Any] = {
        "task": task,
        "args": list(args),
        "kwargs": dict(kwargs) if kwargs else {},
    }
    if tc:
        envelope["tc"] = dict(tc)
    return serializer.dumps(envelope)


def parse(serializer: Serializer, payload: bytes) -> tuple[Any, list[Any], dict[str, Any]]:
    """``(task name, args, kwargs)`` of a payload; :class:`EnvelopeError` when it is none.

    The task name is returned as found (the caller decides what an unknown or non-string
    name means); args and kwargs are checked to be a list and a map.
    """
    try:
        envelope = serializer.loads(payload)
    except Exception as exc:
        envelope = _from_json(serializer, payload)
        if envelope is None:
            raise EnvelopeError(f"{type(exc).__name__}: {exc}") from None
    if not isinstance(envelope, dict):
        envelope = _from_json(serializer, payload) or envelope
    if not isinstance(envelope, dict):
        raise EnvelopeError(f"not a task envelope: a {type(envelope).__name__}")
    if "task" not in envelope:
        raise EnvelopeError("not a task envelope: no 'task' field")
    try:
        args = list(envelope.get("args", ()))
        kwargs = dict(envelope.get("kwargs", {}))
    except Exception as exc:
        raise EnvelopeError(f"bad args/kwargs: {type(exc).__name__}: {exc}") from None
    return envelope["task"], args, kwargs


def trace_context(serializer: Serializer, payload: bytes) -> dict[str, str]:
    """The trace context an envelope carries (``{}`` when none, or not an envelope): read
    only by ``echomq.otel``; a malformed ``tc`` is ignored, never a failure of the job."""
    try:
        envelope = serializer.loads(payload)
    except Exception:
        envelope = None
    if not isinstance(envelope, dict):
        envelope = _from_json(serializer, payload)
    tc = envelope.get("tc") if isinstance(envelope, dict) else None
    if not isinstance(tc, dict):
        return {}
    return {k: v for k, v in tc.items() if isinstance(k, str) and isinstance(v, str)}


def _from_json(serializer: Serializer, payload: bytes) -> dict[str, Any] | None:
    """A JSON envelope (the CLI's) read by a worker whose serializer is not JSON, else None."""
    if getattr(serializer, "name", "") == "json" or payload[:1] != b"{":
        return None
    try:
        found = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return found if isinstance(found, dict) else None
