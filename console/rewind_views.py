"""Rewind on the task page (``/tasks/<id>/rewind/`` and ``/tasks/<id>/rewind/confirm/``):
on-call chooses a step (and may edit the payload), previews the plan (the steps that run
again and every external write they own, applied or in doubt), decides each write in doubt,
gives a reason and confirms; the rewind service does the rest (``services.rewind``).

The preview's plan travels signed (``console.rewind_plans``), and confirming applies that
plan or nothing. Both answer with the task's page (its region for htmx), the rewind section
showing the preview or the refusal in place. Who may not rewind is refused with 403 before
the task is read; a refused transition answers 409 with the service's words and the form to
preview again; bad input answers 400 on the field it names.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from console import errors, presenters
from console.plans import PlanRefused
from console.rewind_forms import (
    PERMISSION,
    ConfirmForm,
    RewindForm,
    RewindPanel,
    choose_form,
    offered,
    posted_decisions,
)
from console.rewind_plans import SignedRewind
from console.views import ConsoleRequest, task_page, view_tasks
from tasks_app import services
from tasks_app.exceptions import InvalidInput, InvalidTransition
from tasks_app.models import Task


def _may_rewind(request: ConsoleRequest) -> None:
    # Checked before the task is read: a refusal shows nothing of it.
    if not request.user.has_perm(PERMISSION):
        raise PermissionDenied("rewinding a task needs the on-call permission to redrive")


def _user_id(request: ConsoleRequest) -> int:
    assert request.user.pk is not None  # the view's permission needs a logged-in user
    return int(request.user.pk)


@require_POST
@view_tasks
def rewind_preview(request: ConsoleRequest, pk: int) -> HttpResponse:
    """The plan of rewinding the task from the chosen step (with the edited payload), signed
    for its confirm; nothing changes."""
    _may_rewind(request)
    task = get_object_or_404(Task, pk=pk)
    form = choose_form(task, request.POST)
    if not form.is_valid():
        return task_page(request, task, status=400, rewind=RewindPanel(form=form))
    typed = form.edited_payload(task)
    try:
        plan = services.plan_rewind(task, form.cleaned_data["step"], _restored(typed, task))
    except InvalidInput as exc:
        errors.refusal(request, exc, form)
        return task_page(request, task, status=exc.http_status, rewind=RewindPanel(form=form))
    except InvalidTransition as exc:
        return _refused(request, task, exc.http_status, str(exc), form=form)
    signed = SignedRewind.make(plan, payload=typed, user_id=_user_id(request))
    return task_page(request, task, rewind=_preview(task, plan, signed.token()))


def _restored(typed: Any, task: Task) -> Any:
    """The payload typed on a redacted copy, with the secrets it did not show put back."""
    return None if typed is None else presenters.restore_redacted(typed, task.payload)


def _preview(
    task: Task,
    plan: services.RewindPlan,
    token: str,
    *,
    confirm: ConfirmForm | None = None,
    decided: dict[str, str] | None = None,
) -> RewindPanel:
    """The preview of a rewind: its plan, the payload's changes, and the confirm form
    carrying the plan's token (as posted, when showing a refused confirm again: its time
    runs from the preview)."""
    changes = presenters.payload_changes(task.payload, plan.new_payload)
    return RewindPanel(
        plan=plan,
        token=token,
        confirm=confirm or ConfirmForm(),
        changes=changes if plan.payload_changed else [],
        decided=decided or {},
    )


@require_POST
@view_tasks
def rewind_confirm(request: ConsoleRequest, pk: int) -> HttpResponse:
    """Apply the previewed rewind with the reason and the decisions given. A refusal shows
    the preview again with the error on what is missing (bad input), or the form to preview
    again (the plan refused or spent, the task changed since)."""
    _may_rewind(request)
    task = get_object_or_404(Task, pk=pk)
    form = ConfirmForm(request.POST)
    try:
        signed = SignedRewind.load(
            request.POST.get("plan", ""), user_id=_user_id(request), task_id=task.pk
        )
        signed.check_unspent()
    except PlanRefused as exc:
        return _refused(request, task, 409, f"Nothing changed: {exc}.")
    payload = _restored(signed.payload, task)
    try:
        # The plan as it stands: its writes in doubt name the decisions to read, and it is
        # shown again if the confirm lacks what the form asks for.
        plan = services.plan_rewind(task, signed.step_id, payload)
    except (InvalidInput, InvalidTransition) as exc:
        return _refused(request, task, exc.http_status, str(exc), signed=signed)
    decided = posted_decisions(request.POST, plan)
    token = request.POST.get("plan", "")
    if not form.is_valid():
        panel = _preview(task, plan, token, confirm=form, decided=decided)
        return task_page(request, task, status=400, rewind=panel)
    try:
        services.rewind(
            task,
            step_id=signed.step_id,
            actor=request.user,
            reason=form.cleaned_data["reason"],
            fingerprint=signed.fingerprint,
            payload=payload,
            decisions=decided,
            plan=signed.id,
        )
    except InvalidInput as exc:
        errors.refusal(request, exc, form)
        panel = _preview(task, plan, token, confirm=form, decided=decided)
        return task_page(request, task, status=exc.http_status, rewind=panel)
    except InvalidTransition as exc:
        task.refresh_from_db()
        return _refused(request, task, exc.http_status, str(exc), signed=signed)
    chosen = next(s.kind for s in plan.steps if s.step_id == signed.step_id)
    rerun = ", ".join(s.kind for s in plan.steps)
    messages.success(request, f"Task #{task.pk}: rewound from {chosen}; {rerun} run again.")
    if not request.htmx:
        return redirect("console:task", pk=task.pk)
    task.refresh_from_db()
    response = task_page(request, task)
    # The notice is at the top of the task's region; the preview was further down.
    response["HX-Reswap"] = "outerHTML show:#task:top"
    return response


def _refused(
    request: ConsoleRequest,
    task: Task,
    status: int,
    message: str,
    *,
    form: RewindForm | None = None,
    signed: SignedRewind | None = None,
) -> HttpResponse:
    """The task page answering a refused rewind: the rewind form (as posted, or on the
    refused plan's step and payload) with the refusal beside it, to preview again; once the
    task may not be rewound, the refusal alone."""
    if offered(task, request.user) is None:
        return task_page(request, task, status=status, error=message)
    if form is None:
        initial: dict[str, Any] = {}
        if signed is not None:
            initial["step"] = signed.step_id
            if signed.payload is not None:
                initial["payload"] = presenters.pretty_json(signed.payload)
        form = choose_form(task, initial=initial)
    return task_page(request, task, status=status, rewind=RewindPanel(form=form, error=message))
