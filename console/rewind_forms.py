"""The task page's rewind: the form choosing where to start again (a step, and an edited
payload if wanted), the confirm form under a preview (a reason; each write in doubt is
decided by a pair of radio buttons the template draws), and what the page's rewind section
shows (:class:`RewindPanel`).

Forms parse; the rules (which tasks may be rewound, a reason and a decision for every write
in doubt are required, a payload follows the input rules) are the rewind service's, whose
refusals the views show where they belong.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django import forms

from console import presenters
from console.action_forms import JSONObjectField, param_field
from tasks_app import services
from tasks_app.models import Step, StepStatus, Task
from tasks_app.operations.rewinds import HAPPENED, IN_DOUBT, NOT_HAPPENED, RerunStep
from tasks_app.operations.task_actions import REASON, rewind_refusal

PERMISSION = "tasks_app.redrive_task"

# What a person says of a write in doubt, as the radio buttons say it.
DECISION_CHOICES = (
    (HAPPENED, "It happened: do not send again"),
    (NOT_HAPPENED, "It did not happen: send again"),
)


class RewindForm(forms.Form):
    step = forms.TypedChoiceField(coerce=int, label="Rewind from step")
    payload = JSONObjectField(
        "payload",
        required=False,
        max_length=200_000,
        label="Edited payload",
        help_text=(
            "Leave empty to keep the payload (shown under Payload and results); a JSON object "
            "replaces it for the steps that run again."
        ),
        widget=forms.Textarea({"rows": 5, "spellcheck": "false"}),
    )

    def __init__(self, data: Any = None, *, steps: list[Step], **kwargs: Any) -> None:
        super().__init__(data, auto_id="rewind_%s", **kwargs)
        choice = self.fields["step"]
        assert isinstance(choice, forms.TypedChoiceField)
        choice.choices = [(step.pk, step_label(step)) for step in steps]
        # A dead task's page refreshes itself every few seconds: the chosen step is kept
        # across the refreshes (a select's choice does not hold a refresh back).
        choice.widget.attrs["hx-preserve"] = "true"

    def edited_payload(self, task: Task) -> Any:
        """The payload typed, as the service takes it: None when left empty or when it is
        the task's own (a copy of the page's redacted payload, its secrets put back)."""
        typed = self.cleaned_data["payload"]
        if typed is None or presenters.restore_redacted(typed, task.payload) == task.payload:
            return None
        return typed


def step_label(step: Step) -> str:
    """An option of the step select: "1 · draft (succeeded)"."""
    return f"{step.position} · {step.kind} ({str(step.status).replace('_', ' ')})"


def standing_steps(task: Task) -> list[Step]:
    """The task's current steps, one per position (a fan-out's items run again together,
    so its first item stands for them)."""
    first: dict[int, Step] = {}
    for step in Step.objects.current().filter(task=task).order_by("position", "item"):
        first.setdefault(step.position, step)
    return list(first.values())


def choose_form(
    task: Task, data: Any = None, *, steps: list[Step] | None = None, **kwargs: Any
) -> RewindForm:
    """The rewind form of ``task``: a dead task starts on its dead step, others on the first."""
    steps = standing_steps(task) if steps is None else steps
    dead = next((step.pk for step in steps if step.status == StepStatus.DEAD), None)
    initial = {"step": dead or (steps[0].pk if steps else None), **kwargs.pop("initial", {})}
    return RewindForm(data, steps=steps, initial=initial, **kwargs)


class ConfirmForm(forms.Form):
    # The plan's token travels beside these fields (console.rewind_plans).
    reason = param_field(REASON)
    # Never drawn as a field: the decisions are radio buttons per write in doubt; an error
    # naming them is shown beside those.
    decisions = forms.CharField(required=False)

    def __init__(self, data: Any = None, **kwargs: Any) -> None:
        super().__init__(data, auto_id="rewind_%s", **kwargs)


def decision_field(key: str) -> str:
    """The POST field holding the decision on the write ``key``."""
    return f"decision:{key}"


def posted_decisions(data: Any, plan: services.RewindPlan) -> dict[str, str]:
    """The decisions posted for the plan's writes in doubt (none for a write left
    undecided, which the service refuses by name)."""
    return {
        write.key: data[decision_field(write.key)]
        for write in plan.in_doubt
        if data.get(decision_field(write.key))
    }


@dataclass(frozen=True)
class WriteRow:
    """An external write of the plan as the preview lists it, with, for a write in doubt,
    the POST field of its decision and the decision posted."""

    key: str
    kind: str
    state: str
    field: str
    chosen: str
    choices: tuple[tuple[str, str], ...] = DECISION_CHOICES

    @property
    def in_doubt(self) -> bool:
        return self.state == IN_DOUBT


@dataclass(frozen=True)
class RewindPanel:
    """What the task page's rewind section shows: the form choosing a step, or a preview
    (its plan, the signed token and the confirm form); and a refusal's words, if any."""

    form: RewindForm | None = None
    plan: services.RewindPlan | None = None
    # The plan signed (console.rewind_plans), as the confirm form carries it.
    token: str = ""
    confirm: ConfirmForm | None = None
    # The payload's fields the edit changes.
    changes: list[presenters.Change] = field(default_factory=list)
    decided: dict[str, str] = field(default_factory=dict)
    error: str = ""

    @property
    def chosen(self) -> RerunStep | None:
        """The step the preview rewinds from."""
        if self.plan is None:
            return None
        return next((s for s in self.plan.steps if s.step_id == self.plan.step_id), None)

    @property
    def writes(self) -> list[WriteRow]:
        if self.plan is None:
            return []
        return [
            WriteRow(w.key, w.kind, w.state, decision_field(w.key), self.decided.get(w.key, ""))
            for w in self.plan.writes
        ]


def offered(task: Task, user: Any) -> RewindPanel | None:
    """The rewind form for the task page, if ``user`` may rewind and the task may be rewound
    now (the service's rule: only the task's state decides)."""
    if not user.has_perm(PERMISSION):
        return None
    steps = standing_steps(task)
    running = Step.objects.current().filter(task=task, status=StepStatus.RUNNING).exists()
    if rewind_refusal(task, running=running) is not None:
        return None
    return RewindPanel(form=choose_form(task, steps=steps))
