"""The approvals pages: what waits for the viewer, the review of a draft with its
changes and comments, and a decision taken, refused or shown once made."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User

from approvals import services as approvals
from tests.approval_support import advance, pending_request
from tests.console_support import HTMX, body, login
from tests.factories import pending_article_request

pytestmark = pytest.mark.django_db


def test_the_approvals_list_shows_what_the_viewer_may_decide_oldest_first(
    editor: User, author: User
) -> None:
    first = pending_article_request(actor=author, key="publish:a:1")
    second = pending_article_request(actor=author, key="publish:a:2")
    page = body(login(editor).get("/approvals/"))
    assert page.index(f"Approval #{first.pk}") < page.index(f"Approval #{second.pk}")
    # The author may not decide their own tasks: nothing waits for them.
    assert "Nothing is waiting for you." in body(login(author).get("/approvals/"))


def test_a_decision_with_a_stale_draft_hash_is_refused_and_says_so(
    editor: User, author: User
) -> None:
    request = pending_article_request(actor=author)
    response = login(editor).post(
        f"/approvals/{request.pk}/decide/",
        {"decision": "approve", "comment": "", "draft_hash": "0" * 64},
        headers=HTMX,
    )
    assert response.status_code == 409
    assert "is not the draft under review" in body(response)
    request.refresh_from_db()
    assert request.status == "pending"


def test_reject_needs_a_comment(editor: User, author: User) -> None:
    request = pending_article_request(actor=author)
    response = login(editor).post(
        f"/approvals/{request.pk}/decide/",
        {"decision": "reject", "comment": "", "draft_hash": request.draft_hash},
        headers=HTMX,
    )
    assert response.status_code == 400
    assert "comment: " in body(response)


def test_the_review_shows_the_new_revision_with_its_word_diff_and_earlier_comments(
    editor: User, author: User
) -> None:
    first = pending_article_request(actor=author)
    response = login(editor).post(
        f"/approvals/{first.pk}/decide/",
        {
            "decision": "request_changes",
            "comment": "mention the date",
            "draft_hash": first.draft_hash,
        },
    )
    assert response.status_code == 302
    second = pending_request(advance(first.task))
    assert second.revision == 1
    page = body(login(editor).get(f"/approvals/{second.pk}/"))
    assert "What changed since revision 0" in page
    assert re.search(r"<ins>[^<]*mention the date[^<]*</ins>", page)
    assert f"Revision 0: {editor.username} asked for changes" in page and "mention the date" in page
    assert "Publishes article article-001" in page  # what an approval lets happen
    assert "next step: publish" in page


def test_approving_in_the_browser_form_lets_the_task_go_on(editor: User, author: User) -> None:
    request = pending_article_request(actor=author)
    response = login(editor).post(
        f"/approvals/{request.pk}/decide/",
        {"decision": "approve", "comment": "", "draft_hash": request.draft_hash},
        headers=HTMX,
    )
    assert response.status_code == 200
    assert f"Approval #{request.pk} approved." in body(response)
    request.refresh_from_db()
    assert (request.status, request.decided_by) == ("approved", editor.username)


def test_a_decided_request_shows_who_decided_instead_of_the_form(
    editor: User, other_editor: User, author: User
) -> None:
    request = pending_article_request(actor=author)
    approvals.approve(request, actor=other_editor, draft_hash=request.draft_hash)
    page = body(login(editor).get(f"/approvals/{request.pk}/"))
    assert f"by {other_editor.username}" in page
    assert ">Approve</button>" not in page


def test_every_page_names_an_approval_alike_and_prints_the_revision_it_holds(
    editor: User, other_editor: User, author: User
) -> None:
    request = pending_article_request(actor=author)
    approvals.request_changes(request, actor=editor, comment="Shorter title")
    second = pending_request(advance(request.task))
    edited = approvals.edit_draft(
        second, actor=other_editor, changes={"title": "Short"}, comment="done"
    )
    assert edited is not None and edited.revision == 2
    # The draft carries no revision of its own that an edit would leave behind.
    assert "revision" not in edited.draft and "Revision 1" not in edited.draft["body"]
    client = login(editor)
    review = body(client.get(f"/approvals/{edited.pk}/"))
    assert f"<h1>Approval #{edited.pk} " in review and "revision 2</span>" in review
    assert "Review #" not in review and "Revision</h3>" not in review
    listed = body(client.get("/approvals/"))
    assert f">Approval #{edited.pk}</a>" in listed and "Review #" not in listed
    assert re.search(r"<td>2 <span class=\"muted\">\(edited by", listed)
