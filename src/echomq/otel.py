"""OpenTelemetry spans for task calls (extra ``otel``).

OpenTelemetry spans for task calls (optional extra ``echomq[otel]``), named and attributed
by the OpenTelemetry messaging semantic conventions.

Opt in once per app, before enqueueing or starting a worker::

    import echomq.otel
    echomq.otel.instrument(app)            # the global tracer provider, or tracer_provider=

Then an enqueue through the app layer (``Task.enqueue``/``aenqueue``/``enqueue_many`` and
their ``options(...)`` forms) is a PRODUCER span ``"send <queue>"`` whose W3C trace context
travels in the task envelope (an optional ``tc`` element, present only when tracing is on) as
the messages' creation context, and a worker of that app runs each handler inside a CONSUMER
span ``"process <queue>"`` that links to that creation context (the conventions' SHOULD) and
is also its child (their MAY for a span that accounts for one message: a backend that draws
no links still shows one trace). A payload without ``tc`` (an old envelope, the CLI's, a
producer without tracing) starts a new trace. The attributes are the conventions':
``messaging.system`` ``"echomq"`` (the registry has no value for it and says to use the
system's own name then; not ``"redis"``, which is the database the queue runs on),
``messaging.operation.type`` / ``.name`` (``send``, ``process``), ``messaging.destination.name``
(the queue), ``messaging.message.id`` (the job id), ``messaging.batch.message_count`` (an
``enqueue_many``), ``error.type`` (a failed operation); echomq's own under ``echomq.*``.

``instrument(app, legacy_names=True)`` (or ``ECHOMQ_OTEL_LEGACY_NAMES=1``) keeps the names
of echomq 0.5 for one release: ``"<task> send"`` / ``"<task> process"`` with the deprecated
``messaging.operation``, the consumer span a child and not linked.

Tracing off is the default and costs nothing: this module (and opentelemetry) is not imported,
the envelope is unchanged, and the worker's per-job path makes no extra call.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from contextvars import Token
from typing import TYPE_CHECKING, Any

from echomq.protocol import extras as _extras

# Importing this module is turning tracing on: without the otel extra it says which extra to
# install (MissingExtra, an ImportError), and nothing else in echomq imports it.
try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
except ImportError as exc:
    raise _extras.missing("otel", "tracing (echomq.otel)", exc) from exc

from echomq.hooks import Hooks
from echomq.protocol import envelope as _envelope

if TYPE_CHECKING:
    from echomq.app import App, Task
    from echomq.context import JobContext
    from echomq.protocol.kernel import Enqueued

__all__ = ["LEGACY_ENV", "instrument", "uninstrument"]

_SYSTEM = "echomq"
# The one-release opt-in to the old span names and attributes (see the module's doc).
LEGACY_ENV = "ECHOMQ_OTEL_LEGACY_NAMES"


def instrument(
    app: App,
    *,
    tracer_provider: trace.TracerProvider | None = None,
    legacy_names: bool | None = None,
) -> None:
    """Turn tracing on for ``app``: its enqueues and its workers' handler runs make spans.

    ``tracer_provider`` defaults to the global one (``opentelemetry.trace``). A worker picks
    the tracing up when it is built, so instrument the app before creating its ``Worker``.
    ``legacy_names=True`` emits the names of echomq 0.5 instead of the semantic
    conventions' (None: ``ECHOMQ_OTEL_LEGACY_NAMES`` set to ``1``/``true``/``yes``).
    """
    if legacy_names is None:
        legacy_names = os.environ.get(LEGACY_ENV, "").strip().lower() in ("1", "true", "yes")
    tracer = trace.get_tracer("echomq", tracer_provider=tracer_provider)
    app._otel = _Tracing(app, tracer, legacy=bool(legacy_names))


def uninstrument(app: App) -> None:
    """Turn tracing off for ``app`` (workers built afterwards make no spans)."""
    app._otel = None


def _error_type(error: BaseException) -> str:
    """``error.type``: the exception's class name, qualified unless a builtin (low
    cardinality, as the conventions ask)."""
    cls = type(error)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


class _Tracing:
    """The spans of one instrumented app: producer side for ``Task``, consumer side as hooks."""

    def __init__(self, app: App, tracer: trace.Tracer, *, legacy: bool = False) -> None:
        self.app = app
        self.tracer = tracer
        self.legacy = legacy
        # Open consumer spans by run (queue, id, token): before_job opens, after_job closes.
        self._runs: dict[tuple[str, str, int], tuple[trace.Span, Token[otel_context.Context]]] = {}

    def _names(self, operation: str, queue: str, task: str) -> tuple[str, dict[str, Any]]:
        """One span's name and its operation attributes, in the conventions' form or the
        legacy one."""
        if self.legacy:
            return f"{task} {operation}", {"messaging.operation": operation}
        return f"{operation} {queue}", {
            "messaging.operation.type": operation,
            "messaging.operation.name": operation,
        }

    # -- producer --------------------------------------------------------------------------

    def start_send(
        self,
        task: Task[Any, Any],
        calls: Iterable[tuple[Any, Any]],
        opts: dict[str, Any] | None = None,
        *,
        batch: bool = False,
    ) -> tuple[trace.Span, list[bytes]]:
        """Open the send span and build the payloads carrying its context (``opts``: the
        jobs' options, see ``echomq.protocol.envelope``; ``batch``: an ``enqueue_many``, whose span
        counts its messages even when there is one)."""
        name, operation = self._names("send", task.queue, task.name)
        span = self.tracer.start_span(
            name,
            kind=SpanKind.PRODUCER,
            attributes={
                "messaging.system": _SYSTEM,
                **operation,
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
        # The conventions count a batching API's messages even when it sends one (and never a
        # single-message API's); the legacy names counted any call of more than one.
        if (len(payloads) != 1) if self.legacy else batch:
            span.set_attribute("messaging.batch.message_count", len(payloads))
        return span, payloads

    def end_send(
        self, span: trace.Span, sent: Enqueued | None, error: BaseException | None
    ) -> None:
        """Close a send span with the job id it made, or the error that stopped it."""
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
            if not self.legacy:
                span.set_attribute("error.type", _error_type(error))
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
        links: list[Link] = []
        if parent is not None and not self.legacy:
            creation = trace.get_current_span(parent).get_span_context()
            if creation.is_valid:
                links.append(Link(creation))
        name, operation = self._names("process", job.queue, job.task)
        span = self.tracer.start_span(
            name,
            context=parent,
            kind=SpanKind.CONSUMER,
            links=links,
            attributes={
                "messaging.system": _SYSTEM,
                **operation,
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
            if not self.legacy:
                span.set_attribute("error.type", _error_type(error) if error else outcome)
        span.end()
