"""An action's answer carries every region of the page that shows what it changed (swapped
out of band), and the dead letters' bulk form, once previewed, is locked to its plan.

The browser walks of the same are in ``tests/browser/test_fresh_pages.py``."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User

from approvals.models import ApprovalRequest
from tests.approval_support import advance, pending_request, press_release
from tests.console_support import HTMX, body, login, plan_of, post_bulk
from tests.factories import dead_task, pending_article_request

pytestmark = pytest.mark.django_db


def region(page: str, tag: str, region_id: str) -> str:
    """The out-of-band copy of the region ``region_id`` in an answer."""
    found = re.search(
        rf'<{tag} [^>]*id="{region_id}"[^>]* hx-swap-oob="true">(.*?)</{tag}>', page, re.S
    )
    assert found, f"no out-of-band #{region_id} in:\n{page[:3000]}"
    return found.group(1)


def decide(client: object, request: ApprovalRequest, decision: str = "approve") -> str:
    response = client.post(  # type: ignore[attr-defined]
        f"/approvals/{request.pk}/decide/",
        {"decision": decision, "comment": "Seen.", "draft_hash": request.draft_hash},
        headers=HTMX,
    )
    assert response.status_code == 200, body(response)[:2000]
    return body(response)


def test_a_decision_answers_with_the_facts_the_edit_offer_and_the_nav_count(
    editor: User, author: User
) -> None:
    request = pending_article_request(actor=author, key="publish:fresh:1")
    pending_article_request(actor=author, key="publish:fresh:2")
    client = login(editor)
    assert 'data-waiting="2"' in body(client.get(f"/approvals/{request.pk}/"))

    page = decide(client, request)

    assert page.lstrip().startswith('<section id="decision"')
    facts = region(page, "dl", "facts")
    assert "Who may decide" in facts and "Expires" not in facts
    assert "Edit the draft" not in region(page, "div", "edit-draft")
    assert 'data-waiting="1"' in region(page, "li", "nav-approvals")


def test_the_second_approval_of_a_press_release_answers_with_the_quorum_reached(
    editor: User, other_editor: User, author: User
) -> None:
    request = pending_request(advance(press_release(actor=author)))
    decide(login(editor), request)

    page = decide(login(other_editor), request)

    facts = region(page, "dl", "facts")
    assert f"2 of 2, each from a different person: {editor.username}, {other_editor.username}" in (
        facts
    )
    assert "Escalation" not in facts
    assert "Edit the draft" not in region(page, "div", "edit-draft")
    assert "data-waiting" not in region(page, "li", "nav-approvals")


def test_a_cancel_on_the_task_page_answers_with_the_nav_count(superuser: User) -> None:
    request = pending_article_request(actor="cli:producer", key="publish:fresh:cancel")
    client = login(superuser)
    response = client.post(
        f"/tasks/{request.task_id}/cancel/", {"reason": "not needed"}, headers=HTMX
    )
    assert response.status_code == 200
    assert body(response).lstrip().startswith('<div id="task"')
    assert "data-waiting" not in region(body(response), "li", "nav-approvals")


def test_a_preview_locks_the_form_to_its_plan_and_change_unlocks_it(oncall: User) -> None:
    dead_task()
    client = login(oncall)

    answer = post_bulk(client, action="cancel", limit="7")
    preview = body(answer)

    action = re.search(r'<select name="action"[^>]*>', preview)
    assert action and " disabled" in action.group(0)
    assert '<input type="hidden" name="action" value="cancel">' in preview
    limit = re.search(r'<input type="number" name="limit"[^>]*>', preview)
    assert limit and 'value="7"' in limit.group(0) and " readonly" in limit.group(0)
    assert '<button type="submit" name="change" value="1">Change</button>' in preview

    again = post_bulk(
        client, action="cancel", limit="7", confirm="1", plan=plan_of(answer), change="1"
    )

    page = body(again)
    assert again.status_code == 200
    assert 'name="plan"' not in page and ">Preview</button>" in page
    assert re.search(r'<select name="action"(?![^>]*disabled)[^>]*>', page)
    assert re.search(r'<option value="cancel" selected>', page)
    assert re.search(r'<input type="number" name="limit"(?![^>]*readonly)[^>]*value="7"', page)
    assert "remote fixed" in page  # the reason as typed


def test_a_bulk_result_links_its_plan_to_the_audit_log_only_for_who_may_read_it(
    superuser: User,
) -> None:
    dead_task()
    client = login(superuser)
    preview = post_bulk(client, action="cancel")
    page = body(post_bulk(client, action="cancel", confirm="1", plan=plan_of(preview)))
    assert re.search(r'Plan <a href="/audit/\?plan=[0-9a-f]+" class="mono">', page)
