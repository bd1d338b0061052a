"""Finding a ``django.tasks`` function by the module path stored with its task: the
producer checks at enqueue that the worker will find it; the worker imports it, or runs a
stand-in that fails naming why when it is gone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.tasks import Task as DjangoTask
from django.tasks.exceptions import InvalidTask
from django.utils.module_loading import import_string

from tasks_app.integrations.django_task_errors import FunctionMissing


def check_importable(task: DjangoTask[..., Any]) -> None:
    """Refuse at enqueue a task the worker would not find by its module path."""
    try:
        found = import_task(task.module_path)
    except FunctionMissing:
        found = None
    if found is None or found.func is not task.func:
        raise InvalidTask(
            f"The worker imports a task by its module path, and {task.module_path!r} does "
            "not name this task: declare it with @task at the top level of an importable "
            "module, under the function's own name."
        )


def import_task(path: str) -> DjangoTask[..., Any]:
    """The ``@task`` at ``path``, or :class:`FunctionMissing` naming why not."""
    try:
        found = import_string(path)
    except Exception as exc:  # ImportError, or whatever importing its module raised
        raise FunctionMissing(f"task function {path!r} cannot be imported: {exc}") from exc
    if not isinstance(found, DjangoTask):
        raise FunctionMissing(f"{path!r} is not a django.tasks Task")
    return found


def stand_in(path: str, reason: str) -> Callable[..., Any]:
    """A function named as the one at ``path`` was, that raises :class:`FunctionMissing`
    with ``reason``: what a result shows for a task whose function is gone."""
    module, _, name = path.rpartition(".")

    def vanished(*args: Any, **kwargs: Any) -> Any:
        raise FunctionMissing(reason)

    vanished.__module__ = module
    vanished.__name__ = vanished.__qualname__ = name
    return vanished
