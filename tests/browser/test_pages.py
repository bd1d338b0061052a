"""Every page in a real browser: live regions that refresh or swap without a reload, no
Content-Security-Policy violation, no serious accessibility violation, no sideways scroll on
a phone, and a screenshot of each for the docs."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pprint import pformat
from typing import Any

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.contrib.auth.models import User
from playwright.sync_api import ConsoleMessage, Page, expect

from approvals import services as approvals
from approvals.models import ApprovalRequest
from tasks_app import services
from tasks_app.models import Task, TaskStatus
from tests.approval_support import ARTICLE, TICKET
from tests.browser.support import (
    LINES,
    OVERFLOW,
    PHONE,
    RECORD_CSP,
    SCREENSHOTS,
    accessibility_problems,
    action_form,
    log_in,
    pending_request,
    task_status,
)
from tests.e2e_support import Worker, wait_for

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(120),
    pytest.mark.django_db(transaction=True),
]

NOT_DONE = [TaskStatus.PENDING, TaskStatus.RUNNING]


# --- a console with something on every page ------------------------------------------------


@dataclass(frozen=True)
class Staged:
    dead: Task
    review: ApprovalRequest

    @property
    def pages(self) -> list[tuple[str, str]]:
        """Each page after logging in: its screenshot's name and its address."""
        return [
            ("overview", "/"),
            ("tasks", "/tasks/"),
            ("task-detail", f"/tasks/{self.dead.pk}/"),
            ("dead-letters", "/dead/"),
            ("approvals", "/approvals/"),
            ("review", f"/approvals/{self.review.pk}/"),
            ("queues", "/queues/"),
            ("limits", "/limits/"),
            ("audit", "/audit/"),
        ]


def stage(worker: Worker, *, oncall: User, editor: User, author: User) -> Staged:
    """Tasks in every state the pages show, run by the worker: finished ones, one retried,
    a dead letter whose payload holds a secret and markup, a draft sent back once (so its
    review has a diff and an earlier decision) and a reply waiting for review."""
    for n in range(3):
        services.enqueue("demo.noop", {"n": n}, idempotency_key=f"browser:noop:{n}")
    services.enqueue("demo.flaky", {"fail_first": 1}, idempotency_key="browser:retried")
    dead = services.enqueue(
        "demo.flaky",
        {
            "error": "permanent",
            "fail_first": 1,
            "note": "<script>alert('escaped')</script>",
            "api_key": "sk-live-not-shown",
        },
        idempotency_key="browser:dead",
        actor="cli:producer",
    ).task
    article = services.enqueue(
        "publish_article", ARTICLE, idempotency_key="browser:article-001", actor=author
    ).task
    services.enqueue("ticket_reply", TICKET, idempotency_key="browser:reply:T-42", actor=author)
    first = pending_request(article, worker)
    approvals.request_changes(
        first, actor=editor, comment="Say which day the launch is.", draft_hash=first.draft_hash
    )
    review = pending_request(article, worker, revision=1)
    wait_for(
        lambda: not Task.objects.filter(status__in=NOT_DONE).exists(),
        timeout=30,
        what=lambda: "every staged task to settle or wait for review\n" + worker.tail(),
    )
    services.pause_queue("default", actor=oncall, reason="Database failover drill")
    services.resume_queue("default", actor=oncall, reason="Drill over")
    return Staged(dead=task_status(dead, TaskStatus.DEAD, worker), review=review)


def tour(page: Page, staged: Staged, user: User) -> Iterator[str]:
    """Open every page in turn, the login page first; yield each one's name once shown."""
    page.goto("/accounts/login/")
    yield "login"
    log_in(page, user)
    for name, url in staged.pages:
        page.goto(url)
        expect(page.locator("h1")).to_be_visible()
        yield name


# --- live regions ----------------------------------------------------------------------------


def test_the_overview_updates_by_itself(page: Page, worker: Worker, oncall: User) -> None:
    log_in(page, oncall)
    page.goto("/")
    stat = page.locator('[data-stat="succeeded_last_hour"]')
    before = int(stat.inner_text())
    page.evaluate("window.__sameDocument = true")

    task = services.enqueue("demo.noop", {}, actor="cli:producer").task

    # The region polls every 5 s; the worker takes well under a second.
    expect(stat).not_to_have_text(str(before), timeout=20_000)
    assert int(stat.inner_text()) == before + 1
    assert page.evaluate("window.__sameDocument") is True, "the page was reloaded"
    assert task_status(task, TaskStatus.SUCCEEDED, worker).finished_at is not None


def test_filtering_tasks_swaps_the_results_without_reloading_the_page(
    page: Page, worker: Worker, oncall: User
) -> None:
    done = services.enqueue("demo.noop", {}, actor="cli:producer").task
    dead = services.enqueue("demo.flaky", {"error": "permanent", "fail_first": 1}).task
    task_status(done, TaskStatus.SUCCEEDED, worker)
    task_status(dead, TaskStatus.DEAD, worker)
    log_in(page, oncall)
    page.goto("/tasks/")
    results = page.locator("#results")
    expect(results.get_by_role("link", name=f"#{dead.pk}", exact=True)).to_be_visible()
    heading = page.locator("h1").element_handle()
    page.evaluate("window.__sameDocument = true")

    page.get_by_label("Status").select_option("succeeded")
    page.get_by_role("button", name="Filter").click()

    expect(page).to_have_url(re.compile(r"/tasks/\?(.*&)?status=succeeded(&|$)"))
    expect(results.get_by_role("link", name=f"#{dead.pk}", exact=True)).to_have_count(0)
    expect(results.get_by_role("link", name=f"#{done.pk}", exact=True)).to_be_visible()
    assert page.evaluate("h => h.isConnected && document.querySelector('h1') === h", heading)
    assert page.evaluate("window.__sameDocument") is True, "the page was reloaded"
    expect(page.get_by_label("Status")).to_have_value("succeeded")


