"""A quorum of approvers (press_release: two editors): each approval is a vote, a person
counts once, the request is approved by its second distinct voter, and any other decision
ends it at once. Races run on real threads against PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User

from approvals import services as approvals
from approvals.models import ApprovalRequest, ApprovalStatus, ApprovalVote
from tasks_app.exceptions import AlreadyDecided, NotPermitted
from tasks_app.models import Event, EventKind, StepStatus, Task, TaskStatus
from tests.approval_support import (
    advance,
    article,
    current,
    pending_request,
    press_release,
    result_of,
)
from tests.conftest import _user, event_kinds, together
from tests.remotes import LoopbackRemote

Remotes = tuple[LoopbackRemote, LoopbackRemote]


def _waiting_release(actor: object = "cli:producer") -> tuple[Task, ApprovalRequest]:
    task = advance(press_release(actor))
    assert task.status == TaskStatus.WAITING_APPROVAL
    return task, pending_request(task)


def _voters(request: ApprovalRequest) -> list[str]:
    return list(ApprovalVote.objects.filter(request=request).values_list("voter", flat=True))


# --- the request a quorum step opens ----------------------------------------------------------


def test_a_press_release_review_needs_two_approvals_and_escalates_and_reminds_in_time(
    db: None,
) -> None:
    _, request = _waiting_release()

    assert (request.quorum, request.approver_group) == (2, "editors")
    assert (request.escalate_to, request.escalated_at, request.reminded_at) == (
        "senior_editors",
        None,
        None,
    )
    assert request.escalates_at is not None and request.remind_at is not None
    assert request.escalates_at - request.created_at == pytest.approx(
        timedelta(hours=8), abs=timedelta(seconds=1)
    )
    # Reminded 4 hours before its 24 hours run out.
    assert request.expires_at - request.remind_at == timedelta(hours=4)
    assert request.expires_at - request.created_at == pytest.approx(
        timedelta(hours=24), abs=timedelta(seconds=1)
    )
    assert request.groups == ["editors"]  # the second group only once escalated


# --- one vote at a time -------------------------------------------------------------------


def test_one_approval_of_two_leaves_the_request_pending_and_is_recorded_as_an_event(
    db: None, editor: User
) -> None:
    task, request = _waiting_release()

    returned = approvals.approve(
        request, actor=editor, comment="Fine by me", draft_hash=request.draft_hash
    )

    assert returned.status == ApprovalStatus.PENDING
    assert pending_request(task) == request
    request.refresh_from_db()
    assert (request.decided_by, request.decided_at) == ("", None)
    assert current(task, "board_review").status == StepStatus.WAITING_APPROVAL
    assert current(task, "publish").status == StepStatus.BLOCKED
    task.refresh_from_db()
    assert task.status == TaskStatus.WAITING_APPROVAL
    vote = ApprovalVote.objects.get(request=request)
    assert (vote.voter, vote.voter_user, vote.draft_hash, vote.comment) == (
        editor.username,
        editor,
        request.draft_hash,
        "Fine by me",
    )
    recorded = Event.objects.for_task(task.pk).get(kind=EventKind.APPROVAL_RECORDED)
    assert (recorded.actor, recorded.actor_user_id, recorded.reason) == (
        editor.username,
        editor.pk,
        "Fine by me",
    )
    assert (recorded.data["approvals"], recorded.data["quorum"]) == (1, 2)
    assert recorded.data["request"] == request.pk
    assert EventKind.APPROVED not in event_kinds(task)


def test_the_same_editor_approving_twice_is_refused_and_counts_once(db: None, editor: User) -> None:
    task, request = _waiting_release()
    approvals.approve(request, actor=editor, draft_hash=request.draft_hash)

    with pytest.raises(AlreadyDecided, match="you already approved") as refused:
        approvals.approve(request, actor=editor, draft_hash=request.draft_hash)

    assert "1 more approval " in str(refused.value)
    assert _voters(request) == [editor.username]
    assert pending_request(task) == request
    assert event_kinds(task, EventKind.APPROVAL_RECORDED, EventKind.APPROVED) == [
        EventKind.APPROVAL_RECORDED
    ]


def test_an_editor_approving_as_a_user_and_again_by_name_counts_once(
    db: None, editor: User
) -> None:
    """A trusted caller's "cli:<name>" is that person, as for the enqueuer's own task: one
    person's approvals count once whichever way in they came."""
    task, request = _waiting_release()
    approvals.approve(request, actor=editor, draft_hash=request.draft_hash)

    with pytest.raises(AlreadyDecided, match="you already approved"):
        approvals.approve(request, actor=f"cli:{editor.username}", draft_hash=request.draft_hash)

    assert _voters(request) == [editor.username]
    assert pending_request(task) == request


def test_a_second_distinct_editor_approves_the_request_and_the_task_goes_on_to_publish(
    db: None, editor: User, other_editor: User, remotes: Remotes
) -> None:
    publishing, _ = remotes
    task, request = _waiting_release()
    approvals.approve(request, actor=editor, draft_hash=request.draft_hash)

    approvals.approve(request, actor=other_editor, comment="Ship it", draft_hash=request.draft_hash)

    request.refresh_from_db()
    assert request.status == ApprovalStatus.APPROVED
    assert request.decided_by == f"{editor.username}, {other_editor.username}"
    assert request.decided_by_user == other_editor
    review = result_of(task, "board_review")
    assert review["approvers"] == [editor.username, other_editor.username]
    assert review["approved_by"] == f"{editor.username}, {other_editor.username}"
    assert review["draft_hash"] == request.draft_hash
    assert current(task, "publish").status == StepStatus.PENDING
    assert event_kinds(task, EventKind.APPROVAL_RECORDED, EventKind.APPROVED) == [
        EventKind.APPROVAL_RECORDED,
        EventKind.APPROVED,
    ]
    approved = Event.objects.for_task(task.pk).get(kind=EventKind.APPROVED)
    assert (approved.actor, approved.reason) == (other_editor.username, "Ship it")

    task = advance(task)
    assert task.status == TaskStatus.SUCCEEDED
    assert [write["body"]["body"] for write in publishing.applied] == [request.draft["body"]]
    assert publishing.applied[0]["body"]["approved_by"] == request.decided_by


