"""The console's action forms, made from the table of operator actions
(``tasks_app.operations.task_actions.ACTIONS``): a form field per parameter kind, the task
page's forms (one per ``form`` of the table's rows, plus one for a row's one-task
parameters, such as "Redrive with changes") and the parameter fields of the bulk form.

Forms parse; the rules (a reason is required, a payload follows the input rules, a delay's
range) are the services', whose :class:`InvalidInput` the views show on the field it
names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django import forms
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from console import presenters
from tasks_app import validation
from tasks_app.exceptions import InvalidInput
from tasks_app.models import Task, TaskStatus
from tasks_app.operations.task_actions import ACTIONS, ActionSpec, Param

# What the delay field suggests (the browser's list; any other delay may be typed).
DELAY_CHOICES = (("5m", "5 minutes"), ("15m", "15 minutes"), ("1h", "1 hour"), ("1d", "1 day"))


def parse_json(text: str, field: str) -> Any:
    """``text`` parsed as JSON, or a form error naming ``field`` and the rule."""
    try:
        return json.loads(text)
    except RecursionError:
        raise forms.ValidationError(
            f"{field}: nesting deeper than {validation.MAX_DEPTH} levels"
        ) from None
    except ValueError as exc:
        raise forms.ValidationError(f"{field}: not valid JSON ({exc})") from None


class DelayInput(forms.TextInput):
    """A text input with a list of common delays to pick from."""

    def render(
        self, name: str, value: Any, attrs: dict[str, Any] | None = None, renderer: Any = None
    ) -> SafeString:
        list_id = f"{(attrs or {}).get('id', name)}_choices"
        field = super().render(name, value, {**(attrs or {}), "list": list_id}, renderer)
        options = format_html_join("", '<option value="{}">{}</option>', DELAY_CHOICES)
        return format_html('{}<datalist id="{}">{}</datalist>', field, list_id, options)


class JSONObjectField(forms.CharField):
    """A JSON object typed into a text area, or None when left empty."""

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.name = name

    def clean(self, value: Any) -> dict[str, Any] | None:
        raw: str = super().clean(value).strip()
        if not raw:
            return None
        parsed = parse_json(raw, self.name)
        if not isinstance(parsed, dict):
            raise forms.ValidationError(f"{self.name}: must be a JSON object")
        return parsed


def param_field(param: Param, *, keep_typing: bool = False) -> forms.Field:
    """The form field of a parameter. Every field is optional to Django: the service
    refuses a required one missing, naming it; the browser marks it required and says so
    before sending. With ``keep_typing`` (a form offered while its page refreshes itself),
    text being typed is kept across the refreshes (``hx-preserve``)."""
    attrs: dict[str, Any] = {"required": True} if param.required else {}
    if keep_typing:
        attrs["hx-preserve"] = "true"
    label = param.label
    if param.kind == "json":
        return JSONObjectField(
            param.name,
            required=False,
            max_length=200_000,
            label=label,
            help_text=param.help,
            widget=forms.Textarea({"rows": 8, "spellcheck": "false", **attrs}),
        )
    if param.kind == "step":
        return forms.CharField(
            required=False,
            max_length=100,
            label=label,
            help_text=param.help,
            widget=forms.TextInput({"size": 20, "autocomplete": "off", **attrs}),
        )
    if param.kind == "delay":
        return forms.CharField(
            required=False,
            max_length=20,
            label=label,
            help_text=param.help,
            widget=DelayInput({"size": 10, "autocomplete": "off", **attrs}),
        )
    return forms.CharField(
        required=False,
        max_length=2000,
        label=label,
        help_text=param.help,
        widget=forms.Textarea({"rows": 2, **attrs}),
    )


@dataclass(frozen=True)
class Button:
    text: str
    name: str
    value: str
    tone: str


@dataclass(frozen=True)
class PageForm:
    """One form of the task page: its buttons (the actions it takes), its heading and the
    parameters it asks for. ``key`` names it in the page's context (``<key>_form``) and
    prefixes its element ids; ``url`` is the POST address (``/tasks/<id>/<url>/``)."""

    key: str
    url: str
    specs: tuple[ActionSpec, ...]
    params: tuple[Param, ...]
    heading: str
    variant: bool = False

    @property
    def help(self) -> str:
        """What each of its actions does (a form of one action: what that one does)."""
        if len(self.specs) == 1:
            return self.specs[0].explanation
        return " ".join(f"{spec.label}: {spec.explanation}" for spec in self.specs)

    @property
    def buttons(self) -> list[Button]:
        """Its submit buttons: one per action; in a shared form each carries its action's
        fixed argument (``outcome=done``), which tells the view which was chosen."""
        made = []
        for spec in self.specs:
            name, value = next(iter(spec.fixed.items()), ("", ""))
            text = self.heading if self.variant else spec.label
            made.append(Button(text, name, value, "" if self.variant else spec.tone))
        return made

    def chosen(self, data: Any) -> ActionSpec | None:
        """The action a POST of this form asks for (None when a shared form's button
        value matches none of its actions)."""
        if len(self.specs) == 1:
            return self.specs[0]
        for spec in self.specs:
            if all(data.get(k) == v for k, v in spec.fixed.items()):
                return spec
        return None

    @property
    def keep_typing(self) -> bool:
        # An action offered while a task is at work (cancel), when its page refreshes every
        # few seconds: a reason being typed is kept across the refreshes, which go on. (A
        # dead task's page skips a refresh while a field holds typed text, console.js.)
        return any(TaskStatus.RUNNING in spec.targets for spec in self.specs)

    def form_class(self) -> type[forms.Form]:
        fields = {p.name: param_field(p, keep_typing=self.keep_typing) for p in self.params}
        return type(f"{self.key.title()}Form", (forms.Form,), fields)

    def bind(self, data: Any = None, **kwargs: Any) -> forms.Form:
        return self.form_class()(data, auto_id=f"{self.key}_%s", **kwargs)

    def initial(self, task: Task) -> dict[str, Any]:
        """What the form starts with: a JSON parameter shows the task's value (its
        payload), with secrets hidden; a redrive puts back what was not changed."""
        return {
            param.name: presenters.pretty_json(getattr(task, param.name))
            for param in self.params
            if param.kind == "json"
        }

    def action(
        self, data: Any, cleaned: dict[str, Any], task: Task
    ) -> tuple[ActionSpec, dict[str, Any]]:
        """The action a valid POST of this form asks for and its service's arguments: the
        parameters given (a required one even when empty, for the service to refuse by
        name), a JSON one with its redacted values restored from ``task``. A shared form
        posted without one of its buttons' values is refused naming the choice."""
        spec = self.chosen(data)
        if spec is None:
            key = next(iter(self.specs[0].fixed), "action")
            values = " or ".join(repr(s.fixed.get(key, s.name)) for s in self.specs)
            raise InvalidInput(key, "choice", f"{key}: must be {values}")
        params: dict[str, Any] = {}
        for param in self.params:
            value = cleaned.get(param.name)
            if param.kind == "json" and value is not None:
                value = presenters.restore_redacted(value, getattr(task, param.name))
            if value not in (None, "") or param.required:
                params[param.name] = value
        return spec, params


