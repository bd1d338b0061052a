"""Tasks for the operator actions' tests to act on: dead ones of each kind an action
applies to, and what an action could change, to compare before and after."""

from __future__ import annotations

from typing import Any

from tasks_app import services
from tasks_app.engine import runner
from tasks_app.models import Event, Step, StepStatus, Task, TaskStatus
from tests.conftest import backdate, only_step

RETRYABLE = "tasks_app.exceptions.RetryableError"


def flaky(payload: dict[str, Any], key: str = "flaky:report-1") -> Task:
    return services.enqueue("demo.flaky", payload, idempotency_key=key, actor="cli:producer").task


def run_due(step: Step) -> None:
    """Let the step's time come (retry backoff included), then claim and run it."""
    backdate(step)
    assert runner.run_claimed(step.pk), f"step {step.pk} could not be claimed"
    step.refresh_from_db()


def dead_flaky(payload: dict[str, Any] | None = None, key: str = "flaky:report-1") -> Task:
    """A demo.flaky task that spent its three attempts."""
    task = flaky(payload or {"fail_first": 4}, key)
    step = only_step(task)
    for _ in range(3):
        run_due(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.DEAD, 3, 3)
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD
    return task


def dead_unknown(key: str = "flaky:report-1") -> Task:
    """A demo.flaky task whose step died at its first claim not knowing whether its call
    happened (the only kind of dead step a resolve applies to)."""
    task = flaky({"error": "outcome_unknown", "fail_first": 1}, key)
    step = only_step(task)
    run_due(step)
    assert (step.status, step.error_class) == (StepStatus.DEAD, OUTCOME_UNKNOWN)
    task.refresh_from_db()
    return task


OUTCOME_UNKNOWN = "tasks_app.exceptions.OutcomeUnknown"


def dead_for(action: str) -> Task:
    """A dead task the action applies to."""
    return dead_unknown() if action == "resolve" else dead_flaky()


def snapshot(task: Task) -> tuple[Any, ...]:
    """Everything an operator action could change."""
    task = Task.objects.get(pk=task.pk)
    steps = list(
        task.steps.order_by("position").values_list(
            "status", "attempts", "fencing_token", "available_at", "finished_at"
        )
    )
    events = list(Event.objects.for_task(task.pk).values_list("pk", flat=True))
    return (task.status, task.payload, task.cancel_requested_at, steps, events)
