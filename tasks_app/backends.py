"""Django's ``django.tasks`` on the durable core.

With ``TASKS = {"default": {"BACKEND": "tasks_app.backends.DurableBackend"}}`` any
``@task`` function enqueues a task of the ``django.task`` workflow; the worker imports the
function by the module path stored in the payload and calls it with the stored arguments.
Retries, leases, events, cancel and redrive work as for any other task.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.tasks import Task as DjangoTask
from django.tasks import TaskContext, TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.utils.json import normalize_json
from django.utils.module_loading import import_string

from . import services
from .exceptions import InvalidInput, PermanentError
from .models import Event, EventKind, Lease, Step, Task, TaskStatus
from .workflows import StepContext, StepSpec, Workflow, register

WORKFLOW = "django.task"

STATUS = {
    TaskStatus.PENDING: TaskResultStatus.READY,
    TaskStatus.RUNNING: TaskResultStatus.RUNNING,
    TaskStatus.WAITING_APPROVAL: TaskResultStatus.RUNNING,
    TaskStatus.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    TaskStatus.DEAD: TaskResultStatus.FAILED,
    TaskStatus.CANCELLED: TaskResultStatus.FAILED,
}


class DurableBackend(BaseTaskBackend):
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        # The queues are the task system's own.
        self.queues = set(params.get("QUEUES", settings.TASKS_QUEUES))

    def enqueue(self, task: DjangoTask, args: list[Any], kwargs: dict[str, Any]) -> TaskResult:
        self.validate_task(task)
        try:
            payload = {
                "func": task.module_path,
                "args": normalize_json(args),
                "kwargs": normalize_json(kwargs),
                "takes_context": task.takes_context,
                "backend": self.alias,
            }
        except (TypeError, ValueError) as exc:
            raise InvalidTask(f"arguments must be JSON values: {exc}") from None
        try:
            result = services.enqueue(
                WORKFLOW,
                payload,
                queue=task.queue_name,
                priority=task.priority,
                run_after=task.run_after,
                actor="django.tasks",
            )
        except InvalidInput as exc:
            raise InvalidTask(str(exc)) from exc
        return self._result(result.task, task)

    def get_result(self, result_id: str) -> TaskResult:
        try:
            pk = int(result_id)
        except (TypeError, ValueError):
            raise TaskResultDoesNotExist(result_id) from None
        row = Task.objects.filter(pk=pk, workflow=WORKFLOW).first()
        if row is None:
            raise TaskResultDoesNotExist(result_id)
        return self._result(row, _django_task(row.payload))

    def _result(self, row: Task, task: DjangoTask) -> TaskResult:
        leases = list(
            Lease.objects.filter(step__task=row)
            .order_by("acquired_at")
            .values_list("worker_id", "acquired_at")
        )
        errors = [
            TaskError(
                exception_class_path=data.get("error_class", ""), traceback=data.get("error", "")
            )
            for data in Event.objects.for_task(row.pk)
            .filter(kind__in=[EventKind.RETRY_SCHEDULED, EventKind.DEAD_LETTERED])
            .values_list("data", flat=True)
            if data.get("error_class")
        ]
        result: TaskResult = TaskResult(
            task=task,
            id=str(row.pk),
            status=STATUS[TaskStatus(row.status)],
            enqueued_at=row.created_at,
            started_at=leases[0][1] if leases else None,
            finished_at=row.finished_at,
            last_attempted_at=leases[-1][1] if leases else None,
            args=row.payload.get("args", []),
            kwargs=row.payload.get("kwargs", {}),
            backend=self.alias,
            errors=errors,
            worker_ids=[worker for worker, _ in leases],
        )
        if row.status == TaskStatus.SUCCEEDED:
            step = Step.objects.filter(task=row).order_by("-revision").first()
            value = (step.result or {}).get("return_value") if step else None
            object.__setattr__(result, "_return_value", value)
        return result


def _django_task(payload: dict[str, Any]) -> DjangoTask:
    try:
        task = import_string(payload["func"])
    except (ImportError, KeyError) as exc:
        raise PermanentError(f"task function {payload.get('func')!r} cannot be imported") from exc
    if not isinstance(task, DjangoTask):
        raise PermanentError(f"{payload['func']!r} is not a django.tasks Task")
    return task


def call(ctx: StepContext) -> dict[str, Any]:
    """Run the stored ``@task`` function; its return value becomes the step's result."""
    task = _django_task(ctx.payload)
    args, kwargs = ctx.payload.get("args", []), ctx.payload.get("kwargs", {})
    if ctx.payload.get("takes_context"):
        backend = task.get_backend()
        row = Task.objects.get(pk=ctx.task_id)
        context = TaskContext(task_result=backend.get_result(str(row.pk)))
        value = task.call(context, *args, **kwargs)
    else:
        value = task.call(*args, **kwargs)
    return {"return_value": normalize_json(value)}


register(
    Workflow(WORKFLOW, 1, steps=(StepSpec("call", call),), description="A django.tasks function.")
)
