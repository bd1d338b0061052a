"""The console's pages tell the truth, walked in a real browser: the Overview and the
workflows pages count the same successes, each card opens a list of exactly what it counts,
an approval has one name and one revision number, an unknown outcome says only what is
known, required reasons are marked required, and htmx updates break no Content-Security-
Policy rule."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import ConsoleMessage, Page, expect

from approvals import services as approvals
from tests.approval_support import advance, pending_request
from tests.browser.support import RECORD_CSP, log_in
from tests.factories import (
    backdate_task,
    dead_task,
    enqueued,
    pending_article_request,
    retrying,
    succeeded,
    unknown_outcome,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(120),
    pytest.mark.django_db(transaction=True),
]


def listed(page: Page) -> set[int]:
    links = page.locator("#results tbody th a").all_inner_texts()
    return {int(text.lstrip("#")) for text in links}


def stat(page: Page, name: str) -> int:
    return int(page.locator(f'[data-stat="{name}"]').inner_text())


def test_the_overview_and_the_workflows_page_agree_and_each_card_opens_what_it_counts(
    page: Page, oncall: User, tmp_path: Path
) -> None:
    due = enqueued("demo.noop", {"n": 1})
    retry = retrying(retry_in=timedelta(hours=1))
    recent = {succeeded().pk for _ in range(2)}
    earlier = succeeded()
    backdate_task(earlier, finished_at=timedelta(hours=3))
    log_in(page, oncall)

    page.goto("/")
    assert (stat(page, "succeeded_last_hour"), stat(page, "succeeded_last_day")) == (2, 3)
    page.screenshot(path=tmp_path / "overview.png", full_page=True)
    page.goto("/workflows/?window=hour")
    noop = page.locator('tr[data-workflow="demo.noop"]')
    expect(noop.locator('[data-figure="tasks_succeeded"]')).to_have_text("2")
    page.get_by_role("link", name="Last day").click()
    expect(page).to_have_url(re.compile(r"window=day"))
    expect(noop.locator('[data-figure="tasks_succeeded"]')).to_have_text("3")
    expect(page.locator("#figures")).not_to_contain_text("Per hour")
    page.screenshot(path=tmp_path / "workflows.png", full_page=True)

    for card, expected in (
        ("pending", {due.pk}),
        ("retry_scheduled", {retry.pk}),
        ("succeeded_last_hour", recent),
        ("succeeded_last_day", recent | {earlier.pk}),
    ):
        page.goto("/")
        page.locator(f'a:has([data-stat="{card}"])').click()
        expect(page.locator("h1")).to_have_text("Tasks")
        expect(page.locator("#results tbody tr")).to_have_count(len(expected))
        assert listed(page) == expected, card
        if card == "retry_scheduled":
            expect(page.get_by_label("Status")).to_have_value("retry_scheduled")
            expect(page.get_by_label("Status").locator("option:checked")).to_have_text(
                "Retry scheduled"
            )
            page.screenshot(path=tmp_path / "retry-scheduled.png", full_page=True)
    print(f"screenshots in {tmp_path}")


def test_an_approval_has_one_name_and_one_revision_on_every_page(
    page: Page, editor: User, other_editor: User, author: User, tmp_path: Path
) -> None:
    first = pending_article_request(actor=author)
    approvals.request_changes(first, actor=other_editor, comment="A shorter title")
    second = pending_request(advance(first.task))
    log_in(page, editor)
    page.goto("/approvals/")
    page.get_by_role("link", name=f"Approval #{second.pk}", exact=True).click()
    heading = page.get_by_role("heading", level=1)
    expect(heading).to_have_text(f"Approval #{second.pk} task #{second.task_id}, revision 1")
    expect(page.locator("main")).not_to_contain_text("Review #")
    expect(
        page.locator("section").filter(has=page.get_by_role("heading", name="The draft"))
    ).not_to_contain_text("Revision 1")
    page.screenshot(path=tmp_path / "review.png", full_page=True)
    page.get_by_role("link", name=f"#{second.task_id}", exact=True).click()
    expect(page.locator("#task")).to_contain_text("r1")
    expect(page.locator("#task")).not_to_contain_text("r2")
    print(f"screenshots in {tmp_path}")


def test_an_unknown_outcome_says_only_what_is_known_and_reasons_are_marked_required(
    page: Page, oncall: User, tmp_path: Path
) -> None:
    task = unknown_outcome()
    log_in(page, oncall)
    page.goto(f"/tasks/{task.pk}/")
    error = page.locator("section").filter(has=page.get_by_role("heading", name="Last error"))
    expect(error).to_contain_text("Nobody knows whether the remote call of this step happened")
    expect(error).not_to_contain_text("no external write")
    reasons = page.get_by_role("textbox", name="Reason")
    expect(reasons.first).to_be_visible()
    for n in range(reasons.count()):
        expect(reasons.nth(n)).to_have_attribute("required", "")
    for label in page.locator("label").filter(has_text="Reason").all():
        expect(label).to_contain_text("(required)")
    page.screenshot(path=tmp_path / "unknown-outcome.png", full_page=True)
    # The browser refuses an empty reason before sending it.
    form = page.locator("form").filter(has=page.get_by_role("button", name="Mark done"))
    form.get_by_role("button", name="Mark done").click()
    assert form.get_by_role("textbox", name="Reason").evaluate("(e) => !e.validity.valid")
    print(f"screenshots in {tmp_path}")


def test_htmx_updates_break_no_content_security_policy_rule(
    page: Page, oncall: User, tmp_path: Path
) -> None:
    for _ in range(2):
        succeeded()
    dead_task()
    console: list[str] = []

    def record(message: ConsoleMessage) -> None:
        console.append(f"{page.url}: console {message.type}: {message.text}")

    page.on("console", record)
    page.add_init_script(RECORD_CSP)
    log_in(page, oncall)
    page.goto("/")
    # The overview refreshes itself every 5 seconds: two refreshes swapped in.
    for _ in range(2):
        with page.expect_response(
            lambda r: r.url.endswith("/") and r.request.headers.get("hx-request") == "true",
            timeout=15_000,
        ):
            pass
    page.goto("/tasks/")
    page.get_by_label("Status").select_option("dead")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"status=dead"))
    page.goto("/workflows/")
    page.get_by_role("link", name="Last hour").click()
    expect(page).to_have_url(re.compile(r"window=hour"))
    page.get_by_role("link", name="Last week").click()
    expect(page).to_have_url(re.compile(r"window=week"))
    page.goto("/dead/")
    page.get_by_label("Action").select_option("redrive")
    page.get_by_label("Reason").fill("Checking the count first")
    page.get_by_role("button", name="Preview").click()
    expect(page.get_by_role("button", name="Redrive 1 task")).to_be_visible()
    # A task at work refreshes its page (a reason being typed is preserved across the
    # swaps); cancelling it answers with the regions it changed, out of band.
    waiting = enqueued("demo.noop", {"n": 9}, run_after=timezone.now() + timedelta(hours=1))
    page.goto(f"/tasks/{waiting.pk}/")
    cancel = page.locator("form").filter(has=page.get_by_role("button", name="Cancel task"))
    cancel.get_by_role("textbox", name="Reason").fill("No longer needed")
    page.locator("h1").click()
    for _ in range(2):
        with page.expect_response(
            lambda r: f"/tasks/{waiting.pk}/" in r.url and r.request.method == "GET",
            timeout=15_000,
        ):
            pass
    cancel.get_by_role("button", name="Cancel task").click()
    expect(page.locator("#task .facts .badge")).to_have_text("cancelled")
    violations = page.evaluate("window.__csp")
    assert not violations, violations
    assert not [line for line in console if "Content Security Policy" in line], console
