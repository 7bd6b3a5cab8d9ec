"""OpenTelemetry spans (``echomq.otel``): an enqueue is a PRODUCER span whose W3C context
travels in the task envelope, the worker's run of the job a CONSUMER span in the same trace,
its child; tracing off leaves the envelope, the worker's hooks and the spans untouched.
Real workers against the session server, spans captured by the SDK's in-memory exporter."""

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
from echomq import App, Worker, _envelope
from echomq.serializers import JSON

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
    for task, e in (("add", e1), ("hop", e2), ("inl", e3)):
        [send] = named(exporter, f"{task} send")
        [proc] = named(exporter, f"{task} process")
        assert send.kind is SpanKind.PRODUCER and proc.kind is SpanKind.CONSUMER
        assert send.context.trace_id == proc.context.trace_id
        assert proc.parent is not None and proc.parent.span_id == send.context.span_id
        assert send.attributes["messaging.message.id"] == e.id
        attrs = dict(proc.attributes or {})
        assert attrs["messaging.system"] == "echomq"
        assert attrs["messaging.destination.name"] == qname
        assert attrs["messaging.message.id"] == e.id
        assert attrs["echomq.attempt"] == 1
        assert attrs["echomq.outcome"] == "completed"
        assert proc.status.status_code is StatusCode.OK
    for inside, task in (("inside", "hop"), ("inside inline", "inl")):
        [mine] = named(exporter, inside)
        [proc] = named(exporter, f"{task} process")
        assert mine.parent is not None and mine.parent.span_id == proc.context.span_id


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
    [proc] = named(exporter, "boom process")
    assert proc.attributes["echomq.outcome"] == "dead"
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
    [send] = named(exporter, "t send")
    assert send.attributes["messaging.batch.message_count"] == 2
    procs = named(exporter, "t process")
    assert len(procs) == 3
    children = [p for p in procs if p.parent is not None]
    assert len(children) == 2
    assert all(p.parent.span_id == send.context.span_id for p in children)
    [root] = [p for p in procs if p.parent is None]
    assert root.context.trace_id != send.context.trace_id


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
