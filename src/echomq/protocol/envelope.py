"""The task envelope: how one call of a task travels as a payload, built and parsed here only.

An envelope is a list encoded by the app's serializer (JSON by default, msgpack on request,
never pickle)::

    [task, args]                     # no keyword arguments, no trace context
    [task, args, kwargs]             # kwargs only when there are some
    [task, args, kwargs, tc]         # tc: the W3C trace context (kwargs may be {})
    [task, args, kwargs, tc, opts]   # opts: per-job options the worker honours (tc may be {})

``opts`` (issue 24) is a map, present only when a job has one: ``max_attempts`` (this job's
attempt budget, overriding its task's); for a workflow step (issue 42, ``echomq.tasks.workflows``)
``keep_ms`` (its value and error are kept that long) and ``prev`` (``1``: its one flow
child's value is its first argument; a list of ids: a chord callback's members, their values
in that order as its first argument) and ``arg`` (that value as this keyword argument
instead), read by the worker's runner.

A budget travels with the payload, not in the row: the worker makes the retry-or-dead
decision with it, and the protocol's retry compares the ceiling it is sent, counted from the
row's ``floor`` as for any budget (so a reprocess or a re-admission restarts it).

``{"task":"noop","args":[99999],"kwargs":{}}`` (43 B) is now ``["noop",[99999]]`` (16 B).
:func:`parse` still reads the older map form ``{"task", "args", "kwargs", "tc"}`` (any
envelope enqueued before the change runs as it did). The queue below sees opaque bytes;
``Task.payload`` builds envelopes, the worker's runner parses them, and the CLI's
``enqueue --task`` builds them too, through :func:`build`.

Arguments travel as builtins: :func:`to_wire` turns datetimes, UUIDs, decimals, tuples,
sets, dataclasses and enums into strings, lists and maps (``msgspec.to_builtins``); the
worker converts them back by the handler's annotations (``Task.from_wire``).

The CLI does not know the worker's serializer, so it always sends JSON. A worker whose app
uses another serializer still accepts such an envelope: when its own serializer cannot read a
payload that starts with ``[`` (or ``{``, the map form), or reads it as something that is not
an envelope, the payload is read as JSON. A msgpack envelope is an array or a map, and
neither ever starts with the byte ``[`` (0x5b) or ``{`` (0x7b): those bytes are msgpack
positive fixints (91, 123), so the two encodings can never be confused; a custom serializer
gets its own try first.
"""

from __future__ import annotations

from typing import Any

import msgspec
import orjson

from echomq.serializers import JSON, Serializer

__all__ = [
    "EnvelopeError",
    "attempt_budget",
    "build",
    "encode",
    "parse",
    "parse_full",
    "to_wire",
    "trace_context",
]

_JSON = JSON()
_NO_KWARGS: dict[str, Any] = {}
_MSGPACK_NATIVE = (bytes, bytearray)  # msgpack carries bytes as they are
_to_builtins = msgspec.to_builtins


class EnvelopeError(ValueError):
    """A payload that is not a task envelope (the worker dead-letters its job)."""


def to_wire(serializer: Serializer, value: Any) -> Any:
    """``value`` as builtins the serializer can encode (``msgspec.to_builtins``): map keys
    become strings, bytes stay bytes for msgpack (base64 text otherwise). ``TypeError`` for
    a value of a type that has no builtin form."""
    if getattr(serializer, "name", "") == "msgpack":
        return _to_builtins(value, builtin_types=_MSGPACK_NATIVE, str_keys=True)
    return _to_builtins(value, str_keys=True)


def encode(
    serializer: Serializer,
    task: str,
    args: Any,
    kwargs: dict[str, Any] | None = None,
    opts: dict[str, Any] | None = None,
) -> bytes:
    """The payload of one call of ``task`` with its arguments as given: :func:`build` of
    their :func:`to_wire` form, in one pass (``Task.payload``, the enqueue hot path).
    ``TypeError`` (or the serializer's error) when an argument cannot be serialized."""
    if getattr(serializer, "name", "") == "msgpack" or opts:
        a, k = to_wire(serializer, (args, kwargs or _NO_KWARGS))
        return build(serializer, task, a, k, opts=opts)
    envelope = [task, args, kwargs] if kwargs else [task, args]
    try:  # one to_builtins over the whole envelope; map keys as they are (fast)
        return serializer.dumps(_to_builtins(envelope))
    except Exception:  # e.g. a map with int keys, for JSON: the keys as strings, then
        return serializer.dumps(_to_builtins(envelope, str_keys=True))


