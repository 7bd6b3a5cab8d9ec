"""Task arguments from a user's seat (issue 14 #3): a call that does not fit the handler is
refused where it is made, with nothing written; datetimes, UUIDs, decimals, tuples, sets,
dataclasses and enums reach the handler with their types (a real worker, ``drain``); an
argument that cannot be serialized is named; a payload whose argument cannot be converted
to the handler's annotation dies after one attempt, naming it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import uuid
from decimal import Decimal
from typing import Any

import pytest
import redis

import echomq
from echomq import App, BadArguments
from echomq.testing import adrain, drain


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass
class Point:
    x: int
    label: str
    at: dt.datetime


class Opaque:
    """A plain class: msgspec cannot build it, so an argument annotated so is left as is."""


WHEN = dt.datetime(2026, 3, 4, 5, 6, 7, 890123, tzinfo=dt.timezone(dt.timedelta(hours=2)))
ID = uuid.UUID("12345678-1234-5678-1234-567812345678")


def _app(url: str, serializer: str = "json") -> App:
    return App(url=url, serializer=serializer)


def _written(app: App, qname: str, r: redis.Redis) -> tuple[dict[str, int], list[bytes]]:
    return app.queue(qname).counts(), sorted(r.scan_iter(match=f"*{qname}*"))


# --------------------------------------------------------------------------- bind at enqueue


def test_a_call_that_does_not_bind_is_refused_and_nothing_is_written(
    url: str, qname: str, r: redis.Redis
) -> None:
    app = _app(url)

    @app.task(queue=qname, name="send")
    def send(to: str, n: int = 1, /, *, subject: str, urgent: bool = False) -> None:
        pass

    before = _written(app, qname, r)
    bad: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((), {"subject": "s"}),  # missing 'to'
        (("a", 1, 2), {"subject": "s"}),  # too many positional
        (("a",), {}),  # missing the required keyword 'subject'
        (("a",), {"subject": "s", "cc": "b"}),  # an unknown keyword
        ((), {"to": "a", "subject": "s"}),  # positional-only passed by keyword
    ]
    for args, kwargs in bad:
        with pytest.raises(BadArguments, match="task 'send'") as info:
            send.enqueue(*args, **kwargs)
        assert isinstance(info.value, TypeError) and isinstance(info.value, echomq.EchoMQError)
        with pytest.raises(BadArguments):
            send.options(delay_ms=10, group="g").enqueue(*args, **kwargs)
        if args or "to" in kwargs:
            with pytest.raises(BadArguments):
                send.s(*args, **kwargs)
        else:
            # Missing only its first positional argument: a chain step's call (issue 42, the
            # previous step's value fills it), refused when it is sent anywhere else.
            with pytest.raises(BadArguments, match="task 'send'"):
                app.flow(send.s(*args, **kwargs))
    with pytest.raises(BadArguments, match="unexpected keyword argument 'cc'"):
        send.enqueue("a", subject="s", cc="b")
    # enqueue_many: one bad call refuses the whole batch, naming the call
    with pytest.raises(BadArguments, match=r"call 1: task 'send'"):
        send.enqueue_many([(("a",), {"subject": "s"}), (("a", 1, 2, 3), {"subject": "s"})])
    assert _written(app, qname, r) == before

    # the good shapes go through
    send.enqueue("a", subject="s")
    send.enqueue("a", 2, subject="s", urgent=True)
    assert app.queue(qname).counts()["pending"] == 2
    app.close()


async def test_async_enqueue_refuses_a_bad_call(url: str, qname: str, r: redis.Redis) -> None:
    app = _app(url)

    @app.task(queue=qname, name="one")
    async def one(x: int) -> None:
        pass

    with pytest.raises(BadArguments, match="missing a required argument: 'x'"):
        await one.aenqueue()
    with pytest.raises(BadArguments):
        await one.options(delay_ms=5).aenqueue(1, 2)
    assert (await app.aqueue(qname).counts())["pending"] == 0
    await one.aenqueue(1)
    assert (await app.aqueue(qname).counts())["pending"] == 1
    await app.aclose()


def test_periodic_and_flow_calls_are_checked_where_they_are_declared(
    url: str, qname: str, r: redis.Redis
) -> None:
    app = _app(url)
    with pytest.raises(BadArguments, match="tick': too many positional arguments"):

        @app.periodic(every_ms=1000, queue=qname, name="t", args=(1, 2))
        def tick(x: int) -> None:
            pass

    @app.task(queue=qname, name="leaf")
    def leaf(x: int) -> int:
        return x

    with pytest.raises(BadArguments):
        app.flow(leaf.s(1), [leaf.s(1, y=2)])
    assert _written(app, qname, r)[0]["pending"] == 0
    app.close()


def test_handlers_with_star_args_bind_anything_they_accept(url: str, qname: str) -> None:
    app = _app(url)
    got: list[Any] = []

    @app.task(queue=qname, name="many")
    def many(first: int, *rest: Decimal, **extra: dt.date) -> None:
        got.append((first, rest, extra))

    with pytest.raises(BadArguments):
        many.enqueue()
    many.enqueue(1, Decimal("1.5"), Decimal("2"), day=dt.date(2026, 1, 2))
    many.enqueue("7")  # lax conversion: "7" is an int where an int is expected
    assert drain(app, timeout_s=20).completed == 2
    assert sorted(got, key=lambda g: len(g[1])) == [
        (7, (), {}),
        (1, (Decimal("1.5"), Decimal("2")), {"day": dt.date(2026, 1, 2)}),
    ]
    app.close()


# --------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("serializer", ["json", "msgpack"])
def test_arguments_round_trip_by_annotation(url: str, qname: str, serializer: str) -> None:
    app = _app(url, serializer)
    got: dict[str, Any] = {}

    @app.task(queue=qname, name="typed")
    def typed(
        when: dt.datetime,
        ident: uuid.UUID,
        amount: Decimal,
        pair: tuple[int, str],
        point: Point,
        color: Color,
        tags: set[str],
        by_id: dict[int, str],
        raw: bytes,
        maybe: int | None = None,
        *,
        opaque: Opaque | None = None,
        anything: Any = None,
        bare: Any = None,
    ) -> None:
        got.update(locals())

    point = Point(3, "p", WHEN)
    typed.enqueue(
        WHEN,
        ID,
        Decimal("12.340"),
        (1, "b"),
        point,
        Color.BLUE,
        {"x", "y"},
        {1: "one", 2: "two"},
        b"\x00\xff",
        opaque={"kept": [1]},
        anything=(1, 2),
        bare=WHEN,
    )
    result = drain(app, timeout_s=20)
    assert (result.completed, result.dead) == (1, 0)
    assert got["when"] == WHEN and got["when"].utcoffset() == dt.timedelta(hours=2)
    assert got["ident"] == ID and isinstance(got["ident"], uuid.UUID)
    assert got["amount"] == Decimal("12.340") and str(got["amount"]) == "12.340"
    assert got["pair"] == (1, "b") and isinstance(got["pair"], tuple)
    assert got["point"] == point and isinstance(got["point"], Point)
    assert got["color"] is Color.BLUE
    assert got["tags"] == {"x", "y"}
    assert got["by_id"] == {1: "one", 2: "two"}
    assert got["raw"] == b"\x00\xff"
    assert got["maybe"] is None
    # not converted: a plain class, Any, and nothing at all arrive as they were decoded
    assert got["opaque"] == {"kept": [1]}
    assert got["anything"] == [1, 2]
    assert dt.datetime.fromisoformat(got["bare"]) == WHEN
    app.close()


def test_forward_references_resolve_in_the_worker(url: str, qname: str) -> None:
    app = _app(url)
    got: list[Any] = []

    @app.task(queue=qname, name="later")
    def later(p: Later) -> None:  # defined below the handler
        got.append(p)

    later.enqueue(Later(2))
    assert drain(app, timeout_s=20).completed == 1
    assert got == [Later(2)]
    app.close()


@dataclasses.dataclass
class Later:
    n: int


# --------------------------------------------------------------------------- failures


def test_an_argument_that_cannot_be_serialized_is_named(
    url: str, qname: str, r: redis.Redis
) -> None:
    app = _app(url)

    @app.task(queue=qname, name="x")
    def x(n: int, when: Any = None, *, deep: Any = None) -> None:
        pass

    before = _written(app, qname, r)
    named = "argument '{}' of task 'x': cannot serialize a Opaque"
    with pytest.raises(BadArguments, match=named.format("when")):
        x.enqueue(1, Opaque())
    with pytest.raises(BadArguments, match=named.format("deep")):
        x.enqueue(1, deep={"k": [Opaque()]})
    with pytest.raises(BadArguments, match="argument 'n' of task 'x': cannot serialize"):
        x.enqueue(2**70)  # an integer JSON (orjson) cannot carry
    with pytest.raises(BadArguments, match="call 0: argument 'when'"):
        x.enqueue_many([((1, object()), {})])
    assert _written(app, qname, r) == before
    app.close()


def test_a_payload_that_does_not_convert_dies_after_one_attempt(
    url: str, qname: str, r: redis.Redis
) -> None:
    app = _app(url)
    ran: list[Any] = []

    @app.task(queue=qname, name="count", max_attempts=5)
    def count(n: int, when: dt.datetime | None = None) -> None:
        ran.append(n)

    q = app.queue(qname)
    bad_int = q.enqueue(json.dumps(["count", ["many"]]).encode()).id
    bad_date = q.enqueue(json.dumps(["count", [1], {"when": "not a date"}]).encode()).id
    old_form = {"task": "count", "args": [1, 2, 3], "kwargs": {}}
    bad_arity = q.enqueue(json.dumps(old_form).encode()).id
    result = drain(app, timeout_s=20)
    assert (result.dead, result.failed, ran) == (3, 0, [])
    for job_id, needle in [
        (bad_int, "argument 'n' of task 'count': cannot convert to int"),
        (bad_date, "argument 'when' of task 'count'"),
        (bad_arity, "task 'count': too many positional arguments"),
    ]:
        row = q.get_job(job_id)
        assert row is not None
        assert row["attempts"] == "1"
        assert str(row["last_error"]).startswith("BadArguments: ")
        assert needle in str(row["last_error"])
    app.close()


async def test_adrain_runs_converted_arguments_of_an_async_handler(url: str, qname: str) -> None:
    app = _app(url)
    got: list[Any] = []

    @app.task(queue=qname, name="later_async")
    async def when_async(at: dt.datetime, ids: list[uuid.UUID]) -> None:
        got.append((at, ids))

    await when_async.aenqueue(WHEN, [ID])
    assert (await adrain(app, timeout_s=20)).completed == 1
    assert got == [(WHEN, [ID])]
    await app.aclose()


def test_unannotated_arguments_arrive_as_the_readme_says(url: str, qname: str) -> None:
    """Issue 27 #8: what an unannotated handler gets is said where the task layer is
    introduced (README, quick start), and it is what happens."""
    import base64
    from pathlib import Path

    app = App(url=url)
    got: dict[str, Any] = {}

    @app.task(queue=qname, name="loose")
    def loose(blob, when, pair):  # type: ignore[no-untyped-def]
        got.update(blob=blob, when=when, pair=pair)

    loose.enqueue(b"\x00\xff", WHEN, (1, 2))
    assert drain(app, timeout_s=20).completed == 1
    assert got == {
        "blob": base64.b64encode(b"\x00\xff").decode(),
        "when": WHEN.isoformat(),
        "pair": [1, 2],
    }
    app.close()
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    said = " ".join(quick_start.split())
    for phrase in ("bytes as base64 text", "a datetime, UUID or Decimal as text", "as a list"):
        assert phrase in said, phrase
