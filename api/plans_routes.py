"""``/api/v1/plans``: a program proposes an operator action as a plan, exactly as the
console's preview chooses it (``tasks_app.operations.proposals``); a person signs it in
the console's inbox. A token applies its own plan only where its setting allows."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from ninja import Router, Schema, Status

from api import access, filters
from api.errors import problems
from api.schemas import console_url
from console.forms import DeadFilterForm
from tasks_app.exceptions import InvalidInput
from tasks_app.models import PlanStatus, ProposedPlan
from tasks_app.operations import proposals

router = Router(tags=["plans"])


class DeadFilterIn(Schema):
    """The dead letters' filter, as the console's Dead letters page reads it."""

    workflow: str = ""
    queue: str = ""
    error_class: str = ""
    # A cause, as /api/v1/dead/groups/ names it.
    fingerprint: str = ""


class PlanIn(Schema):
    # A row of the operator actions (redrive, redrive_later, resolve_done, resolve_retry,
    # cancel, rewind), or pause_queue / resume_queue.
    action: str
    reason: str
    # Which tasks: the dead letters matching a filter (at most ``limit``), or named ones.
    filters: DeadFilterIn | None = None
    task_ids: list[int] | None = None
    limit: int | None = None
    # The action's parameters, as the console's bulk form takes them (a delay, a step).
    params: dict[str, Any] = {}
    # For a queue's pause or resume.
    queue: str = ""


class PlanOut(Schema):
    id: str
    action: str
    label: str
    # proposed (awaiting a signature), applied, declined, or expired.
    status: str
    reason: str
    filters: dict[str, Any]
    task_ids: list[int]
    matched: int
    limit: int
    queue: str
    params: dict[str, Any]
    # Writes in doubt among the chosen tasks' dead steps when proposed.
    in_doubt: int
    proposed_by: str
    proposed_at: datetime
    expires_at: datetime
    decided_by: str
    decided_at: datetime | None
    decision_reason: str
    # What applying it did: changed task ids, and [task id, why] of those skipped.
    outcome: dict[str, Any]
    # Its page in the console, where a person signs or declines it.
    url: str

    @classmethod
    def of(cls, plan: ProposedPlan) -> PlanOut:
        return cls(
            id=plan.id,
            action=plan.action,
            label=proposals.action_label(plan.action),
            status="expired" if proposals.is_expired(plan) else plan.status,
            reason=plan.reason,
            filters=plan.filters,
            task_ids=plan.task_ids,
            matched=plan.matched,
            limit=plan.limit,
            queue=plan.queue,
            params=plan.params,
            in_doubt=plan.in_doubt,
            proposed_by=plan.proposed_by,
            proposed_at=plan.proposed_at,
            expires_at=plan.expires_at,
            decided_by=plan.decided_by,
            decided_at=plan.decided_at,
            decision_reason=plan.decision_reason,
            outcome=plan.outcome,
            url=console_url("plan", plan.id),
        )


@router.post("/", response={201: PlanOut, **problems(409)}, summary="Propose a plan")
def propose(request: HttpRequest, body: PlanIn) -> Status[PlanOut]:
    chosen = None
    if body.filters is not None:
        form = filters.checked(DeadFilterForm(body.filters.model_dump()), prefix="filters")
        chosen = form.filters()
    plan = proposals.propose(
        actor=request.user,
        action=body.action,
        reason=body.reason,
        filters=chosen,
        task_ids=body.task_ids,
        limit=body.limit,
        params=body.params,
        queue=body.queue,
    )
    return Status(201, PlanOut.of(plan))


@router.get("/", response={200: list[PlanOut], **problems()}, summary="Plans, newest first")
def plan_list(request: HttpRequest, status: str = "") -> list[PlanOut]:
    access.require(request, access.VIEW_TASKS)
    filters.known(request, {"status"})
    plans = ProposedPlan.objects.select_related("token").order_by("-proposed_at")
    if status:
        if status not in PlanStatus.values:
            choices = ", ".join(PlanStatus.values)
            raise InvalidInput("status", "choice", f"status: one of {choices}")
        plans = plans.filter(status=status)
    return [PlanOut.of(plan) for plan in plans[:100]]


@router.get("/{plan_id}", response={200: PlanOut, **problems(404)}, summary="One plan")
def plan_detail(request: HttpRequest, plan_id: str) -> PlanOut:
    access.require(request, access.VIEW_TASKS)
    return PlanOut.of(get_object_or_404(ProposedPlan, pk=plan_id))


@router.post(
    "/{plan_id}/apply",
    response={200: PlanOut, **problems(404, 409)},
    summary="Apply a plan with this token, where its setting allows; else 403",
)
def apply(request: HttpRequest, plan_id: str) -> PlanOut:
    access.require(request, access.VIEW_TASKS)
    plan = get_object_or_404(ProposedPlan, pk=plan_id)
    return PlanOut.of(proposals.apply(plan, actor=request.user))
