"""The queues page with its switches, and the audit log with its CSV export."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.http import HttpResponse, HttpResponseBadRequest, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_POST

from tasks_app import audit_chain, lists, presence, selectors, services
from tasks_app.exceptions import InvalidInput, NotPermitted

from . import audit_csv, errors, forms, presenters
from .views import (
    EXPORT_AUDIT,
    VIEW_AUDIT,
    ConsoleRequest,
    render_page,
    view_tasks,
)

# --- queues ---------------------------------------------------------------------------------


@require_GET
@view_tasks
def queue_list(request: ConsoleRequest) -> HttpResponse:
    return _queues_page(request)


def _queues_page(request: ConsoleRequest, *, status: int = 200, error: str = "") -> HttpResponse:
    context = {
        "queues": selectors.queues(),
        "workers": presence.workers(),
        "form": forms.ReasonForm(),
        "error": error,
    }
    return render_page(request, "console/queues.html", context, partial="queues", status=status)


def _queue_action(request: ConsoleRequest, name: str, *, paused: bool) -> HttpResponse:
    form = forms.ReasonForm(request.POST)
    form.is_valid()
    switch = services.pause_queue if paused else services.resume_queue
    try:
        switch(name, actor=request.user, reason=form.cleaned_data.get("reason", ""))
    except NotPermitted as exc:
        errors.log_refusal(request, str(exc))
        return _queues_page(request, status=403, error=f"Not permitted: {exc}")
    except InvalidInput as exc:
        return _queues_page(request, status=400, error=f"Queue {name}: {exc}")
    done = f"Queue {name} {'paused' if paused else 'resumed'}."
    messages.success(request, done)
    if request.htmx:
        return _queues_page(request)
    return redirect("console:queues")


# Reading the queues page and pausing its queues, before anything is parsed or shown.
queue_switch = permission_required(
    ["tasks_app.view_task", "tasks_app.pause_queue"], raise_exception=True
)


@require_POST
@queue_switch
def queue_pause(request: ConsoleRequest, name: str) -> HttpResponse:
    return _queue_action(request, name, paused=True)


@require_POST
@queue_switch
def queue_resume(request: ConsoleRequest, name: str) -> HttpResponse:
    return _queue_action(request, name, paused=False)


# --- audit log ------------------------------------------------------------------------------


@require_GET
@permission_required(VIEW_AUDIT, raise_exception=True)
def audit(request: ConsoleRequest) -> HttpResponse:
    form = forms.AuditFilterForm(request.GET)
    if not form.is_valid():
        context = {"form": form, "problems": forms.named_errors(form)}
        return render_page(request, "console/audit.html", context, partial="results", status=400)
    page = lists.audit_page(form.filters(), after=form.cursor())
    workflows = lists.task_workflows([e.task_id for e in page.rows if e.task_id])
    rows = [(event, workflows.get(event.task_id or 0)) for event in page.rows]
    context = {"form": form, "page": page, "rows": rows, "head": audit_chain.head()}
    return render_page(request, "console/audit.html", context, partial="results")


@require_GET
@permission_required(EXPORT_AUDIT, raise_exception=True)
def audit_export(request: ConsoleRequest) -> HttpResponseBase:
    """The filtered audit log as CSV, streamed row by row, newest first; what producers and
    people wrote is redacted as everywhere else (``tasks_app.redaction``), and no cell is a
    formula (``presenters.csv_lines``). A bad filter answers 400 naming it, never a wider
    export.

    The last row is the audit chain's head, read after the last event row: its first cell
    ``# chain head: event <id> <hash>``, the others empty. A row of the header's width
    keeps the file a CSV any reader and spreadsheet opens; a reader of events skips the
    row by its ``#``. ``manage.py verify_audit --export FILE`` checks each row against the
    database and that head against the chain (``console.audit_csv``)."""
    form = forms.AuditFilterForm(request.GET)
    if not form.is_valid():
        problems = "\n".join(forms.named_errors(form))
        return HttpResponseBadRequest(problems + "\n", content_type="text/plain; charset=utf-8")
    events = lists.audit_events(form.filters()).order_by("-id")
    response = StreamingHttpResponse(
        presenters.csv_lines(audit_csv.rows(events)), content_type="text/csv; charset=utf-8"
    )
    response["Content-Disposition"] = 'attachment; filename="audit-log.csv"'
    return response
