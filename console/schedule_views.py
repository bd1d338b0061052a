"""The Schedules pages: ``/schedules/`` lists every stored schedule (removed ones last) with
where it stands, its next runs in the reader's time zone and in UTC, its last runs with
their tasks and its missed slots; ``/schedules/<name>/`` shows one at length and, for
on-call (``tasks_app.manage_schedules``), its actions: pause, resume and backfill (each a
plan previewed, then confirmed), and run now, each with a reason.

A resume's or a backfill's preview carries its plan signed (``console.schedule_plans``);
confirming applies exactly that plan, or answers 409 and changes nothing when the plan is
refused (too old, someone else's, applied already) or the schedule moved on since.

Each action's answer is the schedule's card (htmx swaps it in place), or the page (a
redirect after a plain POST that succeeded). The services check the permission and the
input and record the events (``tasks_app.operations.schedules``); the actions' decorator
refuses a reader without the permission before anything is read, so a refusal shows
nothing of the schedule.
"""

from __future__ import annotations

import collections
from dataclasses import replace
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.http import Http404, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.views.decorators.http import require_GET, require_POST

from console import errors, schedule_plans
from console.plans import PlanRefused
from console.schedule_cards import Acted, Card, preview
from console.schedule_forms import ResumeForm, confirm_form, make_form
from console.schedule_zones import ViewerZone, read_local, viewer_zone, zone_of
from console.views import VIEW_TASKS, ConsoleRequest, render_page, view_tasks
from tasks_app import validation
from tasks_app.exceptions import IdempotencyConflict, InvalidInput, InvalidTransition, NotPermitted
from tasks_app.models import StoredSchedule
from tasks_app.operations import schedule_sync, schedule_use, schedules
from tasks_app.operations.schedules import SchedulePlan

MANAGE_SCHEDULES = "tasks_app.manage_schedules"
# Reading the page and acting on its schedule, checked before anything is parsed or shown.
manage_schedules = permission_required([VIEW_TASKS, MANAGE_SCHEDULES], raise_exception=True)

LIST = "console/schedules.html"
DETAIL = "console/schedule.html"
# What a service refuses with on these pages, a run now's key taken otherwise included.
REFUSED = (*errors.REFUSED, IdempotencyConflict)


def _render(
    request: ConsoleRequest,
    template: str,
    context: dict[str, Any],
    zone: ViewerZone,
    *,
    partial: str,
    status: int = 200,
) -> HttpResponse:
    # Every time on the page, the audit-style ones ({% when %}) included, in one zone.
    with timezone.override(zone.zone):
        return render_page(
            request, template, {**context, "zone": zone}, partial=partial, status=status
        )


@require_GET
@view_tasks
def schedule_list(request: ConsoleRequest) -> HttpResponse:
    zone = viewer_zone(request)
    pending = schedule_sync.pending_changes()
    by_name = collections.defaultdict(list)
    for change in pending:
        by_name[change.name].append(change)
    found = schedule_use.all_standing()
    cards = [Card(each, zone, by_name[each.schedule.name]) for each in found]
    context = {"cards": cards, "pending": pending}
    return _render(request, LIST, context, zone, partial="schedules")


@require_GET
@view_tasks
def schedule_detail(request: ConsoleRequest, name: str) -> HttpResponse:
    return _page(request, _known(name))


def _known(name: str) -> StoredSchedule:
    """The stored schedule by name (the services' own lookup), or 404."""
    try:
        return schedules.stored(name)
    except InvalidInput as exc:
        raise Http404(str(exc)) from exc


def _page(
    request: ConsoleRequest, row: StoredSchedule, *, acted: Acted | None = None, status: int = 200
) -> HttpResponse:
    """The schedule's page; for htmx its card, with what the action left on it."""
    zone = viewer_zone(request)
    row.refresh_from_db()
    pending = [change for change in schedule_sync.pending_changes() if change.name == row.name]
    card = Card(schedule_use.standing(row), zone, pending, full=True, acted=acted or Acted())
    return _render(request, DETAIL, {"card": card}, zone, partial="card", status=status)


def _done(request: ConsoleRequest, row: StoredSchedule, words: str) -> HttpResponse:
    """After an action: the card with fresh forms (htmx), or the page."""
    messages.success(request, words)
    if not request.htmx:
        return redirect("console:schedule", name=row.name)
    response = _page(request, row)
    # The notice is at the card's top; the form used was further down.
    response["HX-Reswap"] = "outerHTML show:top"
    return response


def _refused(
    request: ConsoleRequest, row: StoredSchedule, acted: Acted, exc: Exception
) -> HttpResponse:
    """A service's refusal on the card: bad input on the field it names, anything else
    as a notice saying nothing changed."""
    assert isinstance(exc, REFUSED)
    if isinstance(exc, IdempotencyConflict):
        error = f"Nothing changed: {exc}."
        return _page(request, row, acted=replace(acted, error=error), status=exc.http_status)
    refused = errors.refusal(request, exc, acted.form)
    error = f"Nothing changed: {refused.message.rstrip('.')}." if refused.message else ""
    return _page(request, row, acted=replace(acted, error=error), status=refused.status)


def _user_id(request: ConsoleRequest) -> int:
    assert request.user.pk is not None  # the views' permission needs a logged-in user
    return int(request.user.pk)


@require_POST
@manage_schedules
def schedule_pause(request: ConsoleRequest, name: str) -> HttpResponse:
    row = _known(name)
    form = make_form("pause", request.POST)
    acted = Acted("pause", form)
    if not form.is_valid():
        return _page(request, row, acted=acted, status=400)
    try:
        schedules.pause(row.name, actor=request.user, reason=form.cleaned_data["reason"])
    except REFUSED as exc:
        return _refused(request, row, acted, exc)
    return _done(request, row, f"Schedule {row.name} paused: none of its slots is enqueued now.")


