"""/metrics on schedules (``tasks_app.observability.schedule_metrics``): per schedule, how late
its oldest undecided slot is, whether it is paused, its next and newest enqueued slot, its
missed slots and its runs by outcome, read as a scrape reads them. Time moves by back-dating
a schedule's next slot or by ticking at a given moment, never by sleeping."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from tasks_app import services
from tasks_app.db.clock import db_now
from tasks_app.engine.schedule_ticks import tick
from tasks_app.engine.schedules import Missed, Schedule, slot_key
from tasks_app.history import counting
from tasks_app.models import RunOutcome, ScheduleRun, StoredSchedule
from tasks_app.observability.schedule_metrics import schedule_metrics
from tasks_app.operations import schedule_sync
from tasks_app.operations import schedules as actions
from tests.metrics_support import Samples, scrape, value
from tests.schedule_support import at, registry_of, store

HOURLY = Schedule(
    name="test.hourly",
    workflow="demo.noop",
    every=timedelta(hours=1),
    tolerance=timedelta(minutes=5),
)
REPORT = Schedule(
    name="test.report",
    workflow="demo.noop",
    every=timedelta(minutes=10),
    slot_field="slot",
    missed=Missed.EACH,
    max_missed=2,
    tolerance=timedelta(minutes=1),
)
ONCALL = "cli:oncall"


def late_by(name: str, seconds: float) -> None:
    """Back-date the schedule's next slot: it fell ``seconds`` ago and no tick decided it."""
    StoredSchedule.objects.filter(name=name).update(next_slot=db_now() - timedelta(seconds=seconds))


def runs_by_outcome(samples: Samples, name: str) -> dict[str, float]:
    return {
        outcome: value(samples, "tasks_schedule_runs_total", schedule=name, outcome=outcome)
        for outcome in RunOutcome.values
    }


def series_of(samples: Samples, name: str) -> set[str]:
    """The names of the samples labelled with schedule ``name``."""
    return {metric for metric, labels in samples if ("schedule", name) in labels}


@pytest.mark.django_db(transaction=True)
def test_a_schedule_past_its_tolerance_reports_by_how_much_and_one_on_time_reports_0(
    client: Client,
) -> None:
    on_time = Schedule(name="test.on-time", workflow="demo.noop", every=timedelta(days=1))
    store(HOURLY, on_time)
    # Its slot fell 20 minutes ago: 15 past its 5 minutes of tolerance.
    late_by(HOURLY.name, 20 * 60)
    row = StoredSchedule.objects.get(name=HOURLY.name)

    samples = scrape(client)

    assert 900 <= value(samples, "tasks_schedule_overdue_seconds", schedule=HOURLY.name) < 960
    assert value(samples, "tasks_schedule_paused", schedule=HOURLY.name) == 0
    assert (
        value(samples, "tasks_schedule_next_slot_timestamp_seconds", schedule=HOURLY.name)
        == row.next_slot.timestamp()
    )
    assert value(samples, "tasks_schedule_overdue_seconds", schedule=on_time.name) == 0
    # Nothing enqueued yet: no time of a last one rather than a made-up 0, and every
    # outcome counted from 0 (so rate() has a first sample).
    assert "tasks_schedule_last_enqueued_timestamp_seconds" not in series_of(samples, HOURLY.name)
    run_now = (("outcome", "run_now"), ("schedule", HOURLY.name))
    assert ("tasks_schedule_runs_total", run_now) in samples
    assert runs_by_outcome(samples, HOURLY.name) == dict.fromkeys(RunOutcome.values, 0)


@pytest.mark.django_db(transaction=True)
def test_a_paused_schedule_reports_no_lateness_and_is_marked_paused(client: Client) -> None:
    store(HOURLY)
    actions.pause(HOURLY.name, actor=ONCALL, reason="the remote is down for the day")
    # Its slots wait on purpose, however long.
    late_by(HOURLY.name, 6 * 3600)

    samples = scrape(client)

    assert value(samples, "tasks_schedule_paused", schedule=HOURLY.name) == 1
    assert value(samples, "tasks_schedule_overdue_seconds", schedule=HOURLY.name) == 0
    assert ("tasks_schedule_overdue_seconds", (("schedule", HOURLY.name),)) in samples
    next_slot = StoredSchedule.objects.get(name=HOURLY.name).next_slot
    assert (
        value(samples, "tasks_schedule_next_slot_timestamp_seconds", schedule=HOURLY.name)
        == next_slot.timestamp()
    )


