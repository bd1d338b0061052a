"""Operator actions racing each other and the system (docs/reliability.md, rows 14 and
15): each pair starts together on its own database connection; whichever takes the
task's lock first wins, the other is refused or applies after it, and every action that
happened has exactly one event. The history check after each test folds every task."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models import F

from approvals import deadlines
from approvals import services as approvals
from approvals.models import ApprovalRequest, ApprovalStatus
from tasks_app import services
from tasks_app.exceptions import AlreadyDecided, ApprovalExpired, InvalidTransition
from tasks_app.models import EventKind, StepStatus, TaskStatus
from tests.approval_support import advance, article, pending_request
from tests.conftest import _user, event_kinds, together
from tests.factories import dead_task

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_double_clicked_redrive_redrives_once() -> None:
    task = dead_task()

    def redrive() -> None:
        services.redrive(task, actor="cli:oncall", reason="remote fixed")

    errors = together(redrive, redrive)

    assert len(errors) == 1 and isinstance(errors[0], InvalidTransition), errors
    assert event_kinds(task, EventKind.REDRIVEN) == [EventKind.REDRIVEN]
    assert task.steps.get().status == StepStatus.PENDING


def test_cancel_racing_a_redrive_ends_one_way_with_an_event_for_each_action_done() -> None:
    task = dead_task()
    errors = together(
        lambda: services.redrive(task, actor="cli:oncall", reason="remote fixed"),
        lambda: services.cancel(task, actor="cli:lead", reason="not needed"),
    )
    task.refresh_from_db()
    done = event_kinds(task, EventKind.REDRIVEN, EventKind.CANCELLED)
    if errors:
        # Cancel went first: a cancelled task has no dead step left to redrive.
        assert len(errors) == 1 and isinstance(errors[0], InvalidTransition), errors
        assert done == [EventKind.CANCELLED]
    else:
        # Redrive went first: the cancel then stopped the step it made due.
        assert done == [EventKind.REDRIVEN, EventKind.CANCELLED]
    assert task.status == TaskStatus.CANCELLED


def test_cancel_racing_a_claim_either_stops_the_claim_or_asks_the_running_step_to_stop() -> None:
    task = services.enqueue("demo.noop", {}).task
    step = task.steps.get()
    claims: list[services.Claim | None] = []
    errors = together(
        lambda: claims.append(services.claim_step(step.pk, worker_id="w1")),
        lambda: services.cancel(task, actor="cli:lead", reason="not needed"),
    )
    assert errors == []
    task.refresh_from_db()
    step.refresh_from_db()
    if claims == [None]:
        # Cancel went first: nothing left to claim.
        assert (task.status, step.status) == (TaskStatus.CANCELLED, StepStatus.CANCELLED)
        assert event_kinds(task, EventKind.CLAIMED, EventKind.CANCELLED) == [EventKind.CANCELLED]
    else:
        # The claim went first: the running step is asked to stop, and its result is fenced.
        assert task.cancel_requested_at is not None and step.status == StepStatus.RUNNING
        assert event_kinds(task, EventKind.CLAIMED, EventKind.CANCEL_REQUESTED) == [
            EventKind.CLAIMED,
            EventKind.CANCEL_REQUESTED,
        ]
        claim = claims[0]
        assert claim is not None
        assert services.complete_step(claim, {})
        task.refresh_from_db()
        assert task.status == TaskStatus.CANCELLED


def test_a_redrive_racing_the_sweeper_is_rung_once_and_redriven_once() -> None:
    task = dead_task()
    errors = together(
        lambda: services.redrive(task, actor="cli:oncall", reason="remote fixed"),
        lambda: services.sweep(),
    )
    assert errors == []
    assert event_kinds(task, EventKind.REDRIVEN) == [EventKind.REDRIVEN]
    step = task.steps.get()
    assert step.status == StepStatus.PENDING and step.attempts == 0


def test_a_decision_racing_expiry_leaves_one_outcome() -> None:
    """docs/reliability.md, row 15: the request expired a moment ago; the sweeper's expiry
    and an editor's approval arrive together. Only the expiry happens: the approval is
    refused as expired (if it came first) or as already decided (if it came second). An
    expiry that met the approval's lock skipped the request (the sweeper waits on nobody):
    the next sweep expires it."""
    author = _user("ava-author", "editors")
    editor = _user("edith-editor", "editors")
    task = advance(article(actor=author))
    request = pending_request(task)
    ApprovalRequest.objects.filter(pk=request.pk).update(
        expires_at=F("created_at") - timedelta(seconds=1)
    )
    errors = together(
        lambda: approvals.approve(request, actor=editor, draft_hash=request.draft_hash),
        lambda: deadlines.expire_due(),
    )
    assert len(errors) == 1 and isinstance(errors[0], ApprovalExpired | AlreadyDecided), errors
    request.refresh_from_db()
    assert request.status in {ApprovalStatus.PENDING, ApprovalStatus.EXPIRED}
    assert deadlines.expire_due() == (1 if request.status == ApprovalStatus.PENDING else 0)
    request.refresh_from_db()
    assert request.status == ApprovalStatus.EXPIRED
    decided = event_kinds(task, EventKind.APPROVED, EventKind.APPROVAL_EXPIRED)
    assert decided == [EventKind.APPROVAL_EXPIRED]
