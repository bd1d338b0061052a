"""The workflow figures' roll-up (``tasks_app.observability.workflow_figures``): the counters kept
per workflow on both paths, the samples the sweeper takes of them, and the figures, charts and
percentiles read back as differences between samples and the counters now.

Time moves by the samples' injected clock (``now=``) and by back-dating rows, never by
sleeping.
"""

from __future__ import annotations

import itertools
import math
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from tasks_app import services
from tasks_app.db.clock import db_now
from tasks_app.engine import runner
from tasks_app.history import counting
from tasks_app.models import Counter, Step, Task, TaskStatus, WorkflowSample
from tasks_app.observability import workflow_figures as wf
from tasks_app.observability import workflow_samples as ws
from tests.conftest import backdate, only_step
from tests.lease_support import claim, expire_lease

HOUR, DAY, WEEK = wf.WINDOWS["hour"], wf.WINDOWS["day"], wf.WINDOWS["week"]


@pytest.fixture(params=["sql", "orm"])
def path(request: pytest.FixtureRequest, settings: Any) -> str:
    settings.TASKS_SQL_FAST_PATH = request.param == "sql"
    return str(request.param)


def succeed(workflow: str = "demo.noop", n: int = 1) -> None:
    for i in range(n):
        task = services.enqueue(workflow, {"n": i}).task
        runner.run_task_steps(task)
        task.refresh_from_db()
        assert task.status == TaskStatus.SUCCEEDED


def retried_then_succeeded() -> Task:
    """A ``demo.flaky`` task whose first claim failed (a retry) and second succeeded."""
    task = services.enqueue("demo.flaky", {"fail_first": 1}).task
    runner.run_task_steps(task)
    # The retry may not be due yet (its backoff has jitter).
    backdate(only_step(task), seconds=60)
    runner.run_task_steps(task)
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED and only_step(task).attempts == 2
    return task


def dead() -> Task:
    task = services.enqueue("demo.flaky", {"error": "permanent", "fail_first": 1}).task
    runner.run_task_steps(task)
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD
    return task


def live(workflow: str) -> counting.WorkflowTotals:
    return counting.by_workflow(counting.totals())[workflow]


def row(rows: list[wf.Row], workflow: str) -> wf.Row:
    return next(r for r in rows if r.workflow == workflow)


# --- the counters, per workflow ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_each_workflows_run_times_are_counted_under_its_name_on_both_paths(path: str) -> None:
    succeed("demo.noop", 2)
    succeed("demo.flaky", 1)

    noop, flaky = live("demo.noop"), live("demo.flaky")
    assert (noop.enqueued, noop.run_times.count) == (2, 2)
    assert (flaky.enqueued, flaky.run_times.count) == (1, 1)
    # A step runs in well under 10 s here.
    assert set(noop.run_times.buckets) <= {"0.01", "0.05", "0.1", "0.5", "1", "5", "10"}
    names = set(Counter.objects.values_list("name", flat=True))
    assert any(name.startswith("step_seconds@demo.noop:le=") for name in names)
    assert not any(name.startswith("step_seconds:") for name in names)


@pytest.mark.django_db(transaction=True)
def test_a_completion_batch_of_two_workflows_counts_each_under_its_own(path: str) -> None:
    tasks = [services.enqueue(w, {}).task for w in ("demo.noop", "demo.flaky", "demo.noop")]
    claims = [claim(only_step(task)) for task in tasks]
    for c in claims:
        Step.objects.filter(pk=c.step_id).update(started_at=F("started_at") - timedelta(seconds=42))
    from tasks_app.engine import fastpath

    if path == "sql":
        fastpath.complete_many([(c, {}) for c in claims])
    else:
        for c in claims:
            services.complete_step(c, {})

    assert live("demo.noop").run_times.buckets == {"60": 2}
    assert live("demo.flaky").run_times.buckets == {"60": 1}
    assert 84 <= live("demo.noop").run_times.sum_ms / 1000 < 120


