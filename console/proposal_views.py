"""The plans programs propose (``tasks_app.operations.proposals``), where a person signs
them: ``/plans/`` lists those awaiting a signature (oldest first) with their proposer, and
the latest decided; ``/plans/<id>/`` shows one whole (the action, the program's reason,
the filter, the tasks it chose and their writes in doubt) with its Apply and Decline forms.

Applying and declining are the services' (they check the action's permission, the plan's
state and its expiry, and record the events naming the proposer and the signer). A
refusal shows only why; a plan decided by someone else meanwhile answers 409.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_GET, require_POST

from console import errors
from console.views import ConsoleRequest, render_page, view_tasks
from tasks_app.exceptions import NotPermitted
from tasks_app.models import PlanStatus, ProposedPlan, Task
from tasks_app.operations import proposals, selectors

LIST = "console/plans.html"
DETAIL = "console/plan.html"
# The tasks a plan's page lists; the rest are counted.
SHOWN_TASKS = 50


class ApplyForm(forms.Form):
    note = forms.CharField(
        required=False,
        max_length=2000,
        label="Note",
        help_text="Optional: your word beside the program's reason.",
    )


class DeclineForm(forms.Form):
    reason = forms.CharField(max_length=2000, label="Reason")


@require_GET
@view_tasks
def plan_inbox(request: ConsoleRequest) -> HttpResponse:
    awaiting = list(proposals.awaiting().select_related("token"))
    decided = list(ProposedPlan.objects.exclude(status=PlanStatus.PROPOSED)[:20])
    context = {"awaiting": awaiting, "decided": decided}
    return render_page(request, LIST, context, partial="plans")


@require_GET
@view_tasks
def plan_page(request: ConsoleRequest, plan_id: str) -> HttpResponse:
    return _page(request, get_object_or_404(ProposedPlan, pk=plan_id))


def _page(
    request: ConsoleRequest,
    plan: ProposedPlan,
    *,
    form: forms.Form | None = None,
    error: str = "",
    status: int = 200,
) -> HttpResponse:
    tasks = Task.objects.with_live_status().filter(pk__in=plan.task_ids).order_by("id")
    context: dict[str, Any] = {
        "plan": plan,
        "label": proposals.action_label(plan.action),
        "expired": proposals.is_expired(plan),
        "tasks": list(tasks[:SHOWN_TASKS]),
        "more": max(len(plan.task_ids) - SHOWN_TASKS, 0),
        # The form a refused POST used, with its errors; the other fresh.
        "apply_form": form if isinstance(form, ApplyForm) else ApplyForm(),
        "decline_form": form if isinstance(form, DeclineForm) else DeclineForm(),
        "error": error,
        # What the ledger holds now for the chosen tasks' dead steps (a queue plan has none).
        "ledger": selectors.dead_step_ledger(plan.task_ids) if plan.task_ids else None,
        "skipped": plan.outcome.get("skipped", []),
        "changed": plan.outcome.get("changed", []),
    }
    return render_page(request, DETAIL, context, partial="plan", status=status)


@require_POST
@view_tasks
def plan_apply(request: ConsoleRequest, plan_id: str) -> HttpResponse:
    def apply(plan: ProposedPlan, data: dict[str, Any]) -> str:
        plan = proposals.apply(plan, actor=request.user, note=data["note"])
        changed = len(plan.outcome.get("changed", []))
        return f"Plan applied: {changed} task{'' if changed == 1 else 's'} changed."

    return _decide(request, plan_id, ApplyForm(request.POST), apply)


@require_POST
@view_tasks
def plan_decline(request: ConsoleRequest, plan_id: str) -> HttpResponse:
    def decline(plan: ProposedPlan, data: dict[str, Any]) -> str:
        proposals.decline(plan, actor=request.user, reason=data["reason"])
        return "Plan declined: nothing of it was applied."

    return _decide(request, plan_id, DeclineForm(request.POST), decline)


def _decide(
    request: ConsoleRequest,
    plan_id: str,
    form: forms.Form,
    act: Callable[[ProposedPlan, dict[str, Any]], str],
) -> HttpResponse:
    """Apply or decline the plan as ``form`` asks (``act`` says what was done): the plan's
    page again with the form showing why not, or the console's bare refusal for a reader
    without the action's permission."""
    plan = get_object_or_404(ProposedPlan, pk=plan_id)
    if not form.is_valid():
        return _page(request, plan, form=form, status=400)
    try:
        words = act(plan, form.cleaned_data)
    except NotPermitted:
        raise  # the console's refusal: nothing of the plan shown
    except errors.REFUSED as exc:
        refused = errors.refusal(request, exc, form)
        return _page(request, plan, form=form, error=refused.message, status=refused.status)
    return _done(request, plan, words)


def _done(request: ConsoleRequest, plan: ProposedPlan, words: str) -> HttpResponse:
    messages.success(request, words)
    if not request.htmx:
        return redirect("console:plan", plan_id=plan.pk)
    plan.refresh_from_db()
    return _page(request, plan)
