"""Serializers turn a task call into payload bytes and back, above the wire (D7).

The default is JSON (orjson); msgpack is available with the ``msgpack`` extra
(``MsgPack()`` without it raises :class:`~echomq.errors.MissingExtra`). There is no pickle
serializer, and there will not be one: a payload is data, never code.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from echomq.protocol import extras as _extras

__all__ = ["JSON", "MsgPack", "Serializer", "resolve_serializer"]


class Serializer(Protocol):
    """``dumps(obj) -> bytes`` and ``loads(bytes) -> obj``."""

    name: str

    def dumps(self, obj: Any) -> bytes: ...
    def loads(self, data: bytes) -> Any: ...


class JSON:
    """orjson: fast, strict JSON (str keys; datetimes, dataclasses and numpy handled)."""

    name = "json"

    def dumps(self, obj: Any) -> bytes:
        return orjson.dumps(obj)

    def loads(self, data: bytes) -> Any:
        return orjson.loads(data)


class MsgPack:
    """msgpack (``pip install echomq[msgpack]``): compact binary, bytes values round-trip."""

    name = "msgpack"

    def __init__(self) -> None:
        # Imported here, not with this module: a base install (no msgpack) imports this
        # module, and only a MsgPack() built says it needs the extra (MissingExtra).
        (self._m,) = _extras.require("msgpack", "the msgpack serializer")

    def dumps(self, obj: Any) -> bytes:
        return bytes(self._m.packb(obj, use_bin_type=True))

    def loads(self, data: bytes) -> Any:
        return self._m.unpackb(data, raw=False, strict_map_key=True)


def resolve_serializer(value: str | Serializer) -> Serializer:
    """A serializer from its name ("json", "msgpack") or an object with dumps/loads."""
    if isinstance(value, str):
        if value == "json":
            return JSON()
        if value == "msgpack":
            return MsgPack()
        if value == "pickle":
            raise ValueError("echomq never unpickles payloads: use json or msgpack")
        raise ValueError(f"unknown serializer {value!r}: use 'json' or 'msgpack'")
    if not (callable(getattr(value, "dumps", None)) and callable(getattr(value, "loads", None))):
        raise ValueError("a serializer has dumps(obj) -> bytes and loads(bytes) -> obj")
    return value