@pytest.mark.django_db(transaction=True)
def test_retries_and_dead_letters_are_counted_per_workflow_wherever_they_happen() -> None:
    retried_then_succeeded()
    dead()
    # A dead letter the sweeper makes: the last attempt's lease ran out.
    task = services.enqueue("demo.noop", {}).task
    step = only_step(task)
    for _ in range(step.max_attempts):
        claim(step)
        expire_lease(step)
    assert Task.objects.get(pk=task.pk).status == TaskStatus.DEAD

    flaky, noop = live("demo.flaky").events, live("demo.noop").events
    assert (flaky.get("retry_scheduled"), flaky.get("dead_lettered")) == (1, 1)
    assert (noop.get("retry_scheduled", 0), noop.get("dead_lettered")) == (0, 1)


# --- sampling ------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_sample_holds_each_workflows_totals_and_the_next_waits_a_minute() -> None:
    succeed("demo.noop", 2)
    retried_then_succeeded()
    dead()
    now = db_now().replace(minute=10, second=0, microsecond=0)

    assert ws.take_sample(now=now) == 2
    noop = WorkflowSample.objects.get(workflow="demo.noop")
    flaky = WorkflowSample.objects.get(workflow="demo.flaky")
    assert (noop.enqueued, noop.succeeded, noop.retried, noop.dead_lettered) == (2, 2, 0, 0)
    assert (flaky.enqueued, flaky.succeeded, flaky.retried, flaky.dead_lettered) == (2, 1, 1, 1)
    assert sum(noop.run_buckets.values()) == 2 and noop.hourly and flaky.hourly

    succeed("demo.noop")
    assert ws.take_sample(now=now + timedelta(seconds=30)) == 0, "too soon"
    # A minute on, in the same clock hour: only the workflow whose totals changed gets a
    # row, not an hourly one.
    assert ws.take_sample(now=now + timedelta(minutes=1)) == 1
    newest = WorkflowSample.objects.filter(workflow="demo.noop").latest("taken_at")
    assert (newest.succeeded, newest.hourly) == (3, False)


@pytest.mark.django_db(transaction=True)
def test_a_workflow_first_counted_since_the_last_sample_starts_from_zero_there() -> None:
    now = db_now().replace(minute=10, second=0, microsecond=0)
    succeed("demo.noop")
    ws.take_sample(now=now - timedelta(minutes=5))
    succeed("demo.flaky", 2)
    assert ws.take_sample(now=now) == 2  # the flaky's zeros five minutes back, and its totals
    flaky = list(WorkflowSample.objects.filter(workflow="demo.flaky").order_by("taken_at"))
    assert [(s.taken_at, s.succeeded) for s in flaky] == [
        (now - timedelta(minutes=5), 0),
        (now, 2),
    ]
    hour = row(wf.figures(HOUR, now=now), "demo.flaky").figures
    assert hour is not None and hour.succeeded == 2


@pytest.mark.django_db(transaction=True)
def test_an_unchanged_workflow_still_gets_its_hourly_sample() -> None:
    succeed("demo.noop")
    now = db_now().replace(minute=59, second=0, microsecond=0)
    assert ws.take_sample(now=now) == 1
    assert ws.take_sample(now=now + timedelta(minutes=2)) == 1  # the next clock hour
    hourly = list(WorkflowSample.objects.order_by("taken_at").values_list("hourly", flat=True))
    assert hourly == [True, True]


