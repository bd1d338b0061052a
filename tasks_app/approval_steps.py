"""Steps a person decides: opening an approval step when its task reaches it, settling it
after a decision or an expiry, and sending a task back for a new revision."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

from .access import SYSTEM, Actor, actor_fields
from .dispatch import Doorbell, ring_on_commit
from .exceptions import InvalidTransition, error_class, error_text
from .models import EventKind, Step, StepStatus, Task, TaskStatus, step_key
from .transitions import (
    after_success,
    cancel_steps,
    current_steps,
    db_now,
    event_error,
    record_event,
    settle_and_record,
    step_context,
)
from .workflows import AwaitDecision, registry

logger = logging.getLogger(__name__)


def open_approval_step(task: Task, step: Step, *, actor: Actor, reason: str = "") -> None:
    """Open the approval step the task has reached, in the caller's transaction (the task
    row locked): it goes to ``waiting_approval`` and its request is recorded, with an
    ``approval_requested`` event, in the same commit as the change that reached it.

    1. Call the step's handler with the task's payload and earlier results; it reads the
       draft and returns :class:`AwaitDecision`.
    2. In a savepoint, mark the step waiting and let ``open_request`` record the request.
    3. A handler that fails, or returns anything else, leaves nothing of step 2 behind: the
       step is dead-lettered (``permanent_error``) for on-call, and the change that
       reached it stands.
    """
    flow = registry.get(task.workflow, task.workflow_version)
    spec = flow.step(step.position) if flow is not None else None
    ctx = step_context(task, step, attempt=step.attempts, token=step.fencing_token)
    failure: tuple[str, str] = ("invalid_result", "an approval step must return AwaitDecision")
    data: dict[str, Any] | None = None
    try:
        with transaction.atomic():
            wait = spec.handler(ctx) if spec is not None else None
            if isinstance(wait, AwaitDecision):
                step.status = StepStatus.WAITING_APPROVAL
                step.save(update_fields=["status"])
                data = wait.open_request(task, step)
    except Exception as exc:
        logger.exception("approval step %s of task %s could not open", step.pk, task.pk)
        failure = (error_class(exc), error_text(exc))
    if data is None:
        step.status = StepStatus.DEAD
        step.error_class, step.last_error = failure
        step.finished_at = db_now()
        step.save(update_fields=["status", "error_class", "last_error", "finished_at"])
        settle_and_record(
            EventKind.DEAD_LETTERED,
            task,
            step_id=step.pk,
            actor=actor,
            reason="permanent_error",
            steps=[step],
            error_class=step.error_class,
            error=event_error(step.last_error),
        )
        return
    settle_and_record(
        EventKind.APPROVAL_REQUESTED,
        task,
        step_id=step.pk,
        actor=actor,
        reason=reason,
        steps=[step],
        **data,
    )


def waiting_step(task: Task, step_id: int) -> Step:
    step = Step.objects.select_for_update().get(pk=step_id, task=task)
    if step.status != StepStatus.WAITING_APPROVAL:
        raise InvalidTransition(f"step {step.kind} of task #{task.pk} is {step.status}")
    return step


def close_approval_step(
    task: Task,
    step_id: int,
    *,
    step_status: str,
    event_kind: str,
    actor: Actor,
    reason: str = "",
    result: Any = None,
    error: str = "",
    **data: Any,
) -> str:
    """Settle a waiting approval step; the caller holds the task's lock (:func:`lock_task`)
    and has recorded the decision. Returns the task's new status.

    ``step_status`` is ``succeeded`` (approved: ``result`` is stored and the next step made
    due), ``cancelled`` (rejected, or expired under the cancel policy: the task's
    remaining steps are cancelled with it) or ``dead`` (expired under the dead-letter
    policy: ``error`` says why, and on-call redrives or cancels). One event of ``event_kind``
    with ``actor`` and ``reason`` records the change; a task that dies or is cancelled
    by it also gets its ``dead_lettered`` or ``cancelled`` event (actor ``system``).
    """
    step = waiting_step(task, step_id)
    now = db_now()
    changed = [step]
    bells: list[Doorbell] = []
    step.finished_at = now
    reached = None
    if step_status == StepStatus.SUCCEEDED:
        step.status = StepStatus.SUCCEEDED
        step.result = result
        step.save(update_fields=["status", "result", "finished_at"])
        due, reached = after_success(task, step, now)
        changed += due
        bells = [Doorbell(s.pk, s.queue) for s in due]
    elif step_status == StepStatus.CANCELLED:
        step.status = StepStatus.CANCELLED
        step.save(update_fields=["status", "finished_at"])
        changed += cancel_steps(task, (StepStatus.BLOCKED, StepStatus.PENDING), now)
    elif step_status == StepStatus.DEAD:
        step.status = StepStatus.DEAD
        step.error_class = event_kind
        step.last_error = error
        step.save(update_fields=["status", "finished_at", "error_class", "last_error"])
    else:
        raise ValueError(f"close_approval_step: unknown step_status {step_status!r}")
    status = settle_and_record(
        event_kind,
        task,
        step_id=step.pk,
        actor=actor,
        reason=reason,
        steps=changed,
        **data,
    )
    if reached is not None:
        open_approval_step(task, reached, actor=actor)
    # A task that ends here ends with its status event too, as every other path does, so
    # timelines and dead-letter and cancel counts read one kind of event for each.
    who, _ = actor_fields(actor)
    if step_status == StepStatus.DEAD:
        record_event(
            EventKind.DEAD_LETTERED,
            task_id=task.pk,
            step_id=step.pk,
            actor=SYSTEM,
            reason=event_kind,
            task_status=status,
        )
    elif status == TaskStatus.CANCELLED:
        record_event(
            EventKind.CANCELLED,
            task_id=task.pk,
            actor=SYSTEM,
            reason=f"{event_kind} by {who}",
            task_status=status,
        )
    ring_on_commit(bells)
    return status


def revise(
    task: Task,
    step_id: int,
    *,
    back_to: str,
    actor: Actor,
    reason: str,
    change_request: dict[str, Any],
    **data: Any,
) -> list[Step]:
    """Send a task back from a waiting approval step to the step of kind ``back_to``.

    The caller holds the task's lock. The current rows from ``back_to`` up to the approval
    step become ``superseded`` (they stay as history); new rows for the same positions are
    appended with the task's next revision number and step keys ending ``:r<n>``. The
    first new row is due now and carries ``change_request`` for its handler. Returns the
    new rows.
    """
    approval = waiting_step(task, step_id)
    current = {s.position: s for s in current_steps(task)}
    start = next(
        (
            s.position
            for s in current.values()
            if s.kind == back_to and s.position < approval.position
        ),
        None,
    )
    if start is None:
        raise InvalidTransition(f"task #{task.pk} has no step {back_to!r} before {approval.kind}")
    replaced = [current[p] for p in range(start, approval.position + 1)]
    revision = max(task.steps.values_list("revision", flat=True)) + 1
    now = db_now()
    for old in replaced:
        old.status = StepStatus.SUPERSEDED
        old.finished_at = old.finished_at or now
    Step.objects.bulk_update(replaced, ["status", "finished_at"])
    fresh = [
        Step(
            task=task,
            position=old.position,
            revision=revision,
            kind=old.kind,
            status=StepStatus.PENDING if old.position == start else StepStatus.BLOCKED,
            queue=task.queue,
            priority=task.priority,
            max_attempts=old.max_attempts,
            available_at=now if old.position == start else None,
            dispatched_at=now if old.position == start else None,
            idempotency_key=step_key(task.key, old.position, old.kind, revision),
            change_request={**change_request, "revision": revision}
            if old.position == start
            else None,
        )
        for old in replaced
    ]
    Step.objects.bulk_create(fresh)
    settle_and_record(
        EventKind.CHANGES_REQUESTED,
        task,
        step_id=approval.pk,
        actor=actor,
        reason=reason,
        steps=[*replaced, *fresh],
        revision=revision,
        back_to=back_to,
        **data,
    )
    ring_on_commit([Doorbell(fresh[0].pk, fresh[0].queue)])
    return fresh
