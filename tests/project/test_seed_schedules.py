"""The demo's schedules as ``seed_demo`` leaves them for `make run`
(``tasks_app.demo.schedules``): all four stored, the weekly report paused with a reason,
the hourly sync with missed slots; a second seed changes none of it."""

from __future__ import annotations

import pytest

from tasks_app.demo import schedules as demo
from tasks_app.models import Event, EventKind, RunOutcome, ScheduleRun, StoredSchedule
from tasks_app.operations.schedule_use import all_standing
from tests.schedule_support import registry_of

pytestmark = pytest.mark.django_db


def seed() -> str:
    return demo.seed("cli:seed_demo", registry=registry_of(*demo.DEMO_SCHEDULES))


def test_the_seed_leaves_a_paused_schedule_and_one_with_missed_slots() -> None:
    assert seed() == "4 stored, 4 changed by this run"
    states = {standing.schedule.name: standing.state for standing in all_standing()}
    assert states["demo.weekly-report"] == "paused"
    assert {states["demo.heartbeat"], states["demo.nightly-digest"]} == {"active"}
    weekly = StoredSchedule.objects.get(name="demo.weekly-report")
    assert weekly.paused_by == "cli:seed_demo" and weekly.paused_reason
    missed = ScheduleRun.objects.filter(schedule="demo.hourly-sync", outcome=RunOutcome.MISSED)
    assert missed.count() >= 1
    assert Event.objects.filter(kind=EventKind.SCHEDULE_PAUSED).count() == 1


def test_a_second_seed_changes_nothing() -> None:
    seed()
    runs = ScheduleRun.objects.count()
    assert seed() == "4 stored, 0 changed by this run"
    assert ScheduleRun.objects.count() == runs
    assert Event.objects.filter(kind=EventKind.SCHEDULE_PAUSED).count() == 1