def stored_two_hours_ago() -> datetime:
    """Store REPORT as if synced two hours ago; its first slot."""
    store(REPORT, starting=db_now() - timedelta(hours=2))
    return StoredSchedule.objects.get(name=REPORT.name).next_slot


def back_after_an_outage(first: datetime) -> None:
    """Tick 55 minutes after the first slot, as the sweeper back from an outage would: six
    slots late; "each" with max_missed 2 enqueues the newest two and records four missed."""
    tick(first + timedelta(minutes=55))


@pytest.mark.django_db(transaction=True)
def test_a_tick_after_an_outage_counts_its_runs_by_outcome_and_its_missed_slots(
    client: Client,
) -> None:
    first = stored_two_hours_ago()
    # The last slot's key is taken by another payload, so its enqueue is refused.
    last = first + timedelta(minutes=50)
    services.enqueue("demo.noop", {"other": True}, idempotency_key=slot_key(REPORT.name, last))

    back_after_an_outage(first)
    samples = scrape(client)

    assert runs_by_outcome(samples, REPORT.name) == {
        "enqueued": 1,
        "missed": 4,
        "refused": 1,
        "run_now": 0,
    }
    assert value(samples, "tasks_schedule_missed_slots_total", schedule=REPORT.name) == 4
    # The newest slot enqueued, the one before the refused one.
    assert (
        value(samples, "tasks_schedule_last_enqueued_timestamp_seconds", schedule=REPORT.name)
        == (last - timedelta(minutes=10)).timestamp()
    )
    assert (
        value(samples, "tasks_schedule_next_slot_timestamp_seconds", schedule=REPORT.name)
        == (last + timedelta(minutes=10)).timestamp()
    )


@pytest.mark.django_db(transaction=True)
def test_a_backfill_and_a_run_now_count_as_runs_and_take_nothing_from_the_missed(
    client: Client,
) -> None:
    first = stored_two_hours_ago()
    back_after_an_outage(first)
    plan = actions.plan_backfill(REPORT.name, since=first, until=first + timedelta(minutes=10))
    actions.backfill(REPORT.name, actor=ONCALL, reason="the report is needed", plan=plan)
    actions.run_now(REPORT.name, actor=ONCALL, reason="one more for the audit")

    samples = scrape(client)

    assert runs_by_outcome(samples, REPORT.name) == {
        "enqueued": 4,
        "missed": 4,
        "refused": 0,
        "run_now": 1,
    }
    assert value(samples, "tasks_schedule_missed_slots_total", schedule=REPORT.name) == 4
    # The backfill replaced two missed runs: counted from the runs, the missed would fall.
    assert ScheduleRun.objects.filter(schedule=REPORT.name, outcome=RunOutcome.MISSED).count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_schedule_removed_from_code_has_no_series(client: Client) -> None:
    store(HOURLY, REPORT, starting=at("2026-03-02 09:00"))
    tick(at("2026-03-02 09:55"))
    schedule_sync.sync(actor="cli:test", registry=registry_of(HOURLY))

    samples = scrape(client)

    assert series_of(samples, REPORT.name) == set()
    assert "tasks_schedule_overdue_seconds" in series_of(samples, HOURLY.name)
    # Its counts stay, for the day it is declared again.
    assert counting.totals()[f"{counting.SCHEDULE_RUN}:{REPORT.name}:missed"] == 4


@pytest.mark.django_db(transaction=True)
def test_a_scrape_reads_the_schedules_in_the_same_statements_however_many_there_are() -> None:
    def statements() -> int:
        totals = counting.totals()
        with CaptureQueriesContext(connection) as queries:
            list(schedule_metrics(totals))
        return len(queries.captured_queries)

    store(HOURLY)
    late_by(HOURLY.name, 3600)
    tick()
    one = statements()
    more = [
        Schedule(name=f"test.more-{n}", workflow="demo.noop", every=timedelta(minutes=n))
        for n in (5, 15, 30)
    ]
    schedule_sync.sync(actor="cli:test", registry=registry_of(HOURLY, REPORT, *more))
    for schedule in (REPORT, *more):
        late_by(schedule.name, 3600)
    tick()

    assert statements() == one == 2
