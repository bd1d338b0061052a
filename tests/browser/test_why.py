"""On-call asks "Why isn't this running?" in a real browser: the task page of a task held
back by each kind of blocker names it in words with its link, the page keeps its CSP and
reads well on a phone, and the task list and the Overview say it in short.

The tasks are built in this process (no worker runs in this module; a heartbeat row stands
for one consuming the default queue): what is checked is what the pages say."""

from __future__ import annotations

from typing import Any

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from tests import why_support as made
from tests.browser.support import (
    PHONE,
    RECORD_CSP,
    SCREENSHOTS,
    accessibility_problems,
    log_in,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(180),
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("why_workflows"),
]

why_workflows = made.why_workflows

# What each kind's sentence says, at least.
SAYS = {
    "limit_concurrency": "is at its concurrency of 1",
    "limit_rate": "is at its rate of 1/h",
    "limit_paused": "was paused by cli:olivia",
    "limit_held": "A remote asked to be left alone",
    "lease": "is running on worker",
    "lease_expired": "its lease ran out",
    "approval": "waits for a decision by editors",
    "awaiting_version": "A worker without test.why.rolled v2 handed step 0 (publish) back",
    "run_after": "is scheduled to start",
    "retry": "Attempt 1 of 3",
    "earlier_step": "Step 1 (publish) waits for step 0 (draft), which is running.",
    "dead": "waits for a person to redrive, resolve or cancel it",
    "no_worker": "No live worker consumes queue “other”",
    "queue_paused": "Queue “default” was paused by cli:olivia",
}


def test_the_task_page_names_each_kind_of_blocker(page: Page, oncall: User, settings: Any) -> None:
    settings.TASKS_QUEUES = ["default", "other"]
    made.live_worker("default")
    tasks = {kind: fixture() for kind, fixture in made.EACH.items() if kind != "limit_unknown"}
    # The missing worker: a task in a queue nobody consumes.
    tasks["no_worker"] = made.enqueue(made.PAIR, queue="other")
    page.add_init_script(RECORD_CSP)
    log_in(page, oncall)
    for kind, task in tasks.items():
        page.goto(f"/tasks/{task.pk}/")
        why = page.get_by_role("region", name="Why isn't this running?")
        blocker = why.locator(f'[data-blocker="{kind}"]')
        expect(blocker).to_contain_text(SAYS[kind])
        if kind in made.LINKS:
            link = blocker.get_by_role("link").first
            expect(link).to_have_attribute("href", made.LINKS[kind])
        assert page.evaluate("window.__csp") == [], kind
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.goto(f"/tasks/{tasks['limit_concurrency'].pk}/")
    page.screenshot(path=str(SCREENSHOTS / "why-concurrency.png"), full_page=False)
    page.goto(f"/tasks/{tasks['approval'].pk}/")
    assert accessibility_problems(page, Axe()) == []
    page.set_viewport_size(PHONE)
    page.reload()
    width = page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= PHONE["width"], width
    page.screenshot(path=str(SCREENSHOTS / "why-approval-phone.png"), full_page=False)


def test_a_limit_nobody_here_declares_is_named(page: Page, oncall: User) -> None:
    made.live_worker("default")
    task = made.unknown_limit()
    log_in(page, oncall)
    page.goto(f"/tasks/{task.pk}/")
    blocker = page.locator('[data-blocker="limit_unknown"]')
    expect(blocker).to_contain_text("No workflow on this console's side declares limit")


def test_the_list_and_the_overview_say_what_work_waits_on(page: Page, oncall: User) -> None:
    made.live_worker("default")
    waiting = made.at_rate()
    made.enqueue(f"{made.LIMITED}.hourly")
    log_in(page, oncall)
    page.goto("/tasks/")
    row = page.locator("#results tr").filter(has=page.get_by_role("link", name=f"#{waiting.pk}"))
    expect(row.locator(".waiting-on")).to_contain_text("rate limit why-hourly")
    page.screenshot(path=str(SCREENSHOTS / "why-tasks.png"), full_page=False)
    page.goto("/")
    expect(page.locator('[data-reason="limit_rate"]')).to_have_text(
        "2 steps wait on the rate limit why-hourly"
    )
    page.screenshot(path=str(SCREENSHOTS / "why-overview.png"), full_page=True)
