"""Every value from a payload, a draft, an error or a reason is shown inert on the
console's pages, and secrets in them are redacted at any depth."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from approvals.models import ApprovalRequest
from tasks_app import services
from tasks_app.models import Step
from tests.approval_support import advance, pending_request
from tests.console_support import body, login
from tests.factories import dead_task, enqueued, pending_article_request

pytestmark = pytest.mark.django_db


HOSTILE = '<script>alert(1)</script><img src=x onerror=alert(2) hx-get="/evil" hx-on:click="x()">'


HOSTILE_URL = "javascript:alert(3)"


def test_hostile_payloads_errors_and_keys_are_shown_as_text(superuser: User) -> None:
    task = dead_task(
        {"error": "permanent", "fail_first": 1, "note": HOSTILE, "link": HOSTILE_URL},
        key="hostile:<b>key</b>",
    )
    Step.objects.filter(task=task).update(last_error=HOSTILE, error_class=HOSTILE)
    client = login(superuser)
    for url in (f"/tasks/{task.pk}/", "/dead/", "/tasks/", "/audit/"):
        page = body(client.get(url))
        assert "<script>alert(1)" not in page, url
        assert 'hx-get="/evil"' not in page and "onerror=alert" not in page.replace(
            "onerror=alert(2)", ""
        ).replace("&lt;img src=x onerror=alert(2)", ""), url
        assert 'href="javascript:' not in page, url
    detail = body(client.get(f"/tasks/{task.pk}/"))
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in detail
    assert "hostile:&lt;b&gt;key&lt;/b&gt;" in detail


def test_a_hostile_draft_is_shown_as_text_on_its_review(editor: User, author: User) -> None:
    task = enqueued(
        "publish_article",
        {"article_id": "a-1", "title": HOSTILE, "brief": HOSTILE_URL},
        actor=author,
    )
    request = pending_request(advance(task))
    page = body(login(editor).get(f"/approvals/{request.pk}/"))
    assert "<script>alert(1)" not in page and 'hx-get="/evil"' not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert 'href="javascript:' not in page


def test_secret_keys_are_redacted_at_any_depth(superuser: User) -> None:
    task = dead_task(
        {
            "error": "permanent",
            "fail_first": 1,
            "password": "hunter2",
            "nested": {"API-Key": "k-123", "list": [{"Authorization": "Bearer abc"}]},
        }
    )
    page = body(login(superuser).get(f"/tasks/{task.pk}/"))
    for secret in ("hunter2", "k-123", "Bearer abc"):
        assert secret not in page
    assert page.count("•••redacted•••") >= 3


def test_errors_and_reasons_quoting_secrets_are_shown_without_them(
    superuser: User, oncall: User
) -> None:
    payload = {"api_token": "tok-5ecret", "nested": [{"Client-Secret": "cs-5ecret"}]}
    task = dead_task({"error": "permanent", "fail_first": 1, **payload})
    quoted = f"tasks_app.exceptions.PermanentError: remote refused {payload!r}"
    Step.objects.filter(task=task).update(
        last_error=f"Traceback (most recent call last):\n{quoted}"
    )
    cancelled = dead_task()
    services.cancel(cancelled, actor=oncall, reason="leaked session_id=sess-5ecret, giving up")
    client = login(superuser)
    for url in (f"/tasks/{task.pk}/", f"/tasks/{cancelled.pk}/", "/dead/", "/audit/"):
        page = body(client.get(url))
        for secret in ("tok-5ecret", "cs-5ecret", "sess-5ecret"):
            assert secret not in page, (url, secret)
    detail = body(client.get(f"/tasks/{task.pk}/"))
    assert "&#x27;api_token&#x27;: •••redacted•••" in detail
    assert "session_id=•••redacted•••, giving up" in body(client.get(f"/tasks/{cancelled.pk}/"))


def test_a_draft_under_review_shows_no_secret(editor: User, author: User) -> None:
    request = pending_article_request(actor=author)
    ApprovalRequest.objects.filter(pk=request.pk).update(
        draft={"title": "Launch day", "api_token": "tok-5ecret"}
    )
    page = body(login(editor).get(f"/approvals/{request.pk}/"))
    assert "Launch day" in page and "tok-5ecret" not in page
    assert "•••redacted•••" in page
