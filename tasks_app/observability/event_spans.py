"""What the traces hear of the events recorded (``tasks_app.history.events.listen``,
registered by ``TasksAppConfig.ready``): the end of an attempt open in this process, and
a person's decision on a task. With tracing off the listener returns at once.

A decision is a span named after its event (``approved``, ``approval_recorded``,
``rejected``, ``changes_requested``, ``redriven``, ``resolved``, ``rewound``,
``cancel_requested``, ``cancelled``), the child of its task's stored trace, so the people
appear in the task's trace beside its attempts. Hearing every event where it is recorded
covers every way a decision is made (the console, the API, commands, bulk actions, a
program's plan applied) in one place. Its attributes: the task's (``task.*``),
``enduser.id`` (who decided, by name), ``decision.reason`` (the reason or comment,
redacted, cut short), ``event.id``, and where the event has them ``step.id``,
``decision.plan`` (the plan a bulk action or a program's plan applied),
``decision.outcome`` (a resolve's), ``approval.request`` and ``task.status``. The span
links to the span current when the decision was made (a traced request), if any.

The span is made once the decision's transaction commits, timed from the moment it was
recorded: a decision rolled back leaves none. Events without a task (``plan_applied``, a
queue paused) and those of the system or a worker (a task cancelled by a rejection, an
expiry) make none: each task a plan touched has its own event carrying the plan's id.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import partial

from django.db import transaction
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind
from opentelemetry.util.types import AttributeValue

from tasks_app.access import SYSTEM
from tasks_app.models import Event, EventKind, Step, Task
from tasks_app.observability import engine_spans, tracing
from tasks_app.redaction import redact_text

DECISIONS = frozenset(
    {
        EventKind.APPROVED,
        EventKind.APPROVAL_RECORDED,
        EventKind.REJECTED,
        EventKind.CHANGES_REQUESTED,
        EventKind.REDRIVEN,
        EventKind.RESOLVED,
        EventKind.REWOUND,
        EventKind.CANCEL_REQUESTED,
        EventKind.CANCELLED,
    }
)
# Actors that are not people: the system (``system``, ``system:sweeper``) and workers.
NOT_PEOPLE = (f"{SYSTEM}:", "worker:")
# What an event's data adds to its decision's span, by attribute.
FROM_DATA = {
    "decision.plan": "plan",
    "decision.outcome": "outcome",
    "approval.request": "request",
    "task.status": "task_status",
}
# A reason or comment is cut to this many characters.
SHORT_REASON = 1000


def on_event(event: Event, *, task: Task | None = None, steps: Sequence[Step] = ()) -> None:
    """The listener: an attempt's end to its span, a person's decision to a span of its own."""
    if not tracing.is_on():
        return
    data = event.data or {}
    if event.step_id is not None and event.kind in engine_spans.ENDINGS:
        engine_spans.attempt_ended(event.step_id, event.kind, data)
    if event.kind in DECISIONS and event.task_id is not None and is_person(event.actor):
        _decided(event, task)


def is_person(actor: str) -> bool:
    """Whether an event's actor is a person (a user, ``cli:alice``), not the system or a worker."""
    return bool(actor) and actor != SYSTEM and not actor.startswith(NOT_PEOPLE)


def _decided(event: Event, task: Task | None) -> None:
    """Gather the decision's span now, under the transaction's locks; make it on commit."""
    assert event.task_id is not None
    workflow: str | None = None
    traceparent: str | None = None
    if task is not None:
        workflow, traceparent = task.workflow, task.traceparent
    else:
        found = Task.objects.filter(pk=event.task_id).values_list("workflow", "traceparent").first()
        if found is not None:
            workflow, traceparent = found
    data = event.data or {}
    attributes: dict[str, AttributeValue] = {
        **tracing.task_attributes(event.task_id, workflow),
        "enduser.id": event.actor,
        "decision.reason": _short(event.reason),
        "event.id": event.pk,
    }
    if event.step_id is not None:
        attributes["step.id"] = event.step_id
    for name, key in FROM_DATA.items():
        value = data.get(key)
        if isinstance(value, str | int | float | bool) and value != "":
            attributes[name] = value
    current = trace.get_current_span().get_span_context()
    links = [Link(current)] if current.is_valid else []
    began = time.time_ns()
    transaction.on_commit(
        partial(_make, str(event.kind), traceparent, attributes, links, began), robust=True
    )


def _make(
    name: str,
    traceparent: str | None,
    attributes: dict[str, AttributeValue],
    links: list[Link],
    began: int,
) -> None:
    tracer = tracing.tracer()
    if tracer is None:  # tracing turned off meanwhile
        return
    span = tracer.start_span(
        name,
        context=tracing.context_of(traceparent),
        kind=SpanKind.INTERNAL,
        attributes=attributes,
        links=links,
        start_time=began,
    )
    span.end()


def _short(text: str) -> str:
    reason = redact_text(text or "")
    return reason if len(reason) <= SHORT_REASON else reason[: SHORT_REASON - 1] + "…"
