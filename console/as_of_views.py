"""A task as it stood after any event of its history, and what changed between two of them
(``/tasks/<id>/as-of/?at=<n>&compare=<m>``), for anyone who may see the task: it reads and
changes nothing. The task page lists the events and swaps this page's region in beside
them; the address alone shows the same as a page of its own.
"""

from __future__ import annotations

from django import forms
from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_GET

from approvals import as_of
from console import errors
from console.forms import named_errors
from console.views import ConsoleRequest, render_page, view_tasks
from tasks_app.models import Task


class AsOfForm(forms.Form):
    # The event after which the task is shown (0, its enqueue; by default its last), and
    # the one to compare it with.
    at = forms.IntegerField(required=False, min_value=0)
    compare = forms.IntegerField(required=False, min_value=0)


@require_GET
@view_tasks
def task_as_of(request: ConsoleRequest, pk: int) -> HttpResponse:
    task = get_object_or_404(Task, pk=pk)
    form = AsOfForm(request.GET)
    if not form.is_valid():
        return errors.error_response(request, 400, "; ".join(named_errors(form)) + ".")
    record = as_of.read(task)
    last = len(record.entries) - 1
    at = form.cleaned_data["at"]
    at = last if at is None else at
    compare = form.cleaned_data["compare"]
    for name, value in (("at", at), ("compare", compare)):
        if value is not None and value > last:
            return errors.error_response(
                request,
                400,
                f"{name}: task #{task.pk} has events 0 to {last}; there is no event {value}.",
            )
    state = as_of.state_after(record, at)
    context = {
        "task": task,
        "events": record.entries,
        "at": at,
        "compare": compare,
        "state": state,
        "previous": at - 1 if at > 0 else None,
        "next": at + 1 if at < last else None,
    }
    if compare is not None:
        other = as_of.state_after(record, compare)
        earlier, later = sorted((state, other), key=lambda snapshot: snapshot.point.index)
        context |= {"earlier": earlier, "later": later, "changes": as_of.difference(earlier, later)}
    return render_page(request, "console/task_as_of.html", context, partial="as_of")
