"""An editor, in the browser, decides on drafts another person's task produced: approves
one and sees it published once, sends one back and reviews the new revision's changes."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from approvals.models import ApprovalRequest, ApprovalStatus
from tasks_app import services
from tasks_app.models import TaskStatus
from tests.approval_support import ARTICLE, article, ticket
from tests.browser.support import (
    log_in,
    page_shows_status,
    pending_request,
    status_badge,
    task_status,
)
from tests.e2e_support import Worker
from tests.remotes import LoopbackRemote

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(120),
    pytest.mark.django_db(transaction=True),
]


def open_review(page: Page, request: ApprovalRequest) -> None:
    """From the approvals list, as an editor gets there."""
    page.goto("/approvals/")
    page.get_by_role("link", name=f"Approval #{request.pk}", exact=True).click()
    expect(page.get_by_role("heading", level=1)).to_contain_text(f"Approval #{request.pk}")


def test_an_editor_approves_a_draft_and_sees_it_published(
    page: Page,
    worker: Worker,
    module_remotes: tuple[LoopbackRemote, LoopbackRemote],
    editor: User,
    author: User,
) -> None:
    publishing, _ = module_remotes
    published_before = len(publishing.applied)
    mark = worker.mark()
    # Enqueued by another editor: nobody decides on their own task.
    task = services.enqueue(
        "publish_article", ARTICLE, idempotency_key="browser:article-001", actor=author
    ).task
    request = pending_request(task, worker)

    log_in(page, editor)
    open_review(page, request)
    draft = page.locator("section").filter(has=page.get_by_role("heading", name="The draft"))
    expect(draft).to_contain_text("What ships and why.")
    expect(page.locator(".facts")).to_contain_text(author.username)
    assert len(publishing.applied) == published_before  # nothing goes out before a decision
    page.get_by_role("button", name="Approve").click()
    expect(page.locator("#decision")).to_contain_text(f"Approval #{request.pk} approved.")

    page.get_by_role("link", name=f"#{task.pk}", exact=True).click()
    page_shows_status(page, task, "succeeded")
    request.refresh_from_db()
    assert (request.status, request.decided_by) == (ApprovalStatus.APPROVED, editor.username)
    assert task_status(task, TaskStatus.SUCCEEDED, worker).status == TaskStatus.SUCCEEDED
    published = publishing.applied[published_before:]
    assert [write["body"]["body"] for write in published] == [request.draft["body"]]
    assert published[0]["body"]["approved_by"] == editor.username
    worker.assert_quiet(since=mark)


def test_an_editor_requests_changes_then_approves_the_next_revision_and_sees_it_published(
    page: Page, worker: Worker, editor: User, author: User
) -> None:
    mark = worker.mark()
    task = services.enqueue(
        "publish_article", ARTICLE, idempotency_key="browser:article-002", actor=author
    ).task
    first = pending_request(task, worker)
    comment = "Say which day the launch is."

    log_in(page, editor)
    open_review(page, first)
    page.get_by_label("Comment").fill(comment)
    page.get_by_role("button", name="Request changes").click()
    expect(page.locator("#decision")).to_contain_text(
        f"Approval #{first.pk} sent back with your comment."
    )
    first.refresh_from_db()
    assert (first.status, first.comment) == (ApprovalStatus.CHANGES_REQUESTED, comment)

    second = pending_request(task, worker, revision=1)
    note = f"(Revised as asked: {comment})"
    assert second.draft["body"].endswith(note)
    open_review(page, second)
    changes = page.locator("section").filter(
        has=page.get_by_role("heading", name="What changed since revision 0")
    )
    expect(changes.locator("ins").filter(has_text=note)).to_have_count(1)
    # Added and removed words carry marks of their own, readable without colour.
    added = changes.locator("ins").filter(has_text=note)
    marks = "e => getComputedStyle(e, '::before').content + getComputedStyle(e, '::after').content"
    assert added.evaluate(marks) == '"{+""+}"'

    earlier = page.locator("section").filter(
        has=page.get_by_role("heading", name="Earlier decisions")
    )
    expect(earlier.locator("li")).to_have_count(1)
    expect(earlier.locator("li")).to_contain_text(
        f"Revision 0: {editor.username} asked for changes"
    )
    expect(earlier.locator("blockquote")).to_have_text(comment)

    # The next revision is approved, and its task page follows it to the end by itself.
    page.get_by_role("button", name="Approve").click()
    expect(page.locator("#decision")).to_contain_text(f"Approval #{second.pk} approved.")
    page.goto(f"/tasks/{task.pk}/")
    expect(status_badge(page)).to_have_text("succeeded", timeout=30_000)
    second.refresh_from_db()
    assert (second.status, second.decided_by) == (ApprovalStatus.APPROVED, editor.username)
    worker.assert_quiet(since=mark)


def test_an_editor_lands_on_the_requests_waiting_for_them_and_sees_why_others_are_not(
    page: Page, worker: Worker, editor: User
) -> None:
    # The worker takes each task to its approval step.
    theirs = pending_request(article(actor=editor), worker)
    waiting = pending_request(ticket(), worker)

    log_in(page, editor)

    expect(page).to_have_url("/approvals/")
    expect(page.locator("nav .count")).to_have_text("(1 waiting for you)")
    mine = page.locator("table").first
    expect(mine.locator("tbody tr")).to_have_count(1)
    expect(mine).to_contain_text(f"Approval #{waiting.pk}")
    expect(mine.locator("time").last).to_have_text(re.compile(r"^in \d"))
    others = page.locator("table.others")
    expect(others.locator("tbody tr")).to_have_count(1)
    expect(others).to_contain_text(f"You enqueued task #{theirs.task_id}")
