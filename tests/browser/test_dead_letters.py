"""On-call, in the browser, brings dead letters back: a plain redrive, and a redrive with an
edited payload that the page checks by the enqueue rules first."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from tasks_app import services
from tasks_app.models import Event, TaskStatus
from tests.browser.support import action_form, log_in, page_shows_status, status_badge, task_status
from tests.e2e_support import Worker

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(120),
    pytest.mark.django_db(transaction=True),
]


def test_oncall_redrives_a_dead_letter_and_watches_it_succeed(
    page: Page, worker: Worker, oncall: User
) -> None:
    mark = worker.mark()
    # Three attempts, failing on the first three claims of the step's life: it dies, and
    # the redrive's fourth claim succeeds.
    task = services.enqueue("demo.flaky", {"fail_first": 3}, actor="cli:producer").task
    task_status(task, TaskStatus.DEAD, worker)

    log_in(page, oncall)
    page.goto(f"/tasks/{task.pk}/")
    expect(status_badge(page)).to_have_text("dead")
    expect(page.locator("#error-heading")).to_have_text("Last error")
    form = action_form(page, "Redrive")
    form.get_by_label("Reason").fill("The upstream outage is over")
    # A mark on this document: a reload would lose it.
    page.evaluate("document.body.dataset.watched = 'yes'")
    form.get_by_role("button", name="Redrive", exact=True).click()
    expect(page.locator("#task")).to_contain_text(f"Task #{task.pk}: redriven.")

    # The page follows the task to its outcome by itself.
    expect(status_badge(page)).to_have_text("succeeded", timeout=30_000)
    assert page.evaluate("document.body.dataset.watched") == "yes"
    expect(page.get_by_role("button", name="Redrive", exact=True)).to_have_count(0)
    expect(page.locator(".timeline")).to_contain_text("“The upstream outage is over”")
    task.refresh_from_db()
    step = task.steps.get()
    assert task.status == TaskStatus.SUCCEEDED
    assert (step.status, step.fencing_token) == ("succeeded", 4)
    redriven = Event.objects.for_task(task.pk).get(kind="redriven")
    assert (redriven.actor, redriven.actor_user_id, redriven.reason) == (
        oncall.username,
        oncall.pk,
        "The upstream outage is over",
    )
    worker.assert_quiet(since=mark)


def test_oncall_redrives_with_a_changed_payload_after_the_page_refuses_bad_ones(
    page: Page, worker: Worker, oncall: User
) -> None:
    mark = worker.mark()
    old = {"error": "permanent", "fail_first": 1}
    task = services.enqueue("demo.flaky", old, actor="cli:producer").task
    task_status(task, TaskStatus.DEAD, worker)

    log_in(page, oncall)
    page.goto(f"/tasks/{task.pk}/")
    form = action_form(page, "Redrive with changes")
    payload = form.get_by_label("Payload", exact=True)
    expect(payload).to_have_value(json.dumps(old, indent=2, sort_keys=True))

    deep = '{"error": "permanent", "fail_first": 0, "deep": ' + '{"a": ' * 40 + "1" + "}" * 41
    refusals = [
        ("[1]", "payload: must be a JSON object"),
        ('{"fail_first": 0', "payload: not valid JSON"),
        (deep, "payload: nesting deeper than 32 levels"),
    ]
    for text, error in refusals:
        payload.fill(text)
        form.get_by_label("Reason").fill("Trying a new payload")
        form.get_by_role("button", name="Redrive with changes").click()
        field = form.locator(".field.invalid", has=page.get_by_label("Payload", exact=True))
        expect(field.locator(".field-error")).to_contain_text(error)
        expect(payload).to_have_value(text)
        expect(status_badge(page)).to_have_text("dead")

    task.refresh_from_db()
    assert (task.status, task.payload) == (TaskStatus.DEAD, old)
    assert not Event.objects.for_task(task.pk).filter(kind="redriven").exists()

    new = {"error": "permanent", "fail_first": 0}
    payload.fill(json.dumps(new))
    form.get_by_label("Reason").fill("Stop failing on purpose")
    form.get_by_role("button", name="Redrive with changes").click()
    expect(page.locator("#task")).to_contain_text(f"Task #{task.pk}: redriven.")

    page_shows_status(page, task, "succeeded")
    expect(page.locator("pre.json").first).to_contain_text('"fail_first": 0')
    # The timeline shows what the redrive changed, field by field, secrets as changed only.
    diff = page.locator(".timeline .kind-redriven table.diff")
    expect(diff.locator("tbody tr")).to_have_count(1)
    expect(diff.locator("tbody tr")).to_contain_text("fail_first")
    expect(diff.locator("del")).to_have_text("1")
    expect(diff.locator("ins")).to_have_text("0")
    task.refresh_from_db()
    assert (task.status, task.payload) == (TaskStatus.SUCCEEDED, new)
    redriven = Event.objects.for_task(task.pk).get(kind="redriven")
    assert (redriven.actor, redriven.reason) == (oncall.username, "Stop failing on purpose")
    assert (redriven.data["old_payload"], redriven.data["new_payload"]) == (old, new)
    worker.assert_quiet(since=mark)
