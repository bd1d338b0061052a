"""Dead letters of chosen causes, for the tests of grouping and acting on them: two test
workflows whose one step makes the external writes its payload names and then dies of the
message it is given (``dead``), and the dead step of a task (``dead_step``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from tasks_app import services
from tasks_app.engine import runner
from tasks_app.exceptions import PermanentError
from tasks_app.models import Step, StepStatus, Task, TaskStatus
from tasks_app.workflows import StepContext, StepSpec, Workflow, registry


def dies(ctx: StepContext) -> dict[str, Any]:
    """Makes the external writes the payload names (``writes`` answered, ``hangs`` sent
    with no answer), then fails for good with its message."""
    for name in ctx.payload.get("writes", []):
        ctx.effects.run(name, lambda key: {"sent": key}, idempotent_remote=False)
    for name in ctx.payload.get("hangs", []):
        # Sent, and no answer: the write stays started, with no outcome (in doubt).
        with contextlib.suppress(TimeoutError):
            ctx.effects.run(name, _times_out, idempotent_remote=True)
    raise PermanentError(ctx.payload["message"])


def _times_out(key: str) -> dict[str, Any]:
    raise TimeoutError(f"no answer for {key}")


@pytest.fixture
def causes() -> Iterator[None]:
    flows = [
        Workflow("test.causes.a", 1, steps=(StepSpec("call", dies, max_attempts=1),)),
        Workflow("test.causes.b", 1, steps=(StepSpec("call", dies, max_attempts=1),)),
    ]
    for flow in flows:
        registry.register(flow)
    yield
    for flow in flows:
        registry.unregister(flow.name, flow.version)


def dead(
    workflow: str = "test.causes.a", message: str = "HTTP 503 from /articles/1", **payload: Any
) -> Task:
    task = services.enqueue(workflow, {"message": message, **payload}, actor="cli:producer").task
    runner.run_task_steps(task)
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD, task.status
    return task


def dead_step(task: Task) -> Step:
    return Step.objects.get(task=task, status=StepStatus.DEAD)
