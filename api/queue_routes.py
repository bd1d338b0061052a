"""``/api/v1/queues``: every configured queue with its switch and depth, as the console's
``/queues/`` shows them (``selectors.queues``). Reading them needs ``tasks_app.view_task``;
pausing and resuming stay the console's, with a person's reason."""

from __future__ import annotations

from datetime import datetime

from django.http import HttpRequest
from ninja import Router, Schema

from api import access, filters
from api.errors import problems
from tasks_app.operations import selectors
from tasks_app.operations.selectors import QueueRow
from tasks_app.redaction import redact_text

router = Router(tags=["queues"])


class QueueOut(Schema):
    name: str
    paused: bool
    # Who paused it, why and when; null while it runs.
    paused_by: str | None
    paused_reason: str | None
    paused_at: datetime | None
    # Pending steps due now, and those waiting for a later time (a retry, a run_after).
    due: int
    scheduled: int
    running: int
    # How long the oldest due step has waited; null when none is due.
    oldest_due_age_seconds: float | None

    @classmethod
    def of(cls, row: QueueRow) -> QueueOut:
        state = row.state if row.paused else None
        age = row.oldest_due_age
        return cls(
            name=row.name,
            paused=row.paused,
            paused_by=state.changed_by if state else None,
            paused_reason=redact_text(state.reason) if state else None,
            paused_at=state.changed_at if state else None,
            due=row.due,
            scheduled=row.scheduled,
            running=row.running,
            oldest_due_age_seconds=None if age is None else age.total_seconds(),
        )


class QueueList(Schema):
    items: list[QueueOut]


@router.get("/", response={200: QueueList, **problems()}, summary="Every queue, paused or not")
def queue_list(request: HttpRequest) -> QueueList:
    access.require(request, access.VIEW_TASKS)
    filters.known(request, set())
    return QueueList(items=[QueueOut.of(row) for row in selectors.queues()])
