"""Replaying a task's events.

Every event that changes steps carries their new ``[status, attempts, fencing_token]`` in
``data["steps"]``. Folding them in order must give the state stored on the rows; a
transition written without its event shows up as a difference.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tasks_app.history import timeline
from tasks_app.models import (
    EventKind,
    StepStatus,
    Task,
    derive_task_status,
    live_task_status,
)


@dataclass(frozen=True)
class StepState:
    status: str
    attempts: int
    fencing_token: int


@dataclass(frozen=True)
class TaskState:
    status: str
    steps: dict[int, StepState] = field(default_factory=dict)

    @classmethod
    def from_db(cls, task: Task) -> TaskState:
        """The task as stored, its status as people read it (running while a step runs)."""
        task.refresh_from_db(fields=["status"])
        steps = {
            pk: StepState(status, attempts, token)
            for pk, status, attempts, token in task.steps.values_list(
                "pk", "status", "attempts", "fencing_token"
            )
        }
        return cls.stored(task.status, steps)

    @classmethod
    def stored(cls, status: str, steps: dict[int, StepState]) -> TaskState:
        """A task as its rows store it: ``status`` is the task row's, read as people read
        it (``models.live_task_status``: running while a step runs)."""
        running = any(state.status == StepStatus.RUNNING for state in steps.values())
        return cls(status=live_task_status(status, running), steps=steps)


def fold(task: Task) -> TaskState:
    """The state a task's event history says it is in."""
    return fold_events((event.kind, event.data) for event in timeline.history(task.pk))


def fold_events(events: Iterable[tuple[str, dict[str, Any] | None]]) -> TaskState:
    """The state given by a task's ``(kind, data)`` events, oldest first (for callers that
    read many tasks' events at once, such as the invariant checker)."""
    steps: dict[int, StepState] = {}
    cancel_requested = False
    for kind, data in events:
        cancel_requested = cancel_requested or kind == EventKind.CANCEL_REQUESTED
        for step_id, (status, attempts, token) in ((data or {}).get("steps") or {}).items():
            steps[int(step_id)] = StepState(status, attempts, token)
    status = derive_task_status(
        (state.status for state in steps.values()), cancel_requested=cancel_requested
    )
    return TaskState(status=status, steps=steps)
