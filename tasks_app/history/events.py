"""Recording an event beside the change it records: in the caller's transaction, appended
to the audit chain when a person did it, counted, and told to what listens (the
operational log, ``tasks_app.observability.oplog``, which writes its line once the
transaction commits; it registers itself when the app starts)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Protocol

from tasks_app.access import Actor, actor_fields
from tasks_app.db.clock import db_now
from tasks_app.history import audit_chain, counting
from tasks_app.models import Event, Step, Task


class Listener(Protocol):
    """Hears of each event as it is recorded, with the rows the transition holds."""

    def __call__(self, event: Event, *, task: Task | None, steps: Sequence[Step]) -> None: ...


_listeners: list[Listener] = []


def listen(listener: Listener) -> None:
    """Have ``listener`` hear of every event recorded from now on (once, however often it
    is registered)."""
    if listener not in _listeners:
        _listeners.append(listener)


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
    at: datetime | None = None,
    **data: Any,
) -> Event:
    """Write the event of a transition in the caller's transaction; an operator action is
    appended to the audit chain (``audit_chain.append``). What listens hears of it with
    ``task`` and ``steps``, the rows at hand, so that the log line reads none again.

    It is stamped ``at``, or now, by the database's clock (rule 3) like the attempt records
    it is read beside (``history.timeline``)."""
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
        created_at=at or db_now(),
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
    for listener in _listeners:
        listener(event, task=task, steps=changed)
    return event


def event_error(text: str) -> str:
    """An error as its event keeps it: the end of a long traceback, where the exception
    and its message are."""
    return text if len(text) <= 2000 else "…" + text[-1999:]
