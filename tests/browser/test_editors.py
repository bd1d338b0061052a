"""Editors beyond one approval, in the browser, with the module's worker sending their
mail: notified of a draft, an editor follows the mail's link and edits the draft, which
another editor approves (its author may not), and exactly one publish goes out with the
edited text; a press release needs two
different editors; an undecided one escalates to the senior editors; a reminder is sent
once."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db.models import F
from playwright.sync_api import Browser, Page, expect

from approvals.models import ApprovalRequest, ApprovalStatus
from console import mailbox
from tasks_app.engine.presence import SWEEPER
from tasks_app.models import Heartbeat, Task, TaskStatus
from tests.approval_support import article, mailable, notice_task, press_release
from tests.browser.support import (
    SCREENSHOTS,
    TIMEOUT_MS,
    VIEWPORT,
    log_in,
    pending_request,
    task_status,
)
from tests.e2e_support import Worker, wait_for
from tests.remotes import LoopbackRemote

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(150),
    pytest.mark.django_db(transaction=True),
]


def notice_sent(request: ApprovalRequest, kind: str, worker: Worker) -> Task:
    """Wait until the worker has sent ``request``'s notice of ``kind``."""
    return wait_for(
        lambda: (
            (
                (task := notice_task(request, kind)) is not None
                and task.status == TaskStatus.SUCCEEDED
                and task
            )
            or None
        ),
        timeout=30,
        what=lambda: f"the {kind} notice of approval #{request.pk}\n{worker.tail()}",
    )


def mail_to(user: User, subject: str) -> list[mailbox.Mail]:
    return [m for m in mailbox.messages(to=user.email, limit=500) if subject in m.subject]


def second_page(browser: Browser, live_server_url: str) -> Page:
    """A second person's browser."""
    context = browser.new_context(base_url=live_server_url, viewport=VIEWPORT)
    context.set_default_timeout(TIMEOUT_MS)
    return context.new_page()


def test_an_editor_notified_by_mail_edits_the_draft_and_another_approves_it(
    page: Page,
    browser: Browser,
    live_server: Any,
    worker: Worker,
    demo_mail: Path,
    module_remotes: tuple[LoopbackRemote, LoopbackRemote],
    editor: User,
    other_editor: User,
    author: User,
) -> None:
    publishing, _ = module_remotes
    published_before = len(publishing.applied)
    mailable(editor)
    mailable(other_editor)
    task = article(actor=author, key="browser:editors:article")
    request = pending_request(task, worker)
    notice_sent(request, "opened", worker)

    # The editor reads the mail in the console's Mail page (the demo's mail) ...
    log_in(page, editor)
    page.get_by_role("navigation", name="Sections").get_by_role("link", name="Mail").click()
    message = page.locator("article.mail").filter(has_text=f"Approval #{request.pk} waits for you")
    expect(message).to_have_count(1)
    expect(message).to_contain_text(f"Asked by: {author.username}")
    # ... and follows its link to the review.
    message.locator(f"a[href$='/approvals/{request.pk}/']").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text(f"Approval #{request.pk}")

    # A typo is fixed on the spot: the edit is a new revision, shown as a change.
    page.get_by_text("Edit the draft").click()
    body = page.get_by_label("Body")
    expect(body).to_have_value(request.draft["body"])
    edited = request.draft["body"].replace("What ships and why.", "What ships, and why it matters.")
    body.fill(edited)
    page.get_by_label("Note on your edit").fill("Tightened the lead.")
    page.screenshot(path=SCREENSHOTS / "review-edit.png", full_page=True)
    page.get_by_role("button", name="Save as a new revision").click()

    successor = pending_request(task, worker, revision=1)
    expect(page).to_have_url(re.compile(rf"/approvals/{successor.pk}/$"))
    expect(page.get_by_role("status")).to_contain_text(
        f"Your edit is revision 1, now approval #{successor.pk}: someone else decides on it"
    )
    changes = page.locator("section").filter(
        has=page.get_by_role("heading", name=re.compile("What changed since revision 0"))
    )
    expect(changes).to_contain_text(f"edited by {editor.username}")
    expect(changes.locator("ins")).to_contain_text(["matters."])
    assert successor.draft["body"] == edited
    assert successor.draft_author == editor.username
    request.refresh_from_db()
    assert request.status == ApprovalStatus.EDITED

    # Their own revision is someone else's to decide: the page says so and offers no
    # decision, and they are not told of it.
    decision = page.locator("#decision")
    expect(decision).to_contain_text(
        "You may not decide this request: you wrote this draft of task "
        f"#{task.pk} (revision 1): someone else must review it."
    )
    expect(decision.get_by_role("button", name="Approve")).to_have_count(0)
    expect(page.get_by_text("Edit the draft")).to_have_count(0)
    page.screenshot(path=SCREENSHOTS / "review-own-edit.png", full_page=True)
    notice_sent(successor, "opened", worker)
    assert mail_to(editor, f"Approval #{successor.pk} ") == []

    # The other editor is told, follows the mail and approves the edited text.
    assert mail_to(other_editor, f"Approval #{successor.pk} waits for you")
    reviewer = second_page(browser, live_server.url)
    log_in(reviewer, other_editor)
    reviewer.goto(f"/approvals/{successor.pk}/")
    expect(reviewer.locator("#decision")).to_contain_text("Approve")
    reviewer.get_by_role("button", name="Approve").click()
    expect(reviewer.locator("#decision")).to_contain_text(f"Approval #{successor.pk} approved.")
    task_status(task, TaskStatus.SUCCEEDED, worker)
    published = publishing.applied[published_before:]
    assert [write["body"]["body"] for write in published] == [edited]
    assert published[0]["body"]["approved_by"] == other_editor.username


