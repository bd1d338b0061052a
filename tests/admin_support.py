"""What the admin's tests share: a logged-in staff client, the add form's fields, and the
errors a page's form shows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib.auth.models import User
from django.http import HttpRequest
from django.test import Client

if TYPE_CHECKING:
    # What the test client answers: a response with the context it rendered.
    from django.test.client import _MonkeyPatchedWSGIResponse as Response

ADD_URL = "admin:tasks_app_task_add"


def staff_client(user: User) -> Client:
    """A logged-in client of ``user``, made staff so the admin lets them in."""
    user.is_staff = True
    user.save()
    client = Client()
    # Every authentication goes through axes' backend, which needs a request to count by.
    assert client.login(
        request=HttpRequest(), username=user.username, password="pw-" + user.username
    )
    return client


def form_errors(response: Response) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = response.context["adminform"].form.errors
    return errors


def enqueue_form(**fields: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "workflow": "publish_article",
        "payload": '{"article_id": "a-1", "title": "Launch", "brief": "Why."}',
        "idempotency_key": "",
        "queue": "default",
        "priority": "0",
        "run_after_0": "",
        "run_after_1": "",
    }
    data.update(fields)
    return data
