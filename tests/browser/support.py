"""What the browser tests share: the browser's settings, logging in through the real form,
waiting (with a deadline) for the worker and for what a page shows, and what a page is
checked for (CSP violations, accessibility, its width on a phone, lines of text)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from axe_playwright_python.sync_playwright import Axe
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

# Each page records the violations the browser reports, from before its first script.
RECORD_CSP = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.__csp.push(
    `${event.effectiveDirective} refused ${event.blockedURI || "inline"}`
    + ` at ${event.sourceFile}:${event.lineNumber}`
  );
});
"""
SERIOUS = {"serious", "critical"}
# Axe leaves an ARIA reference to a missing id undecided (the element might come later);
# on a rendered page every one must resolve.
DANGLING_ARIA_IDS = """
() => [...document.querySelectorAll("[aria-describedby], [aria-labelledby], [aria-controls]")]
  .flatMap((element) => ["aria-describedby", "aria-labelledby", "aria-controls"]
    .flatMap((name) => (element.getAttribute(name) || "").split(/\\s+/).filter(Boolean)
      .filter((id) => !document.getElementById(id))
      .map((id) => `${element.id || element.tagName.toLowerCase()} ${name}=${id}`)))
"""
# A phone held upright (an iPhone 12 to 15).
PHONE: ViewportSize = {"width": 390, "height": 844}
# The window's width and how wide the document and the body are, in CSS pixels.
OVERFLOW = """
() => ({
  window: window.innerWidth,
  document: document.documentElement.scrollWidth,
  body: document.body.scrollWidth,
})
"""
# How many lines a cell's text takes: a dotted error class broken letter by letter takes
# dozens.
LINES = """
(cell) => {
  const range = document.createRange();
  range.selectNodeContents(cell);
  return new Set([...range.getClientRects()].map((rect) => Math.round(rect.top))).size;
}
"""


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


def accessibility_problems(
    page: Page, axe: Axe, *, impacts: set[str] | None = SERIOUS
) -> list[Any]:
    """Axe's violations of ``impacts`` (serious and critical; ``None`` for every one), and
    ARIA references to missing ids."""
    problems: list[Any] = [
        {
            "id": violation["id"],
            "impact": violation["impact"],
            "help": violation["help"],
            "targets": [node["target"] for node in violation["nodes"]],
        }
        for violation in axe.run(page).response["violations"]
        if impacts is None or violation["impact"] in impacts
    ]
    problems.extend(f"dangling reference: {ref}" for ref in page.evaluate(DANGLING_ARIA_IDS))
    return problems
