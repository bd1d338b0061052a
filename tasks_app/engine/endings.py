"""How an attempt ends, decided in one place: the status a failed or expired attempt leaves
its step in, and what the task becomes with both events: the attempt's own (``succeeded``,
``retry_scheduled``, ``lease_expired``, an approval's decision...) and, when the attempt
ended the task, its status event (``cancelled`` or ``dead_lettered``), unless the attempt's
own event already is it.

Completing and failing a step (``leases``), a lease running out (``sweeper``) and closing
an approval step (``waiting``) call :func:`finish_attempt`; the fast path's batch
completion (``fastpath.complete_many``, its SQL ``sql.COMPLETE_SQL``) settles in SQL and then
calls :func:`record_ending`, and ``tests/engine/test_parity.py`` compares the two.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tasks_app.access import Actor
from tasks_app.engine.transitions import settle_and_record
from tasks_app.history.events import record_event
from tasks_app.models import EventKind, Step, StepStatus, Task, TaskStatus

# The event of a task that an attempt ended, by the status it ended in.
ENDING_EVENTS: dict[str, str] = {
    TaskStatus.CANCELLED: EventKind.CANCELLED,
    TaskStatus.DEAD: EventKind.DEAD_LETTERED,
}


# The event of a failed attempt, by the status :func:`next_status` gave its step.
FAILED_ATTEMPT_EVENTS: dict[str, str] = {
    StepStatus.CANCELLED: EventKind.CANCELLED,
    StepStatus.PENDING: EventKind.RETRY_SCHEDULED,
    StepStatus.DEAD: EventKind.DEAD_LETTERED,
}


def next_status(task: Task, step: Step, *, may_retry: bool) -> str:
    """The status a failed or expired attempt leaves its step in: ``cancelled`` once a
    cancel was requested; ``pending`` (tried again) while a retry is allowed and attempts
    remain; ``dead`` otherwise."""
    if task.cancel_requested_at is not None:
        return StepStatus.CANCELLED
    if may_retry and step.attempts < step.max_attempts:
        return StepStatus.PENDING
    return StepStatus.DEAD


def finish_attempt(
    task: Task,
    step: Step,
    event: str,
    *,
    actor: Actor,
    reason: str = "",
    also: Iterable[Step] = (),
    ended_by: Actor,
    ending_reason: str,
    **data: Any,
) -> str:
    """Once the caller saved ``step``'s new status (and ``also``, the steps it made due):
    settle the task, record the attempt's ``event`` (with ``actor``, ``reason`` and
    ``data``), then the task's ending event if the attempt ended it (with ``ended_by`` and
    ``ending_reason``). Returns the task's status."""
    status = settle_and_record(
        event, task, step_id=step.pk, actor=actor, reason=reason, steps=[step, *also], **data
    )
    record_ending(task, status, after=event, step=step, actor=ended_by, reason=ending_reason)
    return status


def record_ending(
    task: Task, status: str, *, after: str, step: Step | None, actor: Actor, reason: str
) -> None:
    """The status event of a task an attempt ended in ``status``, written after the
    attempt's event ``after`` unless that is the same event. A ``dead_lettered`` event names
    its dead step."""
    kind = ENDING_EVENTS.get(status)
    if kind is None or kind == after:
        return
    dead = step if kind == EventKind.DEAD_LETTERED else None
    record_event(
        kind,
        task_id=task.pk,
        step_id=dead.pk if dead is not None else None,
        actor=actor,
        reason=reason,
        steps=[dead] if dead is not None else (),
        task=task,
        task_status=status,
    )
