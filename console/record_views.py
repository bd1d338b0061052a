"""The queues page with its switches, the audit log with its CSV export, and the demo's
mail."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.http import Http404, HttpResponse, HttpResponseBadRequest, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_POST

from console import audit_csv, errors, forms, mailbox, presenters
from console.views import (
    EXPORT_AUDIT,
    VIEW_AUDIT,
    ConsoleRequest,
    reads_filter,
    render_page,
    view_tasks,
)
from tasks_app import services
from tasks_app.engine import presence
from tasks_app.history import audit_chain
from tasks_app.operations import audit_log, selectors

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
    except errors.REFUSED as exc:
        refused = errors.refusal(request, exc)
        said = refused.message if refused.status == 403 else f"Queue {name}: {refused.message}"
        return _queues_page(request, status=refused.status, error=said)
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


def _audit_refused(request: ConsoleRequest, form: forms.AuditFilterForm) -> HttpResponse:
    """The audit log's own page, its filter's problems named on it."""
    context = {"form": form, "problems": forms.named_errors(form)}
    return render_page(request, "console/audit.html", context, partial="results", status=400)


@require_GET
@permission_required(VIEW_AUDIT, raise_exception=True)
@reads_filter(forms.AuditFilterForm, refuse=_audit_refused)
def audit(request: ConsoleRequest, form: forms.AuditFilterForm) -> HttpResponse:
    page = audit_log.audit_page(form.filters(), after=form.cursor())
    workflows = audit_log.task_workflows([e.task_id for e in page.rows if e.task_id])
    rows = [(event, workflows.get(event.task_id or 0)) for event in page.rows]
    context = {"form": form, "page": page, "rows": rows, "head": audit_chain.head()}
    return render_page(request, "console/audit.html", context, partial="results")


def _export_refused(request: ConsoleRequest, form: forms.AuditFilterForm) -> HttpResponse:
    """A CSV's reader gets plain text: the filter's problems, one a line."""
    problems = "\n".join(forms.named_errors(form))
    return HttpResponseBadRequest(problems + "\n", content_type="text/plain; charset=utf-8")


@require_GET
@permission_required(EXPORT_AUDIT, raise_exception=True)
@reads_filter(forms.AuditFilterForm, refuse=_export_refused)
def audit_export(request: ConsoleRequest, form: forms.AuditFilterForm) -> HttpResponseBase:
    """The filtered audit log as CSV, streamed row by row, newest first; what producers and
    people wrote is redacted as everywhere else (``tasks_app.redaction``), and no cell is
    a formula (``presenters.csv_lines``). A bad filter answers 400 naming it, never a wider export.

    The last row is the audit chain's head, read after the last event row: its first cell
    ``# chain head: event <id> <hash>``, the others empty. A row of the header's width
    keeps the file a CSV any reader and spreadsheet opens; a reader of events skips the
    row by its ``#``. ``manage.py verify_audit --export FILE`` checks each row against the
    database and that head against the chain (``console.audit_csv``)."""
    events = audit_log.audit_entries(form.filters())
    response = StreamingHttpResponse(
        presenters.csv_lines(audit_csv.rows(events)), content_type="text/csv; charset=utf-8"
    )
    response["Content-Disposition"] = 'attachment; filename="audit-log.csv"'
    return response


# --- the demo's mail ------------------------------------------------------------------------


@require_GET
def mail(request: ConsoleRequest) -> HttpResponse:
    """The notices the demo sent to the reader, by their user, not by an address that
    reads like theirs (everyone's mail, for a superuser): only where mail is written to
    files instead of sent."""
    if mailbox.folder() is None:
        raise Http404("mail is sent by SMTP here: read it in your mail client")
    user = request.user
    address = getattr(user, "email", "")
    recipient = None if user.is_superuser else user.get_username()
    context = {
        "mails": mailbox.messages(recipient=recipient),
        "everyone": recipient is None,
        "address": address,
    }
    return render_page(request, "console/mail.html", context, partial="results")
