"""The console's defences and refusals: a strict content security policy, htmx served
locally, the CSRF token on every post, logging in, and a refused page or write answered
and logged with its reason."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tasks_app.models import TaskStatus
from tests.console_support import HTMX, body, login
from tests.factories import dead_task

pytestmark = pytest.mark.django_db


def test_every_page_sends_a_strict_content_security_policy_with_a_nonce(superuser: User) -> None:
    response = login(superuser).get("/")
    policy = response["Content-Security-Policy"]
    assert "script-src 'self' 'nonce-" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    nonce = re.search(r"'nonce-([^']+)'", policy)
    assert nonce is not None
    # Every script tag carries this response's nonce.
    scripts = re.findall(r"<script[^>]*>", body(response))
    assert scripts and all(f'nonce="{nonce.group(1)}"' in tag for tag in scripts)
    assert "style=" not in body(response)


def test_htmx_sends_the_csrf_token_from_the_body_and_is_served_locally(superuser: User) -> None:
    page = body(login(superuser).get("/"))
    assert re.search(r"""<body hx-headers='\{"X-CSRFToken": "[A-Za-z0-9]{32,}"\}'>""", page)
    assert "/static/django_htmx/htmx-2" in page and "https://" not in page


def test_a_post_without_the_csrf_token_is_refused_and_changes_nothing(oncall: User) -> None:
    task = dead_task()
    client = login(oncall, enforce_csrf_checks=True)
    response = client.post(f"/tasks/{task.pk}/cancel/", {"reason": "x"})
    assert response.status_code == 403
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD

    page = body(client.get(f"/tasks/{task.pk}/"))
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token is not None
    response = client.post(
        f"/tasks/{task.pk}/cancel/", {"reason": "x", "csrfmiddlewaretoken": token.group(1)}
    )
    assert response.status_code == 302
    task.refresh_from_db()
    assert task.status == TaskStatus.CANCELLED


def test_htmx_posts_carry_the_token_in_a_header(oncall: User) -> None:
    task = dead_task()
    client = login(oncall, enforce_csrf_checks=True)
    client.get(f"/tasks/{task.pk}/")
    response = client.post(
        f"/tasks/{task.pk}/cancel/",
        {"reason": "x"},
        headers={**HTMX, "X-CSRFToken": client.cookies["csrftoken"].value},
    )
    assert response.status_code == 200
    assert "cancel requested" in body(response)


def test_the_login_page_logs_in_and_goes_to_the_overview(oncall: User) -> None:
    client = Client()
    response = client.post(
        "/accounts/login/",
        {"username": oncall.username, "password": "pw-" + oncall.username},
        follow=True,
    )
    assert response.redirect_chain[-1] == ("/", 302)
    assert 'data-stat="pending"' in body(response)


def test_a_refused_page_says_so_in_the_console_and_offers_a_logout(outsider: User) -> None:
    response = login(outsider).get("/")
    assert response.status_code == 403
    page = body(response)
    assert "<h1>Not permitted</h1>" in page
    assert 'action="/accounts/logout/"' in page
    assert ">Overview</a>" not in page  # the nav shows only what the viewer may use


def test_a_refused_write_is_logged_with_who_what_and_why(
    editor: User, caplog: pytest.LogCaptureFixture
) -> None:
    task = dead_task()
    with caplog.at_level("WARNING", logger="tasks_app.events"):
        response = login(editor).post(f"/tasks/{task.pk}/cancel/", {"reason": "mine"})
    assert response.status_code == 403
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("action_")]
    assert line.startswith("action_refused ")
    assert f"user={editor.username}" in line
    assert "action=console:task_cancel" in line
    assert f"object=/tasks/{task.pk}/cancel/" in line


def test_each_refusal_carries_its_status_and_an_input_error_lands_on_its_field() -> None:
    from django import forms as django_forms
    from django.test import RequestFactory

    from console import errors
    from tasks_app.exceptions import InvalidInput, InvalidTransition, NotPermitted

    class Edit(django_forms.Form):
        title = django_forms.CharField()
        reason = django_forms.CharField()

    request = RequestFactory().post("/")
    assert errors.refusal(request, InvalidTransition("task #1 already succeeded")) == (
        errors.Refusal(409, "task #1 already succeeded")
    )
    refused = errors.refusal(request, NotPermitted("needs redrive_task"))
    assert (refused.status, refused.message) == (403, "Not permitted: needs redrive_task")
    form = Edit({"title": "Launch", "reason": "typo"})
    assert form.is_valid()
    # ``draft.title`` on a form of the draft's fields is its ``title``; a field the form
    # lacks is the form's as a whole.
    assert errors.refusal(request, InvalidInput("draft.title", "required"), form) == (
        errors.Refusal(400, "")
    )
    errors.refusal(request, InvalidInput("payload.x", "known_field"), form)
    assert form.errors["title"] == ["draft.title: required"]
    assert form.non_field_errors() == ["payload.x: known_field"]
