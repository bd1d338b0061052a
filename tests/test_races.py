"""Operator actions racing each other and the system (docs/reliability.md, rows 14 and
15): each pair starts together on its own database connection; whichever takes the
task's lock first wins, the other is refused or applies after it, and every action that
happened has exactly one event. The history check after each test folds every task."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db.models import F

from approvals import services as approvals
from approvals.models import ApprovalRequest, ApprovalStatus
from tasks_app import services
from tasks_app.exceptions import AlreadyDecided, ApprovalExpired, InvalidTransition
from tasks_app.models import Event, EventKind, StepStatus, Task, TaskStatus

from .approval_support import advance, article, pending_request
from .conftest import _user, worker_thread
from .console_support import dead_task

pytestmark = pytest.mark.django_db(transaction=True)


def together(*actions: Callable[[], Any]) -> list[BaseException]:
    """Run the actions at once, each in a thread with its own connection; their errors."""
    barrier = threading.Barrier(len(actions))
    errors: list[BaseException] = []

    def starting(action: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            barrier.wait()
            action()

        return run

    threads = [worker_thread(starting(action), errors) for action in actions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads), "an action is still waiting"
    return errors


def kinds(task: Task, *wanted: str) -> list[str]:
    events = Event.objects.for_task(task.pk).values_list("kind", flat=True)
    return [kind for kind in events if kind in wanted]


def test_a_double_clicked_redrive_redrives_once() -> None:
    task = dead_task()

    def redrive() -> None:
        services.redrive(task, actor="cli:oncall", reason="remote fixed")

    errors = together(redrive, redrive)

    assert len(errors) == 1 and isinstance(errors[0], InvalidTransition), errors
    assert kinds(task, EventKind.REDRIVEN) == [EventKind.REDRIVEN]
    assert task.steps.get().status == StepStatus.PENDING


def test_cancel_racing_a_redrive_ends_one_way_with_an_event_for_each_action_done() -> None:
    task = dead_task()
    errors = together(
        lambda: services.redrive(task, actor="cli:oncall", reason="remote fixed"),
        lambda: services.cancel(task, actor="cli:lead", reason="not needed"),
    )
    task.refresh_from_db()
    done = kinds(task, EventKind.REDRIVEN, EventKind.CANCELLED)
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
        assert kinds(task, EventKind.CLAIMED, EventKind.CANCELLED) == [EventKind.CANCELLED]
    else:
        # The claim went first: the running step is asked to stop, and its result is fenced.
        assert task.cancel_requested_at is not None and step.status == StepStatus.RUNNING
        assert kinds(task, EventKind.CLAIMED, EventKind.CANCEL_REQUESTED) == [
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
    assert kinds(task, EventKind.REDRIVEN) == [EventKind.REDRIVEN]
    step = task.steps.get()
    assert step.status == StepStatus.PENDING and step.attempts == 0


def test_a_decision_racing_expiry_leaves_one_outcome() -> None:
    """docs/reliability.md, row 15: the request expired a moment ago; the sweeper's expiry
    and an editor's approval arrive together. Only the expiry happens: the approval is
    refused as expired (if it came first) or as already decided (if it came second)."""
    author = _user("ava-author", "editors")
    editor = _user("edith-editor", "editors")
    task = advance(article(actor=author))
    request = pending_request(task)
    ApprovalRequest.objects.filter(pk=request.pk).update(
        expires_at=F("created_at") - timedelta(seconds=1)
    )
    errors = together(
        lambda: approvals.approve(request, actor=editor, draft_hash=request.draft_hash),
        lambda: approvals.expire_due(),
    )
    assert len(errors) == 1 and isinstance(errors[0], ApprovalExpired | AlreadyDecided), errors
    request.refresh_from_db()
    assert request.status == ApprovalStatus.EXPIRED
    decided = kinds(task, EventKind.APPROVED, EventKind.APPROVAL_EXPIRED)
    assert decided == [EventKind.APPROVAL_EXPIRED]
