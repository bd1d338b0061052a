"""The admin's forms: enqueue a task, and the reason an operator action asks for.

They only parse (JSON text into an object, a date and a time into an aware datetime); the
input rules live in :mod:`tasks_app.validation`, the workflows' own payload validators and
the services, whose :class:`InvalidInput` the admin shows on the field it names.
"""

from __future__ import annotations

import inspect
import json
import re
from typing import Any

from django import forms
from django.conf import settings
from django.contrib.admin.widgets import AdminSplitDateTime
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from tasks_app.exceptions import InvalidInput
from tasks_app.operations.task_actions import ActionSpec
from tasks_app.validation import MAX_PRIORITY, MIN_PRIORITY
from tasks_app.workflows import PayloadValidator, Workflow, registry, unknown_workflow

# What a field the validator asks for is filled with while its rules are read.
PLACEHOLDER = "…"
# A validator that keeps asking for more fields is not asked forever.
MAX_PROBES = 50
# A field no validator asks for, to learn whether it refuses fields it did not ask for.
EXTRA_FIELD = "no_such_field"


def payload_rules(flow: Workflow) -> list[str]:
    """What the workflow's own payload validator requires, in its own words.

    The registry offers each workflow's validator, not a schema, so the rules are read
    from the validator itself (they cannot drift from what enqueue checks):

    1. Its docstring, if it has one, as plain text.
    2. Its answer to an empty object, one line per rule it names; while it answers that
       top-level fields are required, fill them with a placeholder string and ask again,
       until it accepts the payload or names only other rules.
    3. Once it accepts the payload, whether it refuses a field it did not ask for.
    """
    validate = flow.validate_payload
    if validate is None:
        return ["Any JSON object."]
    lines = []
    doc = inspect.getdoc(validate)
    if doc:
        lines.append(plain_text(doc))
    probe: dict[str, Any] = {}
    for _ in range(MAX_PROBES):
        refusal = _refusal(validate, probe)
        if refusal is None:
            if not probe:
                lines.append("{} is accepted: every field it checks is optional.")
            elif _refusal(validate, {**probe, EXTRA_FIELD: PLACEHOLDER}) is not None:
                lines.append("No other fields.")
            break
        lines.extend(str(error) for error in refusal.errors if str(error) not in lines)
        required = [
            name
            for error in refusal.errors
            if error.rule == "required" and error.field.startswith("payload.")
            for name in [error.field.removeprefix("payload.")]
            if name.isidentifier() and name not in probe
        ]
        if not required:
            break
        probe.update(dict.fromkeys(required, PLACEHOLDER))
    return lines


# reStructuredText roles and literals in a docstring: :func:`name` and ``name`` read as name.
_RST_MARKUP = re.compile(r"(?::[a-z]+:)?`{1,2}([^`]+)`{1,2}")


def plain_text(doc: str) -> str:
    """A docstring as a person reads it: no reST markup, one paragraph."""
    return " ".join(_RST_MARKUP.sub(r"\1", doc).split())


def _refusal(validate: PayloadValidator, payload: dict[str, Any]) -> InvalidInput | None:
    try:
        validate(payload)
    except InvalidInput as exc:
        return exc
    except Exception:  # a validator that trips on the probe refuses it; the page still works
        return InvalidInput("payload", "unknown", "(its further rules show when you enqueue)")
    return None


def _steps(flow: Workflow) -> str:
    return " → ".join(
        f"{spec.kind} (a person decides)" if spec.approval else spec.kind for spec in flow.steps
    )


def public_workflows() -> list[Workflow]:
    """The workflows a person may enqueue (their latest versions), by name."""
    return [registry.latest(name) for name in registry.public_names()]


def workflows_help() -> SafeString:
    """Each workflow a person may enqueue: what it does, its steps, and its payload rules;
    escaped, as a list for the payload field's help. Each item names its workflow, so the
    page's script shows only the chosen one's (``static/admin/tasks_app/enqueue.js``)."""
    items = format_html_join(
        "",
        '<li data-workflow="{}"><strong>{}</strong> v{}: {} <span class="quiet">Steps: {}.'
        "</span><ul>{}</ul></li>",
        (
            (
                flow.name,
                flow.name,
                flow.version,
                flow.description or "(no description)",
                _steps(flow),
                format_html_join("", "<li>{}</li>", ((line,) for line in payload_rules(flow))),
            )
            for flow in public_workflows()
        ),
    )
    return format_html(
        "A JSON object, checked by the input rules and by the chosen workflow's own rules:"
        '<ul class="workflow-rules">{}</ul>',
        items,
    )