def test_a_refused_edit_shows_why_on_its_field_keeps_the_text_and_stores_nothing(
    page: Page, worker: Worker, editor: User, author: User
) -> None:
    task = article(actor=author, key="browser:editors:refused-edit")
    request = pending_request(task, worker)
    steps_before = task.steps.count()

    log_in(page, editor)
    page.goto(f"/approvals/{request.pk}/")
    page.get_by_text("Edit the draft").click()
    page.get_by_label("Title").fill("   ")
    page.get_by_label("Body").fill("Launch day\n\nA better lead.")
    page.get_by_role("button", name="Save as a new revision").click()

    # The same review, the edit still open with what was typed, the error on its field.
    expect(page).to_have_url(re.compile(rf"/approvals/{request.pk}/edit/$"))
    expect(page.get_by_role("heading", level=1)).to_contain_text(f"Approval #{request.pk}")
    title = page.locator(".field.invalid").filter(has=page.get_by_label("Title"))
    expect(title.get_by_role("alert")).to_have_text("draft.title: a non-empty string is required")
    expect(page.get_by_label("Body")).to_have_value("Launch day\n\nA better lead.")
    request.refresh_from_db()
    assert request.status == ApprovalStatus.PENDING
    assert task.steps.count() == steps_before
    assert not ApprovalRequest.objects.filter(task=task, revision__gt=0).exists()


