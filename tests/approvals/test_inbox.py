"""The editors' inbox: a login lands an editor on the approvals waiting for them, the nav
counts them, and a request they may not decide is listed with why, not hidden."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db.models.functions import Now
from django.urls import reverse

from approvals.models import ApprovalRequest
from approvals.selectors import inbox, names_approver
from tests.approval_support import advance, article, pending_request, press_release, ticket
from tests.console_support import login


@pytest.mark.django_db
def test_a_login_lands_editors_on_the_approvals_auditors_on_the_audit_log_others_on_the_overview(
    editor: User, oncall: User, auditor: User, superuser: User
) -> None:
    assert login(editor).get(reverse("console:start"))["Location"] == "/approvals/"
    assert login(auditor).get(reverse("console:start"))["Location"] == "/audit/"
    assert login(oncall).get(reverse("console:start"))["Location"] == "/"
    assert login(superuser).get(reverse("console:start"))["Location"] == "/"


@pytest.mark.django_db
def test_an_editor_sees_the_requests_they_may_not_decide_with_why(
    editor: User, other_editor: User
) -> None:
    theirs = pending_request(advance(article(actor=editor)))
    open_one = pending_request(advance(ticket()))

    seen = inbox(editor)

    assert seen.mine == [open_one]
    assert [(request, why) for request, why in seen.others] == [
        (theirs, f"you enqueued task #{theirs.task_id}: someone else must decide on it")
    ]
    assert inbox(other_editor).mine == [theirs, open_one]
    page = login(editor).get(reverse("console:approvals")).content.decode()
    assert "Waiting for someone else" in page
    assert f"You enqueued task #{theirs.task_id}: someone else must decide on it" in page


@pytest.mark.django_db
def test_the_nav_counts_the_requests_waiting_for_the_reader(
    editor: User, other_editor: User, oncall: User
) -> None:
    pending_request(advance(article(actor=editor)))
    pending_request(advance(ticket()))

    def waiting(user: User) -> str:
        page = login(user).get(reverse("console:tasks")).content.decode()
        marker = 'data-waiting="'
        return page[page.index(marker) + len(marker) :].split('"')[0] if marker in page else ""

    assert waiting(editor) == "1"
    assert waiting(other_editor) == "2"
    assert waiting(oncall) == ""  # on-call does not see approvals


@pytest.mark.django_db
def test_a_login_lands_anyone_an_open_request_names_on_the_approvals(
    superuser: User, senior_editor: User
) -> None:
    request = pending_request(advance(press_release()))
    # Named by nothing open: a superuser and a senior editor (before any escalation) land
    # where they always did.
    assert login(superuser).get(reverse("console:start"))["Location"] == "/"
    assert names_approver(senior_editor) is False

    ApprovalRequest.objects.filter(pk=request.pk).update(
        approver_users=[superuser.username], escalated_at=Now()
    )

    assert login(superuser).get(reverse("console:start"))["Location"] == "/approvals/"
    # Escalated, the request names the second group too.
    assert names_approver(senior_editor) is True
    assert inbox(senior_editor).mine == [request]
