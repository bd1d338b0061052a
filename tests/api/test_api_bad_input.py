"""Bad input answers 400 as JSON naming the field and the rule it broke, and stores
nothing: a list's filters are the console's (so are their rules), a parameter no list
reads is refused rather than ignored, and an enqueue follows the input rules; an
idempotency key finds the task it made, or conflicts naming itself."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from tasks_app.models import Event, Task
from tests.api_support import ENDPOINTS, Endpoint, call, conforms, sample, token_for

pytestmark = pytest.mark.django_db

TASKS = "/api/v1/tasks/"

# A list, a query string it refuses, the field it names and the rule.
BAD_FILTERS = [
    ("/api/v1/tasks/", "status=nope", "status", "invalid"),
    ("/api/v1/tasks/", "after=0", "after", "invalid"),
    ("/api/v1/tasks/", "after=soon", "after", "int_parsing"),
    ("/api/v1/tasks/", "since=garbage", "since", "invalid"),
    ("/api/v1/tasks/", "payload=article_id", "payload", "invalid"),
    ("/api/v1/tasks/", "workflow=no.such.workflow", "workflow", "invalid"),
    ("/api/v1/dead/", "after=0", "after", "invalid"),
    ("/api/v1/dead/", "queue=nope", "queue", "invalid"),
    ("/api/v1/dead/", "fingerprint=not-a-cause!", "fingerprint", "invalid"),
    ("/api/v1/dead/groups/", "workflow=nope", "workflow", "invalid"),
    ("/api/v1/audit/", "since=garbage", "since", "invalid"),
    ("/api/v1/audit/", "after=0", "after", "invalid"),
    ("/api/v1/audit/", "kind=nope", "kind", "invalid"),
    ("/api/v1/audit/", "since=2026-01-02&until=2026-01-01", "until", "invalid"),
    ("/api/v1/audit/", "plan=xyz", "plan", "invalid"),
    ("/api/v1/workflows/", "window=month", "window", "invalid"),
    ("/api/v1/workflows/demo.noop", "window=month", "window", "invalid"),
]


def refused_for(answer: Any, field: str, rule: str) -> dict[str, Any]:
    assert answer.status_code == 400, answer.content
    body: dict[str, Any] = answer.json()
    assert (body["error"], body["field"], body["rule"]) == ("invalid_input", field, rule), body
    assert body["detail"].startswith(f"{field}:"), body["detail"]
    return body


@pytest.mark.parametrize(("path", "query", "field", "rule"), BAD_FILTERS)
def test_a_bad_filter_is_refused_naming_its_field(
    path: str, query: str, field: str, rule: str, superuser: User
) -> None:
    secret = token_for(superuser, "auditors")
    answer = call("GET", f"{path}?{query}", secret)
    refused_for(answer, field, rule)
    template = path if "demo" not in path else "/api/v1/workflows/{name}"
    conforms(answer, "GET", template)


def test_the_filter_rule_is_the_consoles_own_message() -> None:
    # One home per rule: the API says what the console's form says.
    from console.forms import AuditFilterForm

    form = AuditFilterForm({"since": "garbage"})
    assert not form.is_valid()
    assert str(form.errors["since"][0]).startswith("since: a date and time")


def test_the_audit_filter_names_the_rule_as_the_page_does(superuser: User) -> None:
    answer = call("GET", "/api/v1/audit/?since=garbage", token_for(superuser, "auditors"))
    assert refused_for(answer, "since", "invalid")["detail"].startswith("since: a date and time")


# A group whose token may call an endpoint needing the permission (editors may read tasks
# and approvals).
GROUP_FOR = {"tasks_app.add_task": "producers", "tasks_app.view_audit_log": "auditors"}


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=str)
def test_a_parameter_no_operation_reads_is_refused_not_ignored(
    endpoint: Endpoint, superuser: User
) -> None:
    seen = sample()
    secret = token_for(superuser, GROUP_FOR.get(endpoint.permission, "editors"))
    tasks = Task.objects.count()
    path = f"{endpoint.path(seen)}?colour=red"
    answer = call(endpoint.method, path, secret, body=endpoint.body(seen))
    body = refused_for(answer, "colour", "unexpected")
    assert body["detail"] == "colour: not a filter of this list"
    assert Task.objects.count() == tasks


def enqueue(**fields: Any) -> dict[str, Any]:
    """An enqueue's body: a noop with an empty payload, but for ``fields``."""
    return {"workflow": "demo.noop", "payload": {}, **fields}


