"""OpenTelemetry spans (``echomq.otel``): an enqueue is a PRODUCER span ``send <queue>``
whose W3C context travels in the task envelope, the worker's run of the job a CONSUMER span
``process <queue>`` in the same trace, its child and linked to it, with the messaging
semantic conventions' attributes; ``legacy_names`` keeps the old names; tracing off leaves the
envelope, the worker's hooks and the spans untouched. Real workers against the session
server (both executors), spans captured by the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import orjson
import pytest
import test_worker
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import echomq.otel
from conftest import wait_for
from echomq import App, Worker
from echomq.protocol import envelope as _envelope
from echomq.serializers import JSON

pytestmark = pytest.mark.executors

# The in-process worker fixtures of test_worker (a real Worker on a private loop).
make_app = test_worker.make_app
run_worker = test_worker.run_worker


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def linked_to(span: ReadableSpan, producer: ReadableSpan) -> bool:
    """The consumer span links to the producer's context (the creation context)."""
    return [(lk.context.trace_id, lk.context.span_id) for lk in span.links] == [
        (producer.context.trace_id, producer.context.span_id)
    ]


def raw_payload(app: App, queue: str, job_id: str) -> list[Any]:
    row = app.queue(queue).get_job(job_id)
    assert row is not None
    found: list[Any] = orjson.loads(row["payload"])  # [task, args, kwargs, tc]
    return found


def test_enqueue_and_run_are_one_trace(make_app, run_worker, qname, spans) -> None:
    provider, exporter = spans
    app = make_app()
    echomq.otel.instrument(app, tracer_provider=provider)
    inner = provider.get_tracer("test")

    @app.task(queue=qname, name="add")
    def add(a: int, b: int) -> int:
        return a + b

    @app.task(queue=qname, name="hop")
    async def hop(x: str) -> str:
        await asyncio.sleep(0)
        with inner.start_as_current_span("inside"):  # the handler's own span nests
            return x

    async def produce() -> Any:
        try:
            return await hop.aenqueue("x")
        finally:
            await app.aclose()  # this loop's client

    @app.task(queue=qname, name="inl", inline=True)
    def inl() -> None:
        with inner.start_as_current_span("inside inline"):
            pass

    e1 = add.enqueue(1, 2)
    e2 = asyncio.run(produce())
    e3 = inl.enqueue()
    assert raw_payload(app, qname, e1.id)[3]["traceparent"].startswith("00-")
    w = run_worker(app)
    q = app.queue(qname)
    wait_for(lambda: q.counts()["completed"] == 3)
    w.stop()
    sends = {s.attributes["messaging.message.id"]: s for s in named(exporter, f"send {qname}")}
    procs = {s.attributes["messaging.message.id"]: s for s in named(exporter, f"process {qname}")}
    assert sorted(sends) == sorted(procs) == sorted([e1.id, e2.id, e3.id])
    for task, e in (("add", e1), ("hop", e2), ("inl", e3)):
        send, proc = sends[e.id], procs[e.id]
        assert send.kind is SpanKind.PRODUCER and proc.kind is SpanKind.CONSUMER
        assert send.context.trace_id == proc.context.trace_id
        assert proc.parent is not None and proc.parent.span_id == send.context.span_id
        assert linked_to(proc, send)
        assert send.attributes == {
            "messaging.system": "echomq",
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.destination.name": qname,
            "messaging.message.id": e.id,
            "echomq.task": task,
            "echomq.status": "enqueued",
        }
        assert dict(proc.attributes or {}) == {
            "messaging.system": "echomq",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": qname,
            "messaging.message.id": e.id,
            "echomq.task": task,
            "echomq.attempt": 1,
            "echomq.outcome": "completed",
        }
        assert proc.status.status_code is StatusCode.OK
    for inside, e in (("inside", e2), ("inside inline", e3)):
        [mine] = named(exporter, inside)
        assert mine.parent is not None and mine.parent.span_id == procs[e.id].context.span_id


