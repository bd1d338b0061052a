"""The editors' pages: the approvals they may decide, a review, the decision, and an
editor's own edit of the draft."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_GET, require_POST

from approvals import selectors as approval_selectors
from approvals import services as approval_services
from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.people import has_approved
from approvals.services import DECIDE_PERMISSION
from console import errors, forms
from console.views import (
    VIEW_APPROVALS,
    ConsoleRequest,
    render_page,
)

# --- approvals ------------------------------------------------------------------------------


@require_GET
@permission_required(VIEW_APPROVALS, raise_exception=True)
def approval_list(request: ConsoleRequest) -> HttpResponse:
    context = {"inbox": approval_selectors.inbox(request.user)}
    return render_page(request, "console/approvals.html", context, partial="results")


@require_GET
@permission_required(VIEW_APPROVALS, raise_exception=True)
def review(request: ConsoleRequest, pk: int) -> HttpResponse:
    approval = get_object_or_404(ApprovalRequest.objects.select_related("task", "step"), pk=pk)
    return _review_page(request, approval)


def _review_page(
    request: ConsoleRequest,
    approval: ApprovalRequest,
    *,
    form: forms.DecisionForm | None = None,
    edit_form: forms.DraftEditForm | None = None,
    status: int = 200,
    error: str = "",
    edit_error: str = "",
    done: str = "",
) -> HttpResponse:
    r = approval_selectors.review(approval)
    refused = approval_services.decide_refusal(approval, request.user)
    approved = has_approved(approval, request.user)
    context = {
        "r": r,
        "form": form or forms.DecisionForm(initial={"draft_hash": approval.draft_hash}),
        "edit_form": edit_form or _edit_form(r),
        "refused": refused,
        "approved": approval_selectors.already_approved(approval) if approved else "",
        "error": error,
        "edit_error": edit_error,
        "done": done,
    }
    # A decision (or its refusal, which finds the request as someone else left it) changes
    # the facts and the offer to edit as well as the decision.
    return render_page(
        request,
        "console/review.html",
        context,
        partial="decision",
        status=status,
        refresh=("facts", "edit"),
    )


def _edit_form(r: approval_selectors.Review, data: Any = None) -> forms.DraftEditForm:
    return forms.DraftEditForm(
        {field.name: field.text for field in r.editable},
        data,
        initial={"draft_hash": r.request.draft_hash},
    )


DECISIONS: dict[str, tuple[Callable[..., ApprovalRequest], str]] = {
    "approve": (approval_services.approve, "approved"),
    "reject": (approval_services.reject, "rejected"),
    "request_changes": (approval_services.request_changes, "sent back with your comment"),
}


@require_POST
@permission_required([VIEW_APPROVALS, DECIDE_PERMISSION], raise_exception=True)
def decide(request: ConsoleRequest, pk: int) -> HttpResponse:
    approval = get_object_or_404(ApprovalRequest.objects.select_related("task", "step"), pk=pk)
    form = forms.DecisionForm(request.POST)
    if not form.is_valid():
        return _review_page(request, approval, form=form, status=400)
    call, verb = DECISIONS[form.cleaned_data["decision"]]
    try:
        call(
            approval,
            actor=request.user,
            comment=form.cleaned_data["comment"],
            draft_hash=form.cleaned_data["draft_hash"],
        )
    except errors.REFUSED as exc:
        refused = errors.refusal(request, exc, form)
        approval.refresh_from_db()
        return _review_page(
            request, approval, form=form, status=refused.status, error=refused.message
        )
    approval.refresh_from_db()
    done = f"Approval #{approval.pk} {verb}."
    if approval.status == ApprovalStatus.PENDING:
        count = approval.votes.count()
        done = (
            f"Your approval is recorded ({count} of {approval.quorum}); "
            f"{approval_services.waiting_on_others(approval.quorum, count)}."
        )
    if not request.htmx:
        messages.success(request, done)
        return redirect("console:approvals")
    return _review_page(request, approval, done=done)


@require_POST
@permission_required([VIEW_APPROVALS, DECIDE_PERMISSION], raise_exception=True)
def edit(request: ConsoleRequest, pk: int) -> HttpResponse:
    """An editor's own revision of the draft: on success, the review of the edited
    revision; refused, the same review with the edit and why."""
    approval = get_object_or_404(ApprovalRequest.objects.select_related("task", "step"), pk=pk)
    form = _edit_form(approval_selectors.review(approval), request.POST)
    if not form.is_valid():
        return _review_page(request, approval, edit_form=form, status=400)
    try:
        successor = approval_services.edit_draft(
            approval,
            actor=request.user,
            changes=form.changes(),
            comment=form.cleaned_data["comment"],
            draft_hash=form.cleaned_data["draft_hash"],
        )
    except errors.REFUSED as exc:
        refused = errors.refusal(request, exc, form)
        approval.refresh_from_db()
        return _review_page(
            request, approval, edit_form=form, status=refused.status, edit_error=refused.message
        )
    if successor is None:
        messages.success(request, f"Your edit of approval #{approval.pk} is saved.")
        return redirect("console:task", approval.task_id)
    messages.success(
        request,
        f"Your edit is revision {successor.revision}, now approval #{successor.pk}: "
        "someone else decides on it, and its reviewers are told.",
    )
    return redirect("console:review", successor.pk)
