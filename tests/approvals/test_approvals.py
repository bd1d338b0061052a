"""Approval steps (DESIGN rule 9): who may decide, re-validation of what is decided, one
decision per request, revisions, expiry and cancel."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db.models import F
from django.db.models.functions import Now

from approvals import services as approvals
from approvals.models import ApprovalRequest, ApprovalStatus, decision_text
from approvals.steps import draft_hash
from tasks_app import services
from tasks_app.exceptions import (
    AlreadyDecided,
    ApprovalExpired,
    InvalidInput,
    InvalidTransition,
    NotPermitted,
    StaleApproval,
)
from tasks_app.models import Event, EventKind, Step, StepStatus, Task, TaskStatus
from tests.approval_support import (
    ARTICLE,
    advance,
    article,
    current,
    pending_request,
    result_of,
    ticket,
)
from tests.conftest import event_kinds, worker_thread
from tests.remotes import LoopbackRemote

Remotes = tuple[LoopbackRemote, LoopbackRemote]


def _waiting_article(
    actor: Any = "cli:producer", key: str = "publish:article-001:v1"
) -> tuple[Task, ApprovalRequest]:
    task = advance(article(actor, key))
    assert task.status == TaskStatus.WAITING_APPROVAL
    return task, pending_request(task)


def _expire(request: ApprovalRequest) -> None:
    ApprovalRequest.objects.filter(pk=request.pk).update(
        expires_at=F("expires_at") - timedelta(hours=49)
    )


# --- reaching the approval step ---------------------------------------------------------


def test_a_task_reaching_its_approval_step_parks_with_a_request_for_the_latest_draft(
    db: None, author: User
) -> None:
    task, request = _waiting_article(actor=author)

    review = current(task, "editor_review")
    draft = current(task, "generate_draft").result
    # Opened when the draft succeeded, in the same commit: no worker ever claimed it.
    assert review.status == StepStatus.WAITING_APPROVAL
    assert (review.attempts, review.fencing_token, review.leases.count()) == (0, 0, 0)
    assert request.step == review
    assert request.draft == draft
    assert request.draft_hash == draft_hash(draft)
    assert (request.action, request.approver_group, request.on_expiry) == (
        "publish",
        "editors",
        "dead_letter",
    )
    assert "article-001" in request.summary and "Launch day" in request.summary
    assert (request.requested_by, request.requested_by_user) == (author.username, author)
    assert request.revision == 0
    assert (
        timedelta(hours=47, minutes=59)
        < request.expires_at - request.created_at
        <= timedelta(hours=48, seconds=1)
    )
    assert event_kinds(task) == [
        EventKind.ENQUEUED,
        EventKind.CLAIMED,
        EventKind.SUCCEEDED,  # generate_draft, and in the same transaction ...
        EventKind.APPROVAL_REQUESTED,  # ... editor_review opened
    ]
    requested = Event.objects.for_task(task.pk).get(kind=EventKind.APPROVAL_REQUESTED)
    assert requested.data["request"] == request.pk
    assert requested.data["draft_hash"] == request.draft_hash
    assert requested.data["task_status"] == TaskStatus.WAITING_APPROVAL


# --- the three decisions ----------------------------------------------------------------


def test_approve_records_the_decision_and_the_task_goes_on_to_publish_once(
    db: None, editor: User, remotes: Remotes
) -> None:
    publishing, _ = remotes
    task, request = _waiting_article()

    approvals.approve(request, actor=editor, comment="Good to go", draft_hash=request.draft_hash)

    request.refresh_from_db()
    assert request.status == ApprovalStatus.APPROVED
    assert (request.decided_by, request.decided_by_user) == (editor.username, editor)
    assert request.decided_at is not None and request.comment == "Good to go"
    review = current(task, "editor_review")
    assert review.status == StepStatus.SUCCEEDED
    assert result_of(task, "editor_review")["approved_by"] == editor.username
    assert result_of(task, "editor_review")["draft_hash"] == request.draft_hash
    approved = Event.objects.for_task(task.pk).get(kind=EventKind.APPROVED)
    assert (approved.actor, approved.actor_user_id, approved.reason) == (
        editor.username,
        editor.pk,
        "Good to go",
    )
    assert current(task, "publish").status == StepStatus.PENDING

    task = advance(task)
    assert task.status == TaskStatus.SUCCEEDED
    assert [write["body"]["body"] for write in publishing.applied] == [request.draft["body"]]
    assert publishing.applied[0]["body"]["approved_by"] == editor.username


def test_reject_cancels_the_task_and_nothing_is_published(
    db: None, editor: User, remotes: Remotes
) -> None:
    publishing, _ = remotes
    task, request = _waiting_article()

    approvals.reject(request, actor=editor, comment="Off-brand", draft_hash=request.draft_hash)

    request.refresh_from_db()
    task.refresh_from_db()
    assert (request.status, request.comment) == (ApprovalStatus.REJECTED, "Off-brand")
    assert task.status == TaskStatus.CANCELLED
    assert set(task.steps.filter(position__gte=1).values_list("status", flat=True)) == {
        StepStatus.CANCELLED
    }
    rejected = Event.objects.for_task(task.pk).get(kind=EventKind.REJECTED)
    assert (rejected.actor, rejected.reason) == (editor.username, "Off-brand")
    # The task's terminal event follows the decision, as on every path that ends a task.
    last = Event.objects.for_task(task.pk).last()
    assert last is not None
    assert (last.kind, last.actor, last.reason) == (
        EventKind.CANCELLED,
        "system",
        f"rejected by {editor.username}",
    )
    assert advance(task).status == TaskStatus.CANCELLED
    assert publishing.received == []


@pytest.mark.parametrize("decide", [approvals.reject, approvals.request_changes])
@pytest.mark.parametrize("comment", ["", "   ", None])
def test_reject_and_request_changes_need_a_comment(
    db: None, editor: User, decide: Any, comment: Any
) -> None:
    task, request = _waiting_article()
    events = Event.objects.count()

    with pytest.raises(InvalidInput) as refused:
        decide(request, actor=editor, comment=comment)

    assert (refused.value.field, refused.value.rule) == ("comment", "required")
    assert pending_request(task) == request
    assert Event.objects.count() == events


def test_request_changes_appends_a_revision_whose_drafting_handler_gets_the_comment(
    db: None, editor: User, other_editor: User, remotes: Remotes
) -> None:
    publishing, _ = remotes
    task, first = _waiting_article()
    old_draft, old_review = current(task, "generate_draft"), current(task, "editor_review")

    approvals.request_changes(
        first, actor=editor, comment="Mention the pricing", draft_hash=first.draft_hash
    )

    first.refresh_from_db()
    assert first.status == ApprovalStatus.CHANGES_REQUESTED
    old_draft.refresh_from_db()
    old_review.refresh_from_db()
    assert (old_draft.status, old_review.status) == (StepStatus.SUPERSEDED, StepStatus.SUPERSEDED)
    assert old_draft.result is not None  # history keeps the replaced draft
    redraft = current(task, "generate_draft")
    regate = current(task, "editor_review")
    assert (redraft.revision, regate.revision) == (1, 1)
    assert redraft.idempotency_key == "publish:article-001:v1:0:generate_draft:r1"
    assert regate.idempotency_key == "publish:article-001:v1:1:editor_review:r1"
    assert (redraft.status, regate.status) == (StepStatus.PENDING, StepStatus.BLOCKED)
    assert redraft.change_request == {
        "comment": "Mention the pricing",
        "by": editor.username,
        "request": first.pk,
        "previous_draft": first.draft,
        "revision": 1,
    }
    changed = Event.objects.for_task(task.pk).get(kind=EventKind.CHANGES_REQUESTED)
    assert (changed.actor, changed.reason, changed.data["revision"]) == (
        editor.username,
        "Mention the pricing",
        1,
    )

    task = advance(task)
    second = pending_request(task)
    assert second.revision == 1 and second.pk != first.pk
    assert "Mention the pricing" in second.draft["body"]
    assert second.draft_hash != first.draft_hash
    assert task.status == TaskStatus.WAITING_APPROVAL

    approvals.approve(second, actor=other_editor, draft_hash=second.draft_hash)
    task = advance(task)
    assert task.status == TaskStatus.SUCCEEDED
    assert [write["body"]["body"] for write in publishing.applied] == [second.draft["body"]]
    assert task.steps.filter(status=StepStatus.SUPERSEDED).count() == 2
    assert task.steps.count() == 6


def test_request_changes_can_send_a_ticket_back_twice_and_each_revision_is_numbered(
    db: None, editor: User
) -> None:
    task = advance(ticket())
    for revision in (1, 2):
        request = pending_request(task)
        approvals.request_changes(request, actor=editor, comment=f"Round {revision}")
        task = advance(task)
        assert current(task, "draft_reply").revision == revision
        assert f"Round {revision}" in pending_request(task).draft["body"]
    # lookup_customer was before the step sent back to: it keeps its first row.
    assert task.steps.filter(kind="lookup_customer").count() == 1
    assert task.steps.filter(kind="draft_reply").count() == 3


# --- re-validation ----------------------------------------------------------------------


def test_a_decision_carrying_an_outdated_draft_hash_is_refused_as_stale(
    db: None, editor: User
) -> None:
    task, request = _waiting_article()

    with pytest.raises(StaleApproval):
        approvals.approve(request, actor=editor, draft_hash=draft_hash({"other": "draft"}))

    assert pending_request(task) == request
    assert EventKind.APPROVED not in event_kinds(task)


def test_a_decision_on_an_outdated_draft_is_refused(db: None, editor: User) -> None:
    task, first = _waiting_article()
    approvals.request_changes(first, actor=editor, comment="Shorter, please")
    task = advance(task)
    second = pending_request(task)

    # The old request was settled by the request for changes; its draft is history.
    with pytest.raises(AlreadyDecided) as decided:
        approvals.approve(first, actor=editor, draft_hash=first.draft_hash)
    assert decided.value.decided_by == editor.username
    # The new request with the hash of the draft the decider saw earlier: stale.
    with pytest.raises(StaleApproval):
        approvals.approve(second, actor=editor, draft_hash=first.draft_hash)
    assert pending_request(task) == second


def test_a_request_whose_draft_changed_underneath_it_is_refused_as_stale(
    db: None, editor: User
) -> None:
    task, request = _waiting_article()
    # The drafting row no longer holds the draft the request was made for.
    Step.objects.filter(pk=current(task, "generate_draft").pk).update(result={"title": "swapped"})

    with pytest.raises(StaleApproval):
        approvals.approve(request, actor=editor, draft_hash=request.draft_hash)
    assert pending_request(task) == request


# --- who may decide ---------------------------------------------------------------------


@pytest.mark.parametrize("persona", ["author", "superuser"])
def test_nobody_decides_on_a_task_they_enqueued_not_even_a_superuser(
    db: None, request: pytest.FixtureRequest, persona: str
) -> None:
    user = request.getfixturevalue(persona)
    task, approval = _waiting_article(actor=user)

    for decide in (approvals.approve, approvals.reject, approvals.request_changes):
        with pytest.raises(NotPermitted, match="enqueued"):
            decide(approval, actor=user, comment="mine", draft_hash=approval.draft_hash)

    assert pending_request(task) == approval


def test_a_command_line_enqueue_names_its_user_who_then_may_not_decide(
    db: None, editor: User
) -> None:
    task, approval = _waiting_article(actor=f"cli:{editor.username}")

    with pytest.raises(NotPermitted, match="enqueued"):
        approvals.approve(approval, actor=editor)
    assert pending_request(task) == approval


def test_a_user_may_not_decide_their_own_task_from_the_command_line_either(
    db: None, author: User
) -> None:
    task, approval = _waiting_article(actor=author)

    with pytest.raises(NotPermitted, match="enqueued"):
        approvals.approve(approval, actor=f"cli:{author.username}")
    assert pending_request(task) == approval


def test_may_decide_offers_only_what_a_decision_would_accept(
    db: None, editor: User, author: User, outsider: User, superuser: User
) -> None:
    _, approval = _waiting_article(actor=author)

    assert approvals.decide_refusal(approval, editor) is None
    assert approvals.decide_refusal(approval, superuser) is None
    assert "enqueued" in (approvals.decide_refusal(approval, author) or "")
    assert "permission" in (approvals.decide_refusal(approval, outsider) or "")
    assert approvals.decide_refusal(approval, None) is not None
    with pytest.raises(NotPermitted, match="enqueued"):
        approvals.approve(approval, actor=author)


@pytest.mark.parametrize("actor", [None, "", "  "])
def test_a_decision_must_say_who_made_it(db: None, actor: Any) -> None:
    task, approval = _waiting_article()

    with pytest.raises(InvalidInput) as refused:
        approvals.approve(approval, actor=actor)

    assert (refused.value.field, refused.value.rule) == ("actor", "required")
    assert pending_request(task) == approval


def test_a_trusted_caller_may_decide_by_name(db: None) -> None:
    task, approval = _waiting_article(actor="cli:producer")

    approvals.approve(approval, actor="cli:release-bot", comment="scheduled release")

    approved = Event.objects.for_task(task.pk).get(kind=EventKind.APPROVED)
    assert (approved.actor, approved.actor_user_id) == ("cli:release-bot", None)
    with pytest.raises(NotPermitted, match="enqueued"):
        approvals.approve(_waiting_article("cli:bot", "publish:article-002")[1], actor="cli:bot")


DECISIONS = [approvals.approve, approvals.reject, approvals.request_changes]


@pytest.mark.parametrize("decide", DECISIONS)
def test_a_user_without_the_decide_permission_is_refused(
    db: None, outsider: User, decide: Any
) -> None:
    task, approval = _waiting_article()
    events = Event.objects.count()

    with pytest.raises(NotPermitted, match="decide permission"):
        decide(approval, actor=outsider, comment="no", draft_hash=approval.draft_hash)

    assert pending_request(task) == approval
    assert Event.objects.count() == events


def test_a_user_with_the_permission_but_outside_the_approvers_is_refused(
    db: None, outsider: User, superuser: User
) -> None:
    outsider.user_permissions.add(Permission.objects.get(codename="decide_approvalrequest"))
    outsider = User.objects.get(pk=outsider.pk)  # a fresh permission cache
    task, approval = _waiting_article()

    for decide in DECISIONS:
        with pytest.raises(NotPermitted, match="group editors"):
            decide(approval, actor=outsider, comment="no", draft_hash=approval.draft_hash)
    assert pending_request(task) == approval

    # A superuser skips the list.
    approvals.approve(approval, actor=superuser, draft_hash=approval.draft_hash)
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED


def test_an_outsider_learns_nothing_about_a_decided_request(
    db: None, editor: User, outsider: User
) -> None:
    _, approval = _waiting_article()
    approvals.approve(approval, actor=editor)

    with pytest.raises(NotPermitted):
        approvals.reject(approval, actor=outsider, comment="no")


# --- one decision, never two ------------------------------------------------------------


def test_a_second_decision_is_refused_and_names_who_decided(
    db: None, editor: User, other_editor: User
) -> None:
    task, approval = _waiting_article()
    approvals.approve(approval, actor=editor)

    with pytest.raises(AlreadyDecided, match=editor.username) as refused:
        approvals.reject(approval, actor=other_editor, comment="too late")

    assert (refused.value.decided_by, refused.value.status) == (editor.username, "approved")
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED
    assert event_kinds(task).count(EventKind.APPROVED) == 1
    assert EventKind.REJECTED not in event_kinds(task)


@pytest.mark.django_db(transaction=True)
def test_concurrent_approve_and_reject_one_wins_and_the_other_is_told_who_decided(
    editor: User, other_editor: User
) -> None:
    task, approval = _waiting_article()
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def decide(action: Any, actor: User, **kwargs: Any) -> Any:
        def run() -> None:
            barrier.wait()
            action(approval, actor=actor, draft_hash=approval.draft_hash, **kwargs)

        return run

    threads = [
        worker_thread(decide(approvals.approve, editor), errors),
        worker_thread(decide(approvals.reject, other_editor, comment="No"), errors),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert len(errors) == 1 and isinstance(errors[0], AlreadyDecided), errors
    approval.refresh_from_db()
    task.refresh_from_db()
    assert errors[0].decided_by == approval.decided_by
    decisions = [k for k in event_kinds(task) if k in (EventKind.APPROVED, EventKind.REJECTED)]
    assert len(decisions) == 1
    if approval.status == ApprovalStatus.APPROVED:
        assert decisions == [EventKind.APPROVED] and task.status == TaskStatus.PENDING
    else:
        assert approval.status == ApprovalStatus.REJECTED
        assert decisions == [EventKind.REJECTED] and task.status == TaskStatus.CANCELLED


# --- expiry, cancel, resolve ------------------------------------------------------------


def test_an_expired_article_review_dead_letters_for_oncall_who_can_redrive_it(
    db: None, editor: User, oncall: User
) -> None:
    task, approval = _waiting_article()
    _expire(approval)

    with pytest.raises(ApprovalExpired):
        approvals.approve(approval, actor=editor)

    report = services.sweep()
    assert report.jobs["expired_approvals"] == 1
    approval.refresh_from_db()
    task.refresh_from_db()
    assert (approval.status, approval.decided_by) == (ApprovalStatus.EXPIRED, "system:sweeper")
    assert task.status == TaskStatus.DEAD
    review = current(task, "editor_review")
    assert (review.status, review.error_class) == (StepStatus.DEAD, EventKind.APPROVAL_EXPIRED)
    expired = Event.objects.for_task(task.pk).get(kind=EventKind.APPROVAL_EXPIRED)
    assert (expired.actor, expired.data["policy"]) == ("system:sweeper", "dead_letter")
    assert event_kinds(task)[-2:] == [EventKind.APPROVAL_EXPIRED, EventKind.DEAD_LETTERED]
    dead = Event.objects.for_task(task.pk).get(kind=EventKind.DEAD_LETTERED)
    assert (dead.reason, dead.step_id) == (EventKind.APPROVAL_EXPIRED, review.pk)
    assert services.sweep().jobs["expired_approvals"] == 0

    # On-call may not wave it through by hand ...
    with pytest.raises(InvalidTransition, match="approval"):
        services.resolve(task, actor=oncall, reason="looks fine", outcome="done")
    # ... but a redrive asks the editors again, with a new request.
    services.redrive(task, actor=oncall, reason="editors are back")
    task = advance(task)
    renewed = pending_request(task)
    assert renewed.pk != approval.pk and renewed.step_id == review.pk
    assert task.status == TaskStatus.WAITING_APPROVAL


def test_an_expired_ticket_review_cancels_the_task(db: None) -> None:
    task = advance(ticket())
    approval = pending_request(task)
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        expires_at=F("expires_at") - timedelta(hours=24, seconds=1)
    )

    services.sweep()

    approval.refresh_from_db()
    task.refresh_from_db()
    assert approval.status == ApprovalStatus.EXPIRED
    assert task.status == TaskStatus.CANCELLED
    assert set(task.steps.filter(position__gte=2).values_list("status", flat=True)) == {
        StepStatus.CANCELLED
    }
    expired = Event.objects.for_task(task.pk).get(kind=EventKind.APPROVAL_EXPIRED)
    assert expired.data["policy"] == "cancel"
    assert event_kinds(task)[-2:] == [EventKind.APPROVAL_EXPIRED, EventKind.CANCELLED]


def test_a_request_not_yet_expired_is_left_alone_by_the_sweeper(db: None) -> None:
    task, approval = _waiting_article()
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        expires_at=F("expires_at") - timedelta(hours=47)
    )

    assert services.sweep().jobs["expired_approvals"] == 0
    assert pending_request(task) == approval


def test_a_task_being_cancelled_refuses_a_decision(db: None, editor: User) -> None:
    task, approval = _waiting_article()
    # A second line of defence: cancel closes the request too, so this state is made here.
    Task.objects.filter(pk=task.pk).update(cancel_requested_at=Now())

    with pytest.raises(InvalidTransition, match="cancelled"):
        approvals.approve(approval, actor=editor)

    assert pending_request(task) == approval
    assert current(task, "editor_review").status == StepStatus.WAITING_APPROVAL


def test_cancelling_a_waiting_task_closes_its_request(db: None, oncall: User, editor: User) -> None:
    task, approval = _waiting_article()

    services.cancel(task, actor=oncall, reason="article withdrawn")

    approval.refresh_from_db()
    assert (approval.status, approval.decided_by, approval.comment) == (
        ApprovalStatus.CANCELLED,
        oncall.username,
        "article withdrawn",
    )
    with pytest.raises(AlreadyDecided, match=oncall.username):
        approvals.approve(approval, actor=editor)


def test_the_events_of_a_reviewed_flow_tell_its_whole_story(
    db: None, editor: User, remotes: Remotes
) -> None:
    task, approval = _waiting_article()
    approvals.request_changes(approval, actor=editor, comment="Add a quote")
    task = advance(task)
    approvals.approve(pending_request(task), actor=editor)
    task = advance(task)

    assert task.status == TaskStatus.SUCCEEDED
    assert event_kinds(task) == [
        EventKind.ENQUEUED,
        EventKind.CLAIMED,
        EventKind.SUCCEEDED,  # generate_draft
        EventKind.APPROVAL_REQUESTED,  # editor_review
        EventKind.CHANGES_REQUESTED,
        EventKind.CLAIMED,
        EventKind.SUCCEEDED,  # generate_draft r1
        EventKind.APPROVAL_REQUESTED,  # editor_review r1
        EventKind.APPROVED,
        EventKind.CLAIMED,
        EventKind.SUCCEEDED,  # publish
        EventKind.CLAIMED,
        EventKind.SUCCEEDED,  # cleanup
    ]
    assert result_of(task, "cleanup")["discarded_revisions"] == 1
    assert result_of(task, "generate_draft")["title"] == ARTICLE["title"]
    # (The autouse history check folds these events and compares them with the rows.)


@pytest.mark.parametrize(
    ("status", "text"),
    [
        ("pending", "Waiting for a decision"),
        ("approved", "Approved by mara"),
        ("rejected", "Rejected by mara"),
        ("changes_requested", "mara asked for changes"),
        ("expired", "Expired: nobody decided in time"),
        ("cancelled", "Cancelled with its task by mara"),
        ("edited", "mara edited the draft: a new revision replaced it"),
    ],
)
def test_what_became_of_a_request_reads_as_a_plain_sentence(status: str, text: str) -> None:
    assert decision_text(ApprovalRequest(status=status, decided_by="mara")) == text
