"""Test data built the way production builds it: tasks through ``services.enqueue`` (the only
way a task is made), brought to the state a test needs by running their steps in this
process. Claims and leases are built by ``tests.lease_support``, approval workflows' tasks by
``tests.approval_support``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import F
from django.utils import timezone

from approvals.models import ApprovalRequest
from tasks_app import services
from tasks_app.access import Actor
from tasks_app.engine import runner
from tasks_app.models import Step, StepStatus, Task, TaskStatus
from tests.approval_support import advance, article, pending_request

PRODUCER = "cli:producer"


# --- tasks ----------------------------------------------------------------------------------


def enqueued(
    workflow: str = "demo.noop",
    payload: dict[str, Any] | None = None,
    *,
    key: str | None = None,
    actor: Actor = None,
    **options: Any,
) -> Task:
    """A new task, its first step due; ``options`` are enqueue's (queue, priority,
    run_after)."""
    return services.enqueue(
        workflow,
        payload if payload is not None else {},
        idempotency_key=key,
        actor=actor,
        **options,
    ).task


def noop(key: str | None = None) -> Task:
    return enqueued("demo.noop", {}, key=key, actor=PRODUCER)


def succeeded(key: str | None = None) -> Task:
    task = noop(key)
    runner.run_task_steps(task)
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    return task


def dead_task(
    payload: dict[str, Any] | None = None, *, key: str | None = None, actor: Actor = PRODUCER
) -> Task:
    """A ``demo.flaky`` task that died at its first claim (a permanent error unless the
    payload says otherwise)."""
    task = enqueued(
        "demo.flaky",
        payload if payload is not None else {"error": "permanent", "fail_first": 1},
        key=key,
        actor=actor,
    )
    runner.run_task_steps(task)
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD, task.status
    return task


def unknown_outcome(key: str | None = None) -> Task:
    """A ``demo.flaky`` task that died at its first claim not knowing whether its call was
    applied (``OutcomeUnknown``)."""
    return dead_task({"error": "outcome_unknown", "fail_first": 1}, key=key)


def retrying(*, retry_in: timedelta = timedelta(hours=1)) -> Task:
    """A ``demo.flaky`` task whose first attempt failed, its retry due ``retry_in`` from now."""
    task = enqueued("demo.flaky", {"fail_first": 1})
    step = task.steps.get()
    assert runner.run_claimed(step.pk)  # one claim: it fails, a retry is scheduled
    # demo.flaky backs off for a second at most: the retry is moved on so that it is still
    # scheduled, not due, while the test looks.
    Step.objects.filter(pk=step.pk).update(available_at=timezone.now() + retry_in)
    step.refresh_from_db()
    assert (step.status, step.attempts) == (StepStatus.PENDING, 1), step.status
    return task


def backdate_task(task: Task, **ago: timedelta) -> None:
    """Move the task's times named in ``ago`` (``created_at``, ``finished_at``) that far
    into the past, as if the time had gone by."""
    Task.objects.filter(pk=task.pk).update(**{name: F(name) - delta for name, delta in ago.items()})


# --- approvals ------------------------------------------------------------------------------


def pending_article_request(
    actor: Actor = PRODUCER, key: str = "publish:article-001:v1"
) -> ApprovalRequest:
    """A new ``publish_article`` task run until its draft waits for review: the request."""
    return pending_request(advance(article(actor=actor, key=key)))
