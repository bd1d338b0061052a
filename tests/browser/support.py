"""What the browser tests share: the browser's settings, logging in through the real form,
and waiting (with a deadline) for the worker and for what a page shows."""

from __future__ import annotations

from pathlib import Path

from django.contrib.auth.models import User
from playwright.sync_api import Locator, Page, ViewportSize, expect

from approvals.models import ApprovalRequest, ApprovalStatus
from tasks_app.models import Task
from tests.e2e_support import ROOT, Worker, wait_for

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
VIEWPORT: ViewportSize = {"width": 1280, "height": 800}
TIMEOUT_MS = 10_000
SCREENSHOTS = ROOT / "docs" / "screenshots"


def password(user: User) -> str:
    """The personas' password (``tests/conftest.py``)."""
    return "pw-" + user.username


def log_in(page: Page, user: User) -> None:
    page.goto("/accounts/login/")
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill(password(user))
    page.get_by_role("button", name="Log in").click()
    expect(page.locator(".who")).to_have_text(user.username)


def task_status(task: Task, status: str, worker: Worker, *, timeout: float = 30) -> Task:
    """Wait until the task has ``status`` in the database; return it fresh."""
    wait_for(
        lambda: Task.objects.filter(pk=task.pk, status=status).exists(),
        timeout=timeout,
        what=lambda: f"task #{task.pk} to be {status}\n{worker.tail()}",
    )
    return Task.objects.get(pk=task.pk)


def pending_request(task: Task, worker: Worker, *, revision: int = 0) -> ApprovalRequest:
    """Wait until the task's request of ``revision`` is pending; return it."""
    return wait_for(
        lambda: ApprovalRequest.objects.filter(
            task=task, revision=revision, status=ApprovalStatus.PENDING
        ).first(),
        timeout=30,
        what=lambda: f"a pending request of revision {revision} for #{task.pk}\n{worker.tail()}",
    )


def status_badge(page: Page) -> Locator:
    """The task's status on its page (the steps table has badges of its own)."""
    return page.locator("#task .facts .badge")


def page_shows_status(page: Page, task: Task, status: str, *, timeout: float = 30) -> None:
    """Reload the task's page until its status badge reads ``status``.

    The page does not refresh itself; an operator reloads it, and so does this.
    """
    url = f"/tasks/{task.pk}/"
    badge = status_badge(page)

    def shown() -> bool:
        page.goto(url)
        return badge.inner_text() == status

    wait_for(
        shown,
        timeout=timeout,
        interval=0.25,
        what=lambda: f"{url} to show {status!r}; it shows {badge.inner_text()!r}",
    )


def action_form(page: Page, button: str) -> Locator:
    """The task page's form whose submit button is named ``button``."""
    return page.locator("form").filter(has=page.get_by_role("button", name=button, exact=True))
