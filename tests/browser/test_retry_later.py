"""On-call, in the browser, puts off a dead letter's next run: Retry after a delay on the
task page (a refused delay first, then a good one), the task then listed as retry
scheduled; and the same for a filtered batch through the dead letters' bulk form.

The tasks die in this process (no worker runs in this module): what is checked is what
the pages say and what the database holds after each step."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from tasks_app import services
from tasks_app.models import Event, EventKind, StepStatus, Task, TaskStatus
from tests.browser.support import SCREENSHOTS, action_form, log_in, status_badge
from tests.factories import dead_task
from tests.operator_support import snapshot

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(120),
    pytest.mark.django_db(transaction=True),
]

LATER = "Retry after a delay"


def _due_in(task: Task) -> timedelta:
    step = task.steps.get()
    assert step.available_at is not None
    return step.available_at - services.db_now()


def test_oncall_retries_a_dead_task_after_a_delay(page: Page, oncall: User) -> None:
    task = dead_task()
    log_in(page, oncall)
    page.goto(f"/tasks/{task.pk}/")
    expect(status_badge(page)).to_have_text("dead")
    form = action_form(page, LATER)
    expect(form.get_by_role("heading")).to_have_text(LATER)
    # The delay offers the usual choices and takes any other.
    expect(form.locator("datalist option")).to_have_count(4)

    # A delay beyond the cap is refused on its field, and nothing changes.
    before = snapshot(task)
    form.get_by_label("Delay").fill("8d")
    form.get_by_label("Reason").fill("The remote's fix ships after lunch")
    form.get_by_role("button", name=LATER, exact=True).click()
    refused = action_form(page, LATER)
    expect(refused.locator(".field-error")).to_have_text(
        "delay: more than 0 and at most 7 days: minutes (15), or a number and s, m, h or d "
        "(90s, 5m, 1h, 2d)"
    )
    expect(status_badge(page)).to_have_text("dead")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOTS / "retry-later-refused.png", full_page=True)
    assert snapshot(task) == before

    # What was typed stays; a good delay is taken.
    expect(refused.get_by_label("Reason")).to_have_value("The remote's fix ships after lunch")
    refused.get_by_label("Delay").fill("45")
    refused.get_by_role("button", name=LATER, exact=True).click()

    expect(page.locator("#task")).to_contain_text(
        f"Task #{task.pk}: scheduled to run again after the delay."
    )
    expect(status_badge(page)).to_have_text("pending")
    expect(page.locator(".timeline .kind-redriven")).to_contain_text("to run again after 45 min")
    expect(page.get_by_role("button", name=LATER, exact=True)).to_have_count(0)
    page.screenshot(path=SCREENSHOTS / "retry-later.png", full_page=True)
    step = task.steps.get()
    assert (step.status, step.attempts) == (StepStatus.PENDING, 0)
    assert timedelta(minutes=44) < _due_in(task) <= timedelta(minutes=45)
    event = Event.objects.for_task(task.pk).get(kind=EventKind.REDRIVEN)
    assert (event.actor, event.reason, event.data["delay_seconds"]) == (
        oncall.username,
        "The remote's fix ships after lunch",
        2700,
    )

    # The task list's "retry scheduled" view lists it until it is due.
    page.goto("/tasks/?status=retry_scheduled")
    expect(page.locator("#results").get_by_role("link", name=f"#{task.pk}")).to_be_visible()


def test_a_retry_someone_else_made_first_is_refused_and_changes_nothing(
    page: Page, oncall: User
) -> None:
    task = dead_task()
    log_in(page, oncall)
    page.goto(f"/tasks/{task.pk}/")
    form = action_form(page, LATER)
    form.get_by_label("Delay").fill("15m")
    form.get_by_label("Reason").fill("Wait for the fix")
    # Meanwhile another on-call engineer redrives it from the command line.
    services.redrive(task, actor="cli:bob", reason="fixed already")
    before = snapshot(task)

    form.get_by_role("button", name=LATER, exact=True).click()

    expect(page.locator("#task .notice.error")).to_have_text(
        f"task #{task.pk} has no dead step to redrive"
    )
    expect(status_badge(page)).to_have_text("pending")
    expect(page.get_by_role("button", name=LATER, exact=True)).to_have_count(0)
    page.screenshot(path=SCREENSHOTS / "retry-later-conflict.png", full_page=True)
    assert snapshot(task) == before


def test_oncall_retries_a_filtered_batch_after_a_delay(page: Page, oncall: User) -> None:
    tasks = [dead_task(), dead_task()]
    log_in(page, oncall)
    page.goto("/dead/")
    bulk = page.locator("#bulk")

    bulk.get_by_label("Action").select_option(label=LATER)
    bulk.get_by_label("Reason").fill("Remote maintenance until 14:00")
    bulk.get_by_label("Delay (for Retry after a delay)").fill("2h")
    bulk.get_by_role("button", name="Preview").click()

    plan = bulk.locator(".plan")
    expect(plan).to_contain_text("Plan: Retry 2 tasks after the delay (delay 2h)")
    expect(bulk.get_by_label("Delay (for Retry after a delay)")).to_have_attribute("readonly", "")
    assert {t.status for t in Task.objects.filter(pk__in=[t.pk for t in tasks])} == {
        TaskStatus.DEAD
    }
    bulk.get_by_role("button", name="Retry 2 tasks after the delay", exact=True).click()

    expect(bulk.locator(".notice.success")).to_contain_text("Retry after a delay: 2 tasks changed")
    for task in tasks:
        task.refresh_from_db()
        assert task.status == TaskStatus.PENDING
        assert timedelta(minutes=119) < _due_in(task) <= timedelta(hours=2)
        event = Event.objects.for_task(task.pk).get(kind=EventKind.REDRIVEN)
        assert (event.actor, event.data["delay_seconds"]) == (oncall.username, 7200)
        assert event.data["plan"]
