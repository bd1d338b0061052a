"""After an action, in the browser, the page agrees with itself without a reload: every
region showing what the action changed is updated by its answer (the review's approvals,
deadlines, edit offer and the nav's count after a decision; the cause's count with the list
after a bulk action), and the bulk form, once previewed, is locked to its plan.

No worker runs here: drafts are written in this process (``advance``), and what the
actions make due is left pending."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Locator, Page, expect

from approvals.models import ApprovalRequest, ApprovalStatus
from tasks_app.models import Task, TaskStatus
from tests.approval_support import advance, article, pending_request, press_release
from tests.browser.support import log_in
from tests.cause_support import causes, dead, dead_step

__all__ = ["causes"]  # the fixture, used by name

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(120),
    pytest.mark.django_db(transaction=True),
]


def waiting_badge(page: Page) -> Locator:
    """The nav's count of the approvals waiting for the reader."""
    return page.get_by_role("navigation", name="Sections").locator(".count")


def facts(page: Page) -> Locator:
    return page.locator("dl.facts")


def watch(page: Page) -> None:
    """Mark the document: a reload would lose the mark (:func:`not_reloaded`)."""
    page.evaluate("document.body.dataset.watched = 'yes'")


def not_reloaded(page: Page) -> None:
    assert page.evaluate("document.body.dataset.watched") == "yes"


# --- a review after a decision ------------------------------------------------------------


def test_the_second_approval_of_a_press_release_updates_the_whole_review(
    page: Page, editor: User, other_editor: User, author: User, tmp_path: Path
) -> None:
    request = pending_request(advance(press_release(actor=author, key="fresh:press")))
    other = pending_request(advance(article(actor=author, key="fresh:other")))

    log_in(page, editor)
    expect(waiting_badge(page)).to_have_text("(2 waiting for you)")
    page.goto(f"/approvals/{request.pk}/")
    expect(facts(page).locator(".quorum")).to_have_text("0 of 2, each from a different person")
    watch(page)
    page.get_by_role("button", name="Approve").click()
    expect(page.locator("#decision")).to_contain_text("Your approval is recorded (1 of 2)")
    expect(facts(page).locator(".quorum")).to_have_text(
        f"1 of 2, each from a different person: {editor.username}"
    )
    expect(waiting_badge(page)).to_have_text("(1 waiting for you)")
    not_reloaded(page)

    page.context.clear_cookies()
    log_in(page, other_editor)
    expect(waiting_badge(page)).to_have_text("(2 waiting for you)")
    page.goto(f"/approvals/{request.pk}/")
    expect(facts(page).locator(".escalation")).to_contain_text("To group senior_editors if nobody")
    expect(page.get_by_text("Edit the draft")).to_be_visible()
    watch(page)
    page.get_by_role("button", name="Approve").click()

    expect(page.locator("#decision")).to_contain_text(f"Approval #{request.pk} approved.")
    expect(facts(page).locator(".quorum")).to_have_text(
        f"2 of 2, each from a different person: {editor.username}, {other_editor.username}"
    )
    expect(facts(page).locator(".escalation")).to_have_count(0)
    expect(facts(page)).not_to_contain_text("Expires")
    expect(page.get_by_text("Edit the draft")).to_have_count(0)
    expect(waiting_badge(page)).to_have_text("(1 waiting for you)")
    not_reloaded(page)
    page.screenshot(path=tmp_path / "press-release-approved.png", full_page=True)
    request.refresh_from_db()
    assert request.status == ApprovalStatus.APPROVED
    assert ApprovalRequest.objects.get(pk=other.pk).status == ApprovalStatus.PENDING
    print(f"screenshots in {tmp_path}")


