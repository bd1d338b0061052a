"""Every surface offers every operator action of the table (``task_actions.ACTIONS``), and
taking it there reaches its service: the console's task page (a form with the action's
button and parameters, or, for a row it takes through a flow of its own, that flow), the
dead letters' bulk form (a choice and the parameter fields),
the admin (a changelist action whose confirmation asks for the parameters), the commands
(``task_action``, and the named commands for their rows) and the plain description an API
reads. A row added without one of these fails here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client, RequestFactory
from django.urls import reverse

from console.forms import BulkForm
from tasks_app.integrations.admin import TaskAdmin
from tasks_app.models import Event, Step, Task
from tasks_app.operations import task_actions
from tasks_app.operations.task_actions import ACTIONS, ActionSpec, Param
from tests.admin_support import staff_client
from tests.console_support import body, login
from tests.factories import dead_task, noop, unknown_outcome

NAMES = list(ACTIONS)

# The tasks an action may find itself allowed on; a new row whose rule allows none of these
# needs one added, so that each surface is shown a task it applies to.
CANDIDATES: list[Callable[[], Task]] = [dead_task, unknown_outcome, noop]

# A value each kind of parameter takes (an optional one-task payload is left out).
# A step kind is the candidates' own (demo.flaky's one step).
SAMPLES = {"text": "because the test says so", "delay": "15m", "step": "flaky"}

# The named commands and how each takes a row (beside ``task_action`` for every row).
NAMED_COMMANDS: dict[str, tuple[str, dict[str, Any]]] = {
    "redrive": ("redrive", {}),
    "redrive_later": ("redrive", {}),
    "resolve_done": ("resolve", {"outcome": "done"}),
    "resolve_retry": ("resolve", {"outcome": "retry"}),
    "cancel": ("cancel", {}),
    "rewind": ("rewind", {}),
}


def task_for(spec: ActionSpec) -> Task:
    for make in CANDIDATES:
        task = make()
        if spec.name in task_actions.allowed(task, task_actions.first_dead_step(task)):
            return task
    raise AssertionError(f"no candidate task allows {spec.name}: add one to CANDIDATES")


def values(params: tuple[Param, ...]) -> dict[str, str]:
    return {p.name: SAMPLES[p.kind] for p in params if p.required or p.kind in SAMPLES}


def took(spec: ActionSpec, task: Task, actor: str) -> bool:
    """Whether the action's service wrote its event for ``task`` with ``actor``, with
    what its parameters record (a delay as ``delay_seconds``)."""
    events = Event.objects.for_task(task.pk).filter(actor=actor, reason=SAMPLES["text"])
    if any(param.kind == "delay" for param in spec.params):
        events = events.filter(data__has_key="delay_seconds")
    else:
        events = events.exclude(data__has_key="delay_seconds")
    return events.exists()


@dataclass
class PageForm:
    action: str
    fields: set[str] = field(default_factory=set)
    values: dict[str, str] = field(default_factory=dict)
    buttons: list[tuple[str, str, str]] = field(default_factory=list)


class Forms(HTMLParser):
    """The page's POST forms: their address, field names and buttons (text, name, value)."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[PageForm] = []
        self._button: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form" and a.get("method") == "post":
            self.forms.append(PageForm(a.get("action", "")))
        elif self.forms and tag in ("input", "textarea", "select") and a.get("name"):
            self.forms[-1].fields.add(a["name"])
            self.forms[-1].values[a["name"]] = a.get("value", "")
        elif self.forms and tag == "button":
            self._button = [a.get("name", ""), a.get("value", ""), ""]

    def handle_data(self, data: str) -> None:
        if self._button is not None:
            self._button[2] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "button" and self._button is not None and self.forms:
            name, value, text = self._button
            self.forms[-1].buttons.append((text.strip(), name, value))
            self._button = None


