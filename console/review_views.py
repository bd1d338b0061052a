"""The editors' pages: the approvals they may decide, a review, and the decision."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_GET, require_POST

from approvals import selectors as approval_selectors
from approvals import services as approval_services
from approvals.models import ApprovalRequest
from approvals.services import DECIDE_PERMISSION
from tasks_app.exceptions import InvalidInput, InvalidTransition, NotPermitted

from . import errors, forms
from .views import (
    VIEW_APPROVALS,
    ConsoleRequest,
    form_field,
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
    status: int = 200,
    error: str = "",
    done: str = "",
) -> HttpResponse:
    context = {
        "r": approval_selectors.review(approval),
        "form": form or forms.DecisionForm(initial={"draft_hash": approval.draft_hash}),
        "refused": approval_services.decide_refusal(approval, request.user),
        "error": error,
        "done": done,
    }
    return render_page(request, "console/review.html", context, partial="decision", status=status)


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
    except NotPermitted as exc:
        errors.log_refusal(request, str(exc))
        return _review_page(request, approval, form=form, status=403, error=f"Not permitted: {exc}")
    except InvalidInput as exc:
        form.add_error(form_field(form, exc), str(exc))
        return _review_page(request, approval, form=form, status=400)
    except InvalidTransition as exc:
        approval.refresh_from_db()
        return _review_page(request, approval, form=form, status=409, error=str(exc))
    done = f"Approval #{approval.pk} {verb}."
    if not request.htmx:
        messages.success(request, done)
        return redirect("console:approvals")
    approval.refresh_from_db()
    return _review_page(request, approval, done=done)
