"""Helpers for the API's tests: a token for a user, a call with it, and each answer
checked against the OpenAPI document the API serves."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from django.contrib.auth.models import User
from django.test import Client
from openapi_schema_validator import OAS31Validator

from tasks_app.models import AutoApply
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