class DescribedSplitDateTime(AdminSplitDateTime):
    """Django's date and time inputs, described by the field's help text. Django's point at
    a time-zone warning its script adds only when the browser's zone differs from the
    server's, so otherwise they point at nothing and the help is not read out."""

    def get_context(self, name: str, value: Any, attrs: dict[str, Any] | None) -> dict[str, Any]:
        context = super().get_context(name, value, attrs)
        for widget in context["widget"]["subwidgets"]:
            widget["attrs"]["aria-describedby"] = f"id_{name}_helptext"
        return context


class EnqueueForm(forms.Form):
    class Media:
        # Shows the payload rules of the workflow chosen (see workflows_help).
        js = ["admin/tasks_app/enqueue.js"]

    workflow = forms.ChoiceField()
    payload = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 10, "cols": 80, "class": "vLargeTextField"}),
        initial="{}",
        strip=False,
    )
    # Not stripped, and no length or character rules here: the key's rules are enqueue's.
    idempotency_key = forms.CharField(
        required=False,
        strip=False,
        empty_value=None,
        widget=forms.TextInput(attrs={"class": "vTextField", "autocomplete": "off"}),
        help_text=(
            "Optional; names the business action (e.g. publish:article-001:v3). The same key "
            "with the same workflow and payload returns the existing task."
        ),
    )
    queue = forms.ChoiceField()
    priority = forms.IntegerField(
        initial=0,
        widget=forms.NumberInput(attrs={"min": MIN_PRIORITY, "max": MAX_PRIORITY}),
        help_text=f"From {MIN_PRIORITY} to {MAX_PRIORITY}; higher runs first.",
    )
    run_after = forms.SplitDateTimeField(
        required=False,
        widget=DescribedSplitDateTime,
        label="Run after",
        help_text=f"Optional; not before this time ({settings.TIME_ZONE}).",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Read when the form is made: workflows register at start-up (and in tests).
        workflow = self.fields["workflow"]
        queue = self.fields["queue"]
        assert isinstance(workflow, forms.ChoiceField) and isinstance(queue, forms.ChoiceField)
        workflow.choices = [
            ("", "---------"),
            *(
                (flow.name, f"{flow.name} — {flow.description}" if flow.description else flow.name)
                for flow in public_workflows()
            ),
        ]
        # The registry's own refusal: it names the field, the rule and the known workflows.
        workflow.error_messages["invalid_choice"] = str(unknown_workflow("%(value)s"))
        queue.choices = [(name, name) for name in settings.TASKS_QUEUES]
        queue.initial = settings.TASKS_QUEUES[0]
        self.fields["payload"].help_text = workflows_help()

    def clean_payload(self) -> Any:
        text: str = self.cleaned_data["payload"]
        try:
            return json.loads(text)
        except ValueError as exc:
            raise forms.ValidationError(f"payload: not valid JSON ({exc})") from None
        except RecursionError:
            raise forms.ValidationError("payload: nested too deeply to read") from None


def add_input_error(form: forms.Form, exc: InvalidInput) -> None:
    """Show each rule a service refused on the field it names (``payload.title`` is the
    payload's); a field the form does not have gets a form-wide error."""
    for error in exc.errors:
        form.add_error(error.top_field if error.top_field in form.fields else None, str(error))


class ReasonForm(forms.Form):
    """The reason an operator action records; the services require it (and say so)."""

    reason = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60, "required": True}),
        help_text="Recorded with each task's event: who did what, and why.",
    )


def action_form(spec: ActionSpec, data: Any = None) -> ReasonForm:
    """The confirmation form of an operator action: the reason, then each parameter the
    action takes for many tasks (a delay), as text the service reads and checks."""
    fields: dict[str, forms.Field] = {
        param.name: forms.CharField(
            required=False,
            max_length=200,
            label=param.label,
            help_text=param.help,
            widget=forms.TextInput(attrs={"size": 12, "required": param.required}),
        )
        for param in spec.bulk_params
        if param.name != "reason"
    }
    form_class = type(f"{spec.name.title()}Form", (ReasonForm,), fields)
    form: ReasonForm = form_class(data)
    return form


def action_params(form: forms.Form) -> dict[str, Any]:
    """The parameters a valid confirmation form gives, as the bulk service takes them."""
    return {name: form.cleaned_data[name] for name in form.fields if name != "reason"}
