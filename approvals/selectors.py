"""Read queries over approval requests, for pages and commands."""

from __future__ import annotations

from django.db.models import QuerySet

from tasks_app.services import Actor

from .models import ApprovalRequest, ApprovalStatus
from .services import may_decide


def pending_requests() -> QuerySet[ApprovalRequest]:
    """Requests waiting for a decision, the soonest to expire first."""
    return (
        ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING)
        .select_related("task")
        .order_by("expires_at", "id")
    )


def decidable_by(actor: Actor) -> list[ApprovalRequest]:
    """The pending requests ``actor`` may decide (:func:`services.may_decide`)."""
    return [request for request in pending_requests() if may_decide(request, actor) is None]