@require_POST
@manage_schedules
def schedule_resume(request: ConsoleRequest, name: str) -> HttpResponse:
    """Preview a resume (without ``confirm=1``: an empty reason is refused here already),
    or apply the previewed plan (with it); ``change=1`` goes back to choosing."""
    row = _known(name)
    form = make_form("resume", request.POST)
    acted = Acted("resume", form)
    if not form.is_valid() or request.POST.get("change") == "1":
        return _page(request, row, acted=acted, status=200 if form.is_valid() else 400)
    if request.POST.get("confirm") == "1":
        return _confirm(request, row, form)
    try:
        reason = validation.require_text(form.cleaned_data["reason"], "reason")
        plan = schedules.plan_resume(row.name, mode=form.cleaned_data["mode"] or "policy")
    except REFUSED as exc:
        return _refused(request, row, acted, exc)
    return _previewed(request, row, acted, plan, reason)


@require_POST
@manage_schedules
def schedule_backfill(request: ConsoleRequest, name: str) -> HttpResponse:
    """Preview a backfill of the slots from ``since`` to ``until`` (local times read in the
    zone the form was shown in), or apply the previewed plan, as a resume does."""
    row = _known(name)
    form = make_form("backfill", request.POST)
    acted = Acted("backfill", form)
    if not form.is_valid() or request.POST.get("change") == "1":
        return _page(request, row, acted=acted, status=200 if form.is_valid() else 400)
    if request.POST.get("confirm") == "1":
        return _confirm(request, row, form)
    data = form.cleaned_data
    zone = zone_of(data["zone"]) if data["zone"] else viewer_zone(request)
    try:
        reason = validation.require_text(data["reason"], "reason")
        plan = schedules.plan_backfill(
            row.name, since=read_local(data["since"], zone), until=read_local(data["until"], zone)
        )
    except REFUSED as exc:
        return _refused(request, row, acted, exc)
    return _previewed(request, row, acted, plan, reason)


def _previewed(
    request: ConsoleRequest, row: StoredSchedule, acted: Acted, plan: SchedulePlan, reason: str
) -> HttpResponse:
    """The plan shown with its confirm form, which carries it signed; nothing changes."""
    token = schedule_plans.token(plan, user_id=_user_id(request))
    confirm = confirm_form(plan.action, initial={"plan": token, "reason": reason})
    shown = preview(plan, token, viewer_zone(request), confirm)
    return _page(request, row, acted=replace(acted, preview=shown))


def _confirm(request: ConsoleRequest, row: StoredSchedule, form: forms.Form) -> HttpResponse:
    """Apply the plan the confirm carries, with the reason given: 409 and nothing changed
    when the plan is refused or stale, 400 on the reason (the preview kept) when it is
    missing. ``form`` is the action's form as posted beside it, to choose again from."""
    action = "resume" if isinstance(form, ResumeForm) else "backfill"
    confirm = confirm_form(action, request.POST)
    token = request.POST.get("plan", "")
    try:
        plan = schedule_plans.load(token, user_id=_user_id(request), name=row.name, action=action)
    except PlanRefused as exc:
        acted = Acted(action, form, error=f"Nothing changed: {exc}.")
        return _page(request, row, acted=acted, status=409)
    if not confirm.is_valid():
        shown = preview(plan, token, viewer_zone(request), confirm)
        return _page(request, row, acted=Acted(action, form, shown), status=400)
    apply = schedules.resume if action == "resume" else schedules.backfill
    try:
        made = apply(row.name, actor=request.user, reason=confirm.cleaned_data["reason"], plan=plan)
    except InvalidInput as exc:
        errors.refusal(request, exc, confirm)
        shown = preview(plan, token, viewer_zone(request), confirm)
        return _page(request, row, acted=Acted(action, form, shown), status=exc.http_status)
    except (NotPermitted, InvalidTransition) as exc:
        return _refused(request, row, Acted(action, form), exc)
    return _done(request, row, _applied_words(row, plan, made))


def _applied_words(row: StoredSchedule, plan: SchedulePlan, made: Any) -> str:
    count = len(plan.enqueue)
    if plan.action == "resume":
        missed = f"; {len(plan.missed)} missed slot(s) recorded" if plan.missed else ""
        return f"Schedule {row.name} resumed: {count} run(s) enqueued{missed}."
    started = sum(1 for run in made if run.task_id)
    words = f"Schedule {row.name} backfilled: {started} run(s) enqueued"
    if len(made) < count:
        words += f" ({count - len(made)} of the preview's slots were enqueued meanwhile)"
    return words + "."


@require_POST
@manage_schedules
def schedule_run_now(request: ConsoleRequest, name: str) -> HttpResponse:
    """Enqueue one run now. The form's request id makes a second send of it (a double
    click, a form sent again) find the task the first one started."""
    row = _known(name)
    form = make_form("run_now", request.POST)
    acted = Acted("run_now", form)
    if not form.is_valid():
        return _page(request, row, acted=acted, status=400)
    try:
        result = schedules.run_now(
            row.name,
            actor=request.user,
            reason=form.cleaned_data["reason"],
            request_id=form.cleaned_data["request_id"] or None,
        )
        task_id, created = result.task.pk, result.created
    except REFUSED as exc:
        return _refused(request, row, acted, exc)
    words = (
        "Schedule {} run now: task {} enqueued."
        if created
        else "Schedule {} was already run by this request: task {}; nothing new was enqueued."
    )
    link = format_html('<a href="{}">#{}</a>', reverse("console:task", args=[task_id]), task_id)
    return _done(request, row, format_html(words, row.name, link))
