"""On-call, in the browser, during an incident: sees the dead letters as a few causes, opens
one, and acts on that cause alone after the preview says which tasks have external writes
in doubt; on a task's page, sees what a rerun would repeat before redriving, and the page
follows a redrive made elsewhere without a reload."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from tasks_app import services
from tasks_app.models import Event, Task, TaskStatus
from tests.browser.support import SCREENSHOTS, log_in, status_badge
from tests.cause_support import causes, dead, dead_step

__all__ = ["causes"]  # the fixture, used by name

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(120),
    pytest.mark.django_db(transaction=True),
]


def test_oncall_acts_on_one_cause_after_the_preview_names_the_writes_in_doubt(
    page: Page, causes: None, oncall: User
) -> None:
    outage = [
        dead("test.causes.a", "HTTP 503 from /articles/17"),
        dead("test.causes.b", "HTTP 503 from /articles/18", writes=["publish"]),
        dead("test.causes.a", "HTTP 503 from /articles/19", writes=["publish"], hangs=["notify"]),
    ]
    other = [dead("test.causes.a", f"connection refused by 10.0.0.{n}") for n in (7, 8)]
    log_in(page, oncall)

    page.goto("/dead/")
    page.get_by_role("link", name="Group them by cause").click()
    expect(page).to_have_url("/dead/groups/")
    rows = page.locator("#groups tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_contain_text("HTTP 503 from /articles/<n>")
    expect(rows.nth(0).locator(".count")).to_have_text("3")
    expect(rows.nth(0)).to_contain_text("test.causes.a, test.causes.b")
    expect(rows.nth(1)).to_contain_text("connection refused by <n>.<n>")
    expect(rows.nth(1).locator(".count")).to_have_text("2")
    # Times say how long ago, with the moment and its zone on hover.
    expect(rows.nth(0).locator("time").first).to_have_attribute("title", re.compile(r".* UTC$"))
    page.screenshot(path=SCREENSHOTS / "dead-groups.png", full_page=True)

    rows.nth(0).get_by_role("link", name="Act on them").click()
    cause = dead_step(outage[0]).error_fingerprint
    expect(page).to_have_url(f"/dead/?fingerprint={cause}#bulk")
    expect(page.locator(".notice.cause")).to_contain_text("Showing one cause")
    expect(page.locator("#results tbody tr")).to_have_count(3)

    bulk = page.locator("#bulk")
    bulk.get_by_label("Action").select_option(label="Redrive")
    bulk.get_by_label("Reason").fill("The remote is back after the outage")
    bulk.get_by_role("button", name="Preview").click()
    plan = bulk.locator(".plan")
    expect(plan).to_contain_text("Plan: Redrive 3 tasks")
    expect(plan).to_contain_text(f"cause {cause}")
    expect(plan.locator(".in-doubt")).to_contain_text("1 task has external writes in doubt")
    expect(plan.locator(".in-doubt")).to_contain_text("they will be called again with the same key")
    expect(plan.locator(".in-doubt").get_by_role("link")).to_have_text(f"#{outage[2].pk}")
    expect(plan).to_contain_text("2 tasks have external writes that happened")
    plan.scroll_into_view_if_needed()
    page.screenshot(path=SCREENSHOTS / "bulk-preview-effects.png", full_page=True)
    assert Task.objects.filter(status=TaskStatus.DEAD).count() == 5  # nothing changed yet

    bulk.get_by_role("button", name="Redrive 3 tasks").click()
    expect(bulk.locator(".notice.success")).to_contain_text("Redrive: 3 tasks changed")
    # The list above comes with the answer: the cause has no dead letters left.
    expect(page.locator("#results")).to_contain_text("No dead letters match.")
    statuses = dict(Task.objects.values_list("pk", "status"))
    assert {statuses[t.pk] for t in outage} == {TaskStatus.PENDING}
    assert {statuses[t.pk] for t in other} == {TaskStatus.DEAD}
    plan_ids = {e.data["plan"] for e in Event.objects.filter(kind="redriven")}
    assert len(plan_ids) == 1

    page.goto("/dead/groups/")
    expect(page.locator("#groups tbody tr")).to_have_count(1)
    expect(page.locator("#groups tbody tr")).to_contain_text("connection refused")


def test_the_task_page_shows_what_a_rerun_repeats_and_follows_a_redrive_made_elsewhere(
    page: Page, causes: None, oncall: User
) -> None:
    task = dead(message="HTTP 502 from the wire", writes=["publish"], hangs=["notify"])
    log_in(page, oncall)

    page.goto(f"/tasks/{task.pk}/")
    expect(status_badge(page)).to_have_text("dead")
    ledger = page.locator("[data-ledger]")
    expect(ledger.locator("li.applied")).to_contain_text(
        "publish: happened; running the step again skips it by its key"
    )
    expect(ledger.locator("li.in-doubt")).to_contain_text("notify: in doubt")
    expect(ledger.locator("li.in-doubt")).to_contain_text("calls it again with the same key")
    steps = page.locator("section[aria-labelledby=steps-heading] tbody tr")
    expect(steps.locator(".effect.in-doubt")).to_have_text("notify: in doubt")

    services.redrive(Task.objects.get(pk=task.pk), actor="cli:oncall", reason="from the terminal")

    expect(status_badge(page)).to_have_text("pending", timeout=20_000)
    expect(page.locator(".timeline")).to_contain_text("“from the terminal”")
    # A redriven step's old error is no longer shown as its state.
    expect(steps.locator(".error-class")).to_have_count(0)


def test_the_dead_letter_list_refreshes_itself_keeping_the_filter(
    page: Page, causes: None, oncall: User
) -> None:
    dead("test.causes.a", "HTTP 503 from /articles/1")
    dead("test.causes.b", "HTTP 503 from /articles/2")
    log_in(page, oncall)
    page.goto("/dead/?workflow=test.causes.a")
    rows = page.locator("#results tbody tr")
    expect(rows).to_have_count(1)
    page.evaluate("document.body.dataset.watched = 'yes'")

    newer = dead("test.causes.a", "HTTP 503 from /articles/3")
    dead("test.causes.b", "HTTP 503 from /articles/4")

    # Within one refresh, without a reload: the new dead letter of the filtered workflow,
    # and not the other workflow's.
    expect(rows).to_have_count(2, timeout=15_000)
    expect(rows.first).to_contain_text(f"#{newer.pk}")
    expect(page.get_by_label("Workflow")).to_have_value("test.causes.a")
    assert page.evaluate("document.body.dataset.watched") == "yes"
