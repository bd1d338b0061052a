"""The enqueue's insert on PostgreSQL: every task of a batch and its steps in one statement
(``sql.INSERT_SQL``), from the items ``enqueueing`` prepared."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from tasks_app.db import rows
from tasks_app.db.hot_cursor import hot_cursor
from tasks_app.engine.dispatch import Doorbell, ring_on_commit
from tasks_app.engine.sql import INSERT_SQL
from tasks_app.models import Task, TaskStatus
from tasks_app.models.graphs import is_root

if TYPE_CHECKING:
    from datetime import datetime

    from tasks_app.engine.limits import Placement
    from tasks_app.engine.workflows import Workflow


class Insertable(Protocol):
    """What the insert reads of an item ``enqueueing`` prepared (its ``PreparedItem``),
    declared here so the fast path does not import the module that calls it."""

    @property
    def workflow(self) -> Workflow: ...
    @property
    def payload(self) -> dict[str, Any]: ...
    @property
    def canonical(self) -> str: ...
    @property
    def payload_hash(self) -> str: ...
    @property
    def idempotency_key(self) -> str | None: ...
    @property
    def queue(self) -> str: ...
    @property
    def priority(self) -> int: ...
    @property
    def run_after(self) -> datetime | None: ...
    @property
    def placement(self) -> Placement: ...
    @property
    def traceparent(self) -> str | None: ...


TASK_FIELDS = [field.attname for field in Task._meta.concrete_fields]
_row_json = json.JSONEncoder(ensure_ascii=False).encode


def _limits_of(item: Insertable, position: int, turn: int | None) -> dict[str, Any]:
    limits = item.placement.steps[position]
    return {"limits": limits, "turn": turn} if limits else {}


def _place_of(workflow: Workflow, position: int) -> dict[str, Any]:
    """Where the step sits in its workflow's graph, for INSERT_SQL: whether it starts with
    the task (``root``) and, in a graph, the positions it waits for (a line stores none)."""
    after = workflow.stored_after(position)
    place: dict[str, Any] = {"after": after} if after is not None else {}
    return place | ({"root": True} if is_root(position, after) else {})


def insert_tasks(
    items: Sequence[tuple[int, Insertable]],
    turns: dict[int, int | None],
    *,
    author: str,
    user_id: int | None,
) -> dict[int, Task]:
    """Create tasks for the items whose keys are free; returns them by item index. A step
    under limits is stored with them and its item's turn (``turns``)."""
    if not items:
        return {}
    by_index = dict(items)
    # Rows travel as one JSON document each for tasks and steps: encoding and decoding JSON
    # is far cheaper on both sides than a dozen parameter arrays.
    # Each payload's canonical text goes in as it is, not encoded again.
    tasks = ",".join(
        _row_json(
            {
                "ord": index,
                "workflow": item.workflow.name,
                "version": item.workflow.version,
                "hash": item.payload_hash,
                "key": item.idempotency_key,
                "queue": item.queue,
                "priority": item.priority,
                "run_after": item.run_after.isoformat() if item.run_after else None,
            }
            # Only with tracing on: a missing key reads as NULL (INSERT_SQL's input).
            | ({"traceparent": item.traceparent} if item.traceparent else {})
        )[:-1]
        + ',"payload":'
        + item.canonical
        + "}"
        for index, item in items
    )
    steps = [
        {"ord": index, "position": position, "kind": spec.kind, "max_attempts": spec.max_attempts}
        | _limits_of(item, position, turns.get(index))
        | _place_of(item.workflow, position)
        for index, item in items
        for position, spec in enumerate(item.workflow.steps)
    ]
    params = {
        "items": f"[{tasks}]",
        "steps": json.dumps(steps),
        "author": author,
        "user": user_id,
    }
    with hot_cursor() as cursor:
        cursor.execute(INSERT_SQL, params, prepare=True)
        inserted = cursor.fetchall()
    created: dict[int, Task] = {}
    bells: list[Doorbell] = []
    for index, pk, created_at, roots, available_at in inserted:
        item = by_index[index]
        row = {
            "id": pk,
            "workflow": item.workflow.name,
            "workflow_version": item.workflow.version,
            "payload": item.payload,
            "payload_hash": item.payload_hash,
            "idempotency_key": item.idempotency_key,
            "queue": item.queue,
            "priority": item.priority,
            "status": TaskStatus.PENDING,
            "created_by": author,
            "created_by_user_id": user_id,
            "created_at": created_at,
            "updated_at": created_at,
            "finished_at": None,
            "cancel_requested_at": None,
            "traceparent": item.traceparent,
        }
        task = rows.instance(Task, TASK_FIELDS, [row[name] for name in TASK_FIELDS])
        created[index] = task
        countdown = max((available_at - created_at).total_seconds(), 0.0)
        bells += [Doorbell(root, item.queue, countdown) for root in roots]
    ring_on_commit(bells)
    return created
