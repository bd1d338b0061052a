"""``/api/v1/workflows``: per-workflow figures as the console's ``/workflows/`` pages show
them: every workflow over a window (``?window=hour|day|week``, the day by default), and one
workflow over each window with its bars over the chosen one. The steps' figures come from
the counters' roll-up (``tasks_app.observability.workflow_figures``), the tasks succeeded as
the overview counts them (``selectors.succeeded_since``). Reading them needs
``tasks_app.view_task``."""

from __future__ import annotations

import math
from datetime import datetime

from django.http import Http404, HttpRequest
from ninja import Query, Router, Schema

from api import access, filters, links
from api.errors import problems
from api.schemas import console_url
from console.forms import WindowForm
from tasks_app.db.clock import db_now
from tasks_app.history.counting import STEP_SECONDS_BUCKETS
from tasks_app.observability import workflow_figures
from tasks_app.observability.workflow_figures import Figures, Row
from tasks_app.operations import listings, selectors

router = Router(tags=["workflows"])


class WindowQuery(Schema):
    # hour, day or week.
    window: str | None = None


class RunTimeOut(Schema):
    """A quantile of successful runs' times, estimated from the run-time histogram."""

    seconds: float
    # Past the histogram's last bound: ``seconds`` is that bound, the run took longer.
    over: bool

    @classmethod
    def of(cls, value: float | None) -> RunTimeOut | None:
        if value is None:
            return None
        if math.isinf(value):
            return cls(seconds=float(STEP_SECONDS_BUCKETS[-1]), over=True)
        return cls(seconds=value, over=False)


class FiguresOut(Schema):
    """What a workflow's steps did between ``start`` and ``end`` (the samples' span, which
    may differ from the window's)."""

    start: datetime
    end: datetime
    enqueued: int
    succeeded: int
    retried: int
    dead_lettered: int
    # Of the steps that ended, the share dead-lettered; of the attempts that ended, the
    # share retried; null when none ended.
    failure_rate: float | None
    retry_rate: float | None
    mean_seconds: float | None
    p50: RunTimeOut | None
    p95: RunTimeOut | None
    p99: RunTimeOut | None

    @classmethod
    def of(cls, found: Figures | None) -> FiguresOut | None:
        if found is None:
            return None
        return cls(
            start=found.start,
            end=found.end,
            enqueued=found.enqueued,
            succeeded=found.succeeded,
            retried=found.retried,
            dead_lettered=found.dead_lettered,
            failure_rate=found.failure_rate,
            retry_rate=found.retry_rate,
            mean_seconds=found.mean,
            p50=RunTimeOut.of(found.p50),
            p95=RunTimeOut.of(found.p95),
            p99=RunTimeOut.of(found.p99),
        )


class WindowFiguresOut(Schema):
    tasks_succeeded: int
    # It has counters (something of it was enqueued or ran); ``figures`` is null before the
    # sweeper's first sample of it.
    counted: bool
    # The figures start further from the window's start than a sample can be.
    off_window: bool
    figures: FiguresOut | None

    @classmethod
    def of(cls, row: Row, tasks_succeeded: int) -> WindowFiguresOut:
        return cls(
            tasks_succeeded=tasks_succeeded,
            counted=row.counted,
            off_window=row.off_window,
            figures=FiguresOut.of(row.figures),
        )


class WorkflowRowOut(WindowFiguresOut):
    workflow: str
    # Its page in the console, and its figures over every window here.
    url: str
    api_url: str


class WorkflowList(Schema):
    window: str
    now: datetime
    items: list[WorkflowRowOut]


class BarOut(Schema):
    start: datetime
    end: datetime
    # Null where no sample tells.
    figures: FiguresOut | None


class WorkflowOut(Schema):
    name: str
    now: datetime
    # By window name: hour, day, week.
    windows: dict[str, WindowFiguresOut]
    # The chosen window's bars, oldest first, the last still filling.
    window: str
    bars: list[BarOut]
    url: str
    # Its dead letters grouped by cause; null for a workflow no longer registered (the
    # dead letters' filter knows registered workflows only).
    dead_groups_url: str | None


@router.get(
    "/",
    response={200: WorkflowList, **problems()},
    summary="Every workflow's figures over a window",
)
def workflow_list(request: HttpRequest, query: Query[WindowQuery]) -> WorkflowList:
    access.require(request, access.VIEW_TASKS)
    filters.known(request, set(WindowQuery.model_fields))
    window = filters.read(request, WindowForm).chosen()
    now = db_now()
    done = selectors.succeeded_by_workflow(now - window.span)
    items = [
        WorkflowRowOut(
            **WindowFiguresOut.of(row, done.get(row.workflow, 0)).model_dump(),
            workflow=row.workflow,
            url=console_url("workflow", row.workflow),
            api_url=links.api_url("workflow_detail", row.workflow),
        )
        for row in workflow_figures.figures(window, now=now)
    ]
    return WorkflowList(window=window.name, now=now, items=items)


@router.get(
    "/{name}",
    response={200: WorkflowOut, **problems(404)},
    summary="One workflow's figures over the last hour, day and week",
)
def workflow_detail(request: HttpRequest, name: str, query: Query[WindowQuery]) -> WorkflowOut:
    access.require(request, access.VIEW_TASKS)
    # An unknown name is not found before its window is read, as on the page.
    if not workflow_figures.is_known(name):
        raise Http404("No workflow of that name is registered or was ever counted.")
    filters.known(request, set(WindowQuery.model_fields))
    window = filters.read(request, WindowForm).chosen()
    now = db_now()
    rows = workflow_figures.workflow_figures(name, now=now)
    windows = {
        key: WindowFiguresOut.of(
            row,
            selectors.succeeded_since(now - workflow_figures.WINDOWS[key].span)
            .filter(workflow=name)
            .count(),
        )
        for key, row in rows.items()
    }
    registered = name in listings.workflow_names()
    return WorkflowOut(
        name=name,
        now=now,
        windows=windows,
        window=window.name,
        bars=[
            BarOut(start=bar.start, end=bar.end, figures=FiguresOut.of(bar.figures))
            for bar in workflow_figures.series(name, window, now=now)
        ],
        url=console_url("workflow", name),
        dead_groups_url=(
            links.api_url("dead_groups", query={"workflow": name}) if registered else None
        ),
    )
