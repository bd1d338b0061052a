"""The operator actions, in one table (:data:`ACTIONS`), and the rule saying which of them
a task allows now.

Every way a person acts on a task reads this table and nothing else: the console's task
page (one control per allowed action) and bulk form (its choices and parameter fields),
the admin's actions (one per row), the management commands (``manage.py task_action``
handles every row; ``redrive``, ``resolve`` and ``cancel`` name rows of it), and the
services' bulk entry (:func:`operator_actions.act_on_tasks`). A row is plain data (an
API can list it as JSON with :func:`describe`): adding an action is a row here, its
service, and its refusal rule below; ``tests/operations/test_action_surfaces.py`` fails
until every surface offers it.

Which states allow each (:func:`refusal`, the one rule the services enforce):

- ``redrive`` and ``redrive_later``: a task with a dead step whose outcome is known. A step
  that died of an unknown outcome would find its started call again and stop again without
  calling; a person's answer (a resolve) moves it on. ``redrive_later`` makes the step due
  after a delay instead of now.
  An approval step is not put off (a person decides it, not a clock): redrive it.
- ``resolve_done``: a task with a dead step that is not an approval step (only a
  decision lets a task past one): the call happened, or a person did the work by hand.
- ``resolve_retry``: a task whose dead step ended with an unknown outcome (it did not
  happen: forget the started call and call again). A step that failed with a known
  outcome is redriven instead.
- ``cancel``: a task not yet succeeded or cancelled, and not already being cancelled.
- ``rewind`` (``tasks_app.operations.rewinds``, from a chosen step, previewed as a plan):
  a task that succeeded, died or was cancelled, with no step still running
  (:func:`rewind_refusal`). The row rewinds many tasks from their step of a given kind and
  leaves a task with a write in doubt to its page; the task page rewinds through its own
  preview, not a form of the table (``page_form``).

So a dead step with a known outcome offers Redrive, Retry after a delay and Mark done; one
with an unknown outcome offers Mark done and Run again. The first dead step (by position)
is the one redrive and resolve look at.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from tasks_app.engine.transitions import is_approval
from tasks_app.exceptions import OutcomeUnknown, error_class
from tasks_app.models import (
    ACTIVE_TASK_STATUSES,
    TERMINAL_TASK_STATUSES,
    Step,
    StepStatus,
    Task,
    TaskStatus,
)

# What a step that died of an unknown outcome records as its error class.
OUTCOME_UNKNOWN = error_class(OutcomeUnknown())


class Action(StrEnum):
    REDRIVE = "redrive"
    REDRIVE_LATER = "redrive_later"
    RESOLVE_DONE = "resolve_done"
    RESOLVE_RETRY = "resolve_retry"
    CANCEL = "cancel"
    REWIND = "rewind"


# How a parameter is read: ``text`` as it is, ``json`` parsed (an object), ``delay`` by
# ``validation.validate_delay`` (15 minutes, 5m, 1h, 2d), ``step`` as the kind of a step
# (one line of text: draft).
ParamKind = Literal["text", "json", "delay", "step"]


@dataclass(frozen=True)
class Param:
    """An input an action takes, by the name the service's keyword, the console's POST
    field and the command's ``--flag`` share."""

    name: str
    label: str
    kind: ParamKind = "text"
    # The service refuses the action without it (an InvalidInput naming it).
    required: bool = False
    help: str = ""
    # Offered for many tasks at once (bulk form, admin, commands): an edited payload
    # belongs to one task.
    bulk: bool = True
    # A one-task parameter gets a form of its own on the task page (``changes``: "Redrive
    # with changes"), beside its action's plain form.
    variant: str = ""


REASON = Param("reason", "Reason", required=True)
PAYLOAD = Param(
    "payload",
    "Payload",
    kind="json",
    bulk=False,
    help="Leave empty to keep the payload; a JSON object replaces it.",
    variant="changes",
)
DELAY = Param(
    "delay",
    "Delay",
    kind="delay",
    required=True,
    help="Minutes (15), or 90s, 5m, 1h, 2d; at most 7 days.",
)

FROM_STEP = Param(
    "from_step",
    "From step",
    kind="step",
    required=True,
    help="The kind of the step to run again from, as the task's steps name it (draft).",
)


