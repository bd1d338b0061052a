"""The spans of the engine's work (``tasks_app.engine.tracing_hooks``), made only with
tracing on (:mod:`tasks_app.observability.tracing` installs :class:`EngineTracer`):

- ``enqueue <workflow>`` (producer) per task: ``task.*``, ``task.queue``, ``task.created``
  (False: the idempotency key returned a task that was there);
- ``step <kind>`` (consumer) per attempt, the child of its task's stored trace, from the
  claim to the attempt's end: ``step.id``, ``step.kind``, ``step.position``,
  ``step.attempt``, ``step.fencing_token``, ``worker.id``, ``step.outcome`` (the event
  that ended it: ``succeeded``, ``retry_scheduled``, ``dead_lettered``, ``cancelled``,
  ``claim_released``, ``stale_write_rejected``); a failure has status ERROR, its
  ``error.type`` and an ``exception`` event with the redacted error;
- ``effect <name>`` (client) per call through the effects ledger, inside its attempt:
  ``effect.key``, ``effect.name``, ``effect.replayed`` (the ledger returned a recorded
  result) or ``effect.called``.

A failed attempt's outcome comes from its event (:func:`attempt_ended`, which the event
listener calls); a success written by the batch statement records no event, so an attempt
whose batch finished without one succeeded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, TypeVar

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from tasks_app.engine.enqueueing import EnqueueResult, PreparedItem
from tasks_app.engine.leases import Claim
from tasks_app.exceptions import error_summary
from tasks_app.models import EventKind, Step
from tasks_app.observability.tracing import context_of, task_attributes, traceparent_of
from tasks_app.redaction import redact_text

T = TypeVar("T")

# The events that end an attempt, as its span's ``step.outcome``; those marked are failures.
ENDINGS = frozenset(
    {
        EventKind.SUCCEEDED,
        EventKind.RETRY_SCHEDULED,
        EventKind.DEAD_LETTERED,
        EventKind.CANCELLED,
        EventKind.CLAIM_RELEASED,
        EventKind.STALE_WRITE_REJECTED,
    }
)
FAILED = frozenset(
    {EventKind.RETRY_SCHEDULED, EventKind.DEAD_LETTERED, EventKind.STALE_WRITE_REJECTED}
)
SUCCEEDED = str(EventKind.SUCCEEDED)
# An attempt whose batch raised before its outcome was recorded.
UNRECORDED = "unrecorded"
# An error as a span tells it: its last line, redacted, cut short.
SHORT_ERROR = 500


@dataclass
class _Attempt:
    span: Span
    outcome: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)


# The attempts open in this process, by (step, fencing token): the event listener finds
# the one a failure's event ends (events come from the thread that runs the attempt, but
# a lease keeper's stale heartbeat comes from its own).
_open: dict[tuple[int, int], _Attempt] = {}
_lock = threading.Lock()


class EngineTracer:
    """``tracing_hooks.Tracer`` with tracing on."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer

    def enqueue(self, items: Sequence[PreparedItem]) -> _EnqueueSpans:
        return _EnqueueSpans(self.tracer, items)

    def attempts(self, claims: Sequence[Claim], steps: Mapping[int, Step]) -> _AttemptSpans:
        return _AttemptSpans(self.tracer, claims, steps)

    @contextmanager
    def effect(self, key: str, name: str) -> Iterator[_EffectSpan]:
        attributes = {"effect.key": key, "effect.name": name}
        with self.tracer.start_as_current_span(
            f"effect {name}", kind=SpanKind.CLIENT, attributes=attributes
        ) as span:
            traced = _EffectSpan(span)
            returned = False
            try:
                yield traced
                returned = True
            finally:
                # Replayed: the ledger returned a recorded result without calling.
                span.set_attribute("effect.called", traced.called)
                span.set_attribute("effect.replayed", returned and not traced.called)


class _EnqueueSpans:
    """One span per item, ended with the enqueue; an error escaping it is on each."""

    def __init__(self, tracer: trace.Tracer, items: Sequence[PreparedItem]) -> None:
        self.spans = [
            tracer.start_span(
                f"enqueue {item.workflow.name}",
                kind=SpanKind.PRODUCER,
                attributes={
                    **task_attributes(None, item.workflow.name),
                    "task.queue": item.queue,
                },
            )
            for item in items
        ]

    def __enter__(self) -> _EnqueueSpans:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for span in self.spans:
            if value is not None:
                span.record_exception(value)
                span.set_status(Status(StatusCode.ERROR, type(value).__name__))
            span.end()

    def stamped(self, items: list[PreparedItem]) -> list[PreparedItem]:
        return [
            replace(item, traceparent=traceparent_of(span.get_span_context()))
            for item, span in zip(items, self.spans, strict=True)
        ]

    def created(self, results: Sequence[EnqueueResult]) -> None:
        for span, result in zip(self.spans, results, strict=True):
            span.set_attributes(task_attributes(result.task.pk, result.task.workflow))
            span.set_attribute("task.created", result.created)


