"""Schedules' figures on ``/metrics`` (``tasks_app.engine.schedules``): per schedule, how late
its oldest undecided slot is, whether it is paused, when its next slot falls and when its
newest enqueued one fell, its missed slots, and its runs by outcome.

Labelled by schedule: schedules are declared in code, so their names are few and change
only with a deploy (``sync_schedules``), unlike a payload's values. A schedule removed
from code has no series: nothing ticks it, and its history stays on the Schedules page.
Declared again, its counters go on from where they stood. A paused schedule has its
series, with 0 overdue: its slots wait on purpose, and ``tasks_schedule_paused`` says so.

Each scrape reads the schedules in one statement (their rows, each with its newest
enqueued slot: the runs' recent index walked back from the newest run, a few entries, more
only while the newest slots are refused or missed) and the database's clock in another.
The runs by outcome come from the counters the scrape read already
(``counting.SCHEDULE_RUN``), not from counting the runs: there is one a slot (a schedule
every minute keeps 43,200 in 30 days), counting two million took 0.65 s on PostgreSQL 15,
and their count by outcome can fall (a backfill replaces the missed or refused run of the
slot it enqueues; retention prunes old runs), which a counter must not.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from django.db.models import OuterRef, Subquery
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from tasks_app.db.clock import db_now
from tasks_app.history.counting import SCHEDULE_RUN
from tasks_app.models import RunOutcome, ScheduleRun, StoredSchedule
from tasks_app.operations.schedule_use import overdue_of


def _gauge(name: str, documentation: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=["schedule"])


def runs_counted(totals: Mapping[str, int]) -> dict[tuple[str, str], int]:
    """The runs counted per (schedule, outcome); a schedule's name holds no ``:``."""
    prefix = f"{SCHEDULE_RUN}:"
    counted: dict[tuple[str, str], int] = {}
    for name, n in totals.items():
        if name.startswith(prefix):
            schedule, _, outcome = name[len(prefix) :].rpartition(":")
            counted[(schedule, outcome)] = counted.get((schedule, outcome), 0) + n
    return counted


def schedule_metrics(totals: Mapping[str, int]) -> Iterator[Metric]:
    """The schedules' figures; ``totals`` are the counters (``counting.totals()``)."""
    now = db_now()
    newest_enqueued = (
        ScheduleRun.objects.filter(schedule=OuterRef("name"), outcome=RunOutcome.ENQUEUED)
        .order_by("-slot")
        .values("slot")[:1]
    )
    rows = list(
        StoredSchedule.objects.filter(removed_at__isnull=True)
        .annotate(last_enqueued=Subquery(newest_enqueued))
        .order_by("name")
    )
    overdue = _gauge(
        "tasks_schedule_overdue_seconds",
        "Seconds the schedule's oldest undecided slot is past its time plus its tolerance "
        "(0 when on time, and while paused).",
    )
    paused = _gauge("tasks_schedule_paused", "1 while the schedule is paused.")
    next_slot = _gauge(
        "tasks_schedule_next_slot_timestamp_seconds",
        "Time of the schedule's oldest undecided slot (Unix seconds): its next, when on time.",
    )
    last_enqueued = _gauge(
        "tasks_schedule_last_enqueued_timestamp_seconds",
        "Time of the schedule's newest slot enqueued as a task (Unix seconds; no series "
        "before its first).",
    )
    missed = CounterMetricFamily(
        "tasks_schedule_missed_slots",
        "Slots of the schedule decided as missed: older than its tolerance when decided, "
        "and not caught up by its missed-run policy.",
        labels=["schedule"],
    )
    runs = CounterMetricFamily(
        "tasks_schedule_runs",
        "Slots the schedule decided, and its runs now, by outcome (a backfilled slot counts "
        "again, as enqueued).",
        labels=["schedule", "outcome"],
    )
    counted = runs_counted(totals)
    for row in rows:
        label = [row.name]
        overdue.add_metric(label, overdue_of(row, now).total_seconds())
        paused.add_metric(label, 0.0 if row.paused_at is None else 1.0)
        next_slot.add_metric(label, row.next_slot.timestamp())
        if row.last_enqueued is not None:
            last_enqueued.add_metric(label, row.last_enqueued.timestamp())
        missed.add_metric(label, row.missed_total)
        # Every outcome from the start (0 before its first), so rate() has a first sample.
        for outcome in RunOutcome.values:
            runs.add_metric([row.name, outcome], counted.get((row.name, outcome), 0))
    yield from (overdue, paused, next_slot, last_enqueued, missed, runs)
