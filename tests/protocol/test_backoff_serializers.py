"""Backoff policies (fixed, exponential and its cap, full jitter, custom callables) and the
payload serializers (JSON by default, msgpack, pickle refused)."""

from __future__ import annotations

import random
from typing import Any

import msgpack
import orjson
import pytest

import echomq
from echomq import App, InvalidArgument, exponential, fixed, jitter
from echomq.backoff import Backoff, resolve_backoff
from echomq.serializers import JSON, MsgPack, resolve_serializer

# --------------------------------------------------------------------------- backoff


def test_fixed() -> None:
    policy = fixed(250)
    assert [policy.delay_ms(n) for n in range(1, 8)] == [250] * 7
    assert fixed(0).delay_ms(3) == 0
    assert isinstance(policy, Backoff)


def test_exponential_doubles_up_to_the_cap() -> None:
    policy = exponential(100, 1_000)
    assert [policy.delay_ms(n) for n in range(1, 7)] == [100, 200, 400, 800, 1_000, 1_000]
    assert policy.delay_ms(0) == 100  # no attempt below the first
    for huge in (61, 62, 63, 64, 1_000, 10**9):
        assert policy.delay_ms(huge) == 1_000  # no overflow, no float blow-up
    assert exponential(0, 500).delay_ms(10) == 0
    assert exponential(800, 300).delay_ms(1) == 300  # the cap wins even on the first
    assert isinstance(exponential(1, 2).delay_ms(70), int)


def test_exponential_default_of_tasks() -> None:
    app = App(url="redis://127.0.0.1:1/0")

    @app.task(name="t")
    def t() -> None:
        pass

    assert t.backoff == exponential(1_000, 60_000)
    assert [t.backoff.delay_ms(n) for n in (1, 2, 7, 8)] == [1_000, 2_000, 60_000, 60_000]


@pytest.mark.parametrize("bad", [-1, 1.5, "10", True, None])
def test_policies_refuse_bad_ms(bad: Any) -> None:
    with pytest.raises(InvalidArgument):
        fixed(bad)
    with pytest.raises(InvalidArgument):
        exponential(bad, 1_000)
    with pytest.raises(InvalidArgument):
        exponential(100, bad)


def test_jitter_stays_within_the_inner_policy() -> None:
    random.seed(1234)
    inner = exponential(100, 1_000)
    policy = jitter(inner)
    for attempt in range(1, 8):
        bound = inner.delay_ms(attempt)
        samples = [policy.delay_ms(attempt) for _ in range(400)]
        assert all(isinstance(x, int) and 0 <= x <= bound for x in samples)
        assert min(samples) <= bound * 0.1 and max(samples) >= bound * 0.9  # full jitter
        assert bound * 0.35 <= sum(samples) / len(samples) <= bound * 0.65
    assert jitter(fixed(0)).delay_ms(5) == 0
    assert jitter(resolve_backoff(lambda a: 0)).delay_ms(1) == 0


def test_jitter_of_a_custom_policy() -> None:
    random.seed(7)
    policy = jitter(resolve_backoff(lambda attempt: attempt * 10))
    assert all(0 <= policy.delay_ms(3) <= 30 for _ in range(100))


def test_custom_callable() -> None:
    policy = resolve_backoff(lambda attempt: attempt * 7)
    assert isinstance(policy, Backoff)
    assert [policy.delay_ms(n) for n in (1, 2, 3)] == [7, 14, 21]
    for bad in (lambda a: -1, lambda a: 1.5, lambda a: None):
        with pytest.raises(InvalidArgument):
            resolve_backoff(bad).delay_ms(1)


def test_resolve_backoff() -> None:
    policy = exponential(5, 50)
    assert resolve_backoff(policy) is policy
    assert resolve_backoff(300) == fixed(300)

    class Mine:
        def delay_ms(self, attempt: int) -> int:
            return 42

    mine = Mine()
    assert resolve_backoff(mine) is mine  # any object with delay_ms is a policy
    for bad in ("soon", True, 1.5, None):
        with pytest.raises(InvalidArgument):
            resolve_backoff(bad)
    with pytest.raises(InvalidArgument):
        resolve_backoff(-5)


def test_task_accepts_every_backoff_form() -> None:
    app = App(url="redis://127.0.0.1:1/0")
    forms: list[Any] = [fixed(10), exponential(1, 2), jitter(fixed(3)), lambda a: a, 25]
    for i, form in enumerate(forms):
        task = app.task(name=f"t{i}", backoff=form)(lambda: None)
        assert isinstance(task.backoff, Backoff)
    assert app.tasks["t4"].backoff == fixed(25)


# --------------------------------------------------------------------------- serializers


ENVELOPE = {"task": "emails.send", "args": [1, "a", None, 2.5, [True]], "kwargs": {"k": {"x": 1}}}


def test_json_is_the_default() -> None:
    app = App(url="redis://127.0.0.1:1/0")
    assert isinstance(app.serializer, JSON) and app.serializer.name == "json"

    @app.task(name="emails.send")
    def send(*args: Any, **kwargs: Any) -> None:
        pass

    payload = send.payload((1, "a", None, 2.5, [True]), {"k": {"x": 1}})
    assert isinstance(payload, bytes)
    assert orjson.loads(payload) == [  # plain JSON on the wire: [task, args, kwargs]
        ENVELOPE["task"],
        ENVELOPE["args"],
        ENVELOPE["kwargs"],
    ]


