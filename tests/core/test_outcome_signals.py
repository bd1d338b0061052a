"""The completion signals producers listen to: sent once per outcome, after the commit
that reached it, never for a transition rolled back."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import transaction

from tasks_app import services
from tasks_app.engine import fastpath, runner
from tasks_app.models import Task, TaskStatus
from tasks_app.signals import task_cancelled, task_dead_lettered, task_succeeded

pytestmark = pytest.mark.django_db

Capture = Callable[..., Any]


@pytest.fixture
def heard() -> Iterator[list[tuple[str, int, str]]]:
    """Every outcome signal sent: (signal, task id, the task's status when sent)."""
    seen: list[tuple[str, int, str]] = []
    receivers = {}
    for name, signal in (
        ("succeeded", task_succeeded),
        ("dead", task_dead_lettered),
        ("cancelled", task_cancelled),
    ):

        def receive(sender: Any, *, task: Task, name: str = name, **kwargs: Any) -> None:
            seen.append((name, task.pk, task.status))

        receivers[name] = receive
        signal.connect(receive, sender=Task)
    yield seen
    task_succeeded.disconnect(receivers["succeeded"], sender=Task)
    task_dead_lettered.disconnect(receivers["dead"], sender=Task)
    task_cancelled.disconnect(receivers["cancelled"], sender=Task)


def test_a_task_that_succeeds_is_announced_once_after_commit(
    heard: list[tuple[str, int, str]], django_capture_on_commit_callbacks: Capture
) -> None:
    task = services.enqueue("demo.noop", {}).task
    with django_capture_on_commit_callbacks(execute=True):
        runner.run_task_steps(task)
    assert heard == [("succeeded", task.pk, TaskStatus.SUCCEEDED)]


def test_successes_recorded_in_a_batch_are_announced_too(
    heard: list[tuple[str, int, str]], django_capture_on_commit_callbacks: Capture
) -> None:
    tasks = [services.enqueue("demo.noop", {"n": n}).task for n in range(3)]
    with django_capture_on_commit_callbacks(execute=True):
        runner.run_batch(fastpath.claim_batch(worker_id="w", limit=10, queue="default"))
    assert sorted(heard) == [("succeeded", task.pk, TaskStatus.SUCCEEDED) for task in tasks]


def test_a_batch_announces_each_task_as_the_database_holds_it(
    django_capture_on_commit_callbacks: Capture,
) -> None:
    """The batch builds the announced tasks from the rows its statement returned; they
    carry every field as a read after the commit gives it."""
    sent: list[Task] = []

    def receive(sender: Any, *, task: Task, **kwargs: Any) -> None:
        sent.append(task)

    task_succeeded.connect(receive, sender=Task)
    try:
        for n in range(3):
            services.enqueue(
                "demo.noop", {"n": n, "deep": {"list": [n, None]}}, idempotency_key=f"k{n}"
            )
        with django_capture_on_commit_callbacks(execute=True):
            runner.run_batch(fastpath.claim_batch(worker_id="w", limit=10, queue="default"))
    finally:
        task_succeeded.disconnect(receive, sender=Task)
    assert len(sent) == 3
    for task in sent:
        stored = Task.objects.get(pk=task.pk)
        fields = [field.attname for field in Task._meta.concrete_fields]
        assert {name: getattr(task, name) for name in fields} == {
            name: getattr(stored, name) for name in fields
        }
        assert task.payload["deep"] == {"list": [task.payload["n"], None]}


def test_each_death_is_an_outcome_of_its_own_and_a_cancel_another(
    heard: list[tuple[str, int, str]], django_capture_on_commit_callbacks: Capture
) -> None:
    task = services.enqueue("demo.flaky", {"error": "permanent", "fail_first": 2}).task
    # Each transaction commits in its own block, as a worker and an operator would.
    with django_capture_on_commit_callbacks(execute=True):
        runner.run_task_steps(task)
    with django_capture_on_commit_callbacks(execute=True):
        services.redrive(task, actor="cli:oncall", reason="try again")
    with django_capture_on_commit_callbacks(execute=True):
        runner.run_task_steps(task)
    with django_capture_on_commit_callbacks(execute=True):
        services.cancel(task, actor="cli:oncall", reason="give up")
    assert heard == [
        ("dead", task.pk, TaskStatus.DEAD),
        ("dead", task.pk, TaskStatus.DEAD),
        ("cancelled", task.pk, TaskStatus.CANCELLED),
    ]


def test_nothing_is_announced_before_the_commit_or_for_a_rollback(
    heard: list[tuple[str, int, str]], django_capture_on_commit_callbacks: Capture
) -> None:
    task = services.enqueue("demo.noop", {}).task
    with (
        django_capture_on_commit_callbacks(execute=True) as callbacks,
        pytest.raises(RuntimeError),
        transaction.atomic(),
    ):
        services.cancel(task, actor="cli:oncall", reason="oops")
        assert heard == []  # not yet: the cancel has not committed
        raise RuntimeError("roll it back")
    assert callbacks == [] and heard == []
    task.refresh_from_db()
    assert task.status == TaskStatus.PENDING


def test_a_failing_receiver_does_not_stop_the_others(
    heard: list[tuple[str, int, str]], django_capture_on_commit_callbacks: Capture
) -> None:
    def broken(sender: Any, **kwargs: Any) -> None:
        raise ValueError("receiver bug")

    task_succeeded.connect(broken, sender=Task)
    try:
        task = services.enqueue("demo.noop", {}).task
        with django_capture_on_commit_callbacks(execute=True):
            runner.run_task_steps(task)
    finally:
        task_succeeded.disconnect(broken, sender=Task)
    assert heard == [("succeeded", task.pk, TaskStatus.SUCCEEDED)]
