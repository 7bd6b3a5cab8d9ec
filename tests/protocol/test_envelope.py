"""The compact task envelope (issue 16 #2): a serializer-encoded list ``[task, args]``,
``[task, args, kwargs]`` when there are kwargs, ``[task, args, kwargs, tc]`` with a trace
context; the older map form still decodes and runs, with JSON and msgpack, and a msgpack
worker still runs the CLI's JSON envelopes.
"""

from __future__ import annotations

import json
from typing import Any

import msgpack
import orjson
import pytest
from click.testing import CliRunner

from echomq import App
from echomq.cli import main
from echomq.protocol import envelope as _envelope
from echomq.serializers import JSON, MsgPack
from echomq.testing import drain


def test_the_envelope_is_a_short_list() -> None:
    app = App(url="redis://127.0.0.1:1/0")

    @app.task(name="noop")
    def noop(n: int, *, k: int = 0) -> None:
        pass

    assert noop.payload((99999,), {}) == b'["noop",[99999]]'  # was 43 B, now 16 B
    assert noop.payload((1,), {"k": 2}) == b'["noop",[1],{"k":2}]'
    traced = _envelope.build(JSON(), "noop", [1], {}, tc={"traceparent": "00-ab-cd-01"})
    assert orjson.loads(traced) == ["noop", [1], {}, {"traceparent": "00-ab-cd-01"}]
    assert _envelope.trace_context(JSON(), traced) == {"traceparent": "00-ab-cd-01"}
    assert _envelope.trace_context(JSON(), noop.payload((1,), {"k": 2})) == {}
    # the old map form still carries its trace context
    old = orjson.dumps({"task": "noop", "args": [], "kwargs": {}, "tc": {"traceparent": "x"}})
    assert _envelope.trace_context(JSON(), old) == {"traceparent": "x"}
    m = MsgPack()
    packed = _envelope.build(m, "noop", [1], None, tc={"traceparent": "y"})
    assert msgpack.unpackb(packed) == ["noop", [1], {}, {"traceparent": "y"}]
    assert _envelope.trace_context(m, packed) == {"traceparent": "y"}
    assert _envelope.parse(m, packed) == ("noop", [1], {})
    app.close()


def test_a_msgpack_envelope_never_starts_like_json() -> None:
    for value in (["t", []], ["t", [1], {"k": 1}], ["t", [], {}, {"a": "b"}], {"task": "t"}):
        assert msgpack.packb(value)[:1] not in (b"[", b"{")
    assert msgpack.unpackb(b"[") == 0x5B  # '[' alone is the positive fixint 91


@pytest.mark.parametrize("serializer", ["json", "msgpack"])
def test_old_map_envelopes_and_new_lists_run(url: str, qname: str, serializer: str) -> None:
    app = App(url=url, serializer=serializer)
    got: list[Any] = []

    @app.task(queue=qname, name="add")
    def add(a: int, b: int = 0) -> None:
        got.append(a + b)

    dumps = app.serializer.dumps
    q = app.queue(qname)
    q.enqueue(dumps({"task": "add", "args": [1], "kwargs": {"b": 10}}))  # old map form
    q.enqueue(dumps({"task": "add", "args": [2]}))  # old map, kwargs left out
    q.enqueue(dumps(["add", [3]]))
    q.enqueue(dumps(["add", [4], {"b": 40}]))
    q.enqueue(dumps(["add", [5], {}, {"traceparent": "junk"}]))  # a bad tc is ignored
    # the CLI's JSON, in both forms, on any worker
    q.enqueue(_envelope.build(JSON(), "add", [6], {"b": 60}))
    q.enqueue(orjson.dumps({"task": "add", "args": [7], "kwargs": {}}))
    add.enqueue(8, b=80)
    result = drain(app, timeout_s=20)
    assert (result.completed, result.dead) == (8, 0)
    assert sorted(got) == [2, 3, 5, 7, 11, 44, 66, 88]
    app.close()


@pytest.mark.parametrize("serializer", ["json", "msgpack"])
def test_malformed_lists_are_dead_lettered(url: str, qname: str, serializer: str) -> None:
    app = App(url=url, serializer=serializer)

    @app.task(queue=qname, name="t", max_attempts=5)
    def t(*args: Any, **kwargs: Any) -> None:
        pass

    dumps = app.serializer.dumps
    q = app.queue(qname)
    bad = {
        q.enqueue(dumps(["t"])).id: "a list of 1 items",
        q.enqueue(dumps(["t", [], {}, {}, {}, "more"])).id: "a list of 6 items",
        q.enqueue(dumps(["t", [], {}, {}, "more"])).id: "bad opts",
        q.enqueue(dumps(["t", 5])).id: "bad args/kwargs",
        q.enqueue(dumps(["t", [], [1]])).id: "bad args/kwargs",
        q.enqueue(dumps([5, []])).id: "unknown task 5",
        q.enqueue(b"[not json").id: "undecodable payload",
    }
    result = drain(app, timeout_s=20)
    assert (result.dead, result.failed) == (len(bad), 0)
    for job_id, needle in bad.items():
        row = q.get_job(job_id)
        assert row is not None and row["attempts"] == "1"
        assert needle in str(row["last_error"]), (needle, row["last_error"])
    app.close()


def test_cli_enqueue_task_reaches_a_msgpack_worker(url: str, qname: str) -> None:
    app = App(url=url, serializer="msgpack")
    got: list[Any] = []

    @app.task(queue=qname, name="emails.send")
    def send(to: str, *, n: int) -> None:
        got.append((to, n))

    call = ["--task", "emails.send", "--args", '["a@b"]', "--kwargs", json.dumps({"n": 2})]
    out = CliRunner().invoke(main, ["--url", url, "enqueue", qname, *call])
    assert out.exit_code == 0, out.output
    job_id = out.output.split()[0]
    payload = app.queue(qname).get_job(job_id)["payload"]  # type: ignore[index]
    assert orjson.loads(payload) == ["emails.send", ["a@b"], {"n": 2}]
    assert drain(app, timeout_s=20).completed == 1
    assert got == [("a@b", 2)]
    app.close()