def test_a_press_release_needs_two_different_editors(
    page: Page,
    browser: Browser,
    live_server: object,
    worker: Worker,
    editor: User,
    other_editor: User,
    author: User,
) -> None:
    task = press_release(actor=author, key="browser:editors:press")
    request = pending_request(task, worker)

    log_in(page, editor)
    expect(page).to_have_url("/approvals/")
    row = page.locator("table").first.locator("tr").filter(has_text=f"Approval #{request.pk}")
    expect(row).to_contain_text("0 of 2")
    page.get_by_role("link", name=f"Approval #{request.pk}", exact=True).click()
    # A second tab on the same review, as a person who lost track of one.
    stale = page.context.new_page()
    stale.goto(f"/approvals/{request.pk}/")

    page.get_by_role("button", name="Approve").click()
    expect(page.locator("#decision")).to_contain_text(
        "Your approval is recorded (1 of 2); it needs 1 more approval from someone else."
    )
    page.reload()
    expect(page.locator(".quorum")).to_have_text(
        f"1 of 2, each from a different person: {editor.username}"
    )
    expect(page.get_by_role("button", name="Approve")).to_have_count(0)
    # The same person approving again, from the other tab, still counts once.
    stale.get_by_role("button", name="Approve").click()
    expect(stale.locator("#decision [role=alert]")).to_contain_text(
        f"you already approved approval #{request.pk}; it needs 1 more approval"
    )
    assert request.votes.count() == 1
    page.goto("/approvals/")
    expect(page.locator("table.others")).to_contain_text(
        "You approved it; it needs 1 more approval from someone else"
    )

    second = second_page(browser, live_server.url)  # type: ignore[attr-defined]
    log_in(second, other_editor)
    second.get_by_role("link", name=f"Approval #{request.pk}", exact=True).click()
    second.get_by_role("button", name="Approve").click()
    expect(second.locator("#decision")).to_contain_text(f"Approval #{request.pk} approved.")
    expect(second.locator("#decision")).to_contain_text(
        f"Approved by {editor.username}, {other_editor.username}"
    )
    task_status(task, TaskStatus.SUCCEEDED, worker)
    request.refresh_from_db()
    assert (request.status, request.votes.count()) == (ApprovalStatus.APPROVED, 2)


def test_an_undecided_press_release_escalates_to_the_senior_editors(
    page: Page, worker: Worker, demo_mail: Path, senior_editor: User, author: User
) -> None:
    mailable(senior_editor)
    task = press_release(actor=author, key="browser:editors:escalates")
    request = pending_request(task, worker)
    # Eight hours pass without a decision: its escalation time is moved back.
    ApprovalRequest.objects.filter(pk=request.pk).update(
        escalates_at=F("created_at") - timedelta(seconds=1)
    )
    notice_sent(request, "escalated", worker)
    request.refresh_from_db()
    assert request.escalated_at is not None

    log_in(page, senior_editor)
    expect(page).to_have_url("/approvals/")
    row = page.locator("table").first.locator("tr").filter(has_text=f"Approval #{request.pk}")
    expect(row).to_contain_text("escalated to senior_editors")
    page.screenshot(path=SCREENSHOTS / "approvals-inbox.png", full_page=True)
    page.get_by_role("navigation", name="Sections").get_by_role("link", name="Mail").click()
    expect(page.locator("article.mail")).to_contain_text(
        [f"Escalated to senior_editors: approval #{request.pk}"]
    )
    page.goto(f"/approvals/{request.pk}/")
    expect(page.locator(".escalation")).to_contain_text("Escalated to group senior_editors")
    page.get_by_role("button", name="Approve").click()
    expect(page.locator("#decision")).to_contain_text("Your approval is recorded (1 of 2)")


def test_a_reminder_before_expiry_is_sent_once(
    page: Page, worker: Worker, demo_mail: Path, editor: User, author: User
) -> None:
    mailable(editor)
    task = article(actor=author, key="browser:editors:remind")
    request = pending_request(task, worker)
    ApprovalRequest.objects.filter(pk=request.pk).update(
        remind_at=F("created_at") - timedelta(seconds=1)
    )
    reminder = notice_sent(request, "reminder", worker)
    # Two more sweeps after the reminder went out, each of which finds it sent.
    wait_for(
        lambda: Heartbeat.objects.filter(
            name=SWEEPER, seen_at__gt=reminder.updated_at + timedelta(seconds=2.5)
        ).first(),
        timeout=30,
        what="two sweeps after the reminder",
    )

    subject = f"Reminder: approval #{request.pk} expires in"
    assert len(mail_to(editor, subject)) == 1
    assert (
        Task.objects.filter(idempotency_key__startswith=f"approvals:notify:{request.pk}:").count()
        == 2
    )
    log_in(page, editor)
    page.get_by_role("navigation", name="Sections").get_by_role("link", name="Mail").click()
    expect(page.locator("article.mail").filter(has_text=subject)).to_have_count(1)
    page.screenshot(path=SCREENSHOTS / "mail.png", full_page=True)
