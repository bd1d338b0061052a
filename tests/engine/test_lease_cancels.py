"""Cancelling a task while one of its steps runs: the running step's result is kept and the
task ends cancelled; its later steps never run; a failure after the cancel schedules no
retry, and a lease that expires after it cancels the step.

Time moves by back-dating rows (``backdate``), never by sleeping.
"""

from __future__ import annotations

import pytest

from tasks_app import services
from tasks_app.exceptions import InvalidTransition
from tasks_app.models import EventKind, Lease, StepStatus, TaskStatus
from tasks_app.tasks import run_step
from tests.conftest import backdate, event_kinds, only_step
from tests.lease_support import WORKER, claim, events, expire_lease, fresh, step_at
from tests.lease_support import pair as pair  # a fixture, for pytest to find
from tests.lease_support import recorder as recorder  # a fixture, for pytest to find

# --- cancel while a step runs -------------------------------------------------------------


@pytest.mark.django_db
def test_a_cancelled_task_keeps_its_running_steps_result_but_ends_cancelled(pair: str) -> None:
    task = services.enqueue(pair, {}).task
    draft, publish = step_at(task, 0), step_at(task, 1)
    held = claim(draft)
    assert services.heartbeat(held) == services.HeartbeatResult(alive=True, cancel_requested=False)

    services.cancel(task, actor="cli:x", reason="r")

    task.refresh_from_db()
    assert task.live_status == TaskStatus.RUNNING
    assert task.cancel_requested_at is not None
    assert fresh(draft).status == StepStatus.RUNNING
    assert fresh(publish).status == StepStatus.CANCELLED
    requested = events(task, EventKind.CANCEL_REQUESTED)[0]
    assert (requested.actor, requested.reason) == ("cli:x", "r")
    # The running attempt hears of it at its next heartbeat; a second cancel is refused.
    assert services.heartbeat(held) == services.HeartbeatResult(alive=True, cancel_requested=True)
    with pytest.raises(InvalidTransition):
        services.cancel(task, actor="cli:x", reason="twice")

    assert services.complete_step(held, {"draft": "v1"}) is True

    draft = fresh(draft)
    assert (draft.status, draft.result) == (StepStatus.SUCCEEDED, {"draft": "v1"})
    assert fresh(publish).status == StepStatus.CANCELLED
    task.refresh_from_db()
    assert task.status == TaskStatus.CANCELLED
    assert task.finished_at is not None
    assert event_kinds(task) == [
        "enqueued",
        "claimed",
        "cancel_requested",
        "succeeded",
        "cancelled",
    ]
    run_step(publish.pk)
    assert fresh(publish).fencing_token == 0
    assert not Lease.objects.filter(step=publish).exists()
    with pytest.raises(InvalidTransition):
        services.cancel(task, actor="cli:x", reason="again")


@pytest.mark.django_db
def test_a_failure_after_cancel_does_not_schedule_a_retry(pair: str) -> None:
    task = services.enqueue(pair, {}).task
    draft = step_at(task, 0)
    held = claim(draft)
    services.cancel(task, actor="cli:x", reason="r")

    assert (
        services.fail_step(held, error_class="Boom", message="boom", retry_in=1, reason="") is True
    )

    draft = fresh(draft)
    assert (draft.status, draft.attempts) == (StepStatus.CANCELLED, 1)
    task.refresh_from_db()
    assert task.status == TaskStatus.CANCELLED
    assert task.finished_at is not None
    assert EventKind.RETRY_SCHEDULED not in event_kinds(task)
    assert event_kinds(task)[-1] == EventKind.CANCELLED
    backdate(draft)
    assert services.claim_step(draft.pk, worker_id=WORKER) is None


@pytest.mark.django_db
def test_a_lease_that_expires_after_cancel_cancels_the_step() -> None:
    task = services.enqueue("demo.noop", {}).task
    step = only_step(task)
    claim(step)
    services.cancel(task, actor="cli:x", reason="r")

    expire_lease(step)

    assert fresh(step).status == StepStatus.CANCELLED
    task.refresh_from_db()
    assert task.status == TaskStatus.CANCELLED
    assert task.finished_at is not None
    assert events(task, EventKind.LEASE_EXPIRED)[0].data["step_status"] == "cancelled"
    assert event_kinds(task) == [
        "enqueued",
        "claimed",
        "cancel_requested",
        "lease_expired",
        "cancelled",
    ]
    backdate(step)
    assert services.claim_step(step.pk, worker_id=WORKER) is None
