"""Django's ``django.tasks`` on the durable core.

With ``TASKS = {"default": {"BACKEND": "tasks_app.backends.DurableBackend"}}`` any
``@task`` function enqueues a task of the ``django.task`` workflow; the worker imports the
function by the module path stored in the payload and calls it with the stored arguments.
Retries, leases, events, cancel and redrive work as for any other task. How it maps onto
Django's API, and where it differs from Django's own backends, is in
``docs/django-tasks.md``.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, cast

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core import checks
from django.db import transaction
from django.dispatch import Signal
from django.tasks import Task as DjangoTask
from django.tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.utils import timezone
from django.utils.json import normalize_json

from tasks_app import services, validation
from tasks_app.exceptions import InvalidInput, InvalidPayload, PermanentError

# The error classes a result may name are part of this module's API.
from tasks_app.integrations.django_task_errors import FunctionMissing as FunctionMissing
from tasks_app.integrations.django_task_errors import InvalidReturnValue as InvalidReturnValue
from tasks_app.integrations.django_task_errors import LeaseExpired as LeaseExpired
from tasks_app.integrations.django_task_errors import TaskCancelled as TaskCancelled
from tasks_app.integrations.django_task_errors import TaskExited as TaskExited
from tasks_app.integrations.django_task_errors import WorkerRefused as WorkerRefused
from tasks_app.integrations.django_task_errors import (
    json_return_value,
    task_errors,
    validate_call_payload,
)
from tasks_app.integrations.django_task_functions import check_importable, import_task, stand_in
from tasks_app.models import Step, Task, TaskStatus, leases_of
from tasks_app.signals import task_cancelled, task_dead_lettered, task_succeeded
from tasks_app.workflows import StepContext, StepSpec, Workflow, register

logger = logging.getLogger(__name__)


WORKFLOW = "django.task"
ACTOR = "django.tasks"

STATUS = {
    TaskStatus.PENDING: TaskResultStatus.READY,
    TaskStatus.RUNNING: TaskResultStatus.RUNNING,
    TaskStatus.WAITING_APPROVAL: TaskResultStatus.RUNNING,
    TaskStatus.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    TaskStatus.DEAD: TaskResultStatus.FAILED,
    TaskStatus.CANCELLED: TaskResultStatus.FAILED,
}

# A result id is a task's primary key (a bigint).
MAX_ID_DIGITS = 18


# --- the backend --------------------------------------------------------------------------------


class DurableBackend(BaseTaskBackend):
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        # The queues are the task system's own.
        self.queues = set(params.get("QUEUES", settings.TASKS_QUEUES))

    def validate_task(self, task: DjangoTask[..., Any]) -> None:
        """Django's rules, plus what a worker in another process needs: a function it can
        import by its module path, and a ``run_after`` it can compare with its clock.

        Called when a task is declared and on every ``using()``, so a function no worker
        could import is refused where it is written. Whether the path really names this
        task is checked at enqueue (while its module is still importing, it cannot be).
        """
        super().validate_task(task)
        func = task.func
        if func.__module__ in (None, "__main__"):
            raise InvalidTask(
                "Task function must be defined in an importable module, not in __main__ "
                "(a script or a shell): the worker imports it by its module path."
            )
        if "." in func.__qualname__ or "<" in func.__qualname__:
            raise InvalidTask(
                f"Task function {func.__qualname__!r} must be a plain function at the top "
                "level of its module (not a method, lambda or nested function): the worker "
                "imports it by its module path."
            )
        # Django checks this only with USE_TZ; the core compares with the database's clock.
        if task.run_after is not None and timezone.is_naive(task.run_after):
            raise InvalidTask("run_after must be an aware datetime.")

    def enqueue[**P, R](
        self,
        task: DjangoTask[P, R],
        args: Any,
        kwargs: Any,
        *,
        idempotency_key: str | None = None,
    ) -> TaskResult[P, R]:
        """Store the task in the caller's transaction; the worker is rung, and
        ``task_enqueued`` sent, once it commits (at once in autocommit).

        With ``idempotency_key`` (see :func:`enqueue_once`), the task that key already
        names is returned if its function and arguments are the same, and
        ``IdempotencyConflict`` is raised if they differ.
        """
        self.validate_task(task)
        check_importable(task)
        key = validation.validate_idempotency_key(idempotency_key)
        payload = self._payload(task, args, kwargs)
        try:
            enqueued = services.enqueue(
                WORKFLOW,
                payload,
                idempotency_key=key,
                queue=task.queue_name,
                # Django accepts a whole float (5.0); the core stores an integer.
                priority=int(task.priority),
                run_after=task.run_after,
                actor=ACTOR,
            )
        except InvalidInput as exc:
            raise InvalidTask(str(exc)) from exc
        if not enqueued.created:
            # Nothing new was enqueued: the task the key names, as it is now, no signal.
            return cast("TaskResult[P, R]", self._result(enqueued.task))
        result = self._result(enqueued.task, task=task, fresh=True)
        transaction.on_commit(lambda: _send(task_enqueued, self, result), robust=True)
        return cast("TaskResult[P, R]", result)

    def get_result(self, result_id: Any) -> TaskResult[..., Any]:
        text = str(result_id)
        if not (text.isascii() and text.isdigit() and len(text) <= MAX_ID_DIGITS):
            raise TaskResultDoesNotExist(result_id)
        row = Task.objects.filter(pk=int(text), workflow=WORKFLOW).first()
        if row is None:
            raise TaskResultDoesNotExist(result_id)
        return self._result(row)

    def check(self, **kwargs: Any) -> list[Any]:
        unknown = sorted(self.queues - set(settings.TASKS_QUEUES))
        if not unknown:
            return []
        return [
            checks.Error(
                f"TASKS[{self.alias!r}] names queues the task system does not run: "
                + ", ".join(unknown),
                hint="Add them to TASKS_QUEUES, or leave QUEUES out to use TASKS_QUEUES.",
                obj=self,
                id="tasks_app.E001",
            )
        ]

    def _payload(self, task: DjangoTask[..., Any], args: Any, kwargs: Any) -> dict[str, Any]:
        """The stored payload; arguments Django's backends refuse raise what they raise
        (``TypeError`` for a type JSON lacks), and values the core refuses (NaN, keys that
        are not strings, ``\\u0000``, more than 64 KiB) raise ``InvalidPayload``."""
        try:
            payload = {
                "func": task.module_path,
                "args": normalize_json(args),
                "kwargs": normalize_json(kwargs),
                "takes_context": task.takes_context,
                "backend": self.alias,
            }
        except RecursionError:
            raise InvalidPayload(
                "arguments", "max_depth", f"arguments: nested deeper than {validation.MAX_DEPTH}"
            ) from None
        validation.validate_payload(payload, field="arguments")
        return payload

    def _result(
        self, row: Task, task: DjangoTask[..., Any] | None = None, *, fresh: bool = False
    ) -> TaskResult[..., Any]:
        """The TaskResult of a stored task; ``fresh`` for one just created (no attempts,
        no errors: nothing to read)."""
        payload = row.payload
        leases: list[tuple[str, Any]] = []
        errors: list[TaskError] = []
        step = None
        if not fresh:
            step = Step.objects.filter(task=row).order_by("position", "-revision").first()
            attempts = [lease for held in leases_of(row.steps.all()).values() for lease in held]
            leases = sorted(
                ((lease.worker_id, lease.acquired_at) for lease in attempts),
                key=lambda attempt: attempt[1],
            )
            errors = task_errors(row, step)
        result: TaskResult[..., Any] = TaskResult(
            task=task if task is not None else self._stored_task(row),
            id=str(row.pk),
            status=STATUS[TaskStatus(row.live_status)],
            enqueued_at=row.created_at,
            started_at=leases[0][1] if leases else None,
            finished_at=row.finished_at,
            last_attempted_at=leases[-1][1] if leases else None,
            args=payload.get("args", []),
            kwargs=payload.get("kwargs", {}),
            backend=payload.get("backend", self.alias),
            errors=errors,
            worker_ids=[worker for worker, _ in leases],
        )
        if row.status == TaskStatus.SUCCEEDED and step is not None:
            # A step resolved as done by a person has no return value: None.
            value = (step.result or {}).get("return_value")
            object.__setattr__(result, "_return_value", value)
        return result

    def _stored_task(self, row: Task) -> DjangoTask[..., Any]:
        """The task as it was enqueued (priority, queue, backend), for its result.

        It describes a stored row, so it is built without ``validate_task``: a queue or a
        backend alias removed from the settings since must not make ``get_result`` raise.
        A function that can no longer be imported is stood in for by one that raises
        :class:`FunctionMissing`, under the stored path. ``run_after`` is not kept.
        """
        path = str(row.payload.get("func", ""))
        try:
            found = import_task(path)
            cls: type[DjangoTask[..., Any]] = type(found)
            func, takes_context = found.func, found.takes_context
        except FunctionMissing as exc:
            cls, func, takes_context = DjangoTask, stand_in(path, str(exc)), False
        fields = {
            "func": func,
            "priority": row.priority,
            "backend": row.payload.get("backend", self.alias),
            "queue_name": row.queue,
            "run_after": None,
            "takes_context": takes_context,
        }
        stored = object.__new__(cls)
        for field in dataclasses.fields(cls):
            value = fields.get(field.name, field.default)
            object.__setattr__(stored, field.name, value)
        return stored


# --- the idempotency key ------------------------------------------------------------------------


def enqueue_once[**P, R](
    task: DjangoTask[P, R], idempotency_key: str, /, *args: P.args, **kwargs: P.kwargs
) -> TaskResult[P, R]:
    """``task.enqueue(*args, **kwargs)`` that enqueues at most once per key.

    The same key with the same function and arguments returns the task already enqueued
    (no second task, no second ``task_enqueued``); with another function or other
    arguments it raises ``tasks_app.exceptions.IdempotencyConflict`` and stores nothing.
    """
    return _durable(task).enqueue(task, list(args), kwargs, idempotency_key=idempotency_key)


async def aenqueue_once[**P, R](
    task: DjangoTask[P, R], idempotency_key: str, /, *args: P.args, **kwargs: P.kwargs
) -> TaskResult[P, R]:
    """See :func:`enqueue_once`."""
    backend = _durable(task)
    return await sync_to_async(backend.enqueue, thread_sensitive=True)(
        task, list(args), kwargs, idempotency_key=idempotency_key
    )


def _durable(task: DjangoTask[..., Any]) -> DurableBackend:
    backend = task.get_backend()
    if not isinstance(backend, DurableBackend):
        raise InvalidTask(
            f"Backend {task.backend!r} keeps no idempotency keys: it is not a DurableBackend."
        )
    return backend


# --- signals ------------------------------------------------------------------------------------


def _send(signal: Signal, backend: BaseTaskBackend, result: TaskResult[..., Any]) -> None:
    """Send once the change is committed: a receiver that fails is logged, and cannot undo
    the change or keep the other receivers from hearing it."""
    for receiver, answer in signal.send_robust(sender=type(backend), task_result=result):
        if isinstance(answer, Exception):
            logger.error(
                "receiver %r of a django.tasks signal failed for task #%s",
                receiver,
                result.id,
                exc_info=answer,
            )


def _backend_of(payload: dict[str, Any]) -> DurableBackend | None:
    try:
        backend = task_backends[payload.get("backend", "default")]
    except InvalidTaskBackend:
        return None
    return backend if isinstance(backend, DurableBackend) else None


def _announce_finished(sender: Any, *, task: Task, **kwargs: Any) -> None:
    """``task_finished`` once per outcome (succeeded, dead, cancelled), after the commit
    that reached it, from the process that made it: the worker for a run's outcome."""
    if task.workflow != WORKFLOW:
        return
    backend = _backend_of(task.payload)
    if backend is not None:
        _send(task_finished, backend, backend._result(task))


