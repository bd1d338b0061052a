"""``@task`` functions the ``django.tasks`` tests enqueue, in a module a worker process can
import (the end-to-end tests put the project on its ``PYTHONPATH``).

Signals a worker sends cannot be heard in the test process, so the receivers here write
each one the process sends, as a JSON line, to the file ``DJANGO_TASKS_SIGNAL_LOG`` names
(nothing when it is unset). The worker imports this module to run a task, which connects
them before the task's first signal; the test process imports it too and logs its own
``task_enqueued``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from django.tasks import TaskResult, TaskResultStatus, task
from django.tasks.signals import task_enqueued, task_finished, task_started

SIGNAL_LOG = "DJANGO_TASKS_SIGNAL_LOG"


@task(priority=5)
def send_digest(user_id: int) -> int:
    """The README's example."""
    return user_id * 2


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def fail(message: str) -> None:
    raise RuntimeError(message)


@task
def label(name: str) -> str:
    return name


def _logger(name: str) -> Any:
    def record(sender: type, *, task_result: TaskResult[..., Any], **kwargs: Any) -> None:
        path = os.environ.get(SIGNAL_LOG)
        if not path:
            return
        successful = task_result.status == TaskResultStatus.SUCCESSFUL
        line = {
            "signal": name,
            "sender": f"{sender.__module__}.{sender.__qualname__}",
            "pid": os.getpid(),
            "id": task_result.id,
            "status": str(task_result.status),
            "priority": task_result.task.priority,
            "attempts": task_result.attempts,
            "worker_ids": task_result.worker_ids,
            "return_value": task_result.return_value if successful else None,
            "errors": [error.exception_class_path for error in task_result.errors],
        }
        # One short write in append mode: lines from several processes do not interleave.
        with Path(path).open("a", encoding="utf-8") as log:
            log.write(json.dumps(line) + "\n")

    return record


_receivers = {name: _logger(name) for name in ("enqueued", "started", "finished")}
task_enqueued.connect(_receivers["enqueued"], dispatch_uid="tests.signal_log.enqueued")
task_started.connect(_receivers["started"], dispatch_uid="tests.signal_log.started")
task_finished.connect(_receivers["finished"], dispatch_uid="tests.signal_log.finished")


def read_signal_log(path: Path, result_id: str | None = None) -> list[dict[str, Any]]:
    """The signals logged so far, in the order they were written (of one task, if given)."""
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [line for line in lines if result_id is None or line["id"] == result_id]
