"""The forms of a schedule's page (``console.schedule_views``): pause, resume, backfill and
run now, and the confirm under a resume's or a backfill's preview.

Forms parse; the rules (a reason is required, the resume modes, what a backfill's range may
hold, a request id's format) are the services' (``tasks_app.operations.schedules``), whose
:class:`InvalidInput` the views put on the field it names. Each form's element ids are its
own (``resume-reason``), as one page holds them all.
"""

from __future__ import annotations

import uuid
from typing import Any

from django import forms

from console.limit_cards import reason_field
from tasks_app.engine.schedules import Missed
from tasks_app.operations.schedules import RESUME_MODES

# Each resume mode as the choice reads; "policy" names the schedule's own when shown.
MODE_WORDS = {
    "policy": "Follow the schedule's policy",
    Missed.SKIP: "Skip them: record them as missed, run none",
    Missed.LATEST: "Run the newest of them once",
    Missed.EACH: "Run each of them",
}
ACTIONS = ("pause", "resume", "backfill", "run_now")


class PauseForm(forms.Form):
    reason = reason_field()


class ResumeForm(forms.Form):
    # A text field under a select: an unknown mode is refused by the service, by name.
    mode = forms.CharField(
        required=False,
        max_length=20,
        label="Slots missed while paused",
        widget=forms.Select(choices=[(mode, MODE_WORDS[mode]) for mode in RESUME_MODES]),
    )
    reason = reason_field()


def _moment_field(label: str, help_text: str) -> forms.CharField:
    return forms.CharField(
        required=False,
        max_length=64,
        label=label,
        help_text=help_text,
        widget=forms.TextInput({"type": "datetime-local", "required": True, "step": "1"}),
    )


class BackfillForm(forms.Form):
    since = _moment_field("From", "The first slot to look at, in the time zone shown.")
    until = _moment_field("Until", "The last slot to look at (included).")
    # The zone the form was shown in: its local times are read in it, whatever the
    # browser's cookie says by the time it is sent.
    zone = forms.CharField(required=False, max_length=80, widget=forms.HiddenInput)
    reason = reason_field()


class RunNowForm(forms.Form):
    reason = reason_field()
    # Made when the form is shown: sending the same form twice enqueues one task.
    request_id = forms.CharField(required=False, max_length=80, widget=forms.HiddenInput)


class ConfirmForm(forms.Form):
    """A preview's confirm: the signed plan (``console.schedule_plans``) and the reason,
    which may still be changed."""

    # No length of its own: a resume after a long pause lists every slot it decides, and
    # the signature, not the length, says whether the plan is the one previewed.
    plan = forms.CharField(required=False, widget=forms.HiddenInput)
    reason = reason_field()


FORMS: dict[str, type[forms.Form]] = {
    "pause": PauseForm,
    "resume": ResumeForm,
    "backfill": BackfillForm,
    "run_now": RunNowForm,
}


def make_form(action: str, data: Any = None, **kwargs: Any) -> forms.Form:
    return FORMS[action](data, auto_id=f"{action.replace('_', '-')}-%s", **kwargs)


def confirm_form(action: str, data: Any = None, **kwargs: Any) -> ConfirmForm:
    return ConfirmForm(data, auto_id=f"{action}-confirm-%s", **kwargs)


def fresh_forms(initial: dict[str, dict[str, Any]] | None = None) -> dict[str, forms.Form]:
    """Every action's form, unbound; run now's with a request id of its own."""
    initial = initial or {}
    made = {action: make_form(action, initial=initial.get(action)) for action in ACTIONS}
    made["run_now"].initial = {**made["run_now"].initial, "request_id": uuid.uuid4().hex}
    return made
