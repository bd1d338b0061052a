"""``manage.py schedules``: each stored schedule's state, next run and last run, as a table
and as JSON, a late one saying how late."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command

from tasks_app.db.clock import db_now
from tasks_app.engine.schedule_ticks import tick
from tasks_app.engine.schedules import Schedule
from tasks_app.models import RunOutcome, ScheduleRun, StoredSchedule
from tasks_app.operations import schedules
from tests.schedule_support import store

pytestmark = pytest.mark.django_db

HOURLY = Schedule(name="test.hourly", workflow="demo.noop", every=timedelta(hours=1))
NIGHTLY = Schedule(
    name="test.nightly", workflow="demo.noop", cron="30 2 * * *", timezone="Europe/Berlin"
)


def output(*args: str) -> str:
    out = StringIO()
    call_command("schedules", *args, stdout=out)
    return out.getvalue()


def test_no_schedule_stored_says_how_to_store_them() -> None:
    assert "manage.py sync_schedules" in output()


def test_each_schedule_with_its_state_and_runs() -> None:
    now = db_now()
    store(HOURLY, NIGHTLY, starting=now - timedelta(hours=2))
    tick(now)
    schedules.pause(NIGHTLY.name, actor="cli:test", reason="holiday")
    # The hourly's next slot waits 20 minutes past its tolerance: no tick came.
    late = now - timedelta(minutes=25)
    StoredSchedule.objects.filter(name=HOURLY.name).update(next_slot=late)
    rows = {row["name"]: row for row in json.loads(output("--json"))}
    assert rows[HOURLY.name]["state"] == "late"
    assert 19 * 60 < rows[HOURLY.name]["overdue_seconds"] < 21 * 60
    missed = ScheduleRun.objects.filter(schedule=HOURLY.name, outcome=RunOutcome.MISSED)
    assert rows[HOURLY.name]["missed_total"] == missed.count() >= 1
    assert rows[NIGHTLY.name]["state"] == "paused"
    assert rows[NIGHTLY.name]["paused_reason"] == "holiday"
    assert rows[NIGHTLY.name]["timing"] == "cron 30 2 * * * (Europe/Berlin)"
    table = output()
    assert "late by 20 min" in table
    assert "paused" in table and "every 1 h" in table