def test_json_round_trip_and_limits() -> None:
    s = resolve_serializer("json")
    data = s.dumps(ENVELOPE)
    assert isinstance(data, bytes) and s.loads(data) == ENVELOPE
    assert s.loads(b'{"a": 1}') == {"a": 1}
    with pytest.raises(TypeError):
        s.dumps({"raw": b"\x00"})  # bytes are not JSON: use msgpack
    with pytest.raises(TypeError):
        s.dumps({"obj": object()})
    with pytest.raises(ValueError):
        s.loads(b"\xff not json")


def test_msgpack_round_trip_keeps_bytes() -> None:
    s = resolve_serializer("msgpack")
    assert isinstance(s, MsgPack) and s.name == "msgpack"
    value = {**ENVELOPE, "args": [b"\x00\xff", 1, "text"]}
    data = s.dumps(value)
    assert isinstance(data, bytes)
    assert msgpack.unpackb(data, raw=False) == value
    assert s.loads(data) == value
    assert s.loads(data)["args"][0] == b"\x00\xff"  # bytes stay bytes, text stays text
    app = App(url="redis://127.0.0.1:1/0", serializer="msgpack")
    assert app.serializer.name == "msgpack"


@pytest.mark.parametrize("value", ["pickle", "Pickle", "yaml", ""])
def test_pickle_and_unknown_names_are_refused(value: str) -> None:
    with pytest.raises(ValueError) as info:
        resolve_serializer(value)
    if value == "pickle":
        assert "never unpickles" in str(info.value)
    with pytest.raises(ValueError):
        App(url="redis://127.0.0.1:1/0", serializer=value)


def test_custom_serializer_objects() -> None:
    class Upper:
        name = "upper"

        def dumps(self, obj: Any) -> bytes:
            return orjson.dumps(obj).upper()

        def loads(self, data: bytes) -> Any:
            return orjson.loads(data.lower())

    custom = Upper()
    assert resolve_serializer(custom) is custom
    app = App(url="redis://127.0.0.1:1/0", serializer=custom)

    @app.task(name="t")
    def t(x: str) -> None:
        pass

    assert t.payload(("hi",), {}) == b'["T",["HI"]]'

    class Half:
        def dumps(self, obj: Any) -> bytes:
            return b""

    for bad in (Half(), object(), 5):
        with pytest.raises(ValueError):
            resolve_serializer(bad)


def test_no_pickle_anywhere_in_the_public_surface() -> None:
    import echomq.serializers as mod

    assert not any("pickle" in name.lower() for name in mod.__all__)
    assert not any("pickle" in name.lower() for name in dir(echomq))


# --------------------------------------------------------------------------- the task envelope


def test_envelope_round_trips_through_every_serializer() -> None:
    from echomq.protocol import envelope as _envelope

    for serializer in (JSON(), MsgPack()):
        data = _envelope.build(serializer, "t", (1, b"x" if serializer.name == "msgpack" else "x"))
        name, args, kwargs = _envelope.parse(serializer, data)
        assert (name, kwargs) == ("t", {}) and args[0] == 1
        data = _envelope.build(serializer, "t", [], {"k": [1, 2]})
        assert _envelope.parse(serializer, data) == ("t", [], {"k": [1, 2]})


def test_a_non_json_worker_reads_a_json_envelope() -> None:
    """The CLI always sends JSON: a msgpack (or custom) app reads it; a msgpack map never
    starts with ``{``, so its own envelopes are never mistaken for JSON."""
    from echomq.protocol import envelope as _envelope

    cli = _envelope.build(JSON(), "t", [1], {"a": "b"})
    assert _envelope.parse(MsgPack(), cli) == ("t", [1], {"a": "b"})
    assert msgpack.packb({"task": "t"})[:1] != b"{"

    class Custom:  # no ``name``: any serializer that cannot read the payload itself
        def dumps(self, obj: Any) -> bytes:
            return b"C" + orjson.dumps(obj)

        def loads(self, data: bytes) -> Any:
            if data[:1] != b"C":
                raise ValueError("not mine")
            return orjson.loads(data[1:])

    assert _envelope.parse(Custom(), cli) == ("t", [1], {"a": "b"})
    assert _envelope.parse(Custom(), _envelope.build(Custom(), "u")) == ("u", [], {})


@pytest.mark.parametrize(
    ("serializer", "payload", "message"),
    [
        (JSON(), b"\xff not json", "JSONDecodeError"),
        (JSON(), b"[1]", "a list of 1 items"),
        (JSON(), b"[1, 2]", "bad args"),
        (JSON(), b'{"args": []}', "no 'task'"),
        (JSON(), b'{"task": "t", "args": 5}', "bad args"),
        (JSON(), b'{"task": "t", "kwargs": [1]}', "bad args"),
        (MsgPack(), b"{not json either", "ExtraData"),
        (MsgPack(), b"[1", "ExtraData"),  # a msgpack int 91, then junk; and not JSON
        (MsgPack(), b"[1]", "a list of 1 items"),  # not msgpack, but a (short) JSON list
        (MsgPack(), msgpack.packb([1, 2]), "bad args"),
    ],
)
def test_what_is_not_an_envelope(serializer: Any, payload: bytes, message: str) -> None:
    from echomq.protocol import envelope as _envelope

    with pytest.raises(_envelope.EnvelopeError, match=message):
        _envelope.parse(serializer, payload)
