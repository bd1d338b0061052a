"""The console's forms: filters read from the query string, the bulk form, the reason
of a queue switch and the editors' forms (the task page's action forms are made from the
table of operator actions, ``console.action_forms``).

Filters turn into the selectors' filter objects; a bad value is a form error naming the
field. Action forms parse; the rules (a reason is required, a payload follows the input
rules, a delay's range, the bulk limit) live in the services, whose :class:`InvalidInput`
the views show on the field it names (a bulk form's limit also defaults to the service's).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django import forms
from django.conf import settings

from console.action_forms import bulk_params, param_field
from console.action_forms import parse_json as parse_json  # its home; kept for imports
from tasks_app import services
from tasks_app.models import EventKind, fingerprints
from tasks_app.observability.workflow_figures import DEFAULT_WINDOW, WINDOWS, Window
from tasks_app.operations.audit_log import AuditFilter
from tasks_app.operations.listings import DeadFilter, workflow_names
from tasks_app.operations.task_actions import ACTIONS


def _choices(values: list[str], blank: str = "any") -> list[tuple[str, str]]:
    return [("", blank), *((value, value) for value in values)]


def _set_choices(form: forms.Form, **choices: list[str]) -> None:
    """Choices read when the form is made (workflows register at start-up)."""
    for name, values in choices.items():
        field = form.fields[name]
        assert isinstance(field, forms.ChoiceField)
        field.choices = _choices(values)


class _Filter(forms.Form):
    """A GET filter: every field optional; ``after`` is the keyset cursor."""

    after = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)

    def cursor(self) -> int | None:
        return self.cleaned_data.get("after") if self.is_valid() else None


def _cause_field() -> forms.RegexField:
    """A dead letter's cause, as ``/dead/groups/`` links to it."""
    return forms.RegexField(
        required=False,
        regex=fingerprints.CAUSE_PATTERN,
        label="Cause",
        widget=forms.HiddenInput,
        error_messages={"invalid": f"fingerprint: {fingerprints.CAUSE_RULE}"},
    )


class DeadFilterForm(_Filter):
    workflow = forms.ChoiceField(required=False)
    queue = forms.ChoiceField(required=False)
    # Declared fields leave the class attributes, so the form's own ``error_class`` (the
    # error list type) is not shadowed at run time; only the checker sees a clash.
    error_class = forms.CharField(  # type: ignore[assignment]
        required=False, max_length=200, label="Error class"
    )
    fingerprint = _cause_field()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _set_choices(self, workflow=workflow_names(), queue=list(settings.TASKS_QUEUES))

    def filters_query(self, *, cursor: bool = False) -> str:
        """The filter as a query string, for the page after a plain POST; with ``cursor``,
        the page being read too (a refresh of the list stays on it)."""
        query = {k: v for k, v in self.filters().__dict__.items() if v}
        if cursor and self.cursor():
            query["after"] = self.cursor()
        return urlencode(query)

    def filters(self) -> DeadFilter:
        data = self.cleaned_data if self.is_valid() else {}
        return DeadFilter(
            workflow=data.get("workflow", ""),
            queue=data.get("queue", ""),
            error_class=data.get("error_class", ""),
            fingerprint=data.get("fingerprint", ""),
        )


# What a date-and-time filter accepts (forms.DateTimeField's formats, read as UTC).
DATETIME_RULE = "a date and time, such as 2026-11-30 or 2026-11-30 13:05 (UTC)"


