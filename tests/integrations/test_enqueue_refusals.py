"""What a person who enqueues by hand is told: an unknown workflow names the workflows
they may choose (never the internal ones), and a refused input names every rule it breaks
at once, each with its field, through the service, the admin's add form and the command,
with nothing stored."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from tasks_app import services
from tasks_app.exceptions import InvalidInput, InvalidPayload, UnknownWorkflow
from tasks_app.integrations.admin_forms import EnqueueForm
from tasks_app.models import Event, Task
from tasks_app.workflows import registry
from tests.admin_support import ADD_URL, enqueue_form, form_errors, staff_client
from tests.command_support import refused

if TYPE_CHECKING:
    from django.test.client import _MonkeyPatchedWSGIResponse as Response

INTERNAL = ("approvals.notify", "django.task")
PUBLIC = ("demo.deliver", "demo.flaky", "demo.noop", "press_release", "publish_article")


def nothing_stored() -> bool:
    return not Task.objects.exists() and not Event.objects.exists()


def test_the_internal_workflows_are_registered_but_not_public(db: None) -> None:
    assert set(INTERNAL) <= set(registry.names())
    assert not set(INTERNAL) & set(registry.public_names())
    assert set(PUBLIC) <= set(registry.public_names())


# --- an unknown workflow --------------------------------------------------------------------


def assert_names_the_public_workflows(message: str) -> None:
    assert message.startswith("workflow: 'demo.nope' is not a registered workflow; known: ")
    known = message.split("known: ", 1)[1].split(", ")
    assert known == registry.public_names()
    assert not set(INTERNAL) & set(known)


def test_the_service_refuses_an_unknown_workflow_naming_the_public_ones(db: None) -> None:
    with pytest.raises(UnknownWorkflow) as refusal:
        services.enqueue("demo.nope", {})
    assert (refusal.value.field, refusal.value.rule) == ("workflow", "registered")
    assert_names_the_public_workflows(str(refusal.value))
    assert nothing_stored()


def test_the_command_refuses_an_unknown_workflow_naming_the_public_ones(db: None) -> None:
    assert_names_the_public_workflows(refused("enqueue", "demo.nope"))


def test_the_admin_refuses_an_unknown_workflow_naming_the_public_ones(superuser: User) -> None:
    response = staff_client(superuser).post(reverse(ADD_URL), enqueue_form(workflow="demo.nope"))
    [message] = form_errors(response)["workflow"]
    assert_names_the_public_workflows(message)
    assert nothing_stored()


# --- every broken rule at once ------------------------------------------------------------------


def test_the_service_names_every_rule_a_payload_and_the_other_inputs_break(db: None) -> None:
    with pytest.raises(InvalidInput) as refusal:
        services.enqueue(
            "publish_article",
            {"article_id": "a-1", "title": "", "extra": 1},
            idempotency_key="task-1",
            queue="nowhere",
            priority=101,
        )
    broken = [(error.field, error.rule) for error in refusal.value.errors]
    assert broken == [
        ("payload.extra", "known_field"),
        ("payload.title", "required"),
        ("payload.brief", "required"),
        ("idempotency_key", "reserved_prefix"),
        ("queue", "known_queue"),
        ("priority", "range"),
    ]
    # The first names the refusal, and its message carries each rule's.
    assert (refusal.value.field, refusal.value.rule) == ("payload.extra", "known_field")
    for error in refusal.value.errors:
        assert str(error) in str(refusal.value)
    assert nothing_stored()


def test_a_payload_breaking_only_payload_rules_is_an_invalid_payload(db: None) -> None:
    with pytest.raises(InvalidPayload) as refusal:
        services.enqueue("demo.flaky", {"fail_first": -1, "error": "nope", "sleep": "x"})
    assert sorted(error.field for error in refusal.value.errors) == [
        "payload.error",
        "payload.fail_first",
        "payload.sleep",
    ]


def test_the_general_payload_rules_are_all_named_too(db: None) -> None:
    with pytest.raises(InvalidPayload) as refusal:
        services.enqueue("demo.noop", {"a": float("nan"), "b": "nul\x00", "c": {1, 2}})
    assert sorted(error.rule for error in refusal.value.errors) == [
        "finite_numbers",
        "json_types",
        "no_nul",
    ]


def test_a_batch_names_each_rule_with_its_item(db: None) -> None:
    with pytest.raises(InvalidInput) as refusal:
        services.enqueue_many(
            [
                {"workflow": "demo.noop", "payload": {}},
                {"workflow": "ticket_reply", "payload": {"ticket_id": "t-1"}, "queue": "x"},
            ]
        )
    assert [error.field for error in refusal.value.errors] == [
        "items[1].payload.customer_id",
        "items[1].payload.message",
        "items[1].queue",
    ]
    assert str(refusal.value).startswith("items[1].payload.customer_id: ")
    assert nothing_stored()


def test_the_command_names_every_broken_rule_on_one_line(db: None) -> None:
    message = refused(
        "enqueue", "ticket_reply", "--payload", '{"ticket_id": ""}', "--priority", "500"
    )
    assert re.findall(r"(\S+): ", message) == [
        "payload.ticket_id",
        "payload.customer_id",
        "payload.message",
        "priority",
    ]


def test_the_admin_shows_every_broken_rule_on_its_field(superuser: User) -> None:
    response: Response = staff_client(superuser).post(
        reverse(ADD_URL),
        enqueue_form(payload='{"article_id": "a-1", "extra": true}', idempotency_key="task-9"),
    )
    errors = form_errors(response)
    assert errors["payload"] == [
        "payload.extra: not a field",
        "payload.title: a non-empty string is required",
        "payload.brief: a non-empty string is required",
    ]
    assert errors["idempotency_key"] == ["idempotency_key: may not start with 'task-'"]
    assert nothing_stored()


# --- the add form offers the public workflows, in plain words ------------------------------------


def test_the_add_form_offers_only_public_workflows(db: None) -> None:
    form = EnqueueForm()
    offered = [value for value, _ in form.fields["workflow"].choices if value]  # type: ignore[attr-defined]
    assert offered == registry.public_names()


def test_the_payload_help_lists_each_public_workflow_once_without_markup(
    superuser: User,
) -> None:
    body = staff_client(superuser).get(reverse(ADD_URL)).content.decode()
    helptext = body.split('id="id_payload_helptext"', 1)[1].split("</ul></div>", 1)[0]
    assert re.findall(r'data-workflow="([^"]+)"', helptext) == registry.public_names()
    for name in INTERNAL:
        assert name not in helptext
    assert "``" not in helptext and ":func:" not in helptext
    # Each rule once: filling in the required fields does not repeat them.
    assert helptext.count("payload.brief: a non-empty string is required") == 2  # two flows
    assert 'src="/static/admin/tasks_app/enqueue.js"' in body