@pytest.mark.django_db(transaction=True)
def test_the_sweeper_samples_and_reports_it_as_no_work() -> None:
    succeed("demo.noop")
    report = services.sweep()
    assert report.jobs["workflow_samples"] == 0
    assert WorkflowSample.objects.filter(workflow="demo.noop").count() == 1
    services.sweep()  # within the minute: no second sample
    assert WorkflowSample.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_old_samples_are_thinned_to_the_hourly_ones_then_deleted() -> None:
    now = db_now()

    def at(age: timedelta, *, hourly: bool) -> WorkflowSample:
        return WorkflowSample(workflow="demo.noop", taken_at=now - age, hourly=hourly)

    WorkflowSample.objects.bulk_create(
        [
            at(timedelta(hours=1), hourly=False),  # recent: kept
            at(timedelta(days=3), hourly=False),  # past two days, not hourly: goes
            at(timedelta(days=3, minutes=1), hourly=True),  # kept
            at(timedelta(days=16), hourly=True),  # past fifteen days: goes
        ]
    )
    assert ws.thin(now) == 2
    ages = sorted(now - s.taken_at for s in WorkflowSample.objects.all())
    assert ages == [timedelta(hours=1), timedelta(days=3, minutes=1)]


# --- reading -------------------------------------------------------------------------------------


def test_percentiles_come_from_the_bucket_counts() -> None:
    assert wf.quantile({}, 0.5) is None
    assert wf.quantile({"0.01": 0}, 0.5) is None
    # Half in (0, 10 ms], half in (10, 50 ms]: the median is the first bucket's top, the
    # 99th percentile near the second's.
    buckets = {"0.01": 50, "0.05": 50}
    assert wf.quantile(buckets, 0.5) == pytest.approx(0.01)
    assert wf.quantile(buckets, 0.99) == pytest.approx(0.01 + 0.04 * 49 / 50)
    assert wf.quantile({"0.5": 1, "inf": 1}, 0.99) == math.inf
    assert wf.quantile({"inf": 3, "1": 1, "0.5": 0}, 0.1) == pytest.approx(0.5 + 0.5 * 0.4)


def test_rates_are_shares_of_what_ended() -> None:
    now = datetime(2026, 12, 1, 12, tzinfo=None)
    before = wf.Point(at=now - timedelta(hours=2))
    after = wf.Point(
        at=now, succeeded=90, retried=20, dead_lettered=10, run_buckets={"1": 90}, run_ms=45_000
    )
    f = wf.Figures.between(before, after)
    assert f.failure_rate == pytest.approx(10 / 100)
    assert f.retry_rate == pytest.approx(20 / 120)
    assert f.span == timedelta(hours=2)
    assert f.mean == pytest.approx(0.5)
    empty = wf.Figures.between(before, wf.Point(at=now))
    assert (empty.failure_rate, empty.retry_rate, empty.p50, empty.mean) == (None,) * 4


def test_a_counter_that_went_down_counts_from_zero_again() -> None:
    now = datetime(2026, 12, 1, 12)
    f = wf.Figures.between(
        wf.Point(at=now - timedelta(hours=1), succeeded=100, run_buckets={"1": 100}),
        wf.Point(at=now, succeeded=7, run_buckets={"1": 7}),
    )
    assert (f.succeeded, f.run_buckets) == (7, {"1": 7})


