"""An auditor, in the browser, reads a task as it stood after each of its events: a graph
task whose branch died and was redriven with its title edited. Stepping through the events
shows its steps and payload change; two points chosen show what changed between them. The
section swaps in place on the task page, with no Content-Security-Policy violation and no
serious accessibility problem, and a screenshot for the docs.

The steps run in this process (``tests.as_of_support``); no worker runs in this module.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from tasks_app.models import Task
from tests.as_of_support import point_of, redriven_diamond
from tests.browser.support import (
    OVERFLOW,
    PHONE,
    RECORD_CSP,
    SCREENSHOTS,
    accessibility_problems,
    log_in,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(120),
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def task() -> Iterator[Task]:
    with redriven_diamond(name="test.as_of.browser", key="orders:2024-06") as made:
        yield made


def test_an_auditor_steps_through_a_redriven_task_and_compares_two_points(
    page: Page, auditor: User, task: Task
) -> None:
    page.add_init_script(RECORD_CSP)
    log_in(page, auditor)
    page.goto(f"/tasks/{task.pk}/")
    section = page.locator("#as-of")
    state = section.locator(".as-of-state")
    expect(state).to_contain_text("No event chosen yet.")

    def shows(heading: str, status: str, start: str) -> None:
        expect(state.locator("h3").first).to_have_text(heading)
        expect(state.locator("dl.facts .badge").first).to_have_text(status)
        start_row = state.locator("table tr", has=page.locator("td", has_text="start")).first
        expect(start_row.locator(".badge")).to_have_text(start)

    # The first event: the task as its enqueue made it, swapped in on the task page.
    section.locator("#as-of-at-0").click()
    shows("After event #0: enqueued", "pending", "pending")
    expect(page).to_have_url(f"/tasks/{task.pk}/")
    expect(state.locator("pre.json").first).to_contain_text('"title": "Old"')
    expect(state).to_contain_text("No step had been claimed yet.")

    # Step through: its first step claimed, then done; focus stays on the button.
    section.locator("#as-of-next").click()
    shows("After event #1: claimed", "running", "running")
    expect(page.locator("#as-of-next")).to_be_focused()
    expect(state.locator("table", has_text="Outcome then")).to_contain_text("held")
    page.locator("#as-of-next").click()
    shows("After event #2: succeeded", "pending", "succeeded")
    expect(state).to_contain_text("orders:2024-06:0:start:write_start")

    # The dead letter, then the redrive with the edited title.
    dead, redriven = point_of(task, "dead_lettered"), point_of(task, "redriven")
    section.locator(f"#as-of-at-{dead}").click()
    shows(f"After event #{dead}: dead lettered", "dead", "succeeded")
    expect(state.locator("pre.json").first).to_contain_text('"title": "Old"')
    section.locator(f"#as-of-at-{redriven}").click()
    shows(f"After event #{redriven}: redriven", "pending", "succeeded")
    expect(state.locator("pre.json").first).to_contain_text('"title": "New"')
    expect(state).to_contain_text("the remote is back")

    # Compared with the dead letter: what the redrive changed, in words.
    section.locator(f"#as-of-compare-{dead}").click()
    changes = state.locator(".as-of-changes li")
    expect(changes).to_have_text(
        [
            "task: dead → pending",
            "step b: dead → pending, attempts 1 → 0",
            "payload.title: 'Old' → 'New'",
        ]
    )
    expect(section.locator("li.compared")).to_contain_text("dead lettered")
    expect(section.locator("li.chosen")).to_contain_text("redriven")
    section.scroll_into_view_if_needed()
    section.screenshot(path=SCREENSHOTS / "task-as-of.png")

    # The address of what is shown opens it as a page of its own.
    state.get_by_role("link", name="Link to this view").click()
    expect(page).to_have_url(f"/tasks/{task.pk}/as-of/?at={redriven}&compare={dead}")
    expect(page.locator(".as-of-changes li")).to_have_count(3)

    assert page.evaluate("window.__csp") == []
    assert accessibility_problems(page, Axe()) == []


def test_on_a_phone_the_events_stack_above_the_state(page: Page, auditor: User, task: Task) -> None:
    log_in(page, auditor)
    page.set_viewport_size(PHONE)
    dead, redriven = point_of(task, "dead_lettered"), point_of(task, "redriven")
    page.goto(f"/tasks/{task.pk}/as-of/?at={redriven}&compare={dead}")
    expect(page.locator(".as-of-changes li")).to_have_count(3)
    widths = page.evaluate(OVERFLOW)
    assert max(widths["document"], widths["body"]) <= widths["window"], widths
    events = page.locator(".as-of-events").bounding_box()
    state = page.locator(".as-of-state").bounding_box()
    assert events is not None and state is not None
    assert events["y"] + events["height"] <= state["y"]
