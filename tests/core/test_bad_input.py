"""Bad input through every way in: a clear refusal naming the field, and nothing stored.

Each example draws a valid call (workflow, payload, key, queue, priority, run_after) and
corrupts exactly one field, so the field the refusal must name is known. The ways in:

- ``services.enqueue`` (Python values, so also what JSON cannot say);
- the ``enqueue`` command (exit status 2 and one line);
- the admin's add form (the error on its field, status 200);
- the console's redrive with changes (status 400, the task as it was).

After every example no task, step or event was added (and the console's task kept its
payload and status). Valid payloads, drawn the same way, are stored exactly as their
canonical JSON says, and the same key with the same payload returns the same task.
"""

from __future__ import annotations

import itertools
import json
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from hypothesis import given
from hypothesis import strategies as st

from tasks_app import services
from tasks_app.exceptions import InvalidInput
from tasks_app.models import Event, EventKind, Task, TaskStatus
from tasks_app.validation import MAX_DEPTH, canonical_json, payload_errors, plainly_valid
from tests.bad_input_strategies import (
    Bad,
    Call,
    argv,
    bad_payloads,
    bad_python_calls,
    bad_text_calls,
    depth,
    examples,
    flaky_payloads,
    json_objects,
    json_text,
    stored,
    structurally_bad,
)
from tests.console_support import login
from tests.factories import dead_task

pytestmark = pytest.mark.django_db

# --- (a) services.enqueue ---------------------------------------------------------------------


@examples(200)
@given(bad=bad_python_calls())
def test_enqueue_refuses_one_bad_field_naming_it_and_stores_nothing(db: None, bad: Bad) -> None:
    call, field, rule = bad
    before = stored()
    with pytest.raises(InvalidInput) as caught:
        services.enqueue(call.pop("workflow"), call.pop("payload"), **call, actor="cli:hypothesis")
    assert (caught.value.field, caught.value.rule) == (field, rule), str(caught.value)
    assert str(caught.value).startswith(f"{field}: ")
    assert stored() == before


# --- (b) the enqueue command ------------------------------------------------------------------


@examples(80)
@given(bad=bad_text_calls(admin=False))
def test_the_enqueue_command_refuses_with_one_line_and_status_2(
    db: None, bad: tuple[Call, str]
) -> None:
    call, field = bad
    before = stored()
    with pytest.raises(CommandError) as caught:
        call_command("enqueue", *argv(call), stdout=StringIO(), stderr=StringIO())
    assert caught.value.returncode == 2
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{field}: "), message
    assert stored() == before


# --- (c) the admin's add form -----------------------------------------------------------------


def form_data(call: Call) -> dict[str, str]:
    run_after = call["run_after"]
    if run_after is None:
        day, time = "", ""
    elif isinstance(run_after, tuple):
        day, time = run_after
    else:
        day, time = run_after.date().isoformat(), run_after.time().isoformat()
    key = call["idempotency_key"]
    return {
        "workflow": call["workflow"],
        "payload": json_text(call["payload"]),
        "idempotency_key": "" if key is None else key,
        "queue": call["queue"],
        "priority": str(call["priority"]),
        "run_after_0": day,
        "run_after_1": time,
    }


@pytest.fixture
def admin_client(superuser: User) -> Client:
    return login(superuser)


@examples(60)
@given(bad=bad_text_calls(admin=True))
def test_the_admin_add_form_shows_the_error_on_its_field_and_stores_nothing(
    admin_client: Client, bad: tuple[Call, str]
) -> None:
    call, field = bad
    before = stored()
    response = admin_client.post("/admin/tasks_app/task/add/", form_data(call))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == [field.split(".")[0]], (field, errors)
    if field.startswith("payload"):
        assert errors["payload"][0].startswith(f"{field}: "), errors
    assert stored() == before


# --- (d) the console's redrive with changes ---------------------------------------------------

DEAD_PAYLOAD = {"error": "permanent", "fail_first": 1}


@pytest.fixture
def dead() -> Task:
    return dead_task(dict(DEAD_PAYLOAD))


@pytest.fixture
def oncall_client(oncall: User) -> Client:
    return login(oncall)


@st.composite
def bad_edits(draw: st.DrawFn) -> tuple[str, str]:
    payload = draw(flaky_payloads())
    bad, field, _ = draw(bad_payloads("demo.flaky", payload, False))
    return json_text(bad), field


@examples(60)
@given(edit=bad_edits())
def test_a_bad_edited_payload_is_refused_and_the_dead_task_stays_as_it_was(
    dead: Task, oncall_client: Client, edit: tuple[str, str]
) -> None:
    text, field = edit
    before = stored()
    response = oncall_client.post(
        f"/tasks/{dead.pk}/redrive/", {"reason": "fixed the input", "payload": text}
    )
    assert response.status_code == 400
    errors = response.context["changes_form"].errors
    assert list(errors) == ["payload"], errors
    assert errors["payload"][0].startswith(f"{field}: "), errors
    assert stored() == before
    dead.refresh_from_db()
    assert (dead.status, dead.payload) == (TaskStatus.DEAD, DEAD_PAYLOAD)
    assert not Event.objects.filter(task_id=dead.pk, kind=EventKind.REDRIVEN).exists()


# --- valid payloads are stored exactly --------------------------------------------------------

_keys = itertools.count()


def same(a: Any, b: Any) -> bool:
    """Equal, with the same JSON types all the way down (True is not 1, 1.0 is not 1)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and a == b


@examples(60)
@given(payload=json_objects.filter(lambda p: depth(p) <= MAX_DEPTH))
def test_a_valid_payload_is_stored_as_its_canonical_json_and_a_repeat_is_the_same_task(
    db: None, payload: dict[str, Any]
) -> None:
    key = f"roundtrip:{next(_keys)}"
    canonical = canonical_json(payload)
    tasks, steps, events = stored()

    first = services.enqueue("demo.noop", payload, idempotency_key=key)
    assert first.created
    # The task row and its step record the enqueue: no Event row.
    assert stored() == (tasks + 1, steps + 1, events)
    task = Task.objects.get(pk=first.task.pk)
    assert same(task.payload, json.loads(canonical)), (task.payload, canonical)
    assert canonical_json(task.payload) == canonical_json(json.loads(canonical))

    # The same object with its keys in another order is the same payload.
    again = services.enqueue("demo.noop", dict(reversed(payload.items())), idempotency_key=key)
    assert (again.created, again.task.pk) == (False, first.task.pk)
    assert stored() == (tasks + 1, steps + 1, events)


@examples(200)
@given(
    case=json_objects.flatmap(lambda payload: structurally_bad(payload, python=True))
    | json_objects.map(lambda payload: (payload, None))
)
def test_the_quick_walk_passes_nothing_the_full_walk_refuses_but_what_the_text_shows(
    case: tuple[Any, str | None],
) -> None:
    # validation.plainly_valid is payload_errors' twin for the payloads producers send: what
    # it passes, the full walk may refuse only for a NUL or a lone surrogate in a string,
    # which the canonical text shows, or for a size, which is checked on that text.
    payload, rule = case
    if not isinstance(payload, dict):
        return
    found = {error.rule for error in payload_errors(payload)}
    if plainly_valid(payload):
        assert found <= {"no_nul", "valid_unicode"}, (rule, found)
    if rule is not None and rule != "max_bytes":
        assert rule in found
