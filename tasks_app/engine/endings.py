"""How an attempt ends, as the one ending it knows it (:class:`Ending`), and the choices
that depend on it: the status a failed attempt leaves its step in (:func:`next_status`)
and the events that record it. :func:`tasks_app.engine.states.end_attempt` applies them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tasks_app.access import SYSTEM, Actor
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


@dataclass(frozen=True)
class Ending:
    """How an attempt ended, as the one ending it knows it, for :func:`end_attempt`."""

    # The attempt's event; None: the failure's, by the status it leaves its step in.
    event: str | None
    actor: Actor
    # The worker's lease to close with this outcome (a person's decision has none).
    lease: str | None = None
    token: int | None = None
    # Decided by the caller: a success or a person's decision on an approval step.
    status: str | None = None
    result: Any = None
    # A failure: tried again after this many seconds while attempts remain (None: never).
    retry_in: float | None = None
    # Handed back uncharged: due again after ``retry_in`` seconds (0 when None).
    handed_back: bool = False
    # The step's error (class, message), and whether a cancelled step records it too.
    error: tuple[str, str] | None = None
    error_when_cancelled: bool = True
    reason: str = ""
    # Who ends the task, and why, when this attempt ends it (dead or cancelled; a cancel's
    # own reason when it differs).
    ended_by: Actor = SYSTEM
    ending_reason: str = ""
    cancelled_reason: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
