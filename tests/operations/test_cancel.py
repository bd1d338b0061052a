"""Cancel (DESIGN rules 7 and 10): pending and dead work is cancelled at once, and a
finished task cannot be. Running work is asked to stop; what its attempt then reports is
in ``tests/engine/test_lease_cancels.py``."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from tasks_app import services
from tasks_app.engine import runner
from tasks_app.exceptions import InvalidTransition
from tasks_app.models import Event, EventKind, StepStatus, Task, TaskStatus
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
