"""OpenTelemetry spans for task calls (optional extra ``echomq[otel]``).

Opt in once per app, before enqueueing or starting a worker::

    import echomq.otel
    echomq.otel.instrument(app)            # the global tracer provider, or tracer_provider=

Then an enqueue through the app layer (``Task.enqueue``/``aenqueue``/``enqueue_many`` and
their ``options(...)`` forms) is a PRODUCER span ``"<task> send"`` whose W3C trace context
travels in the task envelope (an optional ``"tc"`` map, present only when tracing is on), and
a worker of that app runs each handler inside a CONSUMER span ``"<task> process"``, a child of
the producer's span, with the outcome (and the handler's exception) recorded. A payload
without ``"tc"`` (an old envelope, the CLI's, a producer without tracing) starts a new trace.

Tracing off is the default and costs nothing: this module (and opentelemetry) is not imported,
the envelope is unchanged, and the worker's per-job path makes no extra call.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextvars import Token
from typing import TYPE_CHECKING, Any

from echomq import _extras

# Importing this module is turning tracing on: without the otel extra it says which extra to
# install (MissingExtra, an ImportError), and nothing else in echomq imports it.
try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError as exc:
    raise _extras.missing("otel", "tracing (echomq.otel)", exc) from exc

from echomq import _envelope
from echomq.hooks import Hooks

if TYPE_CHECKING:
    from echomq._kernel import Enqueued
    from echomq.app import App, Task
    from echomq.context import JobContext

__all__ = ["instrument", "uninstrument"]

_SYSTEM = "echomq"


def instrument(app: App, *, tracer_provider: trace.TracerProvider | None = None) -> None:
    """Turn tracing on for ``app``: its enqueues and its workers' handler runs make spans.

    ``tracer_provider`` defaults to the global one (``opentelemetry.trace``). A worker picks
    the tracing up when it is built, so instrument the app before creating its ``Worker``.
    """
    tracer = trace.get_tracer("echomq", tracer_provider=tracer_provider)
    app._otel = _Tracing(app, tracer)


def uninstrument(app: App) -> None:
    """Turn tracing off for ``app`` (workers built afterwards make no spans)."""
    app._otel = None


class _Tracing:
    """The spans of one instrumented app: producer side for ``Task``, consumer side as hooks."""

    def __init__(self, app: App, tracer: trace.Tracer) -> None:
        self.app = app
        self.tracer = tracer
        # Open consumer spans by run (queue, id, token): before_job opens, after_job closes.
        self._runs: dict[tuple[str, str, int], tuple[trace.Span, Token[otel_context.Context]]] = {}

    # -- producer --------------------------------------------------------------------------

    def start_send(
        self,
        task: Task[Any, Any],
        calls: Iterable[tuple[Any, Any]],
        opts: dict[str, Any] | None = None,
    ) -> tuple[trace.Span, list[bytes]]:
        """Open the ``"<task> send"`` span and build the payloads carrying its context
        (``opts``: the jobs' options, see ``echomq._envelope``)."""
        span = self.tracer.start_span(
            f"{task.name} send",
            kind=SpanKind.PRODUCER,
            attributes={
                "messaging.system": _SYSTEM,
                "messaging.operation": "send",
                "messaging.destination.name": task.queue,
                "echomq.task": task.name,
            },
        )
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        serializer = self.app.serializer
        payloads = [
            _envelope.build(serializer, task.name, a, k, tc=carrier, opts=opts) for a, k in calls
        ]
        if len(payloads) != 1:
            span.set_attribute("messaging.batch.message_count", len(payloads))
        return span, payloads

    @staticmethod
    def end_send(span: trace.Span, sent: Enqueued | None, error: BaseException | None) -> None:
        """Close a send span with the job id it made, or the error that stopped it."""
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        elif sent is not None:
            span.set_attribute("messaging.message.id", sent.id)
            span.set_attribute("echomq.status", sent.status)
        span.end()

    # -- consumer (worker hooks) -----------------------------------------------------------

    def hooks(self) -> Hooks:
        return Hooks(before_job=self.before_job, after_job=self.after_job)

    def before_job(self, job: JobContext) -> None:
        carrier = _envelope.trace_context(self.app.serializer, job.payload)
        parent = propagate.extract(carrier) if carrier else None
        span = self.tracer.start_span(
            f"{job.task} process",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes={
                "messaging.system": _SYSTEM,
                "messaging.operation": "process",
                "messaging.destination.name": job.queue,
                "messaging.message.id": job.id,
                "echomq.task": job.task,
                "echomq.attempt": job.attempt,
            },
        )
        # The hook runs in the handler's context: the span is current for the handler's own
        # spans (async and inline handlers; sync handlers run in a pool thread).
        token = otel_context.attach(trace.set_span_in_context(span))
        self._runs[(job.queue, job.id, job.token)] = (span, token)

    def after_job(self, job: JobContext, outcome: str, error: BaseException | None) -> None:
        found = self._runs.pop((job.queue, job.id, job.token), None)
        if found is None:
            return
        span, token = found
        otel_context.detach(token)
        span.set_attribute("echomq.outcome", outcome)
        if error is not None:
            span.record_exception(error)
        if outcome == "completed":
            span.set_status(Status(StatusCode.OK))
        elif error is not None or outcome in ("dead", "retried"):
            span.set_status(Status(StatusCode.ERROR, type(error).__name__ if error else outcome))
        span.end()