def test_failing_handler_records_exception(make_app, run_worker, qname, spans) -> None:
    provider, exporter = spans
    app = make_app()
    echomq.otel.instrument(app, tracer_provider=provider)

    @app.task(queue=qname, name="boom", max_attempts=1)
    def boom() -> None:
        raise ValueError("kaput")

    boom.enqueue()
    w = run_worker(app)
    q = app.queue(qname)
    wait_for(lambda: q.counts()["dead"] == 1)
    w.stop()
    [proc] = named(exporter, f"process {qname}")
    assert proc.attributes["echomq.outcome"] == "dead"
    assert proc.attributes["error.type"] == "ValueError"
    assert proc.status.status_code is StatusCode.ERROR
    [event] = [ev for ev in proc.events if ev.name == "exception"]
    assert event.attributes["exception.type"] == "ValueError"
    assert event.attributes["exception.message"] == "kaput"


def test_enqueue_many_and_untraced_envelopes(make_app, run_worker, qname, spans) -> None:
    provider, exporter = spans
    app = make_app()
    echomq.otel.instrument(app, tracer_provider=provider)
    done: list[int] = []

    @app.task(queue=qname, name="t")
    def t(n: int) -> None:
        done.append(n)

    t.enqueue_many([((1,), {}), ((2,), {})])
    # An envelope without "tc" (the CLI's, an old producer's) still runs, in a new trace.
    app.queue(qname).enqueue(_envelope.build(JSON(), "t", [3]))
    w = run_worker(app)
    wait_for(lambda: len(done) == 3)
    w.stop()
    [send] = named(exporter, f"send {qname}")
    assert send.kind is SpanKind.PRODUCER
    assert send.attributes["messaging.batch.message_count"] == 2
    assert send.attributes["messaging.operation.type"] == "send"
    assert "messaging.message.id" not in send.attributes  # a batch: no per-message attribute
    procs = named(exporter, f"process {qname}")
    assert len(procs) == 3
    children = [p for p in procs if p.parent is not None]
    assert len(children) == 2
    assert all(p.parent.span_id == send.context.span_id for p in children)
    assert all(linked_to(p, send) for p in children)
    [root] = [p for p in procs if p.parent is None]
    assert root.context.trace_id != send.context.trace_id
    assert root.links == ()  # nothing to link to
    # A batching API counts its messages even when it sends one (the conventions' rule).
    exporter.clear()
    t.enqueue_many([((4,), {})])
    [one] = named(exporter, f"send {qname}")
    assert one.attributes["messaging.batch.message_count"] == 1


def test_retry_is_a_failed_process_span_then_a_linked_second_one(
    make_app, run_worker, qname, spans
) -> None:
    provider, exporter = spans
    app = make_app()
    echomq.otel.instrument(app, tracer_provider=provider)
    runs: list[int] = []

    @app.task(queue=qname, name="flaky", max_attempts=2, backoff=0)
    def flaky() -> str:
        runs.append(1)
        if len(runs) == 1:
            raise ConnectionError("first try fails")
        return "ok"

    e = flaky.enqueue()
    w = run_worker(app)
    q = app.queue(qname)
    wait_for(lambda: q.counts()["completed"] == 1)
    w.stop()
    [send] = named(exporter, f"send {qname}")
    procs = sorted(
        named(exporter, f"process {qname}"), key=lambda s: s.attributes["echomq.attempt"]
    )
    assert [p.attributes["echomq.attempt"] for p in procs] == [1, 2]
    first, second = procs
    assert first.attributes["echomq.outcome"] == "retried"
    assert first.attributes["error.type"] == "ConnectionError"
    assert first.status.status_code is StatusCode.ERROR
    assert second.attributes["echomq.outcome"] == "completed"
    assert "error.type" not in second.attributes
    for p in procs:  # every attempt belongs to the message's creation context
        assert p.attributes["messaging.message.id"] == e.id
        assert p.parent is not None and p.parent.span_id == send.context.span_id
        assert linked_to(p, send)


def test_a_failed_enqueue_records_error_type(make_app, qname, spans) -> None:
    provider, exporter = spans
    app = make_app(max_payload=64)
    echomq.otel.instrument(app, tracer_provider=provider)

    @app.task(queue=qname, name="t")
    def t(s: str) -> None: ...

    # A bad option fails where the options are made (issue 38: the JobOptions record), before
    # any send; a payload over the app's bound fails in the send.
    with pytest.raises(echomq.InvalidArgument):
        t.options(delay_ms=-5)
    assert not named(exporter, f"send {qname}")
    with pytest.raises(echomq.PayloadTooLarge):
        t.enqueue("x" * 100)
    [send] = named(exporter, f"send {qname}")
    assert send.status.status_code is StatusCode.ERROR
    assert send.attributes["error.type"] == "echomq.errors.PayloadTooLarge"
    assert "messaging.message.id" not in send.attributes


