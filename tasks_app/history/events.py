"""Recording an event beside the change it records: in the caller's transaction, appended
to the audit chain when a person did it, counted, and logged once it commits."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tasks_app.access import Actor, actor_fields
from tasks_app.history import audit_chain, counting
from tasks_app.models import Event, Step, Task
from tasks_app.observability import oplog


def step_state(step: Step) -> list[Any]:
    return [step.status, step.attempts, step.fencing_token]


def record_event(
    kind: str,
    *,
    task_id: int | None,
    step_id: int | None = None,
    actor: Actor = None,
    reason: str = "",
    steps: Iterable[Step] = (),
    task: Task | None = None,
    **data: Any,
) -> Event:
    """Write the event of a transition in the caller's transaction; an operator action is
    appended to the audit chain (``audit_chain.append``). The kinds on-call hears of also
    get their log line once it commits (``oplog``: ``task`` and ``steps`` are the rows at
    hand, so the line reads none again)."""
    name, user_id = actor_fields(actor)
    changed = tuple(steps)
    changes = {str(step.pk): step_state(step) for step in changed}
    if changes:
        data["steps"] = changes
    event = Event(
        task_id=task_id,
        step_id=step_id,
        kind=kind,
        actor=name,
        actor_user_id=user_id,
        reason=reason,
        data=data,
    )
    if audit_chain.is_chained(kind):
        audit_chain.append(event)
    else:
        event.save()
    if kind in counting.COUNTED_EVENT_KINDS:
        counts = {f"{counting.EVENT}:{kind}": 1}
        if kind in counting.WORKFLOW_EVENT_KINDS and task_id is not None:
            # Rare kinds: the task's workflow is read when the caller did not pass the row.
            workflow = (
                task.workflow
                if task is not None
                else Task.objects.filter(pk=task_id).values_list("workflow", flat=True).first()
            )
            if workflow is not None:
                counts[counting.workflow_event_name(workflow, kind)] = 1
        counting.add(counts)
    oplog.log_event(event, task=task, steps=changed)
    return event


def event_error(text: str) -> str:
    """An error as its event keeps it: the end of a long traceback, where the exception
    and its message are."""
    return text if len(text) <= 2000 else "…" + text[-1999:]
