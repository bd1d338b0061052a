"""``/api/v1/approvals``: the approval requests waiting for a decision, the soonest to
expire first (``approvals.selectors.pending_requests``), and one request whatever became of
it, as the console's review page shows it. Reading them needs
``approvals.view_approvalrequest``; deciding stays the console's, by a person. Drafts are
redacted as on every page; ``draft_hash`` is the stored draft's, which a decision carries."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from ninja import Router, Schema

from api import access, filters
from api.errors import problems
from api.schemas import console_url, redacted
from approvals import selectors
from approvals.models import ApprovalRequest
from tasks_app.redaction import redact_text

router = Router(tags=["approvals"])


class ApprovalOut(Schema):
    id: int
    task_id: int
    step_id: int
    # The approval step's kind (``editor_review``).
    step_kind: str
    revision: int
    status: str
    # What follows an approval ("publish") and a line on what it affects.
    action: str
    summary: str
    # Who may decide: members of these groups (the second once escalated) and these users.
    groups: list[str]
    approver_users: list[str]
    # How many distinct approvals it needs, and has.
    quorum: int
    approvals: int
    requested_by: str
    requested_at: datetime
    expires_at: datetime
    draft: Any
    draft_hash: str
    # The review page in the console, where a person decides.
    url: str

    @classmethod
    def of(cls, request: ApprovalRequest, approvals: int) -> ApprovalOut:
        return cls(
            id=request.pk,
            task_id=request.task_id,
            step_id=request.step_id,
            step_kind=request.step.kind,
            revision=request.revision,
            status=request.status,
            action=request.action,
            summary=redact_text(request.summary),
            groups=request.groups,
            approver_users=list(request.approver_users or []),
            quorum=request.quorum,
            approvals=approvals,
            requested_by=request.requested_by,
            requested_at=request.created_at,
            expires_at=request.expires_at,
            draft=redacted(request.draft),
            draft_hash=request.draft_hash,
            url=console_url("review", request.pk),
        )


class ApprovalDetailOut(ApprovalOut):
    # Who decided, when and with what comment; null and empty while it waits.
    decided_by: str | None
    decided_at: datetime | None
    comment: str


class ApprovalList(Schema):
    items: list[ApprovalOut]


@router.get(
    "/",
    response={200: ApprovalList, **problems()},
    summary="Approval requests waiting for a decision, the soonest to expire first",
)
def approval_list(request: HttpRequest) -> ApprovalList:
    access.require(request, access.VIEW_APPROVALS)
    filters.known(request, set())
    pending = selectors.pending_requests().select_related("step")
    return ApprovalList(items=[ApprovalOut.of(each, _counted(each)) for each in pending])


@router.get(
    "/{approval_id}",
    response={200: ApprovalDetailOut, **problems(404)},
    summary="One approval request, pending or decided",
)
def approval_detail(request: HttpRequest, approval_id: int) -> ApprovalDetailOut:
    access.require(request, access.VIEW_APPROVALS)
    filters.known(request, set())
    approval = get_object_or_404(
        ApprovalRequest.objects.select_related("task", "step"), pk=approval_id
    )
    return ApprovalDetailOut(
        **ApprovalOut.of(approval, approval.votes.count()).model_dump(),
        decided_by=approval.decided_by or None,
        decided_at=approval.decided_at,
        comment=redact_text(approval.comment),
    )


def _counted(request: ApprovalRequest) -> int:
    """The approvals ``pending_requests`` counted for ``request``."""
    approvals: int = request.approvals  # type: ignore[attr-defined]
    return approvals
