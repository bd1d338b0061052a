"""Steps a person decides: opening an approval step when its task reaches it, closing it
after a decision or an expiry, sending a task back for a new revision, and taking a
person's own revision of the draft."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import transaction

from tasks_app.access import Actor, actor_fields
from tasks_app.db.clock import db_now
from tasks_app.engine import fan_outs
from tasks_app.engine.dispatch import Doorbell, ring_on_commit
from tasks_app.engine.endings import Ending
from tasks_app.engine.states import (
    after_success,
    end_attempt,
    make_due,
    new_step,
    settle_and_record,
    succeed,
    supersede,
    wait_for_approval,
)
from tasks_app.engine.transitions import current_steps, step_context
from tasks_app.engine.workflows import AwaitDecision, registry
from tasks_app.exceptions import InvalidTransition, error_class, error_text
from tasks_app.history.events import event_error
from tasks_app.models import EventKind, Step, StepStatus, Task, graphs, step_key

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
                wait_for_approval(step)
                data = wait.open_request(task, step)
    except Exception as exc:
        logger.exception("approval step %s of task %s could not open", step.pk, task.pk)
        failure = (error_class(exc), error_text(exc))
    if data is None:
        end_attempt(
            task,
            step,
            Ending(
                EventKind.DEAD_LETTERED,
                actor=actor,
                status=StepStatus.DEAD,
                error=failure,
                reason="permanent_error",
                ended_by=actor,
                ending_reason="permanent_error",
                data={"error_class": failure[0], "error": event_error(failure[1])},
            ),
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
    if step_status not in (StepStatus.SUCCEEDED, StepStatus.CANCELLED, StepStatus.DEAD):
        raise ValueError(f"close_approval_step: unknown step_status {step_status!r}")
    who, _ = actor_fields(actor)
    # A task that ends here ends with its status event too, as every other path does, so
    # timelines and dead-letter and cancel counts read one kind of event for each.
    status, reached, bells = end_attempt(
        task,
        step,
        Ending(
            event_kind,
            actor=actor,
            status=step_status,
            result=result,
            error=(event_kind, error) if step_status == StepStatus.DEAD else None,
            reason=reason,
            ending_reason=event_kind,
            cancelled_reason=f"{event_kind} by {who}",
            data=data,
        ),
    )
    for approval in reached:
        open_approval_step(task, approval, actor=actor)
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
    replaced, fresh, revision, now = _next_revision(task, approval, back_to)
    first = fresh[0]
    make_due(first, now)
    first.change_request = {**change_request, "revision": revision}
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
    ring_on_commit([Doorbell(first.pk, first.queue)])
    return fresh


def replace_draft(
    task: Task,
    step_id: int,
    *,
    draft_from: str,
    draft: Any,
    actor: Actor,
    reason: str,
    **data: Any,
) -> list[Step]:
    """A person's own revision of the draft under review, from a waiting approval step.

    As :func:`revise`, the rows from ``draft_from`` up to the approval step are superseded
    by a new revision; but the new drafting row is ``succeeded`` at once with ``draft`` as
    its result (no worker runs it), so the task goes on from there: the steps between run,
    or the approval step opens again with the new draft. The caller holds the task's lock,
    has checked ``draft``, and records who wrote it. Returns the new rows.
    """
    approval = waiting_step(task, step_id)
    replaced, fresh, revision, now = _next_revision(task, approval, draft_from)
    first = fresh[0]
    succeed(first, draft, now)
    Step.objects.bulk_create(fresh)
    following = after_success(task, first, now)
    status = settle_and_record(
        EventKind.DRAFT_EDITED,
        task,
        step_id=approval.pk,
        actor=actor,
        reason=reason,
        steps=[*replaced, *fresh, *following.changed],
        revision=revision,
        **data,
    )
    fan_outs.letter_refused(task, following.refused, status, actor)
    for reached in following.approvals:
        open_approval_step(task, reached, actor=actor)
    ring_on_commit([Doorbell(s.pk, s.queue) for s in following.due])
    return fresh


def _next_revision(
    task: Task, approval: Step, back_to: str
) -> tuple[list[Step], list[Step], int, datetime]:
    """Supersede the current rows from the step of kind ``back_to`` through ``approval``,
    and make (unsaved, ``blocked``) the rows of the next revision that replace them."""
    rows = current_steps(task)
    # By position, a fan-out's first row: a revision makes one, which fans out anew.
    current = {s.position: s for s in rows if s.item == 0}
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
    if approval.after is None:
        positions = set(range(start, approval.position + 1))
    else:
        # In a graph: the steps on the way from ``back_to`` to the approval step, not a
        # parallel branch's.
        between = graphs.descendants(rows, start) & graphs.ancestors(rows, approval.position)
        positions = {start, *between, approval.position}
    replaced = [s for s in rows if s.position in positions]
    revision = max(task.steps.values_list("revision", flat=True)) + 1
    now = db_now()
    supersede(replaced, now)
    fresh = [
        row_again(task, old, revision, step_key(task.key, old.position, old.kind, revision))
        for old in (current[p] for p in sorted(positions))
    ]
    return replaced, fresh, revision, now


def row_again(task: Task, old: Step, revision: int, key: str) -> Step:
    """The row of revision ``revision`` (unsaved, ``blocked``) that runs ``old``'s step
    again under the step key ``key``: a revision's (a new draft is a new write) or, for a
    rewind, ``old``'s own (what it wrote stands)."""
    return new_step(
        task=task,
        position=old.position,
        revision=revision,
        kind=old.kind,
        queue=task.queue,
        priority=task.priority,
        max_attempts=old.max_attempts,
        idempotency_key=key,
        limits=old.limits,
        limit_turn=old.limit_turn,
        after=old.after,
    )
