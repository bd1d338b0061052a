"""Which operator actions a task allows now: the one rule that the services enforce and
that the console's task page and bulk form, the admin's actions and the management
commands ask before they offer or attempt anything.

- ``redrive``: a task with a dead step whose outcome is known. A step that died of an
  unknown outcome would find its started call again and stop again without calling; a
  person's answer (a resolve) moves it on.
- ``resolve_done``: a task with a dead step that is not an approval step (only a
  decision lets a task past one): the call happened, or a person did the work by hand.
- ``resolve_retry``: a task whose dead step ended with an unknown outcome (it did not
  happen: forget the started call and call again). A step that failed with a known
  outcome is redriven instead.

So a dead step with a known outcome offers Redrive and Mark done; one with an unknown
outcome offers Mark done and Run again; every page, the bulk form, the admin and the
commands ask this module which.
- ``cancel``: a task not yet succeeded or cancelled, and not already being cancelled.

The first dead step (by position) is the one redrive and resolve look at.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from tasks_app.engine.transitions import is_approval
from tasks_app.exceptions import OutcomeUnknown, error_class
from tasks_app.models import TERMINAL_TASK_STATUSES, Step, StepStatus, Task

# What a step that died of an unknown outcome records as its error class.
OUTCOME_UNKNOWN = error_class(OutcomeUnknown())


class Action(StrEnum):
    REDRIVE = "redrive"
    RESOLVE_DONE = "resolve_done"
    RESOLVE_RETRY = "resolve_retry"
    CANCEL = "cancel"


@dataclass(frozen=True)
class ActionSpec:
    name: Action
    label: str
    # The ``tasks_app`` permission a user needs.
    permission: str
    # What a confirm button says, with the number of tasks: "Cancel 3 tasks".
    button: str

    def button_text(self, count: int) -> str:
        return self.button.format(n=count, tasks="task" if count == 1 else "tasks")


ACTIONS: dict[str, ActionSpec] = {
    spec.name: spec
    for spec in (
        ActionSpec(Action.REDRIVE, "Redrive", "redrive_task", "Redrive {n} {tasks}"),
        ActionSpec(Action.RESOLVE_DONE, "Mark done", "resolve_task", "Mark {n} {tasks} done"),
        ActionSpec(Action.RESOLVE_RETRY, "Run again", "resolve_task", "Run {n} {tasks} again"),
        ActionSpec(Action.CANCEL, "Cancel task", "cancel_task", "Cancel {n} {tasks}"),
    )
}


def first_dead_step(task: Task) -> Step | None:
    return task.steps.filter(status=StepStatus.DEAD).order_by("position").first()


def is_outcome_unknown(step: Step) -> bool:
    return step.error_class == OUTCOME_UNKNOWN


def refusal(action: str, task: Task, dead_step: Step | None) -> str | None:
    """Why ``action`` does not apply to ``task`` now, or None when it does.

    ``dead_step`` is the task's first dead step (:func:`first_dead_step`), given by the
    caller, which has usually read it already (under the task's lock, for a service).
    """
    if action == Action.CANCEL:
        if task.status in TERMINAL_TASK_STATUSES:
            return f"task #{task.pk} already {task.status}"
        if task.cancel_requested_at is not None:
            return f"task #{task.pk} is already being cancelled"
        return None
    if dead_step is None:
        verb = "redrive" if action == Action.REDRIVE else "resolve"
        return f"task #{task.pk} has no dead step to {verb}"
    if action == Action.REDRIVE and is_outcome_unknown(dead_step):
        return (
            f"step {dead_step.kind} of task #{task.pk} ended with an unknown outcome: a "
            "redrive would find its started call again and stop again; resolve it instead "
            "(mark done if it happened, run again if it did not)"
        )
    if action == Action.RESOLVE_DONE and is_approval(task, dead_step.position):
        return (
            f"step {dead_step.kind} of task #{task.pk} is an approval: only a person's "
            "decision lets the task past it (redrive it for a new request, or cancel)"
        )
    if action == Action.RESOLVE_RETRY and not is_outcome_unknown(dead_step):
        return (
            f"step {dead_step.kind} of task #{task.pk} failed with a known outcome "
            f"({dead_step.error_class or 'no error class'}): redrive it; running again "
            "without its started calls is for a step whose outcome is unknown"
        )
    return None


def allowed(task: Task, dead_step: Step | None) -> frozenset[Action]:
    """Every action :func:`refusal` lets through for the task."""
    return frozenset(action for action in Action if refusal(action, task, dead_step) is None)
