"""Who may call what: every endpoint for every persona's token, answered as the document
says or refused with 403 showing nothing of what was asked for; a token is cut to its
group, a superuser's too."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User

from tasks_app.models import Task
from tasks_app.operations import tokens
from tests.api_support import (
    ALLOWED,
    ENDPOINTS,
    PERSONAS,
    Endpoint,
    call,
    conforms,
    names_nothing,
    persona_token,
    sample,
    token_for,
)

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=str)
@pytest.mark.parametrize("persona", list(PERSONAS))
def test_each_persona_is_answered_as_documented_or_refused_naming_nothing(
    persona: str, endpoint: Endpoint, request: pytest.FixtureRequest
) -> None:
    secret = persona_token(request.getfixturevalue(persona), persona)
    seen = sample()
    tasks_before = Task.objects.count()
    answer = call(endpoint.method, endpoint.path(seen), secret, body=endpoint.body(seen))
    if endpoint.permission in ALLOWED[persona]:
        assert answer.status_code in (200, 201), answer.content
        conforms(answer, endpoint.method, endpoint.template)
    else:
        names_nothing(answer, seen)
        conforms(answer, endpoint.method, endpoint.template)
        assert Task.objects.count() == tasks_before


@pytest.mark.parametrize("persona", list(PERSONAS))
def test_the_table_of_what_each_persona_may_is_what_their_groups_give(
    persona: str, request: pytest.FixtureRequest
) -> None:
    token = tokens.find(persona_token(request.getfixturevalue(persona), persona))
    assert token is not None
    acting = tokens.acting_user(token)
    permissions = {endpoint.permission for endpoint in ENDPOINTS}
    assert {p for p in permissions if acting.has_perm(p)} == ALLOWED[persona]


MISSING = [
    ("/api/v1/tasks/{task_id}", "/api/v1/tasks/2147483000"),
    ("/api/v1/approvals/{approval_id}", "/api/v1/approvals/2147483000"),
    ("/api/v1/workflows/{name}", "/api/v1/workflows/no.such.workflow"),
]


@pytest.mark.parametrize(("template", "path"), MISSING)
def test_a_reader_of_what_is_not_there_gets_404(template: str, path: str, superuser: User) -> None:
    secret = token_for(superuser, "editors")
    answer = call("GET", path, secret)
    assert answer.status_code == 404
    assert conforms(answer, "GET", template)["error"] == "not_found"


@pytest.mark.parametrize(("template", "path"), MISSING)
def test_a_refused_reader_cannot_tell_what_is_there_from_what_is_not(
    template: str, path: str, outsider: User
) -> None:
    secret = persona_token(outsider, "outsider")
    seen = sample()
    present = {
        "/api/v1/tasks/{task_id}": f"/api/v1/tasks/{seen.task.pk}",
        "/api/v1/approvals/{approval_id}": f"/api/v1/approvals/{seen.approval.pk}",
        "/api/v1/workflows/{name}": "/api/v1/workflows/demo.flaky",
    }[template]
    missing, there = call("GET", path, secret), call("GET", present, secret)
    assert missing.status_code == there.status_code == 403
    assert missing.json() == there.json()


def test_a_superusers_token_cut_to_the_auditors_reads_the_log_and_cannot_enqueue(
    superuser: User,
) -> None:
    secret = token_for(superuser, "auditors")
    before = Task.objects.count()
    answer = call("POST", "/api/v1/tasks/", secret, body={"workflow": "demo.noop", "payload": {}})
    assert answer.status_code == 403
    assert answer.json()["detail"] == "Not permitted: add_task is required."
    assert Task.objects.count() == before
    assert call("GET", "/api/v1/audit/", secret).status_code == 200
    assert call("GET", "/api/v1/approvals/", secret).status_code == 403


def test_a_token_has_its_groups_permissions_only_not_all_its_users(auditor: User) -> None:
    auditor.groups.add(Group.objects.get(name="editors"))
    secret = token_for(auditor, "editors")
    assert call("GET", "/api/v1/approvals/", secret).status_code == 200
    assert call("GET", "/api/v1/audit/", secret).status_code == 403
