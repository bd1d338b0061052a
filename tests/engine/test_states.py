"""How an attempt ends (``tasks_app.engine.states``): the status a failed or expired attempt
leaves its step in, and the task's ending event after the attempt's own, written once."""

from __future__ import annotations

import pytest
from django.utils import timezone

from tasks_app.engine.endings import Ending, next_status
from tasks_app.engine.states import end_attempt
from tasks_app.models import Event, EventKind, Step, StepStatus, Task, TaskStatus
from tests.conftest import event_kinds, only_step
from tests.factories import noop


@pytest.mark.parametrize(
    ("cancel", "attempts", "may_retry", "status"),
    [
        (True, 1, True, StepStatus.CANCELLED),  # a cancel wins over attempts left
        (False, 1, True, StepStatus.PENDING),
        (False, 3, True, StepStatus.DEAD),  # the last attempt
        (False, 1, False, StepStatus.DEAD),  # no retry for this error
    ],
)
def test_a_failed_attempt_leaves_its_step_cancelled_pending_or_dead(
    cancel: bool, attempts: int, may_retry: bool, status: str
) -> None:
    task = Task(cancel_requested_at=timezone.now() if cancel else None)
    step = Step(attempts=attempts, max_attempts=3)
    assert next_status(task, step, may_retry=may_retry) == status


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("event", "step_status", "kinds"),
    [
        # The attempt's own event is the ending: written once.
        (EventKind.DEAD_LETTERED, StepStatus.DEAD, ["dead_lettered"]),
        # The attempt's event, then the task's ending, naming its dead step.
        (EventKind.LEASE_EXPIRED, StepStatus.DEAD, ["lease_expired", "dead_lettered"]),
        # Not an ending: the attempt's event alone.
        (EventKind.RETRY_SCHEDULED, StepStatus.PENDING, ["retry_scheduled"]),
    ],
)
def test_the_task_s_ending_event_follows_the_attempt_s_own_once(
    event: str, step_status: str, kinds: list[str]
) -> None:
    task = noop()
    step = only_step(task)
    before = Event.objects.count()

    how = Ending(
        event, actor="worker:w1", status=step_status, ended_by="system:sweeper", ending_reason="why"
    )
    status, _, _ = end_attempt(task, step, how)

    assert event_kinds(task)[-len(kinds) :] == kinds
    assert Event.objects.count() - before == len(kinds)
    if step_status == StepStatus.DEAD:
        assert status == TaskStatus.DEAD
        ending = Event.objects.filter(task_id=task.pk).last()
        assert ending is not None
        assert (ending.step_id, ending.data["task_status"]) == (step.pk, TaskStatus.DEAD)
        assert ending.data["steps"] == {str(step.pk): [StepStatus.DEAD, step.attempts, 0]}
