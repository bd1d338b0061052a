"""What a guesser and an impatient on-call engineer meet in the browser: a payload filter on
a secret is refused where the filter was asked for, naming the rule, with no list to read
an answer from; a bulk plan confirmed twice (the first answer lost on the way back) is
applied once, the second confirm saying so and changing nothing; reading faster than the
limit shows a small page saying when to come back.

The tasks reach their states in this process (no worker runs in this module)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, Route, expect

from console import throttle
from tasks_app import services
from tasks_app.models import Event, Task, TaskStatus
from tests.browser.support import log_in
from tests.factories import dead_task

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(120),
    pytest.mark.django_db(transaction=True),
]

REFUSAL = "The filter cannot be used: payload: 'api_token' is a secret by the redaction rule"


def test_a_payload_filter_on_a_secret_is_refused_on_the_page_and_at_its_address(
    page: Page, oncall: User, tmp_path: Path
) -> None:
    task = services.enqueue("demo.noop", {"api_token": "right"}, actor="cli:producer").task
    log_in(page, oncall)
    page.goto("/tasks/")
    page.get_by_label("Payload field").fill("api_token=right")
    page.get_by_role("button", name="Filter").click()

    notice = page.locator("#messages .notice.error")
    expect(notice).to_contain_text(REFUSAL)
    expect(notice).to_contain_text("(REDACT_KEY_PATTERNS): no filter compares its value")
    expect(page.get_by_label("Payload field")).to_have_value("api_token=right")
    page.screenshot(path=tmp_path / "refused-filter-htmx.png", full_page=True)

    response = page.goto("/tasks/?payload=api_token%3Dright")
    assert response is not None and response.status == 400
    expect(page.get_by_role("heading", level=1)).to_have_text("Bad request")
    expect(page.locator("main")).to_contain_text(REFUSAL)
    expect(page.get_by_role("link", name=f"#{task.pk}", exact=True)).to_have_count(0)
    page.screenshot(path=tmp_path / "refused-filter-page.png", full_page=True)
    print(f"screenshots in {tmp_path}")


def test_a_plan_confirmed_again_after_its_answer_was_lost_is_applied_once(
    page: Page, oncall: User, tmp_path: Path
) -> None:
    tasks = [dead_task() for _ in range(2)]
    log_in(page, oncall)
    page.goto("/dead/")
    bulk = page.locator("#bulk")
    bulk.get_by_label("Action").select_option(label="Redrive")
    bulk.get_by_label("Reason").fill("The remote is back")
    bulk.get_by_role("button", name="Preview").click()
    confirm = bulk.get_by_role("button", name="Redrive 2 tasks")
    expect(confirm).to_be_visible()

    # The first confirm reaches the server, which applies the plan; its answer is lost on
    # the way back, so the page still offers the button, and the engineer clicks again.
    def lose_the_answer(route: Route) -> None:
        route.fetch()
        route.abort("connectionreset")

    page.route("**/dead/bulk/", lose_the_answer, times=1)
    with page.expect_event("requestfailed"):
        confirm.click()
    assert {Task.objects.get(pk=t.pk).status for t in tasks} == {TaskStatus.PENDING}
    redriven = Event.objects.filter(kind="redriven").count()

    with page.expect_response("**/dead/bulk/") as answer:
        confirm.click()
    assert answer.value.status == 409
    refusal = bulk.locator(".notice.error")
    expect(refusal).to_contain_text(
        "Nothing changed: this preview was already confirmed and applied. Preview again."
    )
    # The list above comes with the refusal: the first confirm redrove them all.
    expect(page.locator("#results")).to_contain_text("No dead letters match.")
    page.screenshot(path=tmp_path / "plan-confirmed-twice.png", full_page=True)
    assert Event.objects.filter(kind="redriven").count() == redriven == 2
    print(f"screenshots in {tmp_path}")


def test_reading_faster_than_the_limit_shows_a_small_page_saying_when_to_come_back(
    page: Page, oncall: User, settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.CONSOLE_READS_PER_MINUTE = 4
    # Ten seconds into one minute throughout (the live server runs in this process).
    monkeypatch.setattr(throttle, "clock", lambda: 29_000_000 * 60.0 + 10)
    log_in(page, oncall)  # the landing page is the first read
    statuses = []
    for _ in range(5):
        response = page.goto("/tasks/")
        assert response is not None
        statuses.append(response.status)
    assert statuses[-1] == 429 and 200 in statuses
    expect(page.get_by_role("heading", level=1)).to_have_text("Too many requests")
    expect(page.locator("main")).to_contain_text("more than 4 pages a minute")
    expect(page.locator("main")).to_contain_text("Try again in 50 seconds")
    page.screenshot(path=tmp_path / "too-many-reads.png", full_page=True)
    print(f"screenshots in {tmp_path}")
