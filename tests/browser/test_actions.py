"""Every action the task page, the queues page and a review offer, taken in the browser as
its user takes it, each ending in the database: on-call marks an unknown outcome done, runs
one again, cancels a task, pauses and resumes a queue; an editor rejects a draft.

The tasks reach their states in this process (no worker runs in this module)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import Page, expect

from approvals.models import ApprovalStatus
from tasks_app import services
from tasks_app.models import Effect, Event, QueueState, StepStatus, Task, TaskStatus
from tests.approval_support import advance, article, pending_request
from tests.browser.support import action_form, log_in, status_badge
from tests.factories import dead_task

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(120),
    pytest.mark.django_db(transaction=True),
]

UNKNOWN = {"error": "outcome_unknown", "fail_first": 1}


def _resolve(page: Page, task: Task, button: str, reason: str) -> None:
    page.goto(f"/tasks/{task.pk}/")
    # A step whose outcome is unknown is resolved, never redriven.
    expect(page.get_by_role("button", name="Redrive", exact=True)).to_have_count(0)
    form = action_form(page, button)
    expect(form.get_by_role("heading")).to_have_text("Resolve the unknown outcome")
    form.get_by_label("Reason").fill(reason)
    form.get_by_role("button", name=button, exact=True).click()
    expect(page.locator("#task")).to_contain_text(f"Task #{task.pk}: resolved.")


def test_oncall_marks_an_unknown_outcome_done(page: Page, oncall: User) -> None:
    task = dead_task(UNKNOWN)
    log_in(page, oncall)

    _resolve(page, task, "Mark done", "The remote shows the call arrived")

    expect(status_badge(page)).to_have_text("succeeded")
    # The timeline says which outcome was chosen; the step's old error is not its state.
    resolved = page.locator(".timeline .kind-resolved")
    expect(resolved).to_contain_text("outcome: it happened (marked done)")
    steps = page.locator("section[aria-labelledby=steps-heading] tbody tr")
    expect(steps.locator(".error-class")).to_have_count(0)
    step = task.steps.get()
    assert step.status == StepStatus.SUCCEEDED
    assert step.error_class  # still stored, only no longer shown as the step's state
    assert (step.result or {}).get("note") == "The remote shows the call arrived"
    event = Event.objects.for_task(task.pk).get(kind="resolved")
    assert (event.actor, event.data["outcome"]) == (oncall.username, "done")


def test_oncall_runs_an_unknown_outcome_again(page: Page, oncall: User) -> None:
    task = dead_task(UNKNOWN)
    log_in(page, oncall)

    _resolve(page, task, "Run again", "Nothing arrived at the remote")

    expect(status_badge(page)).to_have_text("pending")
    expect(page.locator(".timeline .kind-resolved")).to_contain_text(
        "outcome: it did not happen (run again)"
    )
    step = task.steps.get()
    assert (step.status, step.attempts) == (StepStatus.PENDING, 0)
    assert not Effect.objects.filter(step=step, status=Effect.Status.STARTED).exists()
    event = Event.objects.for_task(task.pk).get(kind="resolved")
    assert (event.actor, event.data["outcome"]) == (oncall.username, "retry")


def test_oncall_cancels_a_pending_task(page: Page, oncall: User) -> None:
    later = timezone.now() + timedelta(hours=1)
    task = services.enqueue("demo.noop", {}, run_after=later, actor="cli:producer").task
    log_in(page, oncall)
    page.goto(f"/tasks/{task.pk}/")

    form = action_form(page, "Cancel task")
    form.get_by_label("Reason").fill("Not wanted any more")
    form.get_by_role("button", name="Cancel task").click()

    expect(status_badge(page)).to_have_text("cancelled")
    assert Task.objects.get(pk=task.pk).status == TaskStatus.CANCELLED
    event = Event.objects.for_task(task.pk).get(kind="cancelled")
    assert (event.actor, event.reason) == (oncall.username, "Not wanted any more")


def test_oncall_pauses_and_resumes_a_queue(page: Page, oncall: User) -> None:
    log_in(page, oncall)
    page.goto("/queues/")
    row = page.locator("#queues tr").filter(has=page.get_by_role("link", name="default"))

    row.get_by_label("Reason").fill("Incident 12: remote down")
    row.get_by_role("button", name="Pause").click()
    expect(row.locator(".badge")).to_have_text("paused")
    state = QueueState.objects.get(name="default")
    assert (state.paused, state.changed_by, state.reason) == (
        True,
        oncall.username,
        "Incident 12: remote down",
    )

    row.get_by_label("Reason").fill("Remote is back")
    row.get_by_role("button", name="Resume").click()
    expect(row.locator(".badge")).to_have_text("running")
    assert not QueueState.objects.get(name="default").paused
    kinds = list(Event.objects.filter(task_id=None).values_list("kind", "actor"))
    assert kinds == [("queue_paused", oncall.username), ("queue_resumed", oncall.username)]


def test_an_editor_rejects_a_draft_and_its_task_is_cancelled(
    page: Page, editor: User, author: User
) -> None:
    request = pending_request(advance(article(actor=author)))
    log_in(page, editor)
    page.goto("/approvals/")
    page.get_by_role("link", name=f"Approval #{request.pk}", exact=True).click()

    page.get_by_label("Comment").fill("Off-brand: we do not announce this.")
    page.get_by_role("button", name="Reject").click()

    expect(page.locator("#decision")).to_contain_text(f"Approval #{request.pk} rejected.")
    request.refresh_from_db()
    assert (request.status, request.decided_by, request.comment) == (
        ApprovalStatus.REJECTED,
        editor.username,
        "Off-brand: we do not announce this.",
    )
    assert Task.objects.get(pk=request.task_id).status == TaskStatus.CANCELLED
