"""Every row an operator action or an approval decision could change, to compare before
and after: a refused one changes none, from the console, a command or the browser."""

from __future__ import annotations

from typing import Any

from approvals.models import ApprovalRequest
from tasks_app.models import Event, LimitKey, LimitState, QueueState, Step, Task


def action_rows() -> tuple[Any, ...]:
    """Every row an action could change."""
    return (
        list(Task.objects.order_by("pk").values_list("pk", "status", "payload")),
        list(Step.objects.order_by("pk").values_list("pk", "status", "attempts")),
        list(Event.objects.order_by("pk").values_list("pk", "kind")),
        list(QueueState.objects.order_by("name").values_list("name", "paused")),
        list(ApprovalRequest.objects.order_by("pk").values_list("pk", "status")),
        list(LimitState.objects.order_by("name").values_list("name", "overridden", "concurrency")),
        list(LimitKey.objects.order_by("limit", "key").values_list("limit", "key", "paused_at")),
    )
