"""A handler's arguments checked where called, converted in the worker.

Argument binding: a task handler's signature, compiled once, checks a call where it is
made and converts each decoded argument back by the handler's annotation in the worker.

Arguments travel as builtins (``msgspec.to_builtins``: a datetime as ISO text, a UUID or
Decimal as text, a tuple or set as a list, a dataclass as a map, an enum as its value) and
the worker converts each one back (``msgspec.convert``, lax: ``"1"`` is an int where an int
is expected). An argument without an annotation, or annotated ``Any``, ``object`` or a type
msgspec cannot build (a plain class), arrives as it was decoded.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable, Iterable
from typing import Any

import msgspec
import msgspec.inspect

from echomq.errors import BadArguments

_UNSUPPORTED = re.compile(r"objects of type (\S+) is unsupported")
_PASS = (inspect.Parameter.empty, Any, object)
_AS_IS = frozenset({int, str, float, bool, list, dict, bytes})


class _Params:
    """A handler's parameters, compiled once per task: what a call must bind to, and the
    annotation each argument is converted to in the worker (resolved on first use there, so
    a forward reference defined after the handler resolves)."""

    __slots__ = (
        "_hints",
        "_pos_hints",
        "_shapes",
        "as_is",
        "fn",
        "keywords",
        "max_pos",
        "min_pos",
        "positional",
        "required",
        "sig",
        "varargs",
    )

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self._hints: dict[str, Any] | None = None
        self._pos_hints: list[Any] = []  # the hint of each positional parameter, or None
        self._shapes: dict[tuple[int, tuple[str, ...]], bool] = {}  # call shapes that bind
        # The types of positional-only calls that convert leaves as they are (every argument
        # already its annotation's type, or not annotated): learnt by convert, so a worker
        # pays for the conversion loop once per call shape, not once per job.
        self.as_is: set[tuple[type, ...]] = set()
        try:
            sig: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):  # a builtin without one: calls are not checked
            sig = None
        self.sig = sig
        params = list(sig.parameters.values()) if sig is not None else []
        if sig is None:  # every call passes the fast check
            params = [inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL)]
        kinds = inspect.Parameter
        positional = [
            p for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
        ]
        self.positional = [p.name for p in positional]
        self.varargs = any(p.kind in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD) for p in params)
        # The fast check of a call without kwargs: a positional count in [min_pos, max_pos].
        self.max_pos = (
            1 << 30 if any(p.kind == kinds.VAR_POSITIONAL for p in params) else len(positional)
        )
        self.min_pos = sum(p.default is p.empty for p in positional)
        if any(p.kind == kinds.KEYWORD_ONLY and p.default is p.empty for p in params):
            self.min_pos = self.max_pos + 1  # a required keyword: never a positional-only call
        # The fast check of a call with kwargs (no *args/**kwargs): each parameter a keyword
        # may name, with its positional index (kw-only: past any), and the required ones.
        far = 1 << 30
        index = {n: i for i, n in enumerate(self.positional)}
        self.keywords = {
            p.name: index.get(p.name, far)
            for p in params
            if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)
        }
        self.required = [(index.get(p.name, far), p.name) for p in params if p.default is p.empty]

    def check(self, task: str, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> None:
        """:class:`BadArguments` unless the call binds to the signature."""
        if self.sig is None or (not kwargs and self.min_pos <= len(args) <= self.max_pos):
            return
        if not self.varargs:
            shape = (len(args), tuple(kwargs))
            ok = self._shapes.get(shape)
            if ok is None:
                ok = self._binds(len(args), kwargs)
                if len(self._shapes) < 256:
                    self._shapes[shape] = ok
            if ok:
                return
        try:
            self.sig.bind(*args, **kwargs)
        except TypeError as exc:
            raise BadArguments(f"task {task!r}: {exc}") from None

    def _binds(self, n: int, kwargs: dict[str, Any]) -> bool:
        """Whether ``n`` positional arguments and ``kwargs`` bind (no ``*``/``**`` here)."""
        if n > self.max_pos:
            return False
        keywords = self.keywords
        for k in kwargs:
            if keywords.get(k, -1) < n:  # unknown, positional-only, or given twice
                return False
        return all(i < n or name in kwargs for i, name in self.required)

    def named(
        self, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]
    ) -> Iterable[tuple[str, Any]]:
        """``(parameter name, value)`` of each argument of a call that binds; an extra
        positional one is ``*name[i]``."""
        star = next(
            (n for n, p in (self.sig.parameters.items() if self.sig else ())
             if p.kind == p.VAR_POSITIONAL),
            "args",
        )  # fmt: skip
        for i, value in enumerate(args):
            n = len(self.positional)
            yield (self.positional[i] if i < n else f"*{star}[{i - n}]"), value
        yield from kwargs.items()

    def hints(self) -> dict[str, Any]:
        """The annotation of each parameter whose arguments are converted."""
        if self._hints is None:
            hints = _hints(self.fn, self.sig)
            self._pos_hints = [hints.get(n) for n in self.positional]
            self._hints = hints
        return self._hints

    def convert(
        self, task: str, args: list[Any], kwargs: dict[str, Any]
    ) -> tuple[list[Any], dict[str, Any]]:
        """The arguments of a call that binds, converted to their annotations."""
        hints = self._hints if self._hints is not None else self.hints()
        if not hints:  # nothing to convert: the next call of these types skips this one
            if not kwargs and len(self.as_is) < 64:
                self.as_is.add(tuple(map(type, args)))
            return args, kwargs
        if not self.varargs:  # each positional argument is the parameter at its index
            args = list(args)
            same = True
            for i, (v, h) in enumerate(zip(args, self._pos_hints, strict=False)):
                if h is not None and not (type(v) is h and h in _AS_IS):
                    args[i] = _convert(task, self.positional[i], v, h)
                    same = False
            if same and not kwargs and len(self.as_is) < 64:
                self.as_is.add(tuple(map(type, args)))
            if kwargs:
                kwargs = {
                    k: _convert(task, k, v, hints[k]) if k in hints else v
                    for k, v in kwargs.items()
                }
            return args, kwargs
        assert self.sig is not None
        bound = self.sig.bind(*args, **kwargs)
        for name, value in bound.arguments.items():
            hint = hints.get(name)
            if hint is None:
                continue
            kind = self.sig.parameters[name].kind
            if kind == inspect.Parameter.VAR_POSITIONAL:
                new: Any = tuple(
                    _convert(task, f"*{name}[{i}]", v, hint) for i, v in enumerate(value)
                )
            elif kind == inspect.Parameter.VAR_KEYWORD:
                new = {k: _convert(task, k, v, hint) for k, v in value.items()}
            else:
                new = _convert(task, name, value, hint)
            bound.arguments[name] = new
        return list(bound.args), dict(bound.kwargs)


def _convert(task: str, name: str, value: Any, hint: Any) -> Any:
    if type(value) is hint and hint in _AS_IS:  # already what the handler wants
        return value
    try:
        return msgspec.convert(value, hint, strict=False, str_keys=True)
    except (msgspec.ValidationError, TypeError, ValueError) as exc:
        raise BadArguments(
            f"argument {name!r} of task {task!r}: cannot convert to {_type_name(hint)}: {exc}"
        ) from None


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else repr(hint).replace("typing.", "")


def _hints(fn: Callable[..., Any], sig: inspect.Signature | None) -> dict[str, Any]:
    """The parameters to convert and their resolved annotations: not those without one,
    ``Any`` or ``object``, nor one msgspec cannot build (a plain class, anywhere in it)."""
    if sig is None:
        return {}
    try:
        found = typing.get_type_hints(inspect.unwrap(fn))
    except Exception:  # an unresolvable forward reference: what is not a string still counts
        found = {}
    hints = {}
    for name, p in sig.parameters.items():
        hint = found.get(name, p.annotation)
        if isinstance(hint, str) or any(hint is x for x in _PASS):
            continue
        try:
            if _buildable(msgspec.inspect.type_info(hint), set()):
                hints[name] = hint
        except Exception:  # msgspec does not know the annotation at all
            continue
    return hints


def _buildable(info: Any, seen: set[int]) -> bool:
    """No ``CustomType`` (a class msgspec cannot build from builtins) anywhere in ``info``."""
    if isinstance(info, msgspec.inspect.CustomType):
        return False
    if id(info) in seen:
        return True
    seen.add(id(info))
    for f in getattr(info, "__struct_fields__", ()):
        value = getattr(info, f)
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, (msgspec.inspect.Type, msgspec.inspect.Field)) and not _buildable(
                item, seen
            ):
                return False
    return True
