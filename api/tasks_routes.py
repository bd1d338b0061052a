"""``/api/v1/tasks``: the task list with the console's filters and keyset pages, one
task whole (steps, attempts, effects, timeline), and enqueue."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from ninja import Query, Router, Schema, Status

from api import access, filters
from api.errors import problems
from api.schemas import (
    AttemptOut,
    EffectOut,
    EnqueueIn,
    EnqueueOut,
    EventOut,
    StepOut,
    TaskDetailOut,
    TaskOut,
    TaskPage,
    redacted,
)
from console.task_filters import TaskFilterForm
from tasks_app import services
from tasks_app.models import Task
from tasks_app.observability import tracing
from tasks_app.operations import listings, selectors
from tasks_app.redaction import redact_text

router = Router(tags=["tasks"])


class TaskQuery(Schema):
    """The console's task filters (``/tasks/``), by the same names and rules."""

    status: str | None = None
    workflow: str | None = None
    queue: str | None = None
    key: str | None = None
    payload: str | None = None
    since: str | None = None
    until: str | None = None
    finished_since: str | None = None
    after: int | None = None


@router.get("/", response={200: TaskPage, **problems()}, summary="List tasks, newest first")
def task_list(request: HttpRequest, query: Query[TaskQuery]) -> dict[str, Any]:
    access.require(request, access.VIEW_TASKS)
    filters.known(request, set(TaskQuery.model_fields))
    form = filters.read(request, TaskFilterForm)
    page = listings.task_page(form.filters(), after=filters.cursor(form))
    return {"items": [TaskOut.of(task) for task in page.rows], "next_after": page.next_after}


@router.get(
    "/{task_id}",
    response={200: TaskDetailOut, **problems(404)},
    summary="One task with its steps and timeline",
)
def task_detail(request: HttpRequest, task_id: int) -> TaskDetailOut:
    access.require(request, access.VIEW_TASKS)
    filters.known(request, set())
    task = get_object_or_404(Task.objects.with_live_status(), pk=task_id)
    return detail_of(task)


@router.post(
    "/",
    response={200: EnqueueOut, 201: EnqueueOut, **problems(409)},
    summary="Enqueue a task (201), or find the one its idempotency key made (200)",
)
def enqueue(request: HttpRequest, body: EnqueueIn) -> Status[EnqueueOut]:
    access.require(request, access.ADD_TASKS)
    filters.known(request, set())
    # The caller's trace, when it sends one (W3C traceparent): the enqueue continues it.
    with tracing.continuing(request.headers.get("traceparent"), request.headers.get("tracestate")):
        result = services.enqueue(
            body.workflow,
            body.payload,
            idempotency_key=body.idempotency_key,
            queue=body.queue,
            priority=body.priority,
            run_after=body.run_after,
            actor=request.user,
        )
    task = Task.objects.with_live_status().get(pk=result.task.pk)
    return Status(
        201 if result.created else 200, EnqueueOut(created=result.created, task=TaskOut.of(task))
    )


def detail_of(task: Task) -> TaskDetailOut:
    detail = selectors.task_detail(task)
    steps = [
        StepOut(
            id=row.step.pk,
            position=row.step.position,
            revision=row.step.revision,
            kind=row.step.kind,
            status=row.step.status,
            attempts=row.step.attempts,
            max_attempts=row.step.max_attempts,
            available_at=row.step.available_at,
            idempotency_key=row.step.idempotency_key,
            fencing_token=row.step.fencing_token,
            result=redacted(row.step.result),
            last_error=redact_text(row.step.last_error or ""),
            error_class=row.step.error_class or "",
            attempt_records=[
                AttemptOut(
                    token=lease.token,
                    worker_id=lease.worker_id,
                    acquired_at=lease.acquired_at,
                    expires_at=lease.expires_at,
                    released_at=lease.released_at,
                    outcome=lease.outcome or "",
                )
                for lease in row.leases
            ],
            effects=[
                EffectOut(
                    name=entry.name,
                    key=entry.effect.key,
                    status=entry.effect.status,
                    applied=entry.applied,
                    created_at=entry.effect.created_at,
                )
                for entry in row.effects
            ],
        )
        for row in detail.steps
    ]
    return TaskDetailOut(
        **TaskOut.of(task).model_dump(),
        payload=redacted(task.payload),
        steps=steps,
        timeline=[EventOut.of(entry) for entry in detail.events],
        trace_url=tracing.trace_url(task),
    )