@pytest.mark.django_db(transaction=True)
def test_the_figures_of_a_window_are_the_counters_now_less_the_sample_at_its_start() -> None:
    now = db_now()
    succeed("demo.noop", 2)  # before any sample
    ws.take_sample(now=now - timedelta(days=2), force=True)
    succeed("demo.noop", 3)  # within the week, before the day
    ws.take_sample(now=now - timedelta(hours=3), force=True)
    succeed("demo.noop", 1)  # within the day, before the hour
    retried_then_succeeded()
    ws.take_sample(now=now - timedelta(minutes=90), force=True)
    succeed("demo.noop", 4)  # within the hour
    dead()

    hour, day, week = (row(wf.figures(w, now=now), "demo.noop") for w in (HOUR, DAY, WEEK))
    assert hour.figures is not None and day.figures is not None and week.figures is not None
    assert hour.figures.succeeded == 4 and not hour.off_window
    # No sample near the day's start or the week's: both count from the sample two days
    # back (the latest before the day, the first in the week), and say so.
    assert (day.figures.succeeded, week.figures.succeeded) == (8, 8)
    assert day.off_window and week.off_window
    assert day.figures.start == week.figures.start == now - timedelta(days=2)

    flaky = row(wf.figures(HOUR, now=now), "demo.flaky").figures
    assert flaky is not None
    assert (flaky.succeeded, flaky.dead_lettered, flaky.retried) == (0, 1, 0)
    assert flaky.failure_rate == 1
    # First counted between the samples 3 h and 90 min back: it counts from zero at 3 h.
    flaky_day = row(wf.figures(DAY, now=now), "demo.flaky").figures
    assert flaky_day is not None
    assert (flaky_day.succeeded, flaky_day.retried, flaky_day.dead_lettered) == (1, 1, 1)
    assert flaky_day.start == now - timedelta(hours=3)

    # One workflow's page reads the same figures.
    mine = wf.workflow_figures("demo.noop", now=now)
    assert [mine[w].figures.succeeded for w in ("hour", "day", "week")] == [4, 8, 8]  # type: ignore[union-attr]


@pytest.mark.django_db(transaction=True)
def test_a_registered_workflow_without_samples_is_listed_with_no_figures() -> None:
    rows = wf.figures(HOUR)
    assert {r.workflow for r in rows} >= {"demo.noop", "demo.flaky", "publish_article"}
    assert all(r.figures is None for r in rows)
    assert wf.series("demo.noop", HOUR)[-1].figures is None


@pytest.mark.django_db(transaction=True)
def test_the_list_reads_the_counters_and_the_samples_at_its_start_in_two_queries() -> None:
    now = db_now()
    succeed("demo.noop")
    succeed("demo.flaky")
    counting.upsert({"enqueued:retired.flow#0": 3})
    for minutes in range(180, 0, -1):
        ws.take_sample(now=now - timedelta(minutes=minutes), force=True)
    with CaptureQueriesContext(connection) as queries:
        rows = wf.figures(HOUR, now=now)
    assert {r.workflow for r in rows if r.figures} == {"demo.noop", "demo.flaky", "retired.flow"}
    # Not a read per workflow, nor a read of the three hours of samples.
    assert len(queries) == 2, [q["sql"] for q in queries.captured_queries]


@pytest.mark.django_db(transaction=True)
def test_the_bars_of_a_window_split_the_work_between_their_samples() -> None:
    # At twenty to the hour, so the samples fall in known bars.
    now = db_now().replace(minute=40, second=0, microsecond=0)
    succeed("demo.noop", 2)
    ws.take_sample(now=now - timedelta(minutes=50), force=True)  # ten to the last hour
    succeed("demo.noop", 3)
    ws.take_sample(now=now - timedelta(minutes=20), force=True)  # twenty past this one
    succeed("demo.noop", 1)

    bars = wf.series("demo.noop", HOUR, now=now)
    assert len(bars) == 12
    assert all(a.end == b.start for a, b in itertools.pairwise(bars))
    assert bars[-1].end == now
    counts = [b.figures.succeeded if b.figures else None for b in bars]
    # Before the first sample nothing is known; the bar ending at the second sample (twenty
    # past) has the three runs between the samples; the last bar the one run since.
    assert counts == [None, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 1]

    # The day's bars, an hour each, read the hourly samples: the first of each hour.
    day = [b.figures.succeeded if b.figures else None for b in wf.series("demo.noop", DAY, now=now)]
    assert day == [None] * 22 + [3, 1]


@pytest.mark.django_db(transaction=True)
def test_a_workflow_known_only_by_its_counters_is_known() -> None:
    counting.upsert({"enqueued:retired.flow#0": 3})
    assert wf.is_known("retired.flow")
    assert wf.is_known("demo.noop")
    assert not wf.is_known("never.heard.of")
    assert "retired.flow" in wf.workflow_names()
