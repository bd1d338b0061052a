"""Separation of duties by person, not by account spelling: whoever wrote the draft under
review (an editor's own edit) or enqueued its task may not decide it nor count in its
quorum, however their name is spelled (``approvals.people.person``); deciding, the quorum,
the notices and the inbox all ask the same rule."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from approvals import services as approvals
from approvals.models import ApprovalRequest, ApprovalStatus, ApprovalVote
from approvals.notices import concerned
from approvals.people import person, same_person
from approvals.selectors import inbox
from tasks_app.exceptions import AlreadyDecided, NotPermitted
from tasks_app.models import TaskStatus
from tests.approval_support import advance, article, pending_request, press_release

OWN_EDIT = "you wrote this draft"


def _edited(task_of: Any, editor: Any) -> ApprovalRequest:
    """The request for ``editor``'s own revision of a waiting draft."""
    task = advance(task_of())
    request = pending_request(task)
    successor = approvals.edit_draft(
        request,
        actor=editor,
        changes={"title": "Launch day, revised"},
        comment="Tightened the title",
        draft_hash=request.draft_hash,
    )
    assert successor is not None and successor.status == ApprovalStatus.PENDING
    return successor


def _votes(request: ApprovalRequest) -> int:
    return ApprovalVote.objects.filter(request=request).count()


# --- the draft's author --------------------------------------------------------------------


@pytest.mark.parametrize("decision", ["approve", "reject", "request_changes"])
def test_an_editor_may_not_decide_their_own_edit(db: None, editor: User, decision: str) -> None:
    request = _edited(article, editor)

    with pytest.raises(NotPermitted, match=OWN_EDIT):
        getattr(approvals, decision)(
            request, actor=editor, comment="looks right to me", draft_hash=request.draft_hash
        )

    request.refresh_from_db()
    assert request.status == ApprovalStatus.PENDING
    assert request.task.status == TaskStatus.WAITING_APPROVAL


def test_the_author_of_an_edit_does_not_count_in_a_quorum_of_two(
    db: None, editor: User, other_editor: User, author: User
) -> None:
    request = _edited(press_release, editor)

    with pytest.raises(NotPermitted, match=OWN_EDIT):
        approvals.approve(request, actor=editor, draft_hash=request.draft_hash)
    approvals.approve(request, actor=other_editor, draft_hash=request.draft_hash)

    assert _votes(request) == 1
    assert pending_request(request.task) == request  # still one short: someone else's


def test_an_edit_made_by_a_trusted_name_binds_the_user_it_names(db: None, editor: User) -> None:
    request = _edited(article, f"cli:{editor.username.upper()}")

    with pytest.raises(NotPermitted, match=OWN_EDIT):
        approvals.approve(request, actor=editor, draft_hash=request.draft_hash)
    assert not concerned(request, editor)  # nor told to review it


def test_the_author_finds_their_edit_in_the_inbox_under_others_with_why(
    db: None, editor: User, other_editor: User
) -> None:
    request = _edited(article, editor)

    mine = inbox(editor)
    assert request not in mine.mine
    [why] = [why for listed, why in mine.others if listed == request]
    assert OWN_EDIT in why
    assert request in inbox(other_editor).mine
    assert concerned(request, other_editor) and not concerned(request, editor)


# --- one person, however spelled -----------------------------------------------------------


SPELLINGS = [
    "cli:edith-editor",
    "cli:Edith-Editor",
    "EDITH-EDITOR",
    "\uff45\uff44\uff49\uff54\uff48-\uff45\uff44\uff49\uff54\uff4f\uff52",  # full-width letters
    "cli: edith-editor ",
]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_person_counts_once_in_a_quorum_however_their_name_is_spelled(
    db: None, editor: User, spelling: str
) -> None:
    task = advance(press_release())
    request = pending_request(task)
    approvals.approve(request, actor=editor, draft_hash=request.draft_hash)

    with pytest.raises(AlreadyDecided, match="you already approved"):
        approvals.approve(request, actor=spelling, draft_hash=request.draft_hash)

    assert _votes(request) == 1


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_the_enqueuer_may_not_decide_under_another_spelling_of_their_name(
    db: None, editor: User, spelling: str
) -> None:
    task = advance(article(actor=editor))
    request = pending_request(task)

    with pytest.raises(NotPermitted, match="you enqueued"):
        approvals.approve(request, actor=spelling, draft_hash=request.draft_hash)


def test_different_people_stay_different() -> None:
    assert person("cli:Edith") == person("edith") == person("\uff25\uff44\uff49\uff54\uff48")
    assert not same_person(("edith", None), ("eddie", None))
    assert not same_person(("", None), ("", None))  # nobody is not somebody
    assert same_person(("renamed", 7), ("edith", 7))  # one account, whatever it is called
