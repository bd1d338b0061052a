"""The pieces every transition shares: the database's clock, locking a task, recording an
event beside its change, settling a task's status from its steps, and what a step's
success leads to."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from tasks_app.access import Actor
from tasks_app.engine.effects import Effects
from tasks_app.engine.workflows import StepContext, registry
from tasks_app.history import counting, derive_task_status
from tasks_app.history.events import record_event
from tasks_app.models import (
    TERMINAL_TASK_STATUSES,
    Lease,
    QueueState,
    Step,
    StepStatus,
    Task,
    TaskStatus,
)
from tasks_app.signals import announce_on_commit


def fast_path_enabled() -> bool:
    """Whether the hot paths run their PostgreSQL statements (``tasks_app.engine.fastpath``) or the
    ORM code they restate. The one switch: PostgreSQL with ``TASKS_SQL_FAST_PATH`` on (the
    default); off, PostgreSQL runs the same ORM code as the embedded SQLite mode, so the
    tests exercise that code in-process."""
    return connection.vendor == "postgresql" and bool(settings.TASKS_SQL_FAST_PATH)


def settle_and_record(
    kind: str,
    task: Task,
    *,
    step_id: int | None = None,
    actor: Actor = None,
    reason: str = "",
    steps: Iterable[Step] = (),
    **data: Any,
) -> str:
    """Settle the task's status from its steps, then record the transition's event with
    the status it reached (``task_status``); returns that status."""
    status = settle_task(task)
    record_event(
        kind,
        task_id=task.pk,
        step_id=step_id,
        actor=actor,
        reason=reason,
        steps=steps,
        task=task,
        task_status=status,
        **data,
    )
    return status


def bump_counter(name: str, by: int = 1) -> None:
    """Add to a metrics counter in its own transaction."""
    if by <= 0:
        return
    with transaction.atomic():
        counting.upsert({name: by})


def current_steps(task: Task) -> list[Step]:
    return list(Step.objects.filter(task=task).current().order_by("position", "revision"))


def settle_task(task: Task, steps: Sequence[Step] | None = None) -> str:
    """Store the task status derived from its (non-superseded) steps."""
    current = current_steps(task) if steps is None else steps
    status = derive_task_status(
        (step.status for step in current), cancel_requested=task.cancel_requested_at is not None
    )
    finished = timezone.now() if status in TERMINAL_TASK_STATUSES | {TaskStatus.DEAD} else None
    if status != task.status or (finished is None and task.finished_at is not None):
        if status != task.status:
            announce_on_commit([(task.pk, status)])
        task.status = status
        task.finished_at = finished
        task.save(update_fields=["status", "finished_at", "updated_at"])
    return status


def lock_task(task_id: int) -> Task:
    """Lock a task row: every transition of a task takes this lock first."""
    return Task.objects.select_for_update().get(pk=task_id)


def try_lock_task(task_id: int) -> Task | None:
    """Lock a task row unless another transaction holds it (then ``None``): for the
    sweeper, which must never wait on a row a person or a worker holds. It tries again at
    the next sweep."""
    return Task.objects.select_for_update(skip_locked=True).filter(pk=task_id).first()


def paused_filter() -> Q:
    return Q(queue__in=QueueState.objects.filter(paused=True).values("name"))


def release_lease(step: Step, token: int, outcome: str) -> None:
    Lease.objects.filter(step=step, token=token, released_at=None).update(
        released_at=Now(), outcome=outcome
    )


def after_success(task: Task, after: Step, now: datetime) -> tuple[list[Step], Step | None]:
    """Once ``after`` succeeded: the next step made due, or the approval step reached.

    An approval step is not made due (no worker runs it): it is returned as the step to
    open, which the caller does with :func:`open_approval_step` once its own event is written.
    """
    # The steps of a revision are contiguous: the next one is at the next position (the
    # batch completion's SQL picks it the same way).
    following = (
        task.steps.filter(status=StepStatus.BLOCKED, position=after.position + 1)
        .order_by("-revision")
        .first()
    )
    if following is None:
        return [], None
    if leads_to_approval(task, after.position):
        return [], following
    following.status = StepStatus.PENDING
    following.available_at = now
    following.dispatched_at = now
    following.save(update_fields=["status", "available_at", "dispatched_at"])
    return [following], None


def leads_to_approval(task: Task, position: int) -> bool:
    """Whether a success at ``position`` reaches an approval step, which opens a request in
    the same transaction instead of being made due: the question both the one-by-one path
    (:func:`after_success`) and the batch path (``runner.run_batch``) ask."""
    return is_approval(task, position + 1)


def is_approval(task: Task, position: int) -> bool:
    """Whether the step at ``position`` of the task's workflow version is one a person
    decides (never claimed: opened when the task reaches it)."""
    flow = registry.get(task.workflow, task.workflow_version)
    spec = flow.step(position) if flow is not None else None
    return spec is not None and spec.approval


def step_inputs(task: Task, position: int) -> dict[str, Any]:
    """The results of the task's earlier steps by kind (current rows): a handler's
    ``ctx.results``."""
    if position == 0:
        return {}
    return dict(
        task.steps.filter(status=StepStatus.SUCCEEDED, position__lt=position)
        .order_by("position", "revision")
        .values_list("kind", "result")
    )


def step_context(
    task: Task, step: Step, *, attempt: int, token: int, timeout: float | None = None
) -> StepContext:
    """What a handler gets: the payload, earlier results, its place in the retry story, the
    effects ledger fenced by ``token``, and the request for changes it answers, if any."""
    return StepContext(
        task_id=task.pk,
        step_id=step.pk,
        payload=task.payload,
        results=step_inputs(task, step.position),
        attempt=attempt,
        fencing_token=token,
        step_key=step.idempotency_key,
        effects=Effects(step_id=step.pk, step_key=step.idempotency_key, fencing_token=token),
        timeout=timeout,
        revision=step.revision,
        change_request=step.change_request,
    )


def cancel_steps(task: Task, statuses: Iterable[str], now: datetime) -> list[Step]:
    """Cancel the task's steps in ``statuses`` (the task is locked); returns them."""
    steps = list(task.steps.select_for_update().filter(status__in=statuses).order_by("position"))
    for step in steps:
        step.status = StepStatus.CANCELLED
        step.finished_at = now
    Step.objects.bulk_update(steps, ["status", "finished_at"])
    return steps
