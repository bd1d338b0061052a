"""An editor's own revision of the draft under review (``approvals.services.edit_draft``):
a new revision whose drafting row holds the edited draft, a new request for it, the
edit's rules, and what is published once it is approved."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from approvals import services as approvals
from approvals.models import ApprovalRequest, ApprovalStatus, ApprovalVote
from approvals.selectors import review
from approvals.steps import draft_hash
from tasks_app.exceptions import AlreadyDecided, InvalidInput, NotPermitted, StaleApproval
from tasks_app.models import Event, EventKind, Step, StepStatus, Task, TaskStatus
from tests.approval_support import (
    advance,
    article,
    current,
    pending_request,
    press_release,
    result_of,
    ticket,
)
from tests.conftest import _user, event_kinds, together
from tests.remotes import LoopbackRemote

Remotes = tuple[LoopbackRemote, LoopbackRemote]

NEW_TITLE = "Launch day, revised"
NEW_BODY = "Launch day\n\nWhat ships, why, and when."


def _waiting_article(actor: Any = "cli:producer") -> tuple[Task, ApprovalRequest]:
    task = advance(article(actor))
    assert task.status == TaskStatus.WAITING_APPROVAL
    return task, pending_request(task)


def _edit(request: ApprovalRequest, editor: Any, **changes: Any) -> ApprovalRequest | None:
    return approvals.edit_draft(
        request,
        actor=editor,
        changes=changes or {"title": NEW_TITLE, "body": NEW_BODY},
        comment="Tightened the copy",
        draft_hash=request.draft_hash,
    )


# --- the edited revision ------------------------------------------------------------------


def test_an_edit_closes_the_request_and_opens_one_for_the_editors_revision(
    db: None, editor: User
) -> None:
    task, old = _waiting_article()
    old_draft, old_review = current(task, "generate_draft"), current(task, "editor_review")

    new = _edit(old, editor)

    assert new is not None and new.pk != old.pk
    old.refresh_from_db()
    assert (old.status, old.decided_by, old.decided_by_user, old.comment) == (
        ApprovalStatus.EDITED,
        editor.username,
        editor,
        "Tightened the copy",
    )
    assert old.decided_at is not None
    edited = {**old.draft, "title": NEW_TITLE, "body": NEW_BODY}
    assert pending_request(task) == new
    assert (new.revision, new.status) == (1, ApprovalStatus.PENDING)
    assert new.draft_author == editor.username
    assert (new.draft, new.draft_hash) == (edited, draft_hash(edited))
    assert new.draft_step == "generate_draft" and new.quorum == 1
    # The old rows are history; the drafting row of the new revision already holds the
    # edited draft (no worker ran it) and the review waits on it.
    old_draft.refresh_from_db()
    old_review.refresh_from_db()
    assert (old_draft.status, old_review.status) == (StepStatus.SUPERSEDED, StepStatus.SUPERSEDED)
    redraft, regate = current(task, "generate_draft"), current(task, "editor_review")
    assert (redraft.revision, redraft.status, redraft.attempts) == (1, StepStatus.SUCCEEDED, 0)
    assert redraft.result == edited
    assert redraft.idempotency_key.endswith(":0:generate_draft:r1")
    assert (regate.revision, regate.status, new.step_id) == (
        1,
        StepStatus.WAITING_APPROVAL,
        regate.pk,
    )
    assert current(task, "publish").status == StepStatus.BLOCKED
    task.refresh_from_db()
    assert task.status == TaskStatus.WAITING_APPROVAL


def test_an_edit_is_recorded_with_its_editor_then_the_new_request(db: None, editor: User) -> None:
    task, old = _waiting_article()

    new = _edit(old, editor)

    assert new is not None
    assert event_kinds(task)[-2:] == [EventKind.DRAFT_EDITED, EventKind.APPROVAL_REQUESTED]
    edited = Event.objects.for_task(task.pk).get(kind=EventKind.DRAFT_EDITED)
    assert (edited.actor, edited.actor_user_id, edited.reason) == (
        editor.username,
        editor.pk,
        "Tightened the copy",
    )
    assert edited.step_id == old.step_id
    assert (edited.data["request"], edited.data["revision"]) == (old.pk, 1)
    assert (edited.data["draft_hash"], edited.data["edited_hash"]) == (
        old.draft_hash,
        new.draft_hash,
    )
    assert edited.data["fields"] == ["title", "body"]
    requested = Event.objects.for_task(task.pk).filter(kind=EventKind.APPROVAL_REQUESTED).last()
    assert requested is not None and requested.data["request"] == new.pk


def test_the_review_of_the_edited_request_shows_what_the_editor_changed(
    db: None, editor: User
) -> None:
    _, old = _waiting_article()

    new = _edit(old, editor, title=NEW_TITLE)

    assert new is not None
    page = review(new)
    assert page.previous == old
    assert page.changed
    diffs = {field.name: field.diff for field in page.fields}
    assert diffs["body"] is None and diffs["article_id"] is None
    title_diff = diffs["title"]
    assert title_diff is not None
    assert "".join(part.text for part in title_diff if part.op != "insert") == old.draft["title"]
    assert "".join(part.text for part in title_diff if part.op != "delete") == NEW_TITLE
    assert any("revised" in part.text for part in title_diff if part.op == "insert")


def test_a_ticket_reply_may_have_its_subject_edited(db: None, editor: User) -> None:
    task = advance(ticket())
    old = pending_request(task)

    new = _edit(old, editor, subject="Re: your invoice")

    assert new is not None
    assert new.draft == {**old.draft, "subject": "Re: your invoice"}
    assert current(task, "draft_reply").result == new.draft
    # lookup_customer comes before the drafting step: it keeps its only row.
    assert task.steps.filter(kind="lookup_customer").count() == 1


# --- the edit's rules -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field", "rule"),
    [
        ({"article_id": "article-999"}, "draft.article_id", "editable"),
        ({"title": NEW_TITLE, "revision": "7"}, "draft.revision", "editable"),
        ({"title": ""}, "draft.title", "required"),
        ({"title": "   "}, "draft.title", "required"),
        ({"body": "x" * 20_001}, "draft.body", "max_length"),
        ({"title": "x" * 301}, "draft.title", "max_length"),
        ({"title": "Launch day"}, "draft", "changed"),
        ({}, "draft", "changed"),
        ({"title": 42}, "draft.title", "text"),
        ({"body": None}, "draft.body", "text"),
        ({"body": ["a", "list"]}, "draft.body", "text"),
    ],
)
def test_a_bad_edit_is_refused_naming_its_field_and_nothing_is_stored(
    db: None, editor: User, changes: dict[str, Any], field: str, rule: str
) -> None:
    task, request = _waiting_article()
    counts = (Step.objects.count(), ApprovalRequest.objects.count(), Event.objects.count())

    with pytest.raises(InvalidInput) as refused:
        approvals.edit_draft(request, actor=editor, changes=changes, draft_hash=request.draft_hash)

    assert (refused.value.field, refused.value.rule) == (field, rule)
    assert field in str(refused.value)
    assert (Step.objects.count(), ApprovalRequest.objects.count(), Event.objects.count()) == counts
    assert pending_request(task) == request
    assert current(task, "generate_draft").revision == 0
    assert current(task, "editor_review").status == StepStatus.WAITING_APPROVAL


def test_an_edit_of_a_draft_other_than_the_one_under_review_is_refused_as_stale(
    db: None, editor: User
) -> None:
    task, request = _waiting_article()
    events = Event.objects.count()

    with pytest.raises(StaleApproval):
        approvals.edit_draft(
            request,
            actor=editor,
            changes={"title": NEW_TITLE},
            draft_hash=draft_hash({"title": "what the editor saw long ago"}),
        )

    assert pending_request(task) == request
    assert Event.objects.count() == events
    assert task.steps.count() == 4


def test_the_enqueuer_and_an_outsider_may_not_edit(db: None, author: User, outsider: User) -> None:
    task, request = _waiting_article(actor=author)

    with pytest.raises(NotPermitted, match="enqueued"):
        _edit(request, author)
    with pytest.raises(NotPermitted, match="decide permission"):
        _edit(request, outsider)

    assert pending_request(task) == request
    assert EventKind.DRAFT_EDITED not in event_kinds(task)


def test_a_decided_request_may_not_be_edited(db: None, editor: User, other_editor: User) -> None:
    task, request = _waiting_article()
    approvals.approve(request, actor=editor, draft_hash=request.draft_hash)

    with pytest.raises(AlreadyDecided, match=editor.username):
        _edit(request, other_editor)

    assert EventKind.DRAFT_EDITED not in event_kinds(task)
    assert current(task, "publish").status == StepStatus.PENDING


def test_the_old_request_may_not_be_decided_once_edited(
    db: None, editor: User, other_editor: User
) -> None:
    task, old = _waiting_article()
    new = _edit(old, editor)

    with pytest.raises(AlreadyDecided, match=editor.username):
        approvals.approve(old, actor=other_editor, draft_hash=old.draft_hash)
    # The edited request with the hash of the draft before the edit: stale.
    assert new is not None
    with pytest.raises(StaleApproval):
        approvals.approve(new, actor=other_editor, draft_hash=old.draft_hash)
    assert pending_request(task) == new


# --- with a quorum, and what is published ---------------------------------------------------


def test_a_vote_for_the_draft_before_an_edit_does_not_count_for_the_edited_one(
    db: None, editor: User, other_editor: User
) -> None:
    task = advance(press_release())
    old = pending_request(task)
    approvals.approve(old, actor=editor, draft_hash=old.draft_hash)

    new = _edit(old, other_editor)

    assert new is not None and new.quorum == 2
    assert not ApprovalVote.objects.filter(request=new).exists()
    assert new.draft_author == other_editor.username
    # The first editor approves again: one approval of two, still pending.
    approvals.approve(new, actor=editor, draft_hash=new.draft_hash)
    assert pending_request(task) == new
    third = _user("erin-editor", "editors")
    approvals.approve(new, actor=third, draft_hash=new.draft_hash)
    new.refresh_from_db()
    assert new.status == ApprovalStatus.APPROVED
    assert result_of(task, "board_review")["approvers"] == [editor.username, third.username]


def test_approving_the_edited_draft_publishes_the_edited_text(
    db: None, editor: User, other_editor: User, remotes: Remotes
) -> None:
    publishing, _ = remotes
    task, old = _waiting_article()
    new = _edit(old, editor)
    assert new is not None

    approvals.approve(new, actor=other_editor, draft_hash=new.draft_hash)
    task = advance(task)

    assert task.status == TaskStatus.SUCCEEDED
    published = [write["body"] for write in publishing.applied]
    assert [(body["title"], body["body"]) for body in published] == [(NEW_TITLE, NEW_BODY)]
    assert published[0]["approved_by"] == other_editor.username
    assert result_of(task, "publish")["draft_hash"] == new.draft_hash
    assert task.steps.filter(status=StepStatus.SUPERSEDED).count() == 2


# --- a decision racing the edit -------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_an_approval_racing_an_edit_lets_exactly_one_of_them_happen() -> None:
    approver = _user("edith-editor", "editors")
    reviser = _user("eddie-editor", "editors")
    task, old = _waiting_article()

    errors = together(
        lambda: approvals.approve(old, actor=approver, draft_hash=old.draft_hash),
        lambda: _edit(old, reviser),
    )

    assert len(errors) == 1 and isinstance(errors[0], AlreadyDecided), errors
    old.refresh_from_db()
    task.refresh_from_db()
    done = event_kinds(task, EventKind.APPROVED, EventKind.DRAFT_EDITED)
    assert errors[0].decided_by == old.decided_by
    if old.status == ApprovalStatus.APPROVED:
        # The approval won: the edit found the request decided; nothing was revised.
        assert done == [EventKind.APPROVED]
        assert old.decided_by == approver.username
        assert task.steps.filter(status=StepStatus.SUPERSEDED).count() == 0
        assert not ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING).exists()
        assert current(task, "publish").status == StepStatus.PENDING
        assert task.status == TaskStatus.PENDING
    else:
        # The edit won: the approval found the old request edited; the new one waits.
        assert old.status == ApprovalStatus.EDITED and old.decided_by == reviser.username
        assert done == [EventKind.DRAFT_EDITED]
        new = pending_request(task)
        assert (new.revision, new.draft["title"]) == (1, NEW_TITLE)
        assert current(task, "publish").status == StepStatus.BLOCKED
        assert task.status == TaskStatus.WAITING_APPROVAL
    assert ApprovalRequest.objects.filter(task=task).count() == (
        1 if old.status == ApprovalStatus.APPROVED else 2
    )