for _outcome in (task_succeeded, task_dead_lettered, task_cancelled):
    _outcome.connect(_announce_finished, sender=Task, dispatch_uid="django.tasks.finished")


# --- the worker's side --------------------------------------------------------------------------


def call(ctx: StepContext) -> dict[str, Any]:
    """Run the stored ``@task`` function; its return value becomes the step's result.

    1. Import the function by its stored path (:class:`FunctionMissing` dead-letters).
    2. Send ``task_started`` with the task's result as it is now (running, this claim's
       worker id last); a receiver that raises fails the attempt, as with Django's.
    3. Call the function, with the same result as its context if it takes one.
    4. Check the return value is a JSON value; :class:`InvalidReturnValue` dead-letters.
    """
    task = import_task(str(ctx.payload.get("func", "")))
    backend = _backend_of(ctx.payload)
    if backend is None:
        raise PermanentError(f"backend {ctx.payload.get('backend')!r} is not a DurableBackend")
    result = backend._result(Task.objects.get(pk=ctx.task_id))
    task_started.send(sender=type(backend), task_result=result)
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *result.args, **result.kwargs)
        else:
            value = task.call(*result.args, **result.kwargs)
    except (Exception, KeyboardInterrupt):
        raise
    except BaseException as exc:
        raise TaskExited(f"{type(exc).__name__}: {exc}") from exc
    return {"return_value": json_return_value(value)}


register(
    Workflow(
        WORKFLOW,
        1,
        steps=(StepSpec("call", call),),
        validate_payload=validate_call_payload,
        description="A django.tasks function.",
        # Enqueued by the backend for a @task function, not chosen by name.
        internal=True,
    )
)
