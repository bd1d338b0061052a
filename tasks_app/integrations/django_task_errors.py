"""The errors a ``django.tasks`` result names: what the function raised, or one of the
small classes here for what the worker saw instead (an expired lease, a cancel, a
function it could not import, a return value that is not JSON, an exit); and the checks
of a call's payload and return value that raise them."""

from __future__ import annotations

from typing import Any

from django.tasks.base import TaskError
from django.utils.json import normalize_json

from tasks_app import validation
from tasks_app.exceptions import InvalidPayload, PermanentError
from tasks_app.models import Event, EventKind, Step, Task

# --- the errors a TaskResult can name, besides what the function raised ----------------------


class FunctionMissing(PermanentError, ImportError):
    """The worker could not import the task's function: retrying cannot help."""


class InvalidReturnValue(PermanentError, TypeError):
    """The function returned something that is not a JSON value: retrying cannot help."""


class TaskExited(Exception):
    """The function raised ``SystemExit`` (or another ``BaseException``): a failed
    attempt, not the end of the worker process."""


class LeaseExpired(Exception):
    """The worker running an attempt stopped renewing its lease (it died or hung)."""


class TaskCancelled(Exception):
    """A person (or a command) cancelled the task."""


class WorkerRefused(Exception):
    """The worker would not run the step: its workflow version or step kind is not
    registered there, or its result could not be stored."""


# --- errors -------------------------------------------------------------------------------------

# The events that end an attempt with an error, or end the task by a cancel.
ERROR_EVENTS = (
    EventKind.RETRY_SCHEDULED,
    EventKind.DEAD_LETTERED,
    EventKind.LEASE_EXPIRED,
    EventKind.CANCEL_REQUESTED,
    EventKind.CANCELLED,
)
CANCEL_EVENTS = (EventKind.CANCEL_REQUESTED, EventKind.CANCELLED)


def _class_path(name: type[BaseException]) -> str:
    return f"{name.__module__}.{name.__qualname__}"


def _error(code: str, text: str) -> TaskError:
    if "." in code:
        return TaskError(exception_class_path=code, traceback=text)
    # The core's own reasons (``incompatible_version``...) are codes, not class paths.
    return TaskError(exception_class_path=_class_path(WorkerRefused), traceback=f"{code}: {text}")


def task_errors(row: Task, step: Step | None) -> list[TaskError]:
    """One TaskError per failed attempt (what it raised, or an expired lease), and one per
    cancel by someone other than the system, in order.

    Events keep the first 2,000 characters of a traceback; the step keeps the last error
    in full (its last 10,000), so the latest error reads from the step.
    """
    errors: list[TaskError] = []
    # The latest attempt error: its index, class and text as the event holds them.
    latest: tuple[int, str, str] | None = None
    for kind, actor, reason, data in (
        Event.objects.for_task(row.pk)
        .filter(kind__in=ERROR_EVENTS)
        .values_list("kind", "actor", "reason", "data")
    ):
        code, text = data.get("error_class"), data.get("error", "")
        if code:
            latest = (len(errors), code, text)
            errors.append(_error(code, text))
        elif kind == EventKind.LEASE_EXPIRED:
            path = _class_path(LeaseExpired)
            text = f"the lease of attempt {data.get('token')} expired before its worker reported"
            errors.append(TaskError(exception_class_path=path, traceback=text))
        elif kind in CANCEL_EVENTS and not actor.startswith("system"):
            text = f"cancelled by {actor}: {reason}"
            errors.append(
                TaskError(exception_class_path=_class_path(TaskCancelled), traceback=text)
            )
    if latest is not None and step is not None:
        index, code, text = latest
        if step.error_class == code and step.last_error.startswith(text):
            errors[index] = _error(code, step.last_error)
    return errors


def json_return_value(value: Any) -> Any:
    try:
        value = normalize_json(value)
        validation.validate_payload({"return_value": value}, field="return value")
    except InvalidPayload as exc:
        # Results have no size limit of their own; every other rule holds.
        if exc.rule != "max_bytes":
            raise InvalidReturnValue(str(exc)) from exc
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidReturnValue(f"return value: {exc}") from exc
    return value


def validate_call_payload(payload: dict[str, Any]) -> None:
    """A ``django.task`` payload names a function and holds its arguments (checked also for
    a payload edited on redrive)."""
    shape = {"func": str, "args": list, "kwargs": dict}
    for name, kind in shape.items():
        if not isinstance(payload.get(name), kind):
            raise InvalidPayload(
                f"payload.{name}", "shape", f"payload: {name} must be a {kind.__name__}"
            )
