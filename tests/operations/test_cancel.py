"""Cancel (DESIGN rules 7 and 10): pending and dead work is cancelled at once; running
work is asked to stop, and whatever its attempt then reports (a success, a failure, an
expired lease) ends the task cancelled, never revived or retried."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User

from tasks_app import services
from tasks_app.engine import runner
from tasks_app.exceptions import InvalidTransition
from tasks_app.models import Event, EventKind, StepStatus, Task, TaskStatus
from tasks_app.workflows import StepContext, StepSpec, Workflow, register, registry
from tests.conftest import backdate, event_kinds, only_step
from tests.operator_support import dead_flaky, flaky, run_due, snapshot


def _cancelled_event(task: Task) -> Event:
    return Event.objects.get(task_id=task.pk, kind=EventKind.CANCELLED)


def test_cancelling_pending_work_cancels_it_at_once_and_it_is_never_claimed(
    db: None, oncall: User, broker: Any
) -> None:
    task = flaky({})
    step = only_step(task)

    services.cancel(task, actor=oncall, reason="customer withdrew")

    task.refresh_from_db()
    step.refresh_from_db()
    assert task.status == TaskStatus.CANCELLED
    assert task.finished_at is not None
    assert step.status == StepStatus.CANCELLED
    event = _cancelled_event(task)
    assert (event.actor, event.actor_user_id, event.reason) == (
        "olivia-oncall",
        oncall.pk,
        "customer withdrew",
    )
    assert event.data["steps"] == {str(step.pk): ["cancelled", 0, 0]}

    backdate(step)
    assert services.claim_step(step.pk, worker_id="w1") is None
    assert not runner.run_claimed(step.pk)
    assert services.redispatch_due() == 0
    step.refresh_from_db()
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.CANCELLED, 0, 0)
    assert event_kinds(task) == ["enqueued", "cancelled"]


def test_cancelling_dead_work_cancels_it(db: None, oncall: User) -> None:
    task = dead_flaky()

    services.cancel(task, actor=oncall, reason="report no longer needed")

    task.refresh_from_db()
    step = only_step(task)
    assert task.status == TaskStatus.CANCELLED
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.CANCELLED, 3, 3)
    assert _cancelled_event(task).reason == "report no longer needed"
    with pytest.raises(InvalidTransition):
        services.redrive(task, actor=oncall, reason="changed my mind")
    with pytest.raises(InvalidTransition):
        services.resolve(task, actor=oncall, reason="changed my mind", outcome="retry")


@pytest.fixture
def two_steps(request: pytest.FixtureRequest) -> Iterator[Workflow]:
    def draft(ctx: StepContext) -> dict[str, Any]:
        return {"draft": "v1"}

    def send(ctx: StepContext) -> dict[str, Any]:
        return {"sent": True}

    flow = register(
        Workflow(
            f"test.ops.{request.node.name}"[:100],
            1,
            steps=(StepSpec("draft", draft), StepSpec("send", send)),
        )
    )
    yield flow
    registry.unregister(flow.name, flow.version)


def test_cancelling_running_work_asks_it_to_stop_and_its_late_result_does_not_revive_the_task(
    db: None, oncall: User, two_steps: Workflow
) -> None:
    task = services.enqueue(two_steps.name, {}, idempotency_key="letter:42").task
    first, second = task.steps.order_by("position")
    backdate(first)
    claim = services.claim_step(first.pk, worker_id="w1")
    assert claim is not None

    services.cancel(task, actor=oncall, reason="wrong recipient")

    task.refresh_from_db()
    assert task.status == TaskStatus.RUNNING
    assert task.cancel_requested_at is not None
    requested = Event.objects.get(task_id=task.pk, kind=EventKind.CANCEL_REQUESTED)
    assert (requested.actor, requested.reason) == ("olivia-oncall", "wrong recipient")
    second.refresh_from_db()
    assert second.status == StepStatus.CANCELLED
    assert services.heartbeat(claim) == services.HeartbeatResult(alive=True, cancel_requested=True)
    with pytest.raises(InvalidTransition):
        services.cancel(task, actor=oncall, reason="twice")

    assert services.complete_step(claim, {"draft": "v1"})

    task.refresh_from_db()
    first.refresh_from_db()
    second.refresh_from_db()
    assert task.status == TaskStatus.CANCELLED
    assert task.finished_at is not None
    assert first.status == StepStatus.SUCCEEDED  # it did finish; that is not undone
    assert second.status == StepStatus.CANCELLED
    assert event_kinds(task) == [
        "enqueued",
        "claimed",
        "cancel_requested",
        "succeeded",
        "cancelled",
    ]
    backdate(second)
    assert services.claim_step(second.pk, worker_id="w2") is None
    with pytest.raises(InvalidTransition):
        services.cancel(task, actor=oncall, reason="again")


def test_a_one_step_task_whose_running_step_succeeds_after_a_cancel_ends_cancelled(
    db: None, oncall: User
) -> None:
    task = flaky({})
    step = only_step(task)
    backdate(step)
    claim = services.claim_step(step.pk, worker_id="w1")
    assert claim is not None
    services.cancel(task, actor=oncall, reason="stop it")

    runner.execute(claim)

    step.refresh_from_db()
    task.refresh_from_db()
    # The step keeps its true outcome; the task stays cancelled.
    assert (step.status, step.result) == (StepStatus.SUCCEEDED, {"token": 1, "attempt": 1})
    assert task.status == TaskStatus.CANCELLED
    assert task.finished_at is not None
    assert event_kinds(task) == [
        "enqueued",
        "claimed",
        "cancel_requested",
        "succeeded",
        "cancelled",
    ]
    with pytest.raises(InvalidTransition):
        services.cancel(task, actor=oncall, reason="again")


def test_a_running_step_that_fails_after_a_cancel_ends_cancelled_not_retried(
    db: None, oncall: User
) -> None:
    task = flaky({"fail_first": 1})
    step = only_step(task)
    backdate(step)
    claim = services.claim_step(step.pk, worker_id="w1")
    assert claim is not None
    services.cancel(task, actor=oncall, reason="stop it")

    runner.execute(claim)

    step.refresh_from_db()
    task.refresh_from_db()
    assert (step.status, step.attempts) == (StepStatus.CANCELLED, 1)
    assert task.status == TaskStatus.CANCELLED
    assert event_kinds(task) == ["enqueued", "claimed", "cancel_requested", "cancelled"]
    backdate(step)
    assert services.claim_step(step.pk, worker_id="w2") is None


def test_a_running_step_whose_lease_expires_after_a_cancel_ends_cancelled(
    db: None, oncall: User
) -> None:
    task = flaky({})
    step = only_step(task)
    backdate(step)
    assert services.claim_step(step.pk, worker_id="w1") is not None
    services.cancel(task, actor=oncall, reason="stop it")

    backdate(step)
    assert services.reap_expired_leases() == 1

    step.refresh_from_db()
    task.refresh_from_db()
    assert step.status == StepStatus.CANCELLED
    assert task.status == TaskStatus.CANCELLED
    assert Event.objects.get(task_id=task.pk, kind=EventKind.LEASE_EXPIRED).data["outcome"] == (
        "cancelled"
    )
    assert event_kinds(task) == [
        "enqueued",
        "claimed",
        "cancel_requested",
        "lease_expired",
        "cancelled",
    ]
    backdate(step)
    assert services.claim_step(step.pk, worker_id="w2") is None


def test_cancelling_a_finished_task_is_refused(db: None, oncall: User) -> None:
    succeeded = flaky({}, "flaky:done")
    run_due(only_step(succeeded))
    cancelled = flaky({}, "flaky:cancelled")
    services.cancel(cancelled, actor=oncall, reason="not needed")
    before = [snapshot(succeeded), snapshot(cancelled)]

    for task in (succeeded, cancelled):
        with pytest.raises(InvalidTransition):
            services.cancel(task, actor=oncall, reason="again")

    assert [snapshot(succeeded), snapshot(cancelled)] == before
