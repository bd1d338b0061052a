"""The console's shared view helpers, and its on-call pages: the overview, the task list
and a task with its actions (the dead letters with their bulk actions are in
``dead_views``, the editors' pages in ``review_views``, the workflows' figures in
``workflow_views``, the queues, the audit log and the demo's mail in ``record_views``, a
task's rewind in ``rewind_views``).

Each view parses a form (a filter from the query string through :func:`reads_filter`),
calls one selector or service, and answers with the page's partial for an htmx request, or
the full page (a redirect after a successful plain POST). Permissions on reads are the
decorators'; on writes the services decide, and each refusal carries its status
(:class:`NotPermitted` 403, :class:`InvalidInput` 400, :class:`InvalidTransition` 409),
which ``errors.refusal`` answers with, showing its message and changing nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import wraps
from typing import Any, Concatenate

from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import PermissionDenied
from django.forms import Form
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET, require_POST
from django_htmx.middleware import HtmxDetails

from approvals import selectors as approval_selectors
from approvals.services import DECIDE_PERMISSION
from console import action_forms as action_forms_module
from console import charts, errors, forms, graph_drawing, rewind_forms
from console.task_filters import TaskFilterForm
from tasks_app import services
from tasks_app.engine import presence
from tasks_app.models import Task, TaskStatus
from tasks_app.observability import tracing
from tasks_app.operations import listings, selectors, why, why_counts
from tasks_app.operations.task_actions import ACTIONS


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
    refresh: Sequence[str] = (),
) -> HttpResponse:
    """The full page, or only its ``partial`` region for htmx (history restores excepted).

    An action's answer updates every region that shows what it changed, in the same
    response: the regions named in ``refresh`` follow the partial, swapped out of band (each
    marks itself so when ``oob`` is set), and so does the nav's count of approvals waiting
    for the reader, which any action may change."""
    if not request.htmx or request.htmx.history_restore_request:
        return render(request, template, context, status=status)
    parts = [render_to_string(f"{template}#{partial}", context, request)]
    if request.method == "POST":
        also = {**context, "oob": True}
        regions = [f"{template}#{name}" for name in refresh] + [NAV_APPROVALS]
        parts.extend(render_to_string(region, also, request) for region in regions)
    return HttpResponse("".join(parts), status=status)


# The nav's Approvals entry with its count, on every page (``base.html``).
NAV_APPROVALS = "console/_nav_approvals.html"


def filter_refused(request: ConsoleRequest, form: Form) -> HttpResponse:
    """A filter that cannot be read is refused (400, naming the field and the rule), never
    widened to everything."""
    problems = "; ".join(forms.named_errors(form))
    return errors.error_response(request, 400, f"The filter cannot be used: {problems}.")


def reads_filter[FormT: Form, **P](
    form_class: type[FormT],
    refuse: Callable[[ConsoleRequest, FormT], HttpResponseBase] | None = None,
) -> Callable[
    [Callable[Concatenate[ConsoleRequest, FormT, P], HttpResponseBase]],
    Callable[Concatenate[ConsoleRequest, P], HttpResponseBase],
]:
    """A view that reads its filter from the query string: the view gets the form, read
    and valid, after the request; a filter that cannot be read never reaches it, and is
    refused with 400 naming the field (:func:`filter_refused`, or the page's own
    ``refuse``)."""

    def decorate(
        view: Callable[Concatenate[ConsoleRequest, FormT, P], HttpResponseBase],
    ) -> Callable[Concatenate[ConsoleRequest, P], HttpResponseBase]:
        @wraps(view)
        def read(request: ConsoleRequest, /, *args: P.args, **kwargs: P.kwargs) -> HttpResponseBase:
            form = form_class(request.GET)
            if not form.is_valid():
                return (refuse or filter_refused)(request, form)
            return view(request, form, *args, **kwargs)

        return read

    return decorate


# --- overview -------------------------------------------------------------------------------


@require_GET
def start(request: ConsoleRequest) -> HttpResponse:
    """Where a login lands: an editor (who may decide approvals, superusers aside), and
    anyone an open request names as its approver, on the approvals waiting for them; an
    auditor (who may read the audit log but take no action on tasks) on the audit log;
    everyone else on the overview."""
    user = request.user
    if not user.is_superuser and user.has_perm(DECIDE_PERMISSION):
        return redirect("console:approvals")
    if user.has_perm(VIEW_APPROVALS) and approval_selectors.names_approver(user):
        return redirect("console:approvals")
    acts = any(user.has_perm(f"tasks_app.{action.permission}") for action in ACTIONS.values())
    if user.has_perm(VIEW_AUDIT) and not acts:
        return redirect("console:audit")
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
        # What steps wait on, counted by reason (tasks_app.operations.why_counts).
        "waiting": why_counts.waiting(summary.now),
    }
    return render_page(request, "console/overview.html", context, partial="overview")


# --- tasks ----------------------------------------------------------------------------------


@require_GET
@view_tasks
@reads_filter(TaskFilterForm)
def task_list(request: ConsoleRequest, form: TaskFilterForm) -> HttpResponse:
    page = listings.task_page(form.filters(), after=form.cursor())
    # What holds each row back, for the whole page at once (a few queries, not per row).
    blockers = why.why_many(page.rows)
    rows = [(task, blockers.get(task.pk, [])) for task in page.rows]
    context = {"form": form, "page": page, "rows": rows}
    return render_page(request, "console/tasks.html", context, partial="results")


@require_GET
@view_tasks
def task_detail(request: ConsoleRequest, pk: int) -> HttpResponse:
    task = get_object_or_404(Task, pk=pk)
    return task_page(request, task)


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


def task_page(
    request: ConsoleRequest,
    task: Task,
    *,
    status: int = 200,
    error: str = "",
    action_forms: dict[str, Form] | None = None,
    rewind: rewind_forms.RewindPanel | None = None,
) -> HttpResponse:
    """The task's page: its facts, steps, history and the actions offered to the reader;
    ``rewind`` is what its rewind section shows instead of the plain form (a preview, or a
    refusal), from ``console.rewind_views``."""
    detail = selectors.task_detail(task)
    end = task.finished_at or detail.now
    lanes = charts.attempt_lanes(detail.steps, start=task.created_at, end=end)
    actions = selectors.task_actions(detail, request.user)
    offered = action_forms_module.page_forms(actions.offered)
    bound = {
        f"{made.key}_form": (action_forms or {}).get(f"{made.key}_form")
        or made.bind(initial=made.initial(task))
        for made in offered
    }
    context = {
        "d": detail,
        "task": task,
        "actions": actions,
        # The offered actions' forms, each with its bound form: the template loops over them.
        "page_forms": [(made, bound[f"{made.key}_form"]) for made in offered],
        "lanes": lanes,
        # A graph task's steps drawn as boxes and arrows; None for a line.
        "graph": graph_drawing.draw(row.step for row in detail.steps),
        # "Why isn't this running?": what holds the task back ([] once it has ended).
        "why": why.why(task),
        "error": error,
        **bound,
        # The rewind's form, or its preview (console.rewind_views); None when not offered.
        "rewind": rewind or rewind_forms.offered(task, request.user),
        # Every few seconds while the task is at work; slower while it is dead (someone
        # may redrive or cancel it elsewhere); not once it has ended, nor under a rewind's
        # preview or refusal, which a refresh would take away.
        "refresh": None if rewind else REFRESH_SECONDS.get(task.status),
        # Where the task's trace is seen (TASKS_TRACE_URL), if it has one.
        "trace_url": tracing.trace_url(task),
    }
    return render_page(request, "console/task_detail.html", context, partial="task", status=status)


# How often a task page in each state refreshes itself, in seconds.
REFRESH_SECONDS: dict[str, int] = {
    TaskStatus.PENDING: 3,
    TaskStatus.RUNNING: 3,
    TaskStatus.WAITING_APPROVAL: 10,
    TaskStatus.DEAD: 10,
}


@require_POST
@view_tasks
def task_act(request: ConsoleRequest, pk: int, form: str) -> HttpResponse:
    """Take the operator action a task page form posts (``/tasks/<id>/<form>/``; a
    shared form's button says which of its actions) and answer with the task's page. A
    one-task parameter given (an edited payload) makes it that parameter's form, so an
    error shows where it was typed."""
    made = action_forms_module.posted_form(form, request.POST)
    if not any(request.user.has_perm(f"tasks_app.{spec.permission}") for spec in made.specs):
        raise PermissionDenied
    task = get_object_or_404(Task, pk=pk)
    bound = made.bind(request.POST)
    name = f"{made.key}_form"
    if not bound.is_valid():
        return task_page(request, task, status=400, action_forms={name: bound})
    try:
        spec, params = made.action(request.POST, bound.cleaned_data, task)
        services.run_action(spec.name, task, actor=request.user, **params)
    except errors.REFUSED as exc:
        refused = errors.refusal(request, exc, bound)
        task.refresh_from_db()
        return task_page(
            request, task, status=refused.status, error=refused.message, action_forms={name: bound}
        )
    messages.success(request, f"Task #{task.pk}: {spec.done}.")
    if request.htmx:
        task.refresh_from_db()
        return task_page(request, task)
    return redirect("console:task", pk=task.pk)