def page_forms(specs: tuple[ActionSpec, ...] | list[ActionSpec]) -> list[PageForm]:
    """The task page's forms for ``specs`` (the actions offered, in the table's order):
    one per ``form`` they name, with the buttons of each action sharing it and its
    parameters for many tasks; then one per one-task parameter ("Redrive with changes"),
    holding all of its action's parameters. A shared form is headed by its last action's
    heading (the one naming what sets it apart: "Resolve the unknown outcome")."""
    grouped: dict[str, list[ActionSpec]] = {}
    # An action the page takes through a flow of its own (a rewind) has no form here.
    for spec in (spec for spec in specs if spec.page_form):
        grouped.setdefault(spec.form, []).append(spec)
    made = []
    for key, group in grouped.items():
        params = _union(param for spec in group for param in spec.params if not param.variant)
        made.append(PageForm(key, key, tuple(group), params, group[-1].heading))
        for spec in group:
            for variant in dict.fromkeys(p.variant for p in spec.params if p.variant):
                # The one-task parameters first: they are what this form is for.
                ordered = sorted(spec.params, key=lambda p: not p.variant)
                heading = f"{spec.heading} with {variant}"
                made.append(PageForm(variant, key, (spec,), tuple(ordered), heading, True))
    return made


def posted_form(url: str, data: Any) -> PageForm:
    """The task page form a POST to ``/tasks/<id>/<url>/`` came from: the address's form,
    or its one-task variant when one of that variant's own parameters was given (an edited
    payload: "Redrive with changes"), so an error shows where it was typed."""
    made = FORMS_BY_URL[url]
    for variant in ALL_PAGE_FORMS:
        one_task = [p.name for p in variant.params if p.variant]
        if variant.url == url and any(data.get(n, "").strip() for n in one_task):
            made = variant
    return made


def _union(params: Any) -> tuple[Param, ...]:
    return tuple({param.name: param for param in params}.values())


# Every form of the task page, whether offered now or not: by the address each posts to.
ALL_PAGE_FORMS = page_forms(list(ACTIONS.values()))
FORMS_BY_URL = {form.url: form for form in ALL_PAGE_FORMS if not form.variant}
FORMS_BY_KEY = {form.key: form for form in ALL_PAGE_FORMS}


def bulk_params() -> tuple[Param, ...]:
    """The parameters any action takes for many tasks, but the reason (every form has
    it): the bulk form's extra fields."""
    return _union(
        param for spec in ACTIONS.values() for param in spec.bulk_params if param.name != "reason"
    )