# --- every page ------------------------------------------------------------------------------


def test_no_page_violates_the_content_security_policy(
    page: Page, worker: Worker, superuser: User, oncall: User, editor: User, author: User
) -> None:
    staged = stage(worker, oncall=oncall, editor=editor, author=author)
    console: list[str] = []

    def record(message: ConsoleMessage) -> None:
        console.append(f"{page.url}: console {message.type}: {message.text}")

    page.on("console", record)
    page.on("pageerror", lambda error: console.append(f"{page.url}: page error: {error}"))
    page.add_init_script(RECORD_CSP)
    violations: dict[str, Any] = {}
    for name in tour(page, staged, superuser):
        if name == "tasks":
            # htmx at work under the policy: a filter swapped in.
            page.get_by_label("Status").select_option("dead")
            page.get_by_role("button", name="Filter").click()
            expect(page).to_have_url(re.compile(r"status=dead"))
            expect(page.locator("#results tbody tr")).to_have_count(1)
        if name == "dead-letters":
            # And a POST: the bulk form's preview.
            page.get_by_label("Action").select_option("redrive")
            page.get_by_label("Reason").fill("Checking the count first")
            page.get_by_role("button", name="Preview").click()
            expect(page.get_by_role("button", name="Redrive 1 task")).to_be_visible()
        if found := page.evaluate("window.__csp"):
            violations[name] = found

    assert not violations, "CSP violations:\n" + pformat(violations)
    assert not console, "console messages:\n" + "\n".join(console)
    assert Task.objects.get(pk=staged.dead.pk).status == TaskStatus.DEAD  # only previewed


def test_no_page_has_a_serious_accessibility_violation(
    page: Page, worker: Worker, superuser: User, oncall: User, editor: User, author: User
) -> None:
    staged = stage(worker, oncall=oncall, editor=editor, author=author)
    axe = Axe()
    found: dict[str, list[Any]] = {}
    checked = []
    for name in tour(page, staged, superuser):
        if problems := accessibility_problems(page, axe):
            found[name] = problems
        checked.append(name)
    # A form swapped back with an error in place: the error is tied to its field.
    page.goto(f"/tasks/{staged.dead.pk}/")
    form = action_form(page, "Redrive with changes")
    form.get_by_label("Payload", exact=True).fill("[1]")
    # The reason is required in the browser too; the payload's rule is the server's.
    form.get_by_role("textbox", name="Reason").fill("Fixing the payload")
    form.get_by_role("button", name="Redrive with changes").click()
    payload = form.get_by_label("Payload", exact=True)
    expect(payload).to_have_attribute("aria-invalid", "true")
    expect(payload).to_have_accessible_description(re.compile("must be a JSON object"))
    if problems := accessibility_problems(page, axe):
        found["task-detail with an error"] = problems

    assert len(checked) == len(staged.pages) + 1
    assert not found, "accessibility problems:\n" + pformat(found, width=100)


def test_every_page_has_a_screenshot_for_the_docs(
    page: Page, worker: Worker, superuser: User, oncall: User, editor: User, author: User
) -> None:
    staged = stage(worker, oncall=oncall, editor=editor, author=author)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    taken = []
    for name in tour(page, staged, superuser):
        path = SCREENSHOTS / f"{name}.png"
        page.screenshot(path=path, full_page=True)
        assert path.read_bytes().startswith(b"\x89PNG"), path
        taken.append(name)

    assert taken == ["login", *(name for name, _ in staged.pages)]


def test_no_page_scrolls_sideways_on_a_phone(
    page: Page, worker: Worker, superuser: User, oncall: User, editor: User, author: User
) -> None:
    staged = stage(worker, oncall=oncall, editor=editor, author=author)
    # Unbreakable text where the pages show keys and payloads.
    long = services.enqueue(
        "demo.noop",
        {"blob": "0123456789" * 30},
        idempotency_key="browser:narrow:" + "0123456789" * 15,
    ).task
    task_status(long, TaskStatus.SUCCEEDED, worker)
    page.set_viewport_size(PHONE)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    axe = Axe()
    wide: dict[str, dict[str, int]] = {}
    # A table that scrolls on a phone and holds nothing focusable must take the focus
    # itself, or a keyboard cannot scroll it (axe's scrollable-region-focusable).
    found: dict[str, list[Any]] = {}
    checked = []
    error_class_lines = 0
    for name in tour(page, staged, superuser):
        if name == "task-detail":
            # The dead step's traceback, long lines and all.
            page.get_by_text("Full error").click()
            expect(page.locator("pre.error-text")).to_be_visible()
        if name == "dead-letters":
            error_class = page.locator("#results td.mono").first
            expect(error_class).to_contain_text("PermanentError")
            error_class_lines = error_class.evaluate(LINES)
        widths = page.evaluate(OVERFLOW)
        if max(widths["document"], widths["body"]) > widths["window"]:
            wide[name] = widths
        if problems := accessibility_problems(page, axe):
            found[name] = problems
        page.screenshot(path=SCREENSHOTS / f"narrow-{name}.png", full_page=True)
        checked.append(name)

    assert checked == ["login", *(name for name, _ in staged.pages)]
    assert not wide, "pages wider than a 390 px window:\n" + pformat(wide)
    assert error_class_lines == 1, f"the error class on /dead/ takes {error_class_lines} lines"
    assert not found, "accessibility problems on a phone:\n" + pformat(found, width=100)