class AuditFilterForm(_Filter):
    """The audit log's filter. Unlike the lists' filters, a bad value is refused, never
    left out: an auditor's export must hold what was asked for, not everything."""

    after = forms.IntegerField(
        required=False,
        min_value=1,
        widget=forms.HiddenInput,
        error_messages={
            "invalid": "after: a whole number (the id an older page starts below)",
            "min_value": "after: a whole number from %(limit_value)s",
        },
    )
    task = forms.IntegerField(
        required=False,
        min_value=1,
        label="Task id",
        widget=forms.TextInput({"inputmode": "numeric", "size": 8}),
        error_messages={
            "invalid": "task: a task id, a whole number",
            "min_value": "task: a task id, a whole number from %(limit_value)s",
        },
    )
    actor = forms.CharField(
        required=False,
        max_length=150,
        help_text="The start of the name, in any case",
        error_messages={"max_length": "actor: at most %(limit_value)d characters"},
    )
    kind = forms.ChoiceField(
        required=False,
        label="Action",
        # The labels people read (EventKind's), the kinds the query string carries.
        choices=[("", "any"), *EventKind.choices],
        error_messages={"invalid_choice": "kind: %(value)r is not an event kind"},
    )
    workflow = forms.ChoiceField(
        required=False,
        error_messages={"invalid_choice": "workflow: %(value)r is not a registered workflow"},
    )
    since = forms.DateTimeField(
        required=False,
        help_text="At or after (UTC)",
        error_messages={"invalid": f"since: {DATETIME_RULE}"},
    )
    until = forms.DateTimeField(
        required=False,
        help_text="Before (UTC)",
        error_messages={"invalid": f"until: {DATETIME_RULE}"},
    )
    plan = forms.RegexField(
        required=False,
        regex=r"^[0-9a-f]{1,32}$",
        label="Bulk plan",
        help_text="The id a bulk action wrote on each of its events",
        error_messages={"invalid": "plan: the hexadecimal id of a bulk action's plan"},
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _set_choices(self, workflow=workflow_names())

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        since, until = data.get("since"), data.get("until")
        if since and until and until <= since:
            self.add_error("until", "until: must be later than since")
        return data

    def filters(self) -> AuditFilter:
        data = self.cleaned_data if self.is_valid() else {}
        return AuditFilter(
            actor=data.get("actor", ""),
            kind=data.get("kind", ""),
            workflow=data.get("workflow", ""),
            task=data.get("task"),
            since=data.get("since"),
            until=data.get("until"),
            plan=data.get("plan", ""),
        )


def named_errors(form: forms.Form) -> list[str]:
    """Each of the form's errors as ``field: rule``, for a notice or a plain-text answer
    (a message that already starts with its field's name is left as it is)."""
    named = []
    for name, messages in form.errors.items():
        for message in map(str, messages):
            named.append(message if message.startswith(f"{name}:") else f"{name}: {message}")
    return named


# --- actions ------------------------------------------------------------------------------


class ReasonForm(forms.Form):
    # Required by the services, which say so with the field's name. The task page
    # refreshes itself until the task has ended; it skips a refresh while a field of the
    # region holds typed text (console.js), so nothing being written is lost.
    # The services refuse an empty reason (naming the field); the browser marks it required
    # and says so before sending (``required`` on the widget, a mark on its label).
    reason = forms.CharField(
        required=False, max_length=2000, widget=forms.Textarea({"rows": 2, "required": True})
    )


class BulkForm(ReasonForm):
    """A bulk action on the dead letters a filter selects. Without ``confirm=1`` it only
    previews; with it, it applies the signed ``plan`` its preview made."""

    # Every row of the actions' table, by the label its buttons give it.
    action = forms.ChoiceField(choices=[(spec.name.value, spec.label) for spec in ACTIONS.values()])
    limit = forms.IntegerField(min_value=1, required=False)
    # Only the literal "1" confirms; anything else ("0", "no", "true") previews.
    confirm = forms.CharField(required=False, strip=False, widget=forms.HiddenInput)
    plan = forms.CharField(required=False, max_length=100_000, widget=forms.HiddenInput)
    workflow = forms.ChoiceField(required=False)
    queue = forms.ChoiceField(required=False)
    error_class = forms.CharField(required=False, max_length=200)  # type: ignore[assignment]
    fingerprint = _cause_field()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _set_choices(self, workflow=workflow_names(), queue=list(settings.TASKS_QUEUES))
        # The parameters actions take for many tasks (a delay), after the reason: each is
        # sent to the service only for an action that takes it (``params``).
        for param in bulk_params():
            field = self.fields[param.name] = param_field(param)
            # Asked for only by some actions: the label names them, the service requires it.
            field.widget.attrs.pop("required", None)
            takers = [spec.label for spec in ACTIONS.values() if param in spec.bulk_params]
            field.label = f"{param.label} (for {', '.join(takers)})"

    @property
    def param_fields(self) -> list[forms.BoundField]:
        return [self[param.name] for param in bulk_params()]

    def params(self) -> dict[str, Any]:
        """The parameters the chosen action takes, as given (the service checks them)."""
        spec = ACTIONS[self.cleaned_data["action"]]
        return {
            param.name: self.cleaned_data.get(param.name, "")
            for param in spec.bulk_params
            if param.name != "reason"
        }

    def clean_limit(self) -> int:
        limit: int | None = self.cleaned_data.get("limit")
        cap = services.bulk_limit()
        if limit is None:
            return cap
        if limit > cap:
            raise forms.ValidationError(f"limit: at most {cap} tasks per action")
        return limit

    @property
    def confirmed(self) -> bool:
        return self.cleaned_data.get("confirm") == "1"

    def filters(self) -> DeadFilter:
        return DeadFilter(
            workflow=self.cleaned_data.get("workflow", ""),
            queue=self.cleaned_data.get("queue", ""),
            error_class=self.cleaned_data.get("error_class", ""),
            fingerprint=self.cleaned_data.get("fingerprint", ""),
        )


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(
        choices=[
            ("approve", "Approve"),
            ("reject", "Reject"),
            ("request_changes", "Request changes"),
        ]
    )
    comment = forms.CharField(
        required=False,
        max_length=5000,
        widget=forms.Textarea({"rows": 3}),
        help_text="Required to reject or to request changes.",
    )
    draft_hash = forms.CharField(max_length=64, widget=forms.HiddenInput)


class DraftEditForm(forms.Form):
    """An editor's edit of the draft under review: one field per editable draft field
    (``draft-title``), an optional note, and the hash of the draft they edited."""

    prefix = "draft"
    comment = forms.CharField(
        required=False,
        max_length=5000,
        label="Note on your edit",
        widget=forms.TextInput(),
        help_text="Optional: what you changed and why, for the next reviewer.",
    )
    draft_hash = forms.CharField(max_length=64, widget=forms.HiddenInput)

    def __init__(self, editable: dict[str, str], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.editable = list(editable)
        for name, text in editable.items():
            long = "\n" in text or len(text) > 120
            self.fields[name] = forms.CharField(
                required=False,
                strip=False,
                initial=text,
                label=name.replace("_", " ").capitalize(),
                widget=forms.Textarea({"rows": 8}) if long else forms.TextInput(),
            )
        # The draft's fields first, in the draft's order; then the note.
        self.order_fields([*self.editable, "comment"])

    def changes(self) -> dict[str, str]:
        """The edited fields' text, with a browser's line breaks (CR LF) made the draft's."""
        return {name: self.cleaned_data[name].replace("\r\n", "\n") for name in self.editable}


class WindowForm(forms.Form):
    """The span the workflow figures cover (``?window=hour|day|week``)."""

    window = forms.ChoiceField(
        required=False,
        choices=[(name, window.label) for name, window in WINDOWS.items()],
        error_messages={"invalid_choice": f"window: one of {', '.join(WINDOWS)}"},
    )

    def chosen(self) -> Window:
        data = self.cleaned_data if self.is_valid() else {}
        return WINDOWS[data.get("window") or DEFAULT_WINDOW]