# An enqueue's body, what it breaks (field, rule).
BAD_ENQUEUES = [
    (enqueue(payload=[1, 2]), "payload", "object"),
    (enqueue(payload="text"), "payload", "object"),
    (enqueue(workflow="no.such.workflow"), "workflow", "registered"),
    (enqueue(idempotency_key="a b"), "idempotency_key", "printable_ascii"),
    (enqueue(idempotency_key="task-7"), "idempotency_key", "reserved_prefix"),
    (enqueue(priority=101), "priority", "range"),
    (enqueue(priority="high"), "priority", "int_parsing"),
    (enqueue(queue="nope"), "queue", "known_queue"),
    (enqueue(run_after="2030-01-01T09:00:00"), "run_after", "timezone_aware"),
    ({"payload": {}}, "workflow", "missing"),
]


@pytest.mark.parametrize(("body", "field", "rule"), BAD_ENQUEUES)
def test_a_bad_enqueue_is_refused_naming_its_field_and_stores_nothing(
    body: dict[str, Any], field: str, rule: str, producer: User
) -> None:
    secret = token_for(producer, "producers")
    tasks, events = Task.objects.count(), Event.objects.count()
    answer = call("POST", TASKS, secret, body=body)
    refused_for(answer, field, rule)
    conforms(answer, "POST", TASKS)
    assert (Task.objects.count(), Event.objects.count()) == (tasks, events)


def test_a_body_that_is_not_json_is_refused_and_stores_nothing(producer: User) -> None:
    from django.test import Client

    secret = token_for(producer, "producers")
    tasks = Task.objects.count()
    answer = Client().post(
        TASKS,
        data="{workflow: demo.noop",
        content_type="application/json",
        headers={"Authorization": f"Bearer {secret}"},
    )
    assert answer.status_code == 400, answer.content
    body = conforms(answer, "POST", TASKS)
    assert (body["error"], body["field"], body["rule"]) == ("invalid_input", "body", "json")
    assert Task.objects.count() == tasks


def test_the_same_key_with_the_same_payload_finds_the_task_it_made(producer: User) -> None:
    secret = token_for(producer, "producers")
    body = {"workflow": "demo.noop", "payload": {"n": 1}, "idempotency_key": "import:row-1"}
    first = call("POST", TASKS, secret, body=body)
    assert first.status_code == 201
    again = call("POST", TASKS, secret, body=body)
    assert again.status_code == 200
    found = conforms(again, "POST", TASKS)
    assert found["created"] is False
    assert found["task"]["id"] == first.json()["task"]["id"]
    assert Task.objects.filter(idempotency_key="import:row-1").count() == 1


def test_the_same_key_with_another_payload_conflicts_naming_the_key(producer: User) -> None:
    secret = token_for(producer, "producers")
    body = {"workflow": "demo.noop", "payload": {"n": 1}, "idempotency_key": "import:row-2"}
    assert call("POST", TASKS, secret, body=body).status_code == 201
    tasks = Task.objects.count()
    answer = call("POST", TASKS, secret, body={**body, "payload": {"n": 2}})
    assert answer.status_code == 409
    conflict = conforms(answer, "POST", TASKS)
    assert (conflict["error"], conflict["field"], conflict["rule"]) == (
        "conflict",
        "idempotency_key",
        "conflict",
    )
    assert Task.objects.count() == tasks