RERUN_IN_DOUBT = (
    "they will be called again with the same key; a remote that does not honour the key "
    "may act twice."
)


@dataclass(frozen=True)
class ActionSpec:
    """One operator action: what it is called, who may take it, what it asks for, what
    it calls, and what its controls say."""

    name: Action
    # What its buttons and choices say: "Mark done".
    label: str
    # The ``tasks_app`` permission a user needs.
    permission: str
    # What a confirm button says, with the number of tasks: "Cancel 3 tasks".
    button: str
    # What happened to a task it changed, as a notice says it: "Task #3: redriven.".
    done: str
    # What it does, for whoever is about to take it (the task page, the admin's confirm).
    explanation: str
    # Its service: a function of ``operator_actions`` taking the task, ``actor``,
    # ``reason``, ``plan``, the parameters and ``fixed``.
    service: str
    params: tuple[Param, ...] = (REASON,)
    fixed: Mapping[str, Any] = field(default_factory=dict)
    # The task page's form its button sits in (actions sharing one share its fields), and
    # that form's heading.
    form: str = ""
    heading: str = ""
    # How its button looks: "primary", "danger" or "" (plain).
    tone: str = "primary"
    # What it does to a dead step's external writes in doubt, and to those that happened
    # (a bulk plan's preview says so before anyone confirms).
    # The task statuses it may apply to: what a command's filter selects from.
    targets: tuple[str, ...] = (TaskStatus.DEAD,)
    in_doubt: str = RERUN_IN_DOUBT
    applied: str = "a rerun skips them by their key."
    # Whether the task page offers it as a form of the table: False for an action the page
    # takes through a flow of its own (a rewind is previewed step by step there).
    page_form: bool = True

    def button_text(self, count: int) -> str:
        return self.button.format(n=count, tasks="task" if count == 1 else "tasks")

    @property
    def bulk_params(self) -> tuple[Param, ...]:
        return tuple(param for param in self.params if param.bulk)


# The statuses of a task a rewind may start again from one of its steps.
REWINDABLE = (TaskStatus.SUCCEEDED, TaskStatus.DEAD, TaskStatus.CANCELLED)


ACTIONS: dict[str, ActionSpec] = {
    spec.name: spec
    for spec in (
        ActionSpec(
            Action.REDRIVE,
            "Redrive",
            "redrive_task",
            "Redrive {n} {tasks}",
            "redriven",
            "Runs the dead step again with a fresh attempt budget and the same step key (an "
            "approval step gets a new request).",
            "redrive",
            params=(REASON, PAYLOAD),
            form="redrive",
            heading="Redrive",
        ),
        ActionSpec(
            Action.REDRIVE_LATER,
            "Retry after a delay",
            "redrive_task",
            "Retry {n} {tasks} after the delay",
            "scheduled to run again after the delay",
            "Like a redrive, with a fresh attempt budget and the same step key, but the dead "
            "step becomes due only once the delay has passed (by the database's clock).",
            "redrive",
            params=(DELAY, REASON),
            form="redrive_later",
            heading="Retry after a delay",
        ),
        ActionSpec(
            Action.RESOLVE_DONE,
            "Mark done",
            "resolve_task",
            "Mark {n} {tasks} done",
            "resolved",
            "It happened: the dead step is marked succeeded, with the reason as its note, and "
            "the task continues with its next step.",
            "resolve",
            fixed={"outcome": "done"},
            in_doubt="they will be recorded as done and not called again.",
            form="resolve",
            heading="Mark done by hand",
        ),
        ActionSpec(
            Action.RESOLVE_RETRY,
            "Run again",
            "resolve_task",
            "Run {n} {tasks} again",
            "resolved",
            "It did not happen: the dead step runs again and its unfinished side effects are "
            "forgotten, so the next attempt calls the remote again.",
            "resolve",
            fixed={"outcome": "retry"},
            in_doubt="they will be called again.",
            form="resolve",
            heading="Resolve the unknown outcome",
            tone="",
        ),
        ActionSpec(
            Action.CANCEL,
            "Cancel task",
            "cancel_task",
            "Cancel {n} {tasks}",
            "cancel requested",
            "Stops what has not run; a running step is asked to stop. Done side effects are "
            "not undone.",
            "cancel",
            form="cancel",
            heading="Cancel",
            tone="danger",
            # Pending, running, waiting for approval or dead.
            targets=tuple(s for s in TaskStatus.values if s in ACTIVE_TASK_STATUSES),
            in_doubt="cancelling does not undo them; check the remote system.",
            applied="cancelling does not undo them.",
        ),
        ActionSpec(
            Action.REWIND,
            "Rewind",
            "redrive_task",
            "Rewind {n} {tasks}",
            "rewound",
            "Runs the task again from its step of the kind given: that step, every step that "
            "waits for it and every other step that has not succeeded, with their step keys "
            "kept. A task with an external write in doubt is left alone: rewind it from its "
            "page, saying whether each write happened.",
            "rewind_from",
            params=(FROM_STEP, REASON),
            tone="danger",
            targets=REWINDABLE,
            in_doubt="those tasks are skipped: rewind them one by one from their page.",
            applied="a rerun finds them by their key and skips them.",
            # The task page's own rewind section (choose a step, preview, decide, confirm)
            # is its rewind: a second, plainer form would only skip the preview.
            page_form=False,
        ),
    )
}


