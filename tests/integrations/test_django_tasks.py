"""Django's ``django.tasks`` framework enqueues into the durable core, and behaves as
Django's own backends do for what the API promises.

Steps run in this process through ``tasks_app.engine.runner`` (as a worker would), so the
``task_started`` and ``task_finished`` signals can be heard here; the end-to-end path with
a real worker is in ``test_django_tasks_e2e``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.tasks import TaskContext, TaskResultStatus, default_task_backend, task, task_backends
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.utils import timezone

from tasks_app import services
from tasks_app.backends import (
    DurableBackend,
    FunctionMissing,
    InvalidReturnValue,
    LeaseExpired,
    TaskCancelled,
    TaskExited,
    aenqueue_once,
    enqueue_once,
)
from tasks_app.engine import runner
from tasks_app.exceptions import IdempotencyConflict, InvalidInput, InvalidPayload
from tasks_app.models import Event, Lease, Step, Task, TaskStatus
from tests.conftest import BrokerView, backdate, only_step
from tests.django_task_functions import send_digest


@task
def add(a: int, b: int) -> int:
    return a + b


@task(priority=7)
def explode(message: str) -> None:
    raise RuntimeError(message)


@task(takes_context=True)
def which_attempt(context: TaskContext[Any, Any]) -> str:
    return context.task_result.id


@task
def returns_a_set() -> set[int]:
    return {1, 2}


@task
def exits() -> None:
    sys.exit(3)


def not_declared_as_a_task(value: int) -> int:
    return value


Run = Callable[[str], None]
# (signal name, sender, the TaskResult sent)
Heard = list[tuple[str, type, Any]]


@pytest.fixture
def run(django_capture_on_commit_callbacks: Any) -> Run:
    """Run a task's step the way a worker would (back-dating any retry delay), committing
    so that what is sent after commit is sent."""

    def run(result_id: str) -> None:
        step = only_step(Task.objects.get(pk=int(result_id)))
        backdate(step)
        with django_capture_on_commit_callbacks(execute=True):
            assert runner.run_claimed(step.pk)

    return run


@pytest.fixture
def heard() -> Iterator[Heard]:
    """Every django.tasks signal sent in this process: (name, sender, task result)."""
    seen: Heard = []
    receivers = {}
    for name, signal in (
        ("enqueued", task_enqueued),
        ("started", task_started),
        ("finished", task_finished),
    ):

        def receive(sender: type, *, task_result: Any, name: str = name, **kwargs: Any) -> None:
            seen.append((name, sender, task_result))

        receivers[name] = (signal, receive)
        signal.connect(receive)
    yield seen
    for signal, receive in receivers.values():
        signal.disconnect(receive)


def nothing_stored() -> bool:
    return not Task.objects.exists() and not Event.objects.exists()


def test_the_default_backend_is_the_durable_one() -> None:
    backend = task_backends["default"]
    assert isinstance(backend, DurableBackend)
    assert backend.supports_defer and backend.supports_priority
    assert backend.supports_get_result and backend.supports_async_task


def test_a_queue_the_task_system_does_not_run_fails_the_system_check() -> None:
    backend = DurableBackend("durable", {"QUEUES": ["default", "nowhere"]})
    [error] = backend.check()
    assert error.id == "tasks_app.E001"
    assert "nowhere" in error.msg


# --- enqueue, run, read back -------------------------------------------------------------


@pytest.mark.django_db
def test_the_readme_example_works_as_written(run: Run) -> None:
    result = send_digest.enqueue(42)
    assert send_digest.get_result(result.id).status == TaskResultStatus.READY

    run(result.id)

    assert send_digest.get_result(result.id).status == TaskResultStatus.SUCCESSFUL
    assert send_digest.get_result(result.id).return_value == 84
    assert Task.objects.get(pk=int(result.id)).priority == 5


@pytest.mark.django_db
def test_a_task_function_is_enqueued_run_by_the_worker_and_its_result_read_back(
    run: Run,
) -> None:
    result = add.enqueue(2, b=3)

    assert result.status == TaskResultStatus.READY
    assert (result.args, result.kwargs, result.task) == ([2], {"b": 3}, add)
    assert result.attempts == 0 and result.started_at is None
    stored = Task.objects.get(pk=int(result.id))
    assert stored.workflow == "django.task"
    assert stored.payload["func"] == "tests.integrations.test_django_tasks.add"
    assert result.enqueued_at == stored.created_at

    run(result.id)

    finished = add.get_result(result.id)
    assert finished.status == TaskResultStatus.SUCCESSFUL
    assert finished.is_finished
    assert finished.return_value == 5
    assert finished.attempts == 1
    assert finished.worker_ids == [Lease.objects.get(step__task=stored).worker_id]
    assert finished.started_at is not None and finished.finished_at is not None
    assert finished.enqueued_at is not None
    assert finished.enqueued_at <= finished.started_at <= finished.finished_at
    assert finished.last_attempted_at == finished.started_at
    assert finished.errors == []


@pytest.mark.django_db
def test_a_result_read_right_after_enqueue_equals_the_one_enqueue_returned() -> None:
    result = add.enqueue(1, 2)
    assert default_task_backend.get_result(result.id) == result
    result.refresh()
    assert result.status == TaskResultStatus.READY


@pytest.mark.django_db
def test_results_are_enqueued_and_read_asynchronously_too() -> None:
    result = async_to_sync(add.aenqueue)(1, 2)
    again = async_to_sync(add.aget_result)(result.id)
    assert (again.id, again.status) == (result.id, TaskResultStatus.READY)


@pytest.mark.django_db
def test_a_result_of_another_task_function_is_a_mismatch() -> None:
    result = add.enqueue(1, 2)
    with pytest.raises(TaskResultMismatch):
        send_digest.get_result(result.id)


@pytest.mark.django_db
def test_a_failing_task_function_retries_then_fails_with_each_attempts_error(run: Run) -> None:
    result = explode.enqueue("boom")
    assert Task.objects.get(pk=int(result.id)).priority == 7

    run(result.id)
    retrying = explode.get_result(result.id)
    assert retrying.status == TaskResultStatus.READY  # ready to be executed again
    assert retrying.attempts == 1 and len(retrying.errors) == 1

    run(result.id)
    run(result.id)

    failed = explode.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.is_finished and failed.finished_at is not None
    assert failed.attempts == 3 and len(failed.worker_ids) == 3
    assert [error.exception_class for error in failed.errors] == [RuntimeError] * 3
    assert failed.errors[-1].traceback.startswith("Traceback (most recent call last)")
    assert failed.errors[-1].traceback.endswith("RuntimeError: boom\n")
    with pytest.raises(ValueError, match="failed"):
        _ = failed.return_value


@pytest.mark.django_db
def test_a_task_taking_context_sees_its_own_result(run: Run) -> None:
    result = which_attempt.enqueue()
    run(result.id)
    assert which_attempt.get_result(result.id).return_value == result.id


@pytest.mark.django_db
def test_a_return_value_that_is_not_json_fails_at_once_without_a_retry(run: Run) -> None:
    result = returns_a_set.enqueue()

    run(result.id)

    failed = returns_a_set.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.attempts == 1
    [error] = failed.errors
    assert error.exception_class is InvalidReturnValue
    assert issubclass(error.exception_class, TypeError)  # what Django's backends raise
    assert "Unsupported type" in error.traceback


@pytest.mark.django_db
def test_a_function_that_calls_sys_exit_fails_its_attempt_and_is_retried(run: Run) -> None:
    result = exits.enqueue()

    run(result.id)

    retrying = exits.get_result(result.id)
    assert retrying.status == TaskResultStatus.READY
    [error] = retrying.errors
    assert error.exception_class is TaskExited
    assert "SystemExit: 3" in error.traceback


@pytest.mark.django_db
def test_a_task_whose_function_vanished_reads_back_and_then_fails_with_that_error(
    run: Run,
) -> None:
    # As if the function was removed by a deploy after the task was enqueued.
    payload = {"func": "tests.gone.send_digest", "args": [1], "kwargs": {}, "backend": "default"}
    stored = services.enqueue("django.task", payload).task

    waiting = default_task_backend.get_result(str(stored.pk))
    assert waiting.status == TaskResultStatus.READY
    assert waiting.task.module_path == "tests.gone.send_digest"

    run(str(stored.pk))

    failed = default_task_backend.get_result(str(stored.pk))
    assert failed.status == TaskResultStatus.FAILED
    assert failed.attempts == 1  # dead-lettered at once: retrying cannot bring it back
    [error] = failed.errors
    assert error.exception_class is FunctionMissing
    assert issubclass(error.exception_class, ImportError)
    assert "tests.gone.send_digest" in error.traceback


@pytest.mark.django_db
def test_an_attempt_whose_worker_was_lost_reads_back_as_an_expired_lease() -> None:
    result = add.enqueue(1, 2)
    step = only_step(Task.objects.get(pk=int(result.id)))
    assert services.claim_step(step.pk, worker_id="lost-worker") is not None
    backdate(step)

    assert services.reap_expired_leases() == 1

    again = add.get_result(result.id)
    assert again.status == TaskResultStatus.READY
    assert again.worker_ids == ["lost-worker"]
    [error] = again.errors
    assert error.exception_class is LeaseExpired


@pytest.mark.django_db
def test_a_cancelled_task_reads_back_as_failed_with_who_cancelled_it() -> None:
    result = add.enqueue(1, 2)
    services.cancel(Task.objects.get(pk=int(result.id)), actor="cli:alice", reason="not needed")

    cancelled = add.get_result(result.id)
    assert cancelled.status == TaskResultStatus.FAILED
    assert cancelled.finished_at is not None
    [error] = cancelled.errors
    assert error.exception_class is TaskCancelled
    assert error.traceback == "cancelled by cli:alice: not needed"


@pytest.mark.django_db
def test_a_result_id_that_is_not_a_django_task_does_not_exist() -> None:
    other = services.enqueue("demo.noop", {}).task
    for result_id in (str(other.pk), "nope", "999999", "-1", "1.0", "٣", "9" * 40):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(result_id)


# --- deferral and priority ---------------------------------------------------------------


@pytest.mark.django_db
def test_a_deferred_task_waits_for_its_time() -> None:
    later = timezone.now() + timedelta(hours=1)
    result = add.using(run_after=later).enqueue(1, 1)
    assert result.task.run_after == later
    step = only_step(Task.objects.get(pk=int(result.id)))
    assert step.available_at == later
    assert services.claim_step(step.pk, worker_id="w") is None
    assert add.get_result(result.id).status == TaskResultStatus.READY


@pytest.mark.django_db
def test_a_priority_is_stored_for_the_claim_to_order_by() -> None:
    result = add.using(priority=-3).enqueue(1, 1)
    whole = add.using(priority=5.0).enqueue(1, 2)  # type: ignore[arg-type]
    assert only_step(Task.objects.get(pk=int(result.id))).priority == -3
    assert only_step(Task.objects.get(pk=int(whole.id))).priority == 5


# --- signals -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_enqueued_started_and_finished_are_each_sent_once_with_the_tasks_result(
    heard: Heard, run: Run, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        result = add.enqueue(2, 3)

    run(result.id)

    assert [(name, sender) for name, sender, _ in heard] == [
        ("enqueued", DurableBackend),
        ("started", DurableBackend),
        ("finished", DurableBackend),
    ]
    enqueued, started, finished = (task_result for _, _, task_result in heard)
    assert enqueued is result
    assert (started.id, started.status, started.attempts) == (result.id, "RUNNING", 1)
    assert (finished.id, finished.status, finished.return_value) == (result.id, "SUCCESSFUL", 5)
    assert finished.worker_ids == started.worker_ids


@pytest.mark.django_db
def test_a_failing_task_is_started_once_per_attempt_and_finished_once(
    heard: Heard, run: Run
) -> None:
    result = explode.enqueue("boom")
    for _ in range(3):
        run(result.id)

    assert [(name, r.status, r.attempts) for name, _, r in heard] == [
        ("started", "RUNNING", 1),
        ("started", "RUNNING", 2),
        ("started", "RUNNING", 3),
        ("finished", "FAILED", 3),
    ]
    assert heard[-1][2].errors[-1].exception_class is RuntimeError


@pytest.mark.django_db
def test_a_cancel_finishes_the_task_once_where_the_cancel_happened(
    heard: Heard, django_capture_on_commit_callbacks: Any
) -> None:
    result = add.enqueue(1, 2)
    with django_capture_on_commit_callbacks(execute=True):
        services.cancel(Task.objects.get(pk=int(result.id)), actor="cli:alice", reason="no")
    assert [(name, r.id, r.status) for name, _, r in heard] == [("finished", result.id, "FAILED")]


@pytest.mark.django_db
def test_a_task_of_another_workflow_sends_no_django_tasks_signal(
    heard: Heard, django_capture_on_commit_callbacks: Any
) -> None:
    task_row = services.enqueue("demo.noop", {}).task
    with django_capture_on_commit_callbacks(execute=True):
        runner.run_task_steps(task_row)
    assert Task.objects.get(pk=task_row.pk).status == TaskStatus.SUCCEEDED
    assert heard == []


# --- transactions ------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_an_enqueue_rolled_back_with_its_transaction_leaves_nothing_and_sends_nothing(
    broker: BrokerView, heard: Heard
) -> None:
    with pytest.raises(RuntimeError, match="changed its mind"), transaction.atomic():
        add.enqueue(1, 2)
        assert Task.objects.count() == 1
        raise RuntimeError("the caller changed its mind")

    assert nothing_stored()
    assert broker.step_ids() == []
    assert heard == []


@pytest.mark.django_db(transaction=True)
def test_an_enqueue_in_a_transaction_rings_and_signals_only_once_it_commits(
    broker: BrokerView, heard: Heard
) -> None:
    with transaction.atomic():
        result = add.enqueue(1, 2)
        assert broker.step_ids() == []
        assert heard == []

    assert broker.step_ids() == [only_step(Task.objects.get(pk=int(result.id))).pk]
    assert [(name, r.id) for name, _, r in heard] == [("enqueued", result.id)]


# --- refusals: InvalidTask, and arguments Django refuses ---------------------------------


def _function(qualname: str, module: str = __name__) -> Callable[[], None]:
    """A function that looks declared as ``module.qualname``."""

    def function() -> None:
        return None

    function.__qualname__ = qualname
    function.__module__ = module
    return function


@pytest.mark.parametrize(
    ("function", "message"),
    [
        pytest.param(_function("Digest.send"), "not a method", id="a method"),
        pytest.param(lambda: None, "lambda", id="a lambda"),
        pytest.param(_function("send", "__main__"), "__main__", id="typed in a shell"),
        pytest.param(len, "module level", id="a builtin"),
    ],
)
def test_a_function_no_worker_could_import_is_refused_where_it_is_declared(
    function: Callable[[], None], message: str
) -> None:
    with pytest.raises(InvalidTask, match=message):
        task(function)


def test_a_nested_function_is_refused_as_by_django() -> None:
    def nested() -> None:
        return None

    with pytest.raises(InvalidTask, match="module level"):
        task(nested)


@pytest.mark.django_db
def test_a_function_not_declared_as_a_task_under_its_path_is_refused_at_enqueue() -> None:
    wrapped = task(not_declared_as_a_task)  # the worker would import the bare function
    with pytest.raises(InvalidTask, match="does not name this task"):
        wrapped.enqueue(1)
    assert nothing_stored()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param({"queue_name": "nowhere"}, "Queue 'nowhere'", id="unknown queue"),
        pytest.param({"priority": 101}, "priority", id="priority above 100"),
        pytest.param({"priority": -101}, "priority", id="priority below -100"),
        pytest.param({"priority": 1.5}, "priority", id="fractional priority"),
        pytest.param({"run_after": datetime(2030, 1, 1)}, "aware", id="naive run_after"),
    ],
)
def test_what_validate_task_refuses_is_invalid_task(change: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidTask, match=message):
        add.using(**change)


@pytest.mark.django_db
def test_what_validate_task_refuses_is_refused_at_enqueue_too() -> None:
    # Changed behind validation's back, as a task made under other settings could be.
    changed = add.using()
    object.__setattr__(changed, "queue_name", "nowhere")
    with pytest.raises(InvalidTask, match="nowhere"):
        changed.enqueue(1, 2)
    assert nothing_stored()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        pytest.param([timezone.now()], {}, TypeError, "Unsupported type", id="dt"),
        pytest.param([object()], {}, TypeError, "Unsupported type", id="object"),
        pytest.param([{1, 2}], {}, TypeError, "Unsupported type", id="set"),
        pytest.param([b"\xff"], {}, ValueError, "Unsupported value", id="bytes not utf-8"),
        pytest.param([math.nan], {}, InvalidPayload, "NaN", id="nan"),
        pytest.param([{1: "a"}], {}, InvalidPayload, "not a string", id="int key"),
        pytest.param(["a\x00b"], {}, InvalidPayload, "u0000", id="nul"),
        pytest.param(["x" * 70_000], {}, InvalidPayload, "larger than", id="too big"),
        pytest.param([], {"b": math.inf}, InvalidPayload, "Infinity", id="kwarg inf"),
    ],
)
def test_arguments_that_are_not_json_values_are_refused_and_nothing_is_stored(
    args: list[Any], kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        add.enqueue(*args, **kwargs)
    assert nothing_stored()


@pytest.mark.django_db
def test_arguments_are_normalised_as_by_django() -> None:
    result = add.enqueue((1, 2), b"utf-8 text")  # type: ignore[arg-type]
    assert (result.args, add.get_result(result.id).args) == ([[1, 2], "utf-8 text"],) * 2


# --- the idempotency key -----------------------------------------------------------------


@pytest.mark.django_db
def test_the_same_key_and_arguments_return_the_task_already_enqueued(
    heard: Heard, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        first = enqueue_once(add, "sum:1+2", 1, 2)
        again = enqueue_once(add.using(priority=9), "sum:1+2", 1, 2)

    assert again.id == first.id
    assert again.task.priority == 0  # as it was enqueued
    assert Task.objects.get().idempotency_key == "sum:1+2"
    assert [(name, r.id) for name, _, r in heard] == [("enqueued", first.id)]


@pytest.mark.django_db
def test_the_same_key_with_other_arguments_or_another_function_is_a_conflict() -> None:
    first = enqueue_once(add, "sum:once", 1, 2)

    with pytest.raises(IdempotencyConflict) as caught:
        enqueue_once(add, "sum:once", 2, 2)
    assert caught.value.task_id == int(first.id)
    with pytest.raises(IdempotencyConflict):
        enqueue_once(send_digest, "sum:once", 1)
    assert Task.objects.count() == 1


@pytest.mark.django_db
def test_the_key_follows_the_cores_rules_and_a_bad_one_stores_nothing() -> None:
    for key in ("", "has space", "task-7", "x" * 256):
        with pytest.raises(InvalidInput) as caught:
            enqueue_once(add, key, 1, 2)
        assert caught.value.field == "idempotency_key"
    assert nothing_stored()


@pytest.mark.django_db
def test_the_key_is_read_asynchronously_too() -> None:
    first = async_to_sync(aenqueue_once)(add, "sum:async", 1, 2)
    assert async_to_sync(aenqueue_once)(add, "sum:async", 1, 2).id == first.id


@pytest.mark.django_db
def test_a_key_for_a_task_of_another_backend_is_refused(settings: Any) -> None:
    settings.TASKS = {
        **settings.TASKS,
        "dummy": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"},
    }
    with pytest.raises(InvalidTask, match="keeps no idempotency keys"):
        enqueue_once(add.using(backend="dummy"), "sum:dummy", 1, 2)
    assert not Step.objects.exists()