class _AttemptSpans:
    """A span per claim of the batch, each ended with its attempt (:meth:`running`) or
    with the batch (its success, written with the others, or an error escaping it)."""

    def __init__(
        self, tracer: trace.Tracer, claims: Sequence[Claim], steps: Mapping[int, Step]
    ) -> None:
        # The batch was claimed a moment ago: every attempt starts now.
        began = time.time_ns()
        self.attempts: dict[tuple[int, int], _Attempt] = {}
        for claim in claims:
            step = steps.get(claim.step_id)
            task = step.task if step is not None else None
            kind = step.kind if step is not None else "?"
            attributes = {
                **task_attributes(claim.task_id, task.workflow if task else None),
                "task.queue": claim.queue,
                "step.id": claim.step_id,
                "step.kind": kind,
                "step.attempt": claim.attempt,
                "step.fencing_token": claim.token,
                "worker.id": claim.worker_id,
            }
            if step is not None:
                attributes["step.position"] = step.position
            span = tracer.start_span(
                f"step {kind}",
                context=context_of(task.traceparent if task else None),
                kind=SpanKind.CONSUMER,
                attributes=attributes,
                start_time=began,
            )
            self.attempts[(claim.step_id, claim.token)] = _Attempt(span)
        with _lock:
            _open.update(self.attempts)

    def __enter__(self) -> _AttemptSpans:
        return self

    @contextmanager
    def running(self, claim: Claim) -> Iterator[object]:
        attempt = self.attempts[(claim.step_id, claim.token)]
        # An error escaping the handler's run is recorded when the batch ends (__exit__).
        with trace.use_span(
            attempt.span, end_on_exit=False, record_exception=False, set_status_on_exception=False
        ):
            yield attempt
        if attempt.outcome is not None:
            # Its failure was recorded: the attempt ends here, not with its batch.
            self._end(claim.step_id, claim.token)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for key, attempt in list(self.attempts.items()):
            if attempt.outcome is None and value is None:
                attempt.outcome = SUCCEEDED
            elif attempt.outcome is None:
                attempt.outcome = UNRECORDED
                attempt.span.record_exception(value)  # type: ignore[arg-type]
                attempt.span.set_status(Status(StatusCode.ERROR, type(value).__name__))
            self._end(*key)

    def _end(self, step_id: int, token: int) -> None:
        attempt = self.attempts.pop((step_id, token), None)
        with _lock:
            _open.pop((step_id, token), None)
        if attempt is None:
            return
        span = attempt.span
        span.set_attribute("step.outcome", attempt.outcome or UNRECORDED)
        if attempt.outcome in FAILED:
            error_type = attempt.facts.get("error_class") or str(attempt.outcome)
            span.set_attribute("error.type", error_type)
            span.set_status(Status(StatusCode.ERROR, error_type))
            message = attempt.facts.get("error")
            if message:
                span.add_event(
                    "exception",
                    {"exception.type": error_type, "exception.message": _short(message)},
                )
        span.end()


def attempt_ended(step_id: int, kind: str, data: Mapping[str, Any]) -> None:
    """The event ``kind`` of step ``step_id`` was recorded: if it ends an attempt open in
    this process (its fencing token in ``data``), that attempt's outcome. A heartbeat's
    stale write is not the attempt's end (its handler goes on until it hears)."""
    if kind not in ENDINGS or data.get("operation") == "heartbeat":
        return
    token = data.get("token")
    if not isinstance(token, int):
        return
    with _lock:
        attempt = _open.get((step_id, token))
    if attempt is not None and attempt.outcome is None:
        attempt.outcome = str(kind)
        attempt.facts = {"error_class": data.get("error_class"), "error": data.get("error")}


class _EffectSpan:
    def __init__(self, span: Span) -> None:
        self.span = span
        self.called = False

    def wrap(self, call: Callable[[str], T]) -> Callable[[str], T]:
        def called(key: str) -> T:
            self.called = True
            return call(key)

        return called


def _short(text: str) -> str:
    summary = redact_text(" ".join(error_summary(str(text)).split()))
    return summary if len(summary) <= SHORT_ERROR else summary[: SHORT_ERROR - 1] + "…"
