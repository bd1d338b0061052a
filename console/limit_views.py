"""The Limits page (``/limits/``): each flow-control limit's use now in words, where its
numbers come from, its keys at their limit with the tasks holding them; and, for on-call
(``tasks_app.change_limits``), the live changes: new numbers previewed then confirmed, the
numbers put back to code and settings, a key paused or resumed, each with a reason.

The figures refresh themselves while the tab is visible. One small poller asks for the
page's figures and swaps each limit's block in place (``hx-select-oob``), so the forms
beside them, a reason being typed and a preview waiting for its confirm, are never
replaced under someone's hands. The services check the permission and the input and
record the events (``tasks_app.operations.limits``); the views' decorator refuses a
reader without the permission before anything is read, so a refusal shows nothing of the
limit.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.http import Http404, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from console import errors
from console.limit_cards import Acted, card, fresh_forms, make_forms, recent_changes
from console.views import VIEW_TASKS, ConsoleRequest, render_page, view_tasks
from tasks_app import validation
from tasks_app.db.clock import db_now
from tasks_app.exceptions import InvalidInput, InvalidTransition, NotPermitted
from tasks_app.operations import limits
from tasks_app.operations.limit_use import KeyUse, LimitUse, use_of, uses

CHANGE_LIMITS = "tasks_app.change_limits"
# Reading the page and changing its limits, checked before anything is parsed or shown.
change_limits = permission_required([VIEW_TASKS, CHANGE_LIMITS], raise_exception=True)

TEMPLATE = "console/limits.html"


def _signature(names: list[str]) -> str:
    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:12]


def _page(
    request: ConsoleRequest, *, acted: Acted | None = None, status: int = 200
) -> HttpResponse:
    """The page; for htmx its figures (a poll), or after an action the acted-on card."""
    found = uses()
    changes = recent_changes()
    cards = [card(use, acted, changes.get(use.name)) for use in found]
    names = [use.name for use in found]
    shown = request.GET.get("shown", "") or _signature(names)
    context: dict[str, Any] = {
        "cards": cards,
        "now": db_now(),
        "shown": shown,
        "changed_set": shown != _signature(names),
        "select_oob": ", ".join(made.select_id for made in cards),
    }
    partial = "uses"
    if acted is not None:
        context["card"] = next(made for made in cards if made.name == acted.name)
        partial = "card"
    return render_page(request, TEMPLATE, context, partial=partial, status=status)


@require_GET
@view_tasks
def limit_list(request: ConsoleRequest) -> HttpResponse:
    return _page(request)


# --- actions --------------------------------------------------------------------------------


def _known(name: str) -> LimitUse:
    """The limit by name (``limit_use.use_of``, the services' own lookup), or 404."""
    try:
        return use_of(name)
    except InvalidInput as exc:
        raise Http404(str(exc)) from exc


def _done(request: ConsoleRequest, name: str, words: str) -> HttpResponse:
    """After an action: the card with fresh forms (htmx), or the page at the card."""
    messages.success(request, words)
    if not request.htmx:
        return redirect(reverse("console:limits") + f"#limit-{name}")
    return _page(request, acted=Acted(name))


def _refused(
    request: ConsoleRequest,
    acted: Acted,
    exc: NotPermitted | InvalidInput | InvalidTransition,
    form: forms.Form,
) -> HttpResponse:
    """A service's refusal on the card, its fields' errors on them (errors.refusal)."""
    refused = errors.refusal(request, exc, form)
    return _page(request, acted=replace(acted, error=refused.message), status=refused.status)


def _with(use: LimitUse, which: str, form: forms.Form) -> dict[str, forms.Form]:
    return {**fresh_forms(use), which: form}


@require_POST
@change_limits
def limit_change(request: ConsoleRequest, name: str) -> HttpResponse:
    """Preview new numbers (without ``confirm=1``: what its confirm would refuse, such as
    an empty reason, is refused here already), or apply them (with it) unless the numbers
    in effect changed since the preview; ``change=1`` goes back to editing them."""
    use = _known(name)
    form = make_forms(name, request.POST)["change"]
    acted = Acted(name, _with(use, "change", form))
    if not form.is_valid():
        return _page(request, acted=acted, status=400)
    data = form.cleaned_data
    if request.POST.get("change") == "1":
        return _page(request, acted=acted)
    if problems := _problems(data):
        for exc in problems:
            form.add_error(errors.form_field(form, exc), str(exc))
        return _page(request, acted=acted, status=400)
    try:
        if request.POST.get("confirm") != "1":
            preview = limits.preview_change(
                name, concurrency=data["concurrency"], rate=data["rate"]
            )
            for numbers in ("concurrency", "rate"):
                form.fields[numbers].widget.attrs["readonly"] = True
            return _page(request, acted=replace(acted, preview=preview))
        limits.change_limit(
            name,
            actor=request.user,
            reason=data["reason"],
            concurrency=data["concurrency"],
            rate=data["rate"],
            seen=data["seen"],
        )
    except errors.REFUSED as exc:
        return _refused(request, acted, exc, form)
    after = limits.describe(limits.clean_numbers(data["concurrency"], data["rate"]))
    return _done(request, name, f"Limit {name} changed to {after}.")


def _problems(data: dict[str, Any]) -> list[InvalidInput]:
    """Every problem of a change at once (the service stops at the first): its numbers
    and its reason, each naming its field."""
    problems = []
    try:
        limits.clean_numbers(data["concurrency"], data["rate"])
    except InvalidInput as exc:
        problems.append(exc)
    try:
        validation.require_text(data["reason"], "reason")
    except InvalidInput as exc:
        problems.append(exc)
    return problems


@require_POST
@change_limits
def limit_reset(request: ConsoleRequest, name: str) -> HttpResponse:
    use = _known(name)
    form = make_forms(name, request.POST)["reset"]
    acted = Acted(name, _with(use, "reset", form))
    if not form.is_valid():
        return _page(request, acted=acted, status=400)
    try:
        limits.reset_limit(name, actor=request.user, reason=form.cleaned_data["reason"])
    except errors.REFUSED as exc:
        return _refused(request, acted, exc, form)
    back = limits.describe(use.configured)
    return _done(request, name, f"Limit {name} is back to {back}, as code and settings say.")


def _key_action(request: ConsoleRequest, name: str, *, paused: bool) -> HttpResponse:
    use = _known(name)
    which = "pause" if paused else "resume"
    form = make_forms(name, request.POST)[which]
    acted = Acted(name, _with(use, which, form))
    if not form.is_valid():
        return _page(request, acted=acted, status=400)
    key, reason = form.cleaned_data["key"], form.cleaned_data["reason"]
    before = next((known for known in use.keys if known.key == key), None)
    try:
        switch = limits.pause_key if paused else limits.resume_key
        switch(name, key, actor=request.user, reason=reason)
    except errors.REFUSED as exc:
        return _refused(request, acted, exc, form)
    return _done(request, name, _key_done(name, key, before, paused=paused))


def _key_done(name: str, key: str, before: KeyUse | None, *, paused: bool) -> str:
    what = f"Key {key} of {name}" if key else f"Limit {name}"
    if (before is not None and before.paused_at is not None) == paused:
        return f"{what} was {'already' if paused else 'not'} paused; nothing changed."
    if paused and (before is None or not (before.running or before.waiting)):
        return f"{what} paused (no step runs or waits under it now)."
    return f"{what} {'paused' if paused else 'resumed'}."


@require_POST
@change_limits
def limit_pause(request: ConsoleRequest, name: str) -> HttpResponse:
    return _key_action(request, name, paused=True)


@require_POST
@change_limits
def limit_resume(request: ConsoleRequest, name: str) -> HttpResponse:
    return _key_action(request, name, paused=False)