@pytest.mark.parametrize(
    ("decision", "button", "shown"),
    [
        ("approve", "Approve", "approved"),
        ("reject", "Reject", "rejected"),
        ("request_changes", "Request changes", "sent back with your comment"),
    ],
)
def test_a_decision_on_a_one_approval_request_updates_the_whole_review(
    page: Page, editor: User, author: User, decision: str, button: str, shown: str
) -> None:
    request = pending_request(advance(article(actor=author, key=f"fresh:{decision}")))
    pending_request(advance(article(actor=author, key=f"fresh:{decision}:other")))

    log_in(page, editor)
    page.goto(f"/approvals/{request.pk}/")
    expect(waiting_badge(page)).to_have_text("(2 waiting for you)")
    expect(facts(page)).to_contain_text("Expires")
    expect(page.get_by_text("Edit the draft")).to_be_visible()
    watch(page)
    page.get_by_label("Comment").fill("Checked against the brief.")
    page.get_by_role("button", name=button, exact=True).click()

    expect(page.locator("#decision")).to_contain_text(f"Approval #{request.pk} {shown}.")
    expect(page.get_by_text("Edit the draft")).to_have_count(0)
    expect(waiting_badge(page)).to_have_text("(1 waiting for you)")
    expect(facts(page)).not_to_contain_text("Expires")
    not_reloaded(page)
    request.refresh_from_db()
    assert request.status != ApprovalStatus.PENDING


# --- the dead letters' bulk form -----------------------------------------------------------


def open_cause(page: Page, count: int) -> tuple[list[Task], Locator]:
    """``count`` dead letters of one cause, and a second cause's one, with the page showing
    the first cause; returns its tasks and the bulk form's region."""
    tasks = [dead(message=f"HTTP 503 from /articles/{n}") for n in range(count)]
    dead(message="connection refused by 10.0.0.7")
    page.goto(f"/dead/?fingerprint={dead_step(tasks[0]).error_fingerprint}")
    letters = "dead letter" if count == 1 else "dead letters"
    expect(page.locator(".notice.cause")).to_contain_text(f"{count} {letters} in")
    expect(page.locator("#results tbody tr")).to_have_count(count)
    return tasks, page.locator("#bulk")


def preview(bulk: Locator, action: str, reason: str, limit: str | None = None) -> None:
    bulk.get_by_label("Action").select_option(label=action)
    bulk.get_by_label("Reason").fill(reason)
    if limit is not None:
        bulk.get_by_label("Limit").fill(limit)
    bulk.get_by_role("button", name="Preview").click()


def test_after_a_bulk_action_the_cause_count_agrees_with_the_list(
    page: Page, causes: None, oncall: User, tmp_path: Path
) -> None:
    log_in(page, oncall)
    tasks, bulk = open_cause(page, 4)
    watch(page)

    preview(bulk, "Redrive", "The remote is back", limit="2")
    bulk.get_by_role("button", name="Redrive 2 tasks").click()
    expect(bulk.locator(".notice.success")).to_contain_text("Redrive: 2 tasks changed")
    expect(page.locator(".notice.cause")).to_contain_text("2 dead letters in")
    expect(page.locator("#results tbody tr")).to_have_count(2)

    preview(bulk, "Redrive", "The remote is back")
    bulk.get_by_role("button", name="Redrive 2 tasks").click()
    expect(bulk.locator(".notice.success")).to_contain_text("Redrive: 2 tasks changed")
    expect(page.locator(".notice.cause")).to_contain_text("no dead letter has it now")
    expect(page.locator(".notice.cause")).not_to_contain_text("dead letters in")
    expect(page.locator("#results")).to_contain_text("No dead letters match.")
    not_reloaded(page)
    page.screenshot(path=tmp_path / "bulk-cause-emptied.png", full_page=True)
    assert {Task.objects.get(pk=t.pk).status for t in tasks} == {TaskStatus.PENDING}
    print(f"screenshots in {tmp_path}")


def test_the_bulk_form_is_locked_to_its_plan_until_change(
    page: Page, causes: None, oncall: User, tmp_path: Path
) -> None:
    log_in(page, oncall)
    tasks, bulk = open_cause(page, 3)
    preview(bulk, "Redrive", "The remote is back")
    confirm = bulk.get_by_role("button", name="Redrive 3 tasks")
    expect(confirm).to_be_visible()

    # The plan's action and limit are shown as the plan has them, and cannot be changed.
    expect(bulk.get_by_label("Action")).to_be_disabled()
    expect(bulk.get_by_label("Action")).to_have_value("redrive")
    expect(bulk.get_by_label("Limit")).not_to_be_editable()
    expect(bulk.get_by_label("Reason")).to_be_editable()
    expect(bulk.get_by_label("Action")).to_have_accessible_description(
        "The action, the filter and the limit are the plan's. To change them, choose Change "
        "and preview again."
    )
    bulk.scroll_into_view_if_needed()
    page.screenshot(path=tmp_path / "bulk-locked.png", full_page=True)

    # Change goes back to editing, with what was chosen and typed.
    bulk.get_by_role("button", name="Change").click()
    expect(bulk.get_by_role("button", name="Preview")).to_be_visible()
    expect(bulk.get_by_label("Action")).to_be_enabled()
    expect(bulk.get_by_label("Action")).to_have_value("redrive")
    expect(bulk.get_by_label("Reason")).to_have_value("The remote is back")
    expect(bulk.get_by_label("Limit")).to_be_editable()
    assert {Task.objects.get(pk=t.pk).status for t in tasks} == {TaskStatus.DEAD}

    preview(bulk, "Cancel task", "Obsolete: the articles were withdrawn")
    bulk.get_by_role("button", name="Cancel 3 tasks").click()
    expect(bulk.locator(".notice.success")).to_contain_text("Cancel task: 3 tasks changed")
    assert {Task.objects.get(pk=t.pk).status for t in tasks} == {TaskStatus.CANCELLED}
    print(f"screenshots in {tmp_path}")


