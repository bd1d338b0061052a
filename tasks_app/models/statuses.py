"""The statuses of tasks and steps, and the rule between a task's stored status and the one
people read (DESIGN rule 11: a task whose step runs reads as running, and its row keeps what
it stored before the claim)."""

from __future__ import annotations

from collections.abc import Iterable

from django.db import models


class TaskStatus(models.TextChoices):
    PENDING = "pending"
    # Never stored (DESIGN rule 11): a task whose step runs is stored as it was before the
    # claim, and reads as running (``Task.live_status``, ``TaskQuerySet.in_status``).
    RUNNING = "running"
    WAITING_APPROVAL = "waiting_approval"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"


class StepStatus(models.TextChoices):
    BLOCKED = "blocked"
    PENDING = "pending"
    RUNNING = "running"
    WAITING_APPROVAL = "waiting_approval"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"
    SUPERSEDED = "superseded"


TERMINAL_TASK_STATUSES = frozenset({TaskStatus.SUCCEEDED, TaskStatus.CANCELLED})
ACTIVE_TASK_STATUSES = frozenset(
    {TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.WAITING_APPROVAL, TaskStatus.DEAD}
)
# A step in one of these states will never run again.
FINAL_STEP_STATUSES = frozenset({StepStatus.SUCCEEDED, StepStatus.CANCELLED, StepStatus.SUPERSEDED})


def stored_task_status(status: str) -> str:
    """The status a task row stores for ``status`` (its steps' status,
    ``history.derive_task_status``): a running task keeps its row as before the claim,
    ``pending``, so a claim does not rewrite it (DESIGN rule 11)."""
    return TaskStatus.PENDING if status == TaskStatus.RUNNING else status


def live_task_status(stored: str, step_running: bool) -> str:
    """The status people read: running while one of its steps runs, else the stored one
    (a task stored as anything but pending while a step runs reads as stored, so the fold's
    check finds it; ``running`` was stored before rule 11 and reads the same)."""
    if step_running and stored in (TaskStatus.PENDING, TaskStatus.RUNNING):
        return TaskStatus.RUNNING
    return stored


def derive_task_status(
    step_statuses: Iterable[str], *, cancel_requested: bool = False
) -> TaskStatus:
    """A task's status from its steps (superseded rows are history and ignored).

    Once a cancel was requested the task ends ``cancelled`` as soon as nothing runs, even
    if the step that was running finished its work: a late result does not revive it.
    """
    current = [status for status in step_statuses if status != StepStatus.SUPERSEDED]
    if cancel_requested:
        return TaskStatus.RUNNING if StepStatus.RUNNING in current else TaskStatus.CANCELLED
    if StepStatus.DEAD in current:
        # A dead branch of a graph makes its task dead at once, for a person to redrive,
        # while the branches already running finish (a line runs one step at a time).
        return TaskStatus.DEAD
    if StepStatus.RUNNING in current:
        return TaskStatus.RUNNING
    if StepStatus.WAITING_APPROVAL in current:
        return TaskStatus.WAITING_APPROVAL
    if StepStatus.CANCELLED in current:
        return TaskStatus.CANCELLED
    if current and all(status == StepStatus.SUCCEEDED for status in current):
        return TaskStatus.SUCCEEDED
    return TaskStatus.PENDING