def describe() -> list[dict[str, Any]]:
    """The table as plain JSON-ready data, in its order (for an API or a listing)."""
    return [
        {
            "name": spec.name.value,
            "label": spec.label,
            "permission": f"tasks_app.{spec.permission}",
            "params": [
                {"name": p.name, "kind": p.kind, "required": p.required, "bulk": p.bulk}
                for p in spec.params
            ],
            "explanation": spec.explanation,
        }
        for spec in ACTIONS.values()
    ]


def first_dead_step(task: Task) -> Step | None:
    return task.steps.filter(status=StepStatus.DEAD).order_by("position").first()


def is_outcome_unknown(step: Step) -> bool:
    return step.error_class == OUTCOME_UNKNOWN


REDRIVES = (Action.REDRIVE, Action.REDRIVE_LATER)


def refusal(action: str, task: Task, dead_step: Step | None) -> str | None:
    """Why ``action`` does not apply to ``task`` now, or None when it does.

    ``dead_step`` is the task's first dead step (:func:`first_dead_step`), given by the
    caller, which has usually read it already (under the task's lock, for a service).
    """
    if action == Action.REWIND:
        running = Step.objects.current().filter(task=task, status=StepStatus.RUNNING).exists()
        return rewind_refusal(task, running=running)
    if action == Action.CANCEL:
        if task.status in TERMINAL_TASK_STATUSES:
            return f"task #{task.pk} already {task.status}"
        if task.cancel_requested_at is not None:
            return f"task #{task.pk} is already being cancelled"
        return None
    if dead_step is None:
        verb = "redrive" if action in REDRIVES else "resolve"
        return f"task #{task.pk} has no dead step to {verb}"
    if action in REDRIVES and is_outcome_unknown(dead_step):
        return (
            f"step {dead_step.kind} of task #{task.pk} ended with an unknown outcome: a "
            "redrive would find its started call again and stop again; resolve it instead "
            "(mark done if it happened, run again if it did not)"
        )
    if action == Action.REDRIVE_LATER and is_approval(task, dead_step.position):
        return (
            f"step {dead_step.kind} of task #{task.pk} is an approval: a person decides it, "
            "not a clock (redrive it for a new request now, or cancel)"
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


def rewind_refusal(
    task: Task, step: Step | None = None, step_id: int | None = None, *, running: bool
) -> str | None:
    """Why ``task`` may not be rewound now, or None when it may: a task that finished, died
    or was cancelled, with no step still running (a branch that runs on in a dead task ends
    first). Given a ``step_id``, also from that current step (``step``, None when the task
    has no such step)."""
    if task.status not in REWINDABLE:
        return (
            f"task #{task.pk} is {str(task.status).replace('_', ' ')}: a rewind starts again a "
            "task that succeeded, died or was cancelled (cancel it first)"
        )
    if running:
        return f"a step of task #{task.pk} is still running: rewind once it has ended"
    if step_id is not None and step is None:
        return f"task #{task.pk} has no current step {step_id} to rewind from"
    return None


def allowed(task: Task, dead_step: Step | None) -> frozenset[Action]:
    """Every action :func:`refusal` lets through for the task."""
    return frozenset(action for action in Action if refusal(action, task, dead_step) is None)
