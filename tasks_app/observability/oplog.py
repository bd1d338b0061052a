"""The operational log: one line, on logger ``tasks_app.events``, per transition on-call
needs to hear of, written once the transaction that made it commits.

Written: retries (INFO), dead letters, lease expiries and stale writes refused (WARNING:
work that did not go as planned), and every operator action and approval outcome (INFO:
redrive, resolve, cancel, pause, resume, approve, reject, request changes, expiry). Every
other event kind (claims, successes, enqueues) writes nothing, so the hot path pays
nothing. Each line carries the event kind, the task, the step, its fencing token, the
workflow, the queue and the actor, and where they apply the attempts, the error class, a
short error, the reason and the delay before a retry::

    retry_scheduled task=12 step=34 token=2 workflow=demo.flaky queue=default
        actor=worker:host:77 attempts=2 error_class=tasks_app.exceptions.RetryableError
        error="failing on claim 2 of 3 (fail_first)" retry_in=0.173s

(one line; ``TASKS_LOG_FORMAT=json`` writes the same fields as JSON,
``tasks_app.observability.logs``).

What a line may carry is listed here, by name: never a payload or a result. Free text (an
error, a reason) is cut short and has the values of secret keys removed, as has any dict a
line carries (``tasks_app.redaction``, with ``REDACT_KEY_PATTERNS``).

The hook is :func:`log_event`, which listens to every event recorded
(``tasks_app.history.events.listen``, registered by ``TasksAppConfig.ready``): those the
ORM writes and those of the SQL batch path, which writes only claims, successes and the
``cancelled`` of a task whose cancel came while its step ran (``fastpath.complete_many``).
Its retries, dead letters and stale writes go through the ORM.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from django.db import transaction

from tasks_app.exceptions import error_summary
from tasks_app.models import OPERATOR_EVENT_KINDS, Event, EventKind, Step, Task
from tasks_app.redaction import redact, redact_text

logger = logging.getLogger("tasks_app.events")

LEVELS: dict[str, int] = {
    **dict.fromkeys(OPERATOR_EVENT_KINDS, logging.INFO),
    EventKind.APPROVAL_EXPIRED: logging.INFO,
    EventKind.RETRY_SCHEDULED: logging.INFO,
    EventKind.DEAD_LETTERED: logging.WARNING,
    EventKind.LEASE_EXPIRED: logging.WARNING,
    EventKind.CLAIM_RELEASED: logging.INFO,
    EventKind.STALE_WRITE_REJECTED: logging.WARNING,
}
# Kinds whose lines say how the attempt went: attempts, error class, error.
FAILURES = frozenset(
    {
        EventKind.RETRY_SCHEDULED,
        EventKind.DEAD_LETTERED,
        EventKind.LEASE_EXPIRED,
    }
)
# What an event's data may add to its line: scalars, by name.
FROM_DATA = (
    "outcome",
    "step_status",
    "operation",
    "current_token",
    "current_status",
    "request",
    "revision",
    "policy",
    "ran",
    "running_step",
    "limit",
    "key",
)
# Free text is cut to this many characters.
SHORT = 200


@dataclass(frozen=True)
class _StepFacts:
    pk: int
    fencing_token: int
    attempts: int
    queue: str
    error_class: str
    last_error: str
    workflow: str | None = None


def log_event(event: Event, *, task: Task | None = None, steps: Sequence[Step] = ()) -> None:
    """Write ``event``'s line once the current transaction commits (at once outside one),
    if its kind is one the log carries; nothing if the transaction rolls back.

    ``task`` and ``steps`` are the rows the transition holds, read for the workflow, the
    queue, the token and the attempts; what is not at hand is read by id, here, under the
    transaction's locks, so the line tells the state the event recorded."""
    level = LEVELS.get(event.kind)
    if level is None or not logger.isEnabledFor(level):
        return
    fields = event_fields(event, task=task, steps=steps)
    transaction.on_commit(partial(write, level, event.kind, fields), robust=True)


