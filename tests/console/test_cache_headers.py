"""No browser or proxy keeps a copy of a page that shows tasks, drafts or audit rows: every
answer a view makes says ``Cache-Control: no-store``, refusals and exports included, while
static files keep the long caching WhiteNoise gives them."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.http.response import HttpResponseBase
from django.test import Client
from django.urls import reverse

from tasks_app.models import Task
from tests.approval_support import advance, article, pending_request
from tests.console_support import HTMX, login
from tests.factories import dead_task, succeeded

pytestmark = pytest.mark.django_db


def is_not_stored(response: HttpResponseBase) -> bool:
    directives = {part.strip() for part in response.get("Cache-Control", "").split(",")}
    return "no-store" in directives


@pytest.fixture
def world(author: User) -> dict[str, Any]:
    review_task = advance(article(actor=author))
    return {"dead": dead_task(), "review": pending_request(review_task)}


def console_urls(world: dict[str, Any]) -> list[str]:
    return [
        "/",
        "/tasks/",
        f"/tasks/{world['dead'].pk}/",
        "/dead/",
        "/approvals/",
        f"/approvals/{world['review'].pk}/",
        "/queues/",
        "/limits/",
        "/audit/",
        "/audit/export.csv",
    ]


def test_every_console_page_and_its_htmx_region_is_not_stored(
    superuser: User, world: dict[str, Any]
) -> None:
    client = login(superuser)
    for url in console_urls(world):
        for headers in ({}, HTMX):
            response = client.get(url, headers=headers)
            assert response.status_code == 200, (url, headers)
            assert is_not_stored(response), (url, headers, response.get("Cache-Control"))


def test_the_audit_export_is_not_stored(auditor: User, world: dict[str, Any]) -> None:
    response = login(auditor).get("/audit/export.csv")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert is_not_stored(response)


def test_a_refused_page_and_a_refused_action_are_not_stored(
    outsider: User, editor: User, world: dict[str, Any]
) -> None:
    page = login(outsider).get("/")
    action = login(editor).post(f"/tasks/{world['dead'].pk}/redrive/", {"reason": "mine"})
    assert page.status_code == action.status_code == 403
    assert is_not_stored(page) and is_not_stored(action)


def test_an_invalid_and_a_conflicting_action_are_not_stored(oncall: User) -> None:
    client = login(oncall)
    dead, done = dead_task(), succeeded()
    invalid = client.post(f"/tasks/{dead.pk}/redrive/", {"reason": ""}, headers=HTMX)
    conflicting = client.post(f"/tasks/{done.pk}/cancel/", {"reason": "too late"})
    assert invalid.status_code == 400 and conflicting.status_code == 409
    assert is_not_stored(invalid) and is_not_stored(conflicting)


def test_the_admin_change_page_of_a_task_is_not_stored(superuser: User) -> None:
    task: Task = dead_task()
    response = login(superuser).get(reverse("admin:tasks_app_task_change", args=[task.pk]))
    assert response.status_code == 200
    assert is_not_stored(response)


def test_a_view_that_sets_its_own_caching_keeps_it(client: Client) -> None:
    # The login page, like the admin, says never-cache in its own words (Django's).
    response = client.get("/accounts/login/")
    assert response.status_code == 200
    assert "private" in response["Cache-Control"] and is_not_stored(response)


def test_a_static_file_keeps_its_caching(client: Client) -> None:
    response = client.head("/static/console/console.css")  # the headers, without the file
    assert response.status_code == 200
    assert "max-age=" in response["Cache-Control"]
    assert not is_not_stored(response)