def test_an_empty_reason_is_refused_at_the_preview(
    page: Page, causes: None, oncall: User, tmp_path: Path
) -> None:
    log_in(page, oncall)
    tasks, bulk = open_cause(page, 2)
    with page.expect_response("**/dead/bulk/") as answer:
        preview(bulk, "Redrive", "   ")
    assert answer.value.status == 400
    reason = bulk.locator(".field.invalid").filter(has=page.get_by_label("Reason"))
    expect(reason.get_by_role("alert")).to_have_text("reason: is required and may not be empty")
    expect(bulk.locator(".plan")).to_have_count(0)
    expect(bulk.get_by_role("button", name="Preview")).to_be_visible()
    expect(bulk.get_by_label("Action")).to_be_enabled()
    bulk.scroll_into_view_if_needed()
    page.screenshot(path=tmp_path / "bulk-no-reason.png", full_page=True)
    assert {Task.objects.get(pk=t.pk).status for t in tasks} == {TaskStatus.DEAD}
    print(f"screenshots in {tmp_path}")


def test_a_bulk_result_links_its_plan_only_for_who_may_open_the_audit_log(
    page: Page, causes: None, oncall: User, superuser: User
) -> None:
    log_in(page, oncall)
    _, bulk = open_cause(page, 1)
    preview(bulk, "Cancel task", "Obsolete")
    bulk.get_by_role("button", name="Cancel 1 task").click()
    result = bulk.locator(".notice.success")
    expect(result).to_contain_text("Cancel task: 1 task changed")
    expect(result).to_contain_text("each event it wrote carries this id")
    expect(result.locator("a[href*='/audit/']")).to_have_count(0)

    page.context.clear_cookies()
    log_in(page, superuser)
    tasks, bulk = open_cause(page, 1)
    preview(bulk, "Cancel task", "Obsolete")
    bulk.get_by_role("button", name="Cancel 1 task").click()
    plan = bulk.locator(".notice.success a[href*='/audit/?plan=']")
    expect(plan).to_have_count(1)
    plan.click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Audit log")
    expect(page.locator("#results tbody tr")).to_have_count(1)
    expect(page.locator("#results tbody tr")).to_contain_text(f"#{tasks[0].pk}")


def test_a_confirm_clicked_the_moment_it_shows_is_answered_in_place(
    page: Page, causes: None, oncall: User
) -> None:
    """The quickest person: the preview's confirm button is clicked by script in the same
    moment the answer inserts it. It must already be wired to htmx, or the browser posts
    the form itself and the page reloads."""
    log_in(page, oncall)
    tasks, bulk = open_cause(page, 1)
    watch(page)
    # Answers replace #bulk whole: the observer watches the page, and clicks once.
    page.evaluate(
        """() => new MutationObserver((changes, observer) => {
            const button = [...document.querySelectorAll('#bulk button')]
                .find(b => b.textContent.trim() === 'Cancel 1 task');
            if (button) { observer.disconnect(); button.click(); }
        }).observe(document.body, {childList: true, subtree: true})"""
    )
    preview(bulk, "Cancel task", "Obsolete")
    expect(bulk.locator(".notice.success")).to_contain_text("Cancel task: 1 task changed")
    not_reloaded(page)
    assert Task.objects.get(pk=tasks[0].pk).status == TaskStatus.CANCELLED
