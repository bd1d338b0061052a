"""OpenTelemetry traces of a task, the people's decisions included: one trace per task.

With ``TASKS_TRACING`` on, :func:`setup` (called when the app starts) makes a tracer
provider for the service ``task-console``, exporting by OTLP over HTTP in batches when
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set, and
otherwise to nothing but the processors it is given (a test's in-memory exporter). It
installs the engine's tracer (``tasks_app.engine.tracing_hooks``) and turns on the event
listener below. With tracing off nothing is installed: every hook checks one module-level
flag and returns a shared no-op, and the listener returns at once.

How a trace flows:

1. The enqueue makes a span ``enqueue <workflow>`` per task, a child of the current
   context: the producer's active span, or the W3C ``traceparent`` a caller hands over with
   :func:`continuing` (the API wraps its enqueue in it with the request's header). Its
   traceparent is written into the task row by the same INSERT (``Task.traceparent``).
2. Each attempt of a step is a span ``step <kind>``, a child of that stored context, from
   the claim to the attempt's end, current while the handler runs.
3. Each call through the effects ledger is a span ``effect <name>`` inside its attempt.
4. A person's decision (approve, reject, request changes, redrive, resolve, cancel, the
   events of an applied plan) is a span named after its event kind, a child of the task's
   stored context, made once the decision commits.

Every span carries ``task.id``, ``task.workflow`` and ``task.url`` (the console's page).
This module is the home (setup, a caller's trace continued, a task's trace and its
address); the spans of 1.-3. are :mod:`tasks_app.observability.engine_spans`', those of
4. and the listener :mod:`tasks_app.observability.event_spans`'.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from django.conf import settings
from django.urls import reverse
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from tasks_app.engine import tracing_hooks
from tasks_app.models import Task

SERVICE = "task-console"
SCOPE = "tasks_app"
# What a traceparent looks like (W3C Trace Context, version 00): the version, the trace id,
# the parent span's id, the flags.
TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_PROPAGATOR = TraceContextTextMapPropagator()
# An id no other digits of a task's address contain, replaced by the task's own.
_MARKER = 987654321987


class _On:
    """Tracing as :func:`setup` left it on: the provider and the tracer spans come from."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer(SCOPE)


# The module's one flag: None while tracing is off.
_on: _On | None = None


def setup(*, processors: Sequence[SpanProcessor] = (), make_global: bool = False) -> bool:
    """Trace as ``settings.TASKS_TRACING`` says, from now on; returns whether it is on.

    On: a new provider (the one before shut down, its spans flushed), exporting by OTLP
    over HTTP when the environment names an endpoint, and to ``processors`` too. With
    ``make_global`` (the app's start) it becomes OpenTelemetry's global provider, unless
    one was set already, so a handler's own instrumented calls join the attempt's trace.
    Off: nothing is traced and the provider before is shut down."""
    global _on
    reset()
    if not settings.TASKS_TRACING:
        return False
    provider = TracerProvider(
        resource=Resource.create({SERVICE_NAME: SERVICE}), shutdown_on_exit=make_global
    )
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    ):
        # Imported here: the exporter (and its HTTP client) only where it is used.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        # In batches from a thread of its own, which the SDK starts again in a forked
        # Celery pool process.
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    for processor in processors:
        provider.add_span_processor(processor)
    if make_global and isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)
    _on = _On(provider)
    # Imported here: the engine's tracer reads this module's helpers.
    from tasks_app.observability.engine_spans import EngineTracer

    tracing_hooks.install(EngineTracer(_on.tracer))
    return True


def reset() -> None:
    """Tracing off: the engine's tracer removed, the provider's spans flushed, it shut down."""
    global _on
    tracing_hooks.install(None)
    on, _on = _on, None
    if on is not None:
        on.provider.shutdown()


def is_on() -> bool:
    return _on is not None


def tracer() -> trace.Tracer | None:
    """Where spans come from, or None with tracing off."""
    return None if _on is None else _on.tracer


@contextmanager
def continuing(traceparent: str | None, tracestate: str | None = None) -> Iterator[None]:
    """Inside, an enqueue continues the trace ``traceparent`` names (the W3C header a
    request carries, with its ``tracestate``): its span is that one's child. With tracing
    off, no traceparent or one that does not parse, nothing changes (an enqueue continues
    the current span, if any)::

        with tracing.continuing(request.headers.get("traceparent")):
            result = services.enqueue(...)
    """
    if _on is None or not traceparent or TRACEPARENT.match(traceparent.strip()) is None:
        yield
        return
    carrier = {"traceparent": traceparent.strip()}
    if tracestate:
        carrier["tracestate"] = tracestate
    token = otel_context.attach(_PROPAGATOR.extract(carrier))
    try:
        yield
    finally:
        otel_context.detach(token)


# --- a task's trace -----------------------------------------------------------------------


def traceparent_of(span_context: SpanContext) -> str | None:
    """The W3C traceparent naming ``span_context`` as a parent; None if it is invalid."""
    if not span_context.is_valid:
        return None
    return (
        f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-"
        f"{int(span_context.trace_flags):02x}"
    )


def context_of(traceparent: str | None) -> Context | None:
    """The context whose span ``traceparent`` names (a task's stored one), for a child
    span; None when there is none to continue (the span then starts in the current one).
    Read here rather than by the propagator: every attempt's span reads one."""
    found = TRACEPARENT.match(traceparent or "")
    if found is None:
        return None
    parent = SpanContext(
        trace_id=int(found.group(2), 16),
        span_id=int(found.group(3), 16),
        is_remote=True,
        trace_flags=TraceFlags(int(found.group(4), 16) & TraceFlags.SAMPLED),
    )
    if not parent.is_valid:
        return None
    return trace.set_span_in_context(NonRecordingSpan(parent), Context())


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id (32 hex digits) of a traceparent, or None."""
    found = TRACEPARENT.match(traceparent or "")
    if found is None or set(found.group(2)) == {"0"}:
        return None
    return found.group(2)


def trace_url(task: Task) -> str | None:
    """Where ``task``'s trace is seen (``TASKS_TRACE_URL`` with its trace id), for the
    console's task page and the API; None without that setting or a stored trace. It does
    not depend on tracing being on now: a task traced before still has its trace."""
    template = settings.TASKS_TRACE_URL
    trace_id = trace_id_of(task.traceparent)
    if not template or trace_id is None:
        return None
    # Not str.format: other braces in the setting (a query's JSON) stay as they are.
    return template.replace("{trace_id}", trace_id)


def task_url(task_id: int) -> str:
    """The console's page of the task, as its readers reach it (``CONSOLE_BASE_URL``)."""
    before, after = _task_url_parts(settings.CONSOLE_BASE_URL)
    return f"{before}{task_id}{after}"


@functools.cache
def _task_url_parts(base: str) -> tuple[str, str]:
    """The task page's address before and after its id, reversed once per base: every span
    of every task carries it, and a reverse costs as much as a span."""
    path = reverse("console:task", args=[_MARKER])
    before, _, after = path.partition(str(_MARKER))
    return base.rstrip("/") + before, after


def task_attributes(task_id: int | None, workflow: str | None) -> dict[str, AttributeValue]:
    """What every span of a task carries: ``task.id``, ``task.workflow``, ``task.url``."""
    attributes: dict[str, AttributeValue] = {}
    if task_id is not None:
        attributes |= {"task.id": task_id, "task.url": task_url(task_id)}
    if workflow:
        attributes["task.workflow"] = workflow
    return attributes