@pytest.mark.parametrize("how", ["argument", "env"])
def test_legacy_names_opt_in(make_app, run_worker, qname, spans, monkeypatch, how) -> None:
    provider, exporter = spans
    app = make_app()
    if how == "env":
        monkeypatch.setenv(echomq.otel.LEGACY_ENV, "1")
        echomq.otel.instrument(app, tracer_provider=provider)
    else:
        monkeypatch.setenv(echomq.otel.LEGACY_ENV, "0")  # the argument wins over the env
        echomq.otel.instrument(app, tracer_provider=provider, legacy_names=True)

    @app.task(queue=qname, name="old")
    def old(n: int) -> None: ...

    e = old.enqueue(1)
    old.enqueue_many([((2,), {})])
    w = run_worker(app)
    q = app.queue(qname)
    wait_for(lambda: q.counts()["completed"] == 2)
    w.stop()
    sends = named(exporter, "old send")
    assert len(sends) == 2 and not named(exporter, f"send {qname}")
    assert all(s.attributes["messaging.operation"] == "send" for s in sends)
    assert all("messaging.operation.type" not in s.attributes for s in sends)
    assert all("messaging.batch.message_count" not in s.attributes for s in sends)
    procs = named(exporter, "old process")
    assert len(procs) == 2
    [proc] = [p for p in procs if p.attributes["messaging.message.id"] == e.id]
    assert proc.attributes["messaging.operation"] == "process"
    assert proc.links == ()  # the old structure: a child, not linked
    assert proc.parent is not None


def test_legacy_off_by_default_and_by_env_zero(make_app, qname, spans, monkeypatch) -> None:
    provider, exporter = spans
    app = make_app()
    monkeypatch.setenv(echomq.otel.LEGACY_ENV, "0")
    echomq.otel.instrument(app, tracer_provider=provider)

    @app.task(queue=qname, name="new")
    def new(n: int) -> None: ...

    new.enqueue(1)
    assert [s.name for s in exporter.get_finished_spans()] == [f"send {qname}"]


def test_off_means_no_tc_no_spans_no_hooks(make_app, run_worker, qname, spans) -> None:
    provider, exporter = spans
    trace.set_tracer_provider(provider)  # even a global provider sees nothing when off
    app = make_app()
    done: list[int] = []

    @app.task(queue=qname, name="t")
    def t(n: int) -> None:
        done.append(n)

    e = t.enqueue(1)
    t.enqueue_many([((2,), {})])
    assert raw_payload(app, qname, e.id) == ["t", [1]]
    # The worker's per-job path is unchanged: no tracing hook is installed.
    assert Worker(app).hooks.fns("before_job") == ()
    w = run_worker(app)
    wait_for(lambda: len(done) == 2)
    w.stop()
    assert exporter.get_finished_spans() == ()
    # Instrumenting then uninstrumenting is off again.
    echomq.otel.instrument(app, tracer_provider=provider)
    echomq.otel.uninstrument(app)
    e = t.enqueue(3)
    assert raw_payload(app, qname, e.id) == ["t", [3]]  # no tc
    assert exporter.get_finished_spans() == ()


def test_echomq_does_not_import_otel_when_off() -> None:
    code = (
        "import sys, echomq, echomq.worker, echomq.app;"
        "assert 'echomq.otel' not in sys.modules, 'echomq.otel imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_malformed_trace_context_is_ignored() -> None:
    s = JSON()
    bad = orjson.dumps({"task": "t", "args": [], "kwargs": {}, "tc": {"traceparent": 5}})
    assert _envelope.trace_context(s, bad) == {}
    assert _envelope.trace_context(s, b"not json") == {}
    assert _envelope.parse(s, bad) == ("t", [], {})
    good = _envelope.build(s, "t", [], None, tc={"traceparent": "00-x"})
    assert _envelope.trace_context(s, good) == {"traceparent": "00-x"}