def event_fields(
    event: Event, *, task: Task | None = None, steps: Sequence[Step] = ()
) -> dict[str, Any]:
    """The fields of ``event``'s line, in the order the text format writes them."""
    data: dict[str, Any] = event.data or {}
    step = _subject(event, steps)
    workflow, queue = _workflow_and_queue(event, task, step)
    fields: dict[str, Any] = {
        "task": event.task_id,
        "step": step.pk if step else event.step_id,
        "token": data.get("token", step.fencing_token if step else None),
        "workflow": workflow,
        "queue": queue,
        "actor": event.actor,
    }
    if event.kind in FAILURES and step is not None:
        fields["attempts"] = step.attempts
        fields["error_class"] = data.get("error_class") or step.error_class or None
        fields["error"] = _short_error(data.get("error") or step.last_error, step.error_class)
    if event.kind == EventKind.RETRY_SCHEDULED and data.get("retry_in") is not None:
        fields["retry_in"] = round(float(data["retry_in"]), 3)
    fields["reason"] = _short(event.reason) or None
    for name in FROM_DATA:
        fields[name] = data.get(name)
    return {
        name: redact(value) if isinstance(value, dict | list) else value
        for name, value in fields.items()
        if value is not None and value != ""
    }


def line(kind: str, fields: dict[str, Any]) -> str:
    """The readable line: the kind, then ``name=value`` pairs (values with spaces, quotes
    or ``=`` quoted as JSON strings; seconds marked ``s``)."""
    return " ".join([kind, *(f"{name}={_text(name, value)}" for name, value in fields.items())])


def write(level: int, kind: str, fields: dict[str, Any]) -> None:
    """Log one line of ``kind`` with ``fields`` (readable as the message, structured as
    the record's ``event`` and ``fields``)."""
    logger.log(level, line(kind, fields), extra={"event": kind, "fields": fields})


def _text(name: str, value: Any) -> str:
    if name == "retry_in":
        return f"{value:g}s"
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    text = str(value)
    if not text or any(c.isspace() or c in "\"'=" for c in text):
        return json.dumps(text, ensure_ascii=False)
    return text


def _subject(event: Event, steps: Sequence[Step]) -> _StepFacts | None:
    """The step the event is about: its ``step_id``, or the one step it changed."""
    if event.step_id is None:
        if len(steps) != 1:
            return None
        return _facts(steps[0])
    for step in steps:
        if step.pk == event.step_id:
            return _facts(step)
    found = (
        Step.objects.filter(pk=event.step_id)
        .values_list(
            "pk",
            "fencing_token",
            "attempts",
            "queue",
            "error_class",
            "last_error",
            "task__workflow",
        )
        .first()
    )
    return _StepFacts(*found) if found else None


def _facts(step: Step) -> _StepFacts:
    return _StepFacts(
        step.pk, step.fencing_token, step.attempts, step.queue, step.error_class, step.last_error
    )


def _workflow_and_queue(
    event: Event, task: Task | None, step: _StepFacts | None
) -> tuple[str | None, str | None]:
    queue = (event.data or {}).get("queue")
    if task is not None:
        return task.workflow, queue or task.queue
    if step is not None and step.workflow is not None:
        return step.workflow, queue or step.queue
    if event.task_id is None:
        return None, queue
    found = Task.objects.filter(pk=event.task_id).values_list("workflow", "queue").first()
    if found is None:
        return None, queue
    return found[0], queue or found[1]


def _short_error(text: str, error_class: str) -> str:
    """A stored error's last line (a traceback's says what went wrong), without the class
    it starts with, redacted and cut short."""
    summary = error_summary(text)
    if error_class and summary.startswith(error_class + ":"):
        summary = summary[len(error_class) + 1 :].strip()
    return _short(summary)


def _short(text: str) -> str:
    text = redact_text(" ".join(text.split()))
    return text if len(text) <= SHORT else text[: SHORT - 1] + "…"
