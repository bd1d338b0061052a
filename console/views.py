"""The console's shared view helpers, and its on-call pages: the overview, the task list,
a task with its actions, and the dead letters with their bulk actions (the editors' pages
are in ``review_views``, the queues and the audit log in ``record_views``).

Each view parses a form, calls one selector or service, and answers with the page's
partial for an htmx request, or the full page (a redirect after a successful plain POST).
Permissions on reads are the decorators'; on writes the services decide, and their
refusals map to status codes here: :class:`NotPermitted` 403, :class:`InvalidInput` 400,
:class:`InvalidTransition` 409, each shown with its message and changing nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import PermissionDenied
from django.forms import Form
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import trigger_client_event
from django_htmx.middleware import HtmxDetails

from approvals.services import DECIDE_PERMISSION
from tasks_app import lists, presence, selectors, services
from tasks_app.exceptions import InvalidInput, InvalidTransition, NotPermitted
from tasks_app.models import Task, TaskStatus
from tasks_app.task_actions import ACTIONS, Action

from . import charts, errors, forms, presenters
from .plans import BulkPlan, PlanRefused


class ConsoleRequest(HttpRequest):
    htmx: HtmxDetails
    user: User | AnonymousUser


VIEW_TASKS = "tasks_app.view_task"
VIEW_APPROVALS = "approvals.view_approvalrequest"
VIEW_AUDIT = "tasks_app.view_audit_log"
EXPORT_AUDIT = "tasks_app.export_audit_log"

view_tasks = permission_required(VIEW_TASKS, raise_exception=True)


def render_page(
    request: ConsoleRequest,
    template: str,
    context: dict[str, Any],
    *,
    partial: str,
    status: int = 200,
) -> HttpResponse:
    """The full page, or only its ``partial`` region for htmx (history restores excepted)."""
    if request.htmx and not request.htmx.history_restore_request:
        template = f"{template}#{partial}"
    return render(request, template, context, status=status)


# --- overview -------------------------------------------------------------------------------


@require_GET
def start(request: ConsoleRequest) -> HttpResponse:
    """Where a login lands: an editor (who may decide approvals, superusers aside) on the
    approvals waiting for them, everyone else on the overview."""
    user = request.user
    if not user.is_superuser and user.has_perm(DECIDE_PERMISSION):
        return redirect("console:approvals")
    return redirect("console:overview")


@require_GET
@view_tasks
def overview(request: ConsoleRequest) -> HttpResponse:
    summary = selectors.overview()
    workers = presence.workers()
    context = {
        "o": summary,
        "chart": charts.throughput_chart(summary.throughput),
        "workers": workers,
        "workers_by_state": presence.by_state(workers),
    }
    return render_page(request, "console/overview.html", context, partial="overview")


# --- tasks ----------------------------------------------------------------------------------


@require_GET
@view_tasks
def task_list(request: ConsoleRequest) -> HttpResponse:
    form = forms.TaskFilterForm(request.GET)
    if not form.is_valid():
        return filter_refused(request, form)
    page = lists.task_page(form.filters(), after=form.cursor())
    return render_page(
        request, "console/tasks.html", {"form": form, "page": page}, partial="results"
    )


def filter_refused(request: ConsoleRequest, form: Form) -> HttpResponse:
    """A filter that cannot be read is refused (400, naming the field and the rule), never
    widened to everything."""
    problems = "; ".join(forms.named_errors(form))
    return errors.error_response(request, 400, f"The filter cannot be used: {problems}.")


@require_GET
@view_tasks
def task_detail(request: ConsoleRequest, pk: int) -> HttpResponse:
    task = get_object_or_404(Task, pk=pk)
    return _task_page(request, task)


# The header's "go to task" box: ``123`` or ``#123``; a bigint has at most 19 digits.
TASK_NUMBER = re.compile(r"#?\s*([0-9]{1,19})")


@require_GET
@view_tasks
def task_go(request: ConsoleRequest) -> HttpResponse:
    """Jump to the task a number names: 400 for what is not a task number, 404 for none."""
    match = TASK_NUMBER.fullmatch(request.GET.get("id", "").strip())
    if match is None:
        return errors.error_response(
            request, 400, "id: write a task number, such as 123 or #123 (digits only)."
        )
    pk = int(match.group(1))
    if not Task.objects.filter(pk=pk).exists():
        return errors.error_response(request, 404, f"There is no task #{pk}.")
    return redirect("console:task", pk=pk)


def _task_page(
    request: ConsoleRequest,
    task: Task,
    *,
    status: int = 200,
    error: str = "",
    action_forms: dict[str, Form] | None = None,
) -> HttpResponse:
    detail = selectors.task_detail(task)
    end = task.finished_at or detail.now
    lanes = charts.attempt_lanes(detail.steps, start=task.created_at, end=end)
    context = {
        "d": detail,
        "task": task,
        "actions": selectors.task_actions(detail, request.user),
        "lanes": lanes,
        "error": error,
        "redrive_form": _action_form("redrive_form"),
        # Secrets stay hidden in the editor too; a redrive puts back what was not changed.
        "changes_form": _action_form(
            "changes_form", initial={"payload": presenters.pretty_json(task.payload)}
        ),
        "resolve_form": _action_form("resolve_form"),
        "cancel_form": _action_form("cancel_form"),
        **(action_forms or {}),
        # Every few seconds while the task is at work; slower while it is dead (someone
        # may redrive or cancel it elsewhere); not once it has ended.
        "refresh": REFRESH_SECONDS.get(task.status),
    }
    return render_page(request, "console/task_detail.html", context, partial="task", status=status)


# How often a task page in each state refreshes itself, in seconds.
REFRESH_SECONDS: dict[str, int] = {
    TaskStatus.PENDING: 3,
    TaskStatus.RUNNING: 3,
    TaskStatus.WAITING_APPROVAL: 10,
    TaskStatus.DEAD: 10,
}


# The task page's action forms share field names (the URL contract's ``reason``), so each
# has its own element ids.
ACTION_FORMS: dict[str, tuple[type[forms.ReasonForm], str]] = {
    "redrive_form": (forms.RedriveForm, "redrive_%s"),
    "changes_form": (forms.RedriveForm, "changes_%s"),
    "resolve_form": (forms.ResolveForm, "resolve_%s"),
    "cancel_form": (forms.CancelForm, "cancel_%s"),
}


def _action_form(name: str, data: Any = None, **kwargs: Any) -> forms.ReasonForm:
    form_class, auto_id = ACTION_FORMS[name]
    return form_class(data, auto_id=auto_id, **kwargs)


def _task_action(
    request: ConsoleRequest,
    pk: int,
    form_name: str,
    act: Callable[[Task, dict[str, Any]], object],
    done: str,
) -> HttpResponse:
    """Run one operator action on a task and answer with its page."""
    task = get_object_or_404(Task, pk=pk)
    form = _action_form(form_name, request.POST)
    if not form.is_valid():
        return _task_page(request, task, status=400, action_forms={form_name: form})
    try:
        act(task, form.cleaned_data)
    except NotPermitted as exc:
        errors.log_refusal(request, str(exc))
        return _task_page(request, task, status=403, error=f"Not permitted: {exc}")
    except InvalidInput as exc:
        form.add_error(form_field(form, exc), str(exc))
        return _task_page(request, task, status=400, action_forms={form_name: form})
    except InvalidTransition as exc:
        task.refresh_from_db()
        return _task_page(request, task, status=409, error=str(exc))
    messages.success(request, f"Task #{task.pk}: {done}.")
    if request.htmx:
        task.refresh_from_db()
        return _task_page(request, task)
    return redirect("console:task", pk=task.pk)


def form_field(form: Form, exc: InvalidInput) -> str | None:
    """The form field an input error belongs to (``payload.title`` is the payload's)."""
    return exc.top_field if exc.top_field in form.fields else None


@require_POST
@view_tasks
@permission_required(f"tasks_app.{ACTIONS[Action.REDRIVE].permission}", raise_exception=True)
def task_redrive(request: ConsoleRequest, pk: int) -> HttpResponse:
    form_name = "changes_form" if request.POST.get("payload", "").strip() else "redrive_form"
    return _task_action(
        request,
        pk,
        form_name,
        lambda task, data: services.redrive(
            task,
            actor=request.user,
            reason=data["reason"],
            payload=presenters.restore_redacted(data["payload"], task.payload),
        ),
        "redriven",
    )


@require_POST
@view_tasks
@permission_required(f"tasks_app.{ACTIONS[Action.RESOLVE_DONE].permission}", raise_exception=True)
def task_resolve(request: ConsoleRequest, pk: int) -> HttpResponse:
    return _task_action(
        request,
        pk,
        "resolve_form",
        lambda task, data: services.resolve(
            task, actor=request.user, reason=data["reason"], outcome=data["outcome"]
        ),
        "resolved",
    )


@require_POST
@view_tasks
@permission_required(f"tasks_app.{ACTIONS[Action.CANCEL].permission}", raise_exception=True)
def task_cancel(request: ConsoleRequest, pk: int) -> HttpResponse:
    return _task_action(
        request,
        pk,
        "cancel_form",
        lambda task, data: services.cancel(task, actor=request.user, reason=data["reason"]),
        "cancel requested",
    )


# --- dead letters ---------------------------------------------------------------------------


def _dead_context(filter_form: forms.DeadFilterForm, **extra: Any) -> dict[str, Any]:
    filters = filter_form.filters()
    cause = lists.dead_groups(filters)[:1] if filters.fingerprint else []
    return {
        "form": filter_form,
        "page": lists.dead_letter_page(filters, after=filter_form.cursor()),
        "cause": cause[0] if cause else None,
        "error_classes": lists.dead_error_classes(),
        "bulk_form": extra.pop("bulk_form", None)
        or forms.BulkForm(initial={**filters.__dict__, "limit": settings.CONSOLE_BULK_LIMIT}),
        "bulk_limit": settings.CONSOLE_BULK_LIMIT,
        "filter_query": filter_form.filters_query(),
        "refresh_query": filter_form.filters_query(cursor=True),
        **extra,
    }


@require_GET
@view_tasks
def dead_letters(request: ConsoleRequest) -> HttpResponse:
    form = forms.DeadFilterForm(request.GET)
    if not form.is_valid():
        return filter_refused(request, form)
    # The filter swaps the list and the bulk form together (so they never disagree); the
    # list alone reloads itself after a bulk action and pages on its own.
    partial = "results" if request.htmx.target == "results" else "dead"
    return render_page(request, "console/dead.html", _dead_context(form), partial=partial)


@require_GET
@view_tasks
def dead_groups(request: ConsoleRequest) -> HttpResponse:
    """The dead letters grouped by cause, each linking to its list and its bulk actions."""
    form = forms.DeadFilterForm(request.GET)
    if not form.is_valid():
        return filter_refused(request, form)
    groups = lists.dead_groups(form.filters())
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
    """Preview a bulk action as a plan (without ``confirm=1``), or apply the plan the
    preview made (with it): the tasks it names that still qualify, and no others."""
    if not any(request.user.has_perm(permission) for permission in BULK_PERMISSIONS):
        raise PermissionDenied("acting on dead letters needs an on-call permission")
    form = forms.BulkForm(request.POST)
    filter_form = forms.DeadFilterForm(request.POST)
    status, report, plan, error = 200, None, None, ""
    if not form.is_valid():
        status = 400
    elif not form.confirmed:
        plan = _plan(request, form)
    else:
        try:
            report = _apply_plan(request, form)
        except PlanRefused as exc:
            status, error = 409, f"Nothing changed: {exc}. Preview again."
        except NotPermitted as exc:
            errors.log_refusal(request, str(exc))
            status, error = 403, f"Not permitted: {exc}"
        except InvalidInput as exc:
            form.add_error(form_field(form, exc), str(exc))
            status = 400
            # The plan stays: fixing the reason needs no new preview.
            plan = _posted_plan(request, form)
    context = _dead_context(filter_form, bulk_form=form, report=report, plan=plan, error=error)
    if report is not None and not request.htmx:
        messages.success(request, _bulk_summary(report))
        return redirect(reverse("console:dead") + "?" + filter_form.filters_query())
    response = render_page(request, "console/dead.html", context, partial="bulk", status=status)
    if report is not None:
        # The list below the form reloads itself on this event.
        trigger_client_event(response, "deadChanged")
    return response


def _plan(request: ConsoleRequest, form: forms.BulkForm) -> BulkPlan:
    return BulkPlan.make(
        action=form.cleaned_data["action"],
        filters=form.filters(),
        limit=form.cleaned_data["limit"],
        user_id=_user_id(request),
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
    )
    if difference is not None:
        raise PlanRefused(f"{difference} since the preview")
    return plan


def _apply_plan(request: ConsoleRequest, form: forms.BulkForm) -> services.BulkReport:
    plan = _posted_plan(request, form)
    return plan.apply(actor=request.user, reason=form.cleaned_data["reason"])


def _bulk_summary(report: services.BulkReport) -> str:
    text = f"{ACTIONS[report.action].label}: {len(report.changed)} task(s) changed"
    if report.skipped:
        text += f", {len(report.skipped)} skipped"
    if report.limited:
        text += "; more matched than the limit and were left alone"
    return text + "."
