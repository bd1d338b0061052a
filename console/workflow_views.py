"""The workflows pages: every workflow's figures over a window, and one workflow's over the
last hour, day and week with its charts and its dead letters by cause.

The steps' figures come from the workflow figures' roll-up
(``tasks_app.observability.workflow_figures``): the counters now, less the samples the sweeper
took. The tasks succeeded in a window are read as the overview reads them
(``selectors.succeeded_since``), so both pages say the same. The dead letters of one workflow,
grouped by cause, are a region of their own that the page asks for once shown.
"""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET

from console import charts, forms
from console.views import ConsoleRequest, reads_filter, render_page, view_tasks
from tasks_app.db.clock import db_now
from tasks_app.observability import workflow_figures as figures
from tasks_app.operations import listings, selectors

# The causes of dead letters shown on a workflow's page; the rest are a link away.
TOP_CAUSES = 5


@require_GET
@view_tasks
@reads_filter(forms.WindowForm)
def workflow_list(request: ConsoleRequest, form: forms.WindowForm) -> HttpResponse:
    window = form.chosen()
    now = db_now()
    done = selectors.succeeded_by_workflow(now - window.span)
    context = {
        # Each workflow's figures, and its tasks succeeded in the window.
        "rows": [(row, done.get(row.workflow, 0)) for row in figures.figures(window, now=now)],
        "window": window,
        "windows": list(figures.WINDOWS.values()),
        "now": now,
    }
    return render_page(request, "console/workflows.html", context, partial="figures")


@require_GET
@view_tasks
def workflow_detail(request: ConsoleRequest, name: str) -> HttpResponseBase:
    # An unknown name is not found before its window is read.
    if not figures.is_known(name):
        raise Http404("No workflow of that name is registered or was ever counted.")
    return _workflow_page(request, name)


@reads_filter(forms.WindowForm)
def _workflow_page(request: ConsoleRequest, form: forms.WindowForm, name: str) -> HttpResponse:
    window = form.chosen()
    now = db_now()
    bars = figures.series(name, window, now=now)
    filterable = name in listings.workflow_names()
    context: dict[str, Any] = {
        "name": name,
        "rows": figures.workflow_figures(name, now=now),
        # Tasks succeeded in each window, in the windows' order.
        "tasks_succeeded": [
            selectors.succeeded_since(now - w.span).filter(workflow=name).count()
            for w in figures.WINDOWS.values()
        ],
        "window": window,
        "windows": list(figures.WINDOWS.values()),
        "now": now,
        "bars": bars,
        **charts.workflow_charts(bars),
        # /dead/ filters by registered workflows only.
        "filterable": filterable,
    }
    return render_page(request, "console/workflow.html", context, partial="charts")


@require_GET
@view_tasks
def workflow_causes(request: ConsoleRequest, name: str) -> HttpResponse:
    """The largest causes of a workflow's dead letters: the region its page asks for once
    shown (grouping reads every dead letter of the workflow); a plain request goes to the
    page."""
    if name not in listings.workflow_names():
        raise Http404("No workflow of that name is registered.")
    if not request.htmx:
        return redirect(reverse("console:workflow", args=[name]) + "#dead-heading")
    causes = listings.dead_groups(listings.DeadFilter(workflow=name))
    context = {"name": name, "causes": causes[:TOP_CAUSES], "more_causes": len(causes) > TOP_CAUSES}
    return render(request, "console/workflow.html#causes", context)
