"""The dead letters: their list, grouped by cause, and their bulk actions, each previewed
as a signed plan and applied as the plan says (``console.plans``)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import redirect
from django.template.defaultfilters import pluralize
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from console import errors, forms
from console.plans import BulkPlan, PlanApplied, PlanRefused
from console.views import ConsoleRequest, reads_filter, render_page, view_tasks
from tasks_app import services
from tasks_app.exceptions import InvalidInput
from tasks_app.operations import listings
from tasks_app.operations.task_actions import ACTIONS

# --- dead letters ---------------------------------------------------------------------------


def _dead_context(filter_form: forms.DeadFilterForm, **extra: Any) -> dict[str, Any]:
    filters = filter_form.filters()
    cause = listings.dead_groups(filters)[:1] if filters.fingerprint else []
    return {
        "form": filter_form,
        "page": listings.dead_letter_page(filters, after=filter_form.cursor()),
        "cause": cause[0] if cause else None,
        "error_classes": listings.dead_error_classes(),
        "bulk_form": extra.pop("bulk_form", None)
        or forms.BulkForm(initial={**filters.__dict__, "limit": services.bulk_limit()}),
        "bulk_limit": services.bulk_limit(),
        "refresh_query": filter_form.filters_query(cursor=True),
        **extra,
    }


@require_GET
@view_tasks
@reads_filter(forms.DeadFilterForm)
def dead_letters(request: ConsoleRequest, form: forms.DeadFilterForm) -> HttpResponse:
    # The filter swaps the list and the bulk form together (so they never disagree); the
    # list alone reloads itself after a bulk action and pages on its own.
    partial = "results" if request.htmx.target == "results" else "dead"
    return render_page(request, "console/dead.html", _dead_context(form), partial=partial)


@require_GET
@view_tasks
@reads_filter(forms.DeadFilterForm)
def dead_groups(request: ConsoleRequest, form: forms.DeadFilterForm) -> HttpResponse:
    """The dead letters grouped by cause, each linking to its list and its bulk actions."""
    groups = listings.dead_groups(form.filters())
    context = {
        "form": form,
        "groups": groups,
        "total": sum(group.count for group in groups),
        "filter_query": form.filters_query(),
    }
    return render_page(request, "console/dead_groups.html", context, partial="groups")


BULK_PERMISSIONS = sorted({f"tasks_app.{spec.permission}" for spec in ACTIONS.values()})


@require_POST
@view_tasks
def dead_bulk(request: ConsoleRequest) -> HttpResponse:
    """Preview a bulk action as a plan (without ``confirm=1``; what its confirm would
    refuse, such as an empty reason, is refused here already), apply the plan the preview
    made (with it): the tasks it names that still qualify, and no others; or, with
    ``change=1``, go back from a plan to editing the form."""
    if not any(request.user.has_perm(permission) for permission in BULK_PERMISSIONS):
        raise PermissionDenied("acting on dead letters needs an on-call permission")
    form = forms.BulkForm(request.POST)
    filter_form = forms.DeadFilterForm(request.POST)
    status, report, plan, error = 200, None, None, ""
    # An earlier confirm applied the plan: the list below may be out of date.
    applied = False
    if request.POST.get("change") == "1":
        pass  # back to editing: the form as it was posted, without its plan
    elif not form.is_valid():
        status = 400
    else:
        try:
            if form.confirmed:
                report = _apply_plan(request, form)
            else:
                plan = _plan(request, form)
        except PlanRefused as exc:
            status, error = 409, f"Nothing changed: {exc}. Preview again."
            applied = isinstance(exc, PlanApplied)
        except errors.REFUSED as exc:
            refused = errors.refusal(request, exc, form)
            status, error = refused.status, refused.message
            if form.confirmed and isinstance(exc, InvalidInput):
                # The plan stays: fixing the reason needs no new preview.
                plan = _posted_plan(request, form)
    if plan is not None and plan.ids:
        _lock(form)
    context = _dead_context(filter_form, bulk_form=form, report=report, plan=plan, error=error)
    if report is not None and not request.htmx:
        messages.success(request, _bulk_summary(report))
        return redirect(reverse("console:dead") + "?" + filter_form.filters_query())
    # Once the plan was applied, the cause's count and the list above the form changed too:
    # the answer carries them (the list's first page), so the page agrees with itself.
    refresh = ("cause", "results") if report is not None or applied else ()
    return render_page(
        request, "console/dead.html", context, partial="bulk", status=status, refresh=refresh
    )


def _lock(form: forms.BulkForm) -> None:
    """The form as its plan's preview shows it: the action cannot be changed in place (the
    template carries it as a hidden field, and the limit as read-only)."""
    form.fields["action"].widget.attrs.update({"disabled": True, "aria-describedby": "bulk-locked"})
    for name in form.params():
        form.fields[name].widget.attrs.update({"readonly": True, "aria-describedby": "bulk-locked"})


def _plan(request: ConsoleRequest, form: forms.BulkForm) -> BulkPlan:
    """The preview's plan, after the checks its confirm will make (the permission, the
    reason, the limit): what would be refused is refused before anything is planned."""
    services.check_bulk(
        form.cleaned_data["action"],
        actor=request.user,
        reason=form.cleaned_data["reason"],
        limit=form.cleaned_data["limit"],
        params=form.params(),
    )
    return BulkPlan.make(
        action=form.cleaned_data["action"],
        filters=form.filters(),
        limit=form.cleaned_data["limit"],
        user_id=_user_id(request),
        params=form.params(),
    )


def _user_id(request: ConsoleRequest) -> int:
    assert request.user.pk is not None  # the view's permission needs a logged-in user
    return int(request.user.pk)


def _posted_plan(request: ConsoleRequest, form: forms.BulkForm) -> BulkPlan:
    """The plan the confirm carries, if it matches what the form asks now."""
    plan = BulkPlan.load(form.cleaned_data["plan"], user_id=_user_id(request))
    difference = plan.difference(
        action=form.cleaned_data["action"],
        filters=form.filters(),
        limit=form.cleaned_data["limit"],
        params=form.params(),
    )
    if difference is not None:
        raise PlanRefused(f"{difference} since the preview")
    return plan


def _apply_plan(request: ConsoleRequest, form: forms.BulkForm) -> services.BulkReport:
    plan = _posted_plan(request, form)
    return plan.apply(actor=request.user, reason=form.cleaned_data["reason"])


def _bulk_summary(report: services.BulkReport) -> str:
    changed = len(report.changed)
    text = f"{ACTIONS[report.action].label}: {changed} task{pluralize(changed)} changed"
    if report.skipped:
        text += f", {len(report.skipped)} skipped"
    if report.limited:
        text += "; more matched than the limit and were left alone"
    return text + "."