def test_the_enqueuer_may_not_cast_a_vote(db: None, author: User, editor: User) -> None:
    task, request = _waiting_release(actor=author)

    with pytest.raises(NotPermitted, match="enqueued"):
        approvals.approve(request, actor=author, draft_hash=request.draft_hash)
    approvals.approve(request, actor=editor, draft_hash=request.draft_hash)
    with pytest.raises(NotPermitted, match="enqueued"):
        approvals.approve(request, actor=author, draft_hash=request.draft_hash)

    assert _voters(request) == [editor.username]
    assert pending_request(task) == request


def test_a_rejection_after_one_approval_ends_the_request_at_once(
    db: None, editor: User, other_editor: User
) -> None:
    task, request = _waiting_release()
    approvals.approve(request, actor=editor, draft_hash=request.draft_hash)

    approvals.reject(
        request, actor=other_editor, comment="Not yet public", draft_hash=request.draft_hash
    )

    request.refresh_from_db()
    task.refresh_from_db()
    assert (request.status, request.decided_by, request.comment) == (
        ApprovalStatus.REJECTED,
        other_editor.username,
        "Not yet public",
    )
    assert task.status == TaskStatus.CANCELLED
    assert current(task, "publish").status == StepStatus.CANCELLED
    assert event_kinds(
        task, EventKind.APPROVAL_RECORDED, EventKind.APPROVED, EventKind.REJECTED
    ) == [
        EventKind.APPROVAL_RECORDED,
        EventKind.REJECTED,
    ]
    with pytest.raises(AlreadyDecided, match=other_editor.username):
        approvals.approve(request, actor=_user("erin-editor", "editors"))


def test_changes_requested_after_one_approval_start_the_count_again(
    db: None, editor: User, other_editor: User
) -> None:
    task, first = _waiting_release()
    approvals.approve(first, actor=editor, draft_hash=first.draft_hash)

    approvals.request_changes(
        first, actor=other_editor, comment="Add a quote", draft_hash=first.draft_hash
    )
    task = advance(task)

    first.refresh_from_db()
    assert (first.status, first.decided_by) == (
        ApprovalStatus.CHANGES_REQUESTED,
        other_editor.username,
    )
    second = pending_request(task)
    assert (second.revision, second.quorum) == (1, 2)
    assert _voters(second) == []
    # The editor who approved the first draft must approve the second again, and one
    # approval of it is not yet enough.
    approvals.approve(second, actor=editor, draft_hash=second.draft_hash)
    assert pending_request(task) == second
    approvals.approve(second, actor=other_editor, draft_hash=second.draft_hash)
    second.refresh_from_db()
    assert second.status == ApprovalStatus.APPROVED
    assert result_of(task, "board_review")["approvers"] == [
        editor.username,
        other_editor.username,
    ]


def test_a_quorum_of_one_approves_at_the_first_approval_without_a_recorded_vote_event(
    db: None, editor: User
) -> None:
    task = advance(article())
    request = pending_request(task)

    approvals.approve(request, actor=editor, draft_hash=request.draft_hash)

    request.refresh_from_db()
    assert (request.status, request.decided_by) == (ApprovalStatus.APPROVED, editor.username)
    assert result_of(task, "editor_review")["approvers"] == [editor.username]
    assert EventKind.APPROVAL_RECORDED not in event_kinds(task)


# --- races ----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_one_editor_approving_twice_at_once_casts_one_vote() -> None:
    editor = _user("edith-editor", "editors")
    task, request = _waiting_release()

    def approve() -> None:
        approvals.approve(request, actor=editor, draft_hash=request.draft_hash)

    errors = together(approve, approve)

    assert len(errors) == 1 and isinstance(errors[0], AlreadyDecided), errors
    assert "you already approved" in str(errors[0])
    assert _voters(request) == [editor.username]
    assert pending_request(task) == request
    assert event_kinds(task, EventKind.APPROVAL_RECORDED, EventKind.APPROVED) == [
        EventKind.APPROVAL_RECORDED
    ]


@pytest.mark.django_db(transaction=True)
def test_two_editors_approving_at_once_approve_the_request_once() -> None:
    editors = [_user("edith-editor", "editors"), _user("eddie-editor", "editors")]
    task, request = _waiting_release()

    def approve(editor: User) -> None:
        approvals.approve(request, actor=editor, draft_hash=request.draft_hash)

    errors = together(lambda: approve(editors[0]), lambda: approve(editors[1]))

    assert errors == []
    request.refresh_from_db()
    voters = _voters(request)
    assert sorted(voters) == sorted(editor.username for editor in editors)
    assert request.status == ApprovalStatus.APPROVED
    assert request.decided_by == ", ".join(voters)  # in the order the votes were cast
    assert result_of(task, "board_review")["approvers"] == voters
    # The publish step was made due once: one row, pending, and one approval event.
    publish = task.steps.filter(kind="publish")
    assert [step.status for step in publish] == [StepStatus.PENDING]
    assert event_kinds(task, EventKind.APPROVAL_RECORDED, EventKind.APPROVED) == [
        EventKind.APPROVAL_RECORDED,
        EventKind.APPROVED,
    ]
    task.refresh_from_db()
    assert task.status == TaskStatus.PENDING
