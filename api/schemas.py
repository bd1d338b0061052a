"""What the API answers with: one schema per kind of thing, read from the same rows and
selectors as the console's pages. Payloads, results, errors and event data are redacted
as the console shows them (``tasks_app.redaction``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.urls import reverse
from ninja import Schema

from tasks_app.models import Task
from tasks_app.redaction import redact


def console_url(name: str, *args: Any) -> str:
    from django.conf import settings

    return settings.CONSOLE_BASE_URL.rstrip("/") + reverse(f"console:{name}", args=args)


class TaskOut(Schema):
    id: int
    workflow: str
    workflow_version: int
    queue: str
    priority: int
    status: str
    idempotency_key: str | None
    created_by: str
    created_at: datetime
    finished_at: datetime | None
    # The task's page in the console.
    url: str

    @classmethod
    def of(cls, task: Task) -> TaskOut:
        return cls(
            id=task.pk,
            workflow=task.workflow,
            workflow_version=task.workflow_version,
            queue=task.queue,
            priority=task.priority,
            status=task.live_status,
            idempotency_key=task.idempotency_key,
            created_by=task.created_by,
            created_at=task.created_at,
            finished_at=task.finished_at,
            url=console_url("task", task.pk),
        )


class Page(Schema):
    # The ``after`` of the next (older) page, or null on the last page.
    next_after: int | None


class TaskPage(Page):
    items: list[TaskOut]


class EnqueueIn(Schema):
    workflow: str
    payload: Any
    idempotency_key: str | None = None
    queue: str = "default"
    priority: int = 0
    run_after: datetime | None = None


class EnqueueOut(Schema):
    created: bool
    task: TaskOut


def redacted(value: Any) -> Any:
    return redact(value)


class EventOut(Schema):
    """One entry of a timeline or of the audit log, as the audit export writes it."""

    # The event's id, or for a transition a task's or attempt's row records, its export id.
    id: str
    at: datetime
    kind: str
    label: str
    actor: str
    task_id: int | None
    step_id: int | None
    reason: str
    data: dict[str, Any]
    # The plan a bulk action's or a program's plan's events share.
    plan: str
    chain_hash: str | None

    @classmethod
    def of(cls, entry: Any) -> EventOut:
        from console.audit_csv import label, plan_of
        from tasks_app.models import Event
        from tasks_app.operations import audit_log
        from tasks_app.redaction import redact_event_data, redact_text

        return cls(
            id=str(entry.pk) if isinstance(entry, Event) else audit_log.export_id(entry),
            at=entry.created_at,
            kind=entry.kind,
            label=label(entry.kind),
            actor=entry.actor,
            task_id=entry.task_id,
            step_id=entry.step_id,
            reason=redact_text(entry.reason),
            data=redact_event_data(entry.data),
            plan=plan_of(entry),
            chain_hash=entry.chain_hash or None,
        )


class AttemptOut(Schema):
    token: int
    worker_id: str
    acquired_at: datetime
    expires_at: datetime | None
    released_at: datetime | None
    outcome: str


class EffectOut(Schema):
    name: str
    key: str
    status: str
    # It happened (its result is recorded); otherwise it is in doubt.
    applied: bool
    created_at: datetime


class StepOut(Schema):
    id: int
    position: int
    revision: int
    kind: str
    status: str
    attempts: int
    max_attempts: int
    available_at: datetime | None
    idempotency_key: str
    fencing_token: int
    result: Any
    last_error: str
    error_class: str
    attempt_records: list[AttemptOut]
    effects: list[EffectOut]


class TaskDetailOut(TaskOut):
    payload: Any
    steps: list[StepOut]
    timeline: list[EventOut]
    # The task's trace, where TASKS_TRACE_URL is set and the task was traced.
    trace_url: str | None = None
