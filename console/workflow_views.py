"""The workflows pages: every workflow's figures over a window, and one workflow's over the
last hour, day and week with its charts and its dead letters by cause.

The figures come from the workflow figures' roll-up (``tasks_app.workflow_figures``): the
counters now, less the samples the sweeper took; nothing here reads tasks, steps or
events. The dead letters of one workflow, grouped by cause, are a region of their own
that the page asks for once shown.
"""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET

from tasks_app import lists
from tasks_app import workflow_figures as figures
from tasks_app.transitions import db_now

from . import charts, forms
from .presenters import seconds
from .views import ConsoleRequest, filter_refused, render_page, view_tasks

# The causes of dead letters shown on a workflow's page; the rest are a link away.
TOP_CAUSES = 5
PERCENTILES = ("p50", "p95", "p99")


@require_GET
@view_tasks
def workflow_list(request: ConsoleRequest) -> HttpResponse:
    form = forms.WindowForm(request.GET)
    if not form.is_valid():
        return filter_refused(request, form)
    window = form.chosen()
    now = db_now()
    context = {
        "rows": figures.figures(window, now=now),
        "window": window,
        "windows": list(figures.WINDOWS.values()),
        "now": now,
    }
    return render_page(request, "console/workflows.html", context, partial="figures")


@require_GET
@view_tasks
def workflow_detail(request: ConsoleRequest, name: str) -> HttpResponse:
    if not figures.is_known(name):
        raise Http404("No workflow of that name is registered or was ever counted.")
    form = forms.WindowForm(request.GET)
    if not form.is_valid():
        return filter_refused(request, form)
    window = form.chosen()
    now = db_now()
    bars = figures.series(name, window, now=now)
    filterable = name in lists.workflow_names()
    context: dict[str, Any] = {
        "name": name,
        "rows": figures.workflow_figures(name, now=now),
        "window": window,
        "windows": list(figures.WINDOWS.values()),
        "now": now,
        "bars": bars,
        **_charts(bars),
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
    if name not in lists.workflow_names():
        raise Http404("No workflow of that name is registered.")
    if not request.htmx:
        return redirect(reverse("console:workflow", args=[name]) + "#dead-heading")
    causes = lists.dead_groups(lists.DeadFilter(workflow=name))
    context = {"name": name, "causes": causes[:TOP_CAUSES], "more_causes": len(causes) > TOP_CAUSES}
    return render(request, "console/workflow.html#causes", context)


def _charts(bars: list[figures.Bar]) -> dict[str, Any]:
    """The three charts of a window: steps succeeded, dead letters and retries, and the
    run-time percentiles, a slot per bar."""
    done, trouble, starts, labels = [], [], [], []
    runs: dict[str, list[float | None]] = {p: [] for p in PERCENTILES}
    for bar in bars:
        f = bar.figures
        span = charts.slot_label(bar.start, bar.end)
        done.append(
            charts.Slot(
                bar.start,
                {"succeeded": f.succeeded if f else None},
                f"{span}: {f.succeeded} steps succeeded" if f else f"{span}: no samples",
            )
        )
        trouble.append(
            charts.Slot(
                bar.start,
                {"dead": f.dead_lettered if f else None, "retry": f.retried if f else None},
                f"{span}: {f.dead_lettered} dead letters, {f.retried} retries"
                if f
                else f"{span}: no samples",
            )
        )
        starts.append(bar.start)
        for p in PERCENTILES:
            runs[p].append(getattr(f, p) if f else None)
        labels.append(
            f"{span}: " + ", ".join(f"{p} {seconds(getattr(f, p))}" for p in PERCENTILES)
            if f and f.succeeded
            else f"{span}: no runs"
        )
    return {
        "done_chart": charts.bar_chart(done, series=["succeeded"]),
        "trouble_chart": charts.bar_chart(trouble, series=["dead", "retry"]),
        "duration_chart": charts.log_lines(starts, runs, labels),
    }
