"""On-call, in the browser, reads a workflow's figures: Workflows from the nav, a week
instead of the day, the workflow with the dead letters, its charts, and on to those dead
letters; no Content-Security-Policy violation, no serious accessibility problem, no
sideways scroll on a phone, and a screenshot for the docs.

The history is a week of samples written directly (``tests.workflow_support``) plus a few
tasks run and killed in this process; no worker runs in this module.
"""

from __future__ import annotations

from pprint import pformat
from typing import Any

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from tasks_app import services
from tasks_app.db.clock import db_now
from tasks_app.engine import runner
from tests.browser.support import (
    OVERFLOW,
    PHONE,
    RECORD_CSP,
    SCREENSHOTS,
    accessibility_problems,
    log_in,
)
from tests.factories import dead_task
from tests.workflow_support import fabricate_history

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(120),
    pytest.mark.django_db(transaction=True),
]


# The elements reaching past the window's right edge, outermost first.
PAST_THE_EDGE = """
() => [...document.querySelectorAll("body *")]
  .filter((e) => e.getBoundingClientRect().right > window.innerWidth + 1)
  .slice(0, 5)
  .map((e) => [e.tagName.toLowerCase(), ...e.classList].join(".")
    + ` ${Math.round(e.getBoundingClientRect().right)}`)
"""


def history() -> list[int]:
    """A week of demo.flaky's history, then two runs and two dead letters of one cause now;
    returns the dead tasks' ids."""
    fabricate_history("demo.flaky", now=db_now())
    for n in range(2):
        runner.run_task_steps(services.enqueue("demo.flaky", {"n": n}).task)
    return [dead_task({"error": "permanent", "fail_first": 1, "n": n}).pk for n in range(2)]


def test_oncall_follows_a_workflows_figures_to_its_dead_letters(page: Page, oncall: User) -> None:
    dead = history()
    page.add_init_script(RECORD_CSP)
    log_in(page, oncall)

    page.get_by_role("navigation", name="Sections").get_by_role("link", name="Workflows").click()
    expect(page).to_have_url("/workflows/")
    expect(page.locator("h1")).to_have_text("Workflows")
    flaky = page.locator('tr[data-workflow="demo.flaky"]')
    expect(flaky.locator('[data-figure="failure_rate"]')).to_contain_text("dead")

    # A week instead of the day: the region swaps in place and the address follows.
    page.evaluate("window.__sameDocument = true")
    page.get_by_role("navigation", name="Window").get_by_role("link", name="Last week").click()
    expect(page).to_have_url("/workflows/?window=week")
    expect(page.locator("#figures-heading")).to_have_text("Over the last week")
    assert page.evaluate("window.__sameDocument === true")
    week = int(flaky.locator('[data-figure="succeeded"]').inner_text())
    assert week > 10_000, week

    flaky.get_by_role("link", name="demo.flaky").click()
    expect(page).to_have_url("/workflows/demo.flaky/?window=week")
    expect(page.locator("h1")).to_have_text("demo.flaky")
    expect(page.locator("#charts-heading")).to_have_text("Over the last week")
    expect(page.locator("#charts svg")).to_have_count(3)
    # A bar per six hours, each with its numbers on hover.
    expect(page.locator("#charts svg.bars rect.bar").first).to_be_attached()
    expect(page.locator(".y-ticks li").first).to_be_visible()
    # The two dead letters of today died of one cause.
    cause = page.locator("tr[data-fingerprint]")
    expect(cause).to_have_count(1)
    expect(cause).to_contain_text("PermanentError")
    page.screenshot(path=SCREENSHOTS / "workflow.png", full_page=True)

    page.get_by_role("link", name="All dead letters of demo.flaky").click()
    expect(page).to_have_url("/dead/?workflow=demo.flaky")
    for pk in dead:
        expect(page.locator(f'a[href="/tasks/{pk}/"]').first).to_be_visible()
    assert page.evaluate("window.__csp") == []


def test_the_workflow_pages_read_well_on_a_phone_and_to_a_screen_reader(
    page: Page, oncall: User
) -> None:
    history()
    page.add_init_script(RECORD_CSP)
    log_in(page, oncall)
    axe = Axe()
    wide: dict[str, Any] = {}
    found: dict[str, Any] = {}
    for name, url in (
        ("workflows", "/workflows/?window=hour"),
        ("workflow", "/workflows/demo.flaky/?window=day"),
    ):
        for viewport in (None, PHONE):
            if viewport is not None:
                page.set_viewport_size(viewport)
            page.goto(url)
            expect(page.locator("h1")).to_be_visible()
            if name == "workflow":  # its causes come in a request of their own
                expect(page.locator("#causes tr[data-fingerprint]")).to_have_count(1)
            label = f"{name} at {'390' if viewport else '1280'} px"
            widths = page.evaluate(OVERFLOW)
            if max(widths["document"], widths["body"]) > widths["window"]:
                wide[label] = {**widths, "past the edge": page.evaluate(PAST_THE_EDGE)}
            if problems := accessibility_problems(page, axe):
                found[label] = problems
            shot = f"narrow-{name}.png" if viewport is not None else f"{name}.png"
            if name == "workflows" or viewport is not None:
                page.screenshot(path=SCREENSHOTS / shot, full_page=True)
        page.set_viewport_size({"width": 1280, "height": 800})
    assert not wide, "pages wider than their window:\n" + pformat(wide)
    assert not found, "accessibility problems:\n" + pformat(found, width=100)
    assert page.evaluate("window.__csp") == []