def build(
    serializer: Serializer,
    task: str,
    args: Any = (),
    kwargs: Any = None,
    tc: dict[str, str] | None = None,
    opts: dict[str, Any] | None = None,
) -> bytes:
    """The payload of one call of ``task``; ``tc`` is the W3C trace context (``traceparent``,
    ``tracestate``) when tracing is on (``echomq.otel``), else the envelope has no ``tc``.
    ``opts``: the job's options (see the module's docstring), else none.
    ``args`` and ``kwargs`` are encoded as given (``Task.payload`` passes them through
    :func:`to_wire` first)."""
    envelope: list[Any] = [task, list(args)]
    if opts:
        envelope += [dict(kwargs) if kwargs else {}, dict(tc) if tc else {}, dict(opts)]
    elif tc:
        envelope.append(dict(kwargs) if kwargs else {})
        envelope.append(dict(tc))
    elif kwargs:
        envelope.append(dict(kwargs))
    return serializer.dumps(envelope)


def parse(serializer: Serializer, payload: bytes) -> tuple[Any, list[Any], dict[str, Any]]:
    """``(task name, args, kwargs)`` of a payload; :class:`EnvelopeError` when it is none.

    The task name is returned as found (the caller decides what an unknown or non-string
    name means); args and kwargs are checked to be a list and a map.
    """
    return parse_full(serializer, payload)[:3]


def parse_full(
    serializer: Serializer, payload: bytes
) -> tuple[Any, list[Any], dict[str, Any], dict[str, Any]]:
    """:func:`parse` plus the job's options (``{}`` when none; an ``opts`` that is not a map
    is a malformed envelope, an unknown or unusable option inside one is ignored)."""
    envelope = _load(serializer, payload)
    if isinstance(envelope, list):
        if not 2 <= len(envelope) <= 5:
            raise EnvelopeError(f"not a task envelope: a list of {len(envelope)} items")
        task, args = envelope[0], envelope[1]
        kwargs = envelope[2] if len(envelope) > 2 else _NO_KWARGS
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise EnvelopeError(
                f"bad args/kwargs: a {type(args).__name__} and a {type(kwargs).__name__}"
            )
        opts = envelope[4] if len(envelope) == 5 else {}
        if not isinstance(opts, dict):
            raise EnvelopeError(f"bad opts: a {type(opts).__name__}")
        return task, args, dict(kwargs), opts
    if not isinstance(envelope, dict):
        raise EnvelopeError(f"not a task envelope: a {type(envelope).__name__}")
    if "task" not in envelope:
        raise EnvelopeError("not a task envelope: no 'task' field")
    try:  # the map form, written before the list form
        args = list(envelope.get("args", ()))
        kwargs = dict(envelope.get("kwargs", {}))
    except Exception as exc:
        raise EnvelopeError(f"bad args/kwargs: {type(exc).__name__}: {exc}") from None
    return envelope["task"], args, kwargs, {}


def attempt_budget(opts: dict[str, Any]) -> int:
    """The per-job attempt budget an envelope's ``opts`` carries, 0 when none (or not a
    usable one: an int in [1, 10**15 - 1], the range ``retry`` accepts)."""
    ma = opts.get("max_attempts")
    if isinstance(ma, int) and not isinstance(ma, bool) and 1 <= ma <= 10**15 - 1:
        return ma
    return 0


def trace_context(serializer: Serializer, payload: bytes) -> dict[str, str]:
    """The trace context an envelope carries (``{}`` when none, or not an envelope): read
    only by ``echomq.otel``; a malformed ``tc`` is ignored, never a failure of the job."""
    try:
        envelope = _load(serializer, payload)
    except EnvelopeError:
        return {}
    if isinstance(envelope, list):
        tc = envelope[3] if len(envelope) >= 4 else None
    else:
        tc = envelope.get("tc") if isinstance(envelope, dict) else None
    if not isinstance(tc, dict):
        return {}
    return {k: v for k, v in tc.items() if isinstance(k, str) and isinstance(v, str)}


def _load(serializer: Serializer, payload: bytes) -> Any:
    """The decoded payload: by the app's serializer, else (or when that does not give a list
    or a map) as the CLI's JSON; :class:`EnvelopeError` when neither can read it."""
    try:
        envelope = serializer.loads(payload)
    except Exception as exc:
        found = _from_json(serializer, payload)
        if found is None:
            raise EnvelopeError(f"{type(exc).__name__}: {exc}") from None
        return found
    if not isinstance(envelope, (list, dict)):
        found = _from_json(serializer, payload)
        if found is not None:
            return found
    return envelope


def _from_json(serializer: Serializer, payload: bytes) -> Any:
    """A JSON envelope (the CLI's: a list, or an old map) read by a worker whose serializer
    is not JSON, else None."""
    if getattr(serializer, "name", "") == "json" or payload[:1] not in (b"[", b"{"):
        return None
    try:
        found = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return found if isinstance(found, (list, dict)) else None