@pytest.mark.parametrize("name", NAMES)
def test_the_task_page_offers_it_with_its_parameters_and_takes_it(
    db: None, name: str, superuser: User
) -> None:
    spec = ACTIONS[name]
    task = task_for(spec)
    client = login(superuser)
    parser = Forms()
    parser.feed(body(client.get(reverse("console:task", args=[task.pk]))))

    offering = [
        (form, button)
        for form in parser.forms
        for button in form.buttons
        if button[0] == spec.label
    ]
    if not spec.page_form:
        assert not offering, f"the task page offers {spec.label!r} twice"
        takes_it_through_its_own_flow(client, parser, task, spec, superuser)
        return
    assert offering, f"the task page offers no {spec.label!r} button"
    form, (_, button_name, button_value) = offering[0]
    wanted = {p.name for p in spec.params if not p.variant}
    assert wanted <= form.fields, f"{spec.label}: fields {form.fields}, wanted {wanted}"
    data = {**values(spec.params), **({button_name: button_value} if button_name else {})}
    response = client.post(form.action, data)
    assert response.status_code == 302, body(response)
    assert took(spec, task, superuser.username)


def takes_it_through_its_own_flow(
    client: Client, page: Forms, task: Task, spec: ActionSpec, user: User
) -> None:
    """A row the task page takes through a flow of its own (a rewind): its section offers
    it (choose a step, preview, confirm), and confirming the preview takes it."""
    assert spec.name == task_actions.Action.REWIND, f"which flow of the page takes {spec.name}?"
    url = reverse("console:task_rewind", args=[task.pk])
    [form] = [form for form in page.forms if form.action == url]
    assert any(text == "Preview rewind" for text, _, _ in form.buttons), form.buttons
    assert "step" in form.fields
    step = Step.objects.current().get(task=task, kind=SAMPLES["step"], item=0)
    preview = Forms()
    preview.feed(body(client.post(url, {"step": step.pk})))
    confirm_url = reverse("console:task_rewind_confirm", args=[task.pk])
    [confirm] = [form for form in preview.forms if form.action == confirm_url]
    assert {"plan", "reason"} <= confirm.fields
    response = client.post(confirm_url, {"plan": confirm.values["plan"], "reason": SAMPLES["text"]})
    assert response.status_code == 302, body(response)
    assert took(spec, task, user.username)


@pytest.mark.parametrize("name", NAMES)
def test_the_bulk_form_offers_it_with_its_parameters(db: None, name: str) -> None:
    spec = ACTIONS[name]
    form = BulkForm()
    assert name in {value for value, _ in form.fields["action"].choices}  # type: ignore[attr-defined]
    for param in spec.bulk_params:
        assert param.name in form.fields, f"the bulk form has no {param.name} for {name}"
    bound = BulkForm({"action": name, **values(spec.bulk_params)})
    assert bound.is_valid(), bound.errors
    assert set(bound.params()) == {p.name for p in spec.bulk_params} - {"reason"}


@pytest.mark.parametrize("name", NAMES)
def test_the_admin_offers_it_asks_for_its_parameters_and_takes_it(
    db: None, name: str, superuser: User
) -> None:
    spec = ACTIONS[name]
    request = RequestFactory().get("/")
    request.user = superuser

    assert name in TaskAdmin(Task, admin.site).get_actions(request)
    task = task_for(spec)
    client: Client = staff_client(superuser)
    changelist = reverse("admin:tasks_app_task_changelist")
    chosen = {"action": name, "_selected_action": [str(task.pk)]}
    confirmation = body(client.post(changelist, {**chosen, "index": "0"}))
    for param in spec.bulk_params:
        assert f'name="{param.name}"' in confirmation, f"no {param.name} asked for {name}"
    client.post(changelist, {**chosen, "confirm": "yes", **values(spec.bulk_params)})
    assert took(spec, task, superuser.username)


@pytest.mark.parametrize("name", NAMES)
def test_the_commands_take_it(db: None, name: str) -> None:
    spec = ACTIONS[name]
    options = {k.replace("-", "_"): v for k, v in values(spec.bulk_params).items()}
    task = task_for(spec)
    call_command("task_action", name, str(task.pk), actor="ops:generic", **options)
    assert took(spec, task, "ops:generic")

    assert name in NAMED_COMMANDS, f"say which named command takes {name}, if any"
    command, extra = NAMED_COMMANDS[name]
    task = task_for(spec)
    call_command(command, str(task.pk), actor="ops:named", **options, **extra)
    assert took(spec, task, "ops:named")


def test_the_table_describes_itself_as_plain_data() -> None:
    described = task_actions.describe()
    assert [row["name"] for row in described] == NAMES
    for row in described:
        assert row["permission"].startswith("tasks_app.")
        assert all(set(param) == {"name", "kind", "required", "bulk"} for param in row["params"])
        assert any(param["name"] == "reason" and param["required"] for param in row["params"])
