"""Django's ``django.tasks`` framework enqueues into the durable core."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.tasks import TaskContext, TaskResultStatus, default_task_backend, task, task_backends
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.utils import timezone

from tasks_app import runner, services
from tasks_app.backends import DurableBackend
from tasks_app.models import Event, Lease, Task

from .conftest import backdate, only_step


@task
def add(a: int, b: int) -> int:
    return a + b


@task(priority=7)
def explode(message: str) -> None:
    raise RuntimeError(message)


@task(takes_context=True)
def which_attempt(context: TaskContext) -> str:
    return context.task_result.id


def run(result_id: str) -> None:
    """Run the task's step the way a worker would, back-dating any retry delay."""
    step = only_step(Task.objects.get(pk=int(result_id)))
    backdate(step)
    runner.run_claimed(step.pk)


def test_the_default_backend_is_the_durable_one() -> None:
    assert isinstance(task_backends["default"], DurableBackend)


@pytest.mark.django_db
def test_a_task_function_is_enqueued_run_by_the_worker_and_its_result_read_back() -> None:
    result = add.enqueue(2, 3)

    assert result.status == TaskResultStatus.READY
    stored = Task.objects.get(pk=int(result.id))
    assert stored.workflow == "django.task"
    assert stored.payload["func"] == "tests.test_django_tasks.add"
    assert stored.payload["args"] == [2, 3]

    run(result.id)

    finished = add.get_result(result.id)
    assert finished.status == TaskResultStatus.SUCCESSFUL
    assert finished.return_value == 5
    assert finished.worker_ids == [Lease.objects.get(step__task=stored).worker_id]
    assert finished.started_at is not None and finished.finished_at is not None


@pytest.mark.django_db
def test_a_failing_task_function_retries_then_fails_with_its_errors() -> None:
    result = explode.enqueue("boom")
    stored = Task.objects.get(pk=int(result.id))
    assert stored.priority == 7

    for _ in range(3):
        run(result.id)

    failed = explode.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert len(failed.errors) == 3
    assert failed.errors[-1].exception_class is RuntimeError
    assert "boom" in failed.errors[-1].traceback
    assert len(failed.worker_ids) == 3
    with pytest.raises(ValueError, match="failed"):
        _ = failed.return_value


@pytest.mark.django_db
def test_a_deferred_task_waits_for_its_time() -> None:
    later = timezone.now() + timedelta(hours=1)
    result = add.using(run_after=later).enqueue(1, 1)
    step = only_step(Task.objects.get(pk=int(result.id)))
    assert step.available_at == later
    assert services.claim_step(step.pk, worker_id="w") is None


@pytest.mark.django_db
def test_a_task_taking_context_sees_its_own_result() -> None:
    result = which_attempt.enqueue()
    run(result.id)
    assert which_attempt.get_result(result.id).return_value == result.id


@pytest.mark.django_db
def test_an_unknown_queue_or_non_json_arguments_are_refused_and_nothing_is_stored() -> None:
    with pytest.raises(InvalidTask):
        add.using(queue_name="nowhere").enqueue(1, 2)
    with pytest.raises(InvalidTask):
        add.enqueue(object(), 2)  # type: ignore[arg-type]
    assert not Task.objects.exists()
    assert not Event.objects.exists()


@pytest.mark.django_db
def test_a_result_id_that_is_not_a_django_task_does_not_exist() -> None:
    other = services.enqueue("demo.noop", {}).task
    for result_id in (str(other.pk), "nope", "999999"):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(result_id)


@pytest.mark.django_db
def test_cancel_of_a_django_task_reads_back_as_failed() -> None:
    result = add.enqueue(1, 2)
    services.cancel(Task.objects.get(pk=int(result.id)), actor="cli:test", reason="not needed")
    assert add.get_result(result.id).status == TaskResultStatus.FAILED
