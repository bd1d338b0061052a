"""Helpers for the API's tests: a token for a user, a call with it, and each answer
checked against the OpenAPI document the API serves."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from django.contrib.auth.models import Group, User
from django.test import Client
from openapi_schema_validator import OAS31Validator

from approvals.models import ApprovalRequest
from tasks_app.models import AutoApply, Task
from tasks_app.operations import tokens


def token_for(
    user: User, group: str, *, auto_apply: str = AutoApply.NEVER, name: str = "script"
) -> str:
    """A new token of ``user`` taking ``group``'s permissions: its secret."""
    return tokens.issue(user, name=name, group=group, days=30, auto_apply=auto_apply).secret


def call(method: str, path: str, secret: str | None, *, body: Any = None, **headers: str) -> Any:
    """The API's answer to ``method path`` with ``secret`` as bearer token."""
    client = Client()
    if secret is not None:
        headers["Authorization"] = f"Bearer {secret}"
    kwargs: dict[str, Any] = {"headers": headers}
    if body is not None:
        kwargs.update(data=json.dumps(body), content_type="application/json")
    return getattr(client, method.lower())(path, **kwargs)


@cache
def served_document() -> dict[str, Any]:
    answer = Client().get("/api/v1/openapi.json")
    assert answer.status_code == 200
    document: dict[str, Any] = answer.json()
    return document


def conforms(answer: Any, method: str, template: str) -> Any:
    """``answer``'s JSON, after checking it against what the served document says
    ``method template`` answers with that status; an undocumented status fails."""
    document = served_document()
    operation = document["paths"][template][method.lower()]
    documented = operation["responses"].get(str(answer.status_code))
    assert documented is not None, f"{method} {template} does not document {answer.status_code}"
    schema = documented["content"]["application/json"]["schema"]
    body = answer.json()
    OAS31Validator({**schema, "components": document.get("components", {})}).validate(body)
    return body


# --- personas and what they may call -------------------------------------------------------

# Each persona's fixture and the group its token takes; the outsider's is an empty group of
# their own (a token needs a group its user is in).
PERSONAS = {
    "oncall": "oncall",
    "auditor": "auditors",
    "editor": "editors",
    "producer": "producers",
    "outsider": "nobody-much",
}


def persona_token(user: User, persona: str) -> str:
    """A token of ``user`` as ``persona``: the outsider first joins an empty group."""
    group = PERSONAS[persona]
    if persona == "outsider":
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    return token_for(user, group)


@dataclass(frozen=True)
class Endpoint:
    """One operation: its method and path template (as the document lists it), the
    permission it needs, and how a concrete call is made of a ``Sample``."""

    method: str
    template: str
    permission: str
    path: Callable[[Sample], str]
    body: Callable[[Sample], Any] = lambda sample: None

    def __str__(self) -> str:
        return f"{self.method} {self.template}"


@dataclass(frozen=True)
class Sample:
    """What the calls read: a dead task whose key and payload are marked, and a request
    waiting for review."""

    task: Task
    approval: ApprovalRequest

    @property
    def telltales(self) -> list[str]:
        """Text of the objects no refusal may show."""
        assert self.task.idempotency_key is not None
        return [self.task.idempotency_key, SAMPLE_MARK, "Launch day"]


SAMPLE_KEY = "api-sample:dead-7q"
SAMPLE_MARK = "zebra-quokka-91"
SAMPLE_PAYLOAD = {"error": "permanent", "fail_first": 1, "ticket": SAMPLE_MARK}
VIEW_TASK = "tasks_app.view_task"
VIEW_APPROVALS = "approvals.view_approvalrequest"


def sample() -> Sample:
    from tests.factories import dead_task, pending_article_request

    task = dead_task(dict(SAMPLE_PAYLOAD), key=SAMPLE_KEY)
    return Sample(task=task, approval=pending_article_request(key="publish:api-sample-7q"))


ENDPOINTS = [
    Endpoint("GET", "/api/v1/tasks/", VIEW_TASK, lambda s: "/api/v1/tasks/"),
    Endpoint("GET", "/api/v1/tasks/{task_id}", VIEW_TASK, lambda s: f"/api/v1/tasks/{s.task.pk}"),
    Endpoint(
        "POST",
        "/api/v1/tasks/",
        "tasks_app.add_task",
        lambda s: "/api/v1/tasks/",
        lambda s: {"workflow": "demo.noop", "payload": {"note": "from a program"}},
    ),
    Endpoint("GET", "/api/v1/dead/", VIEW_TASK, lambda s: "/api/v1/dead/"),
    Endpoint("GET", "/api/v1/dead/groups/", VIEW_TASK, lambda s: "/api/v1/dead/groups/"),
    Endpoint("GET", "/api/v1/queues/", VIEW_TASK, lambda s: "/api/v1/queues/"),
    Endpoint("GET", "/api/v1/approvals/", VIEW_APPROVALS, lambda s: "/api/v1/approvals/"),
    Endpoint(
        "GET",
        "/api/v1/approvals/{approval_id}",
        VIEW_APPROVALS,
        lambda s: f"/api/v1/approvals/{s.approval.pk}",
    ),
    Endpoint("GET", "/api/v1/audit/", "tasks_app.view_audit_log", lambda s: "/api/v1/audit/"),
    Endpoint("GET", "/api/v1/workflows/", VIEW_TASK, lambda s: "/api/v1/workflows/"),
    Endpoint(
        "GET", "/api/v1/workflows/{name}", VIEW_TASK, lambda s: "/api/v1/workflows/demo.flaky"
    ),
]

# What each persona's group gives, of the permissions above (as the migrations make them).
ALLOWED = {
    "oncall": {VIEW_TASK},
    "auditor": {VIEW_TASK, "tasks_app.view_audit_log"},
    "editor": {VIEW_TASK, VIEW_APPROVALS},
    "producer": {VIEW_TASK, "tasks_app.add_task"},
    "outsider": set(),
}


def names_nothing(answer: Any, sample: Sample) -> None:
    """``answer`` is a refusal (403) that shows nothing of ``sample``'s objects: not their
    text, not their ids."""
    assert answer.status_code == 403, answer.content
    body = answer.json()
    assert body["error"] == "not_permitted"
    text = answer.content.decode()
    for telltale in sample.telltales:
        assert telltale not in text, telltale
    ids = {sample.task.pk, sample.approval.pk, sample.approval.task_id}
    assert not set(map(int, re.findall(r"\d+", body["detail"]))) & ids, body["detail"]
