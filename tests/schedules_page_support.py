"""Schedules for the Schedules page's tests (``tests/console/test_schedules_page.py``,
``tests/browser/test_schedules.py`` and the permission tables): declared in code for the
test's length and stored as a release stores them (``schedule_sync.sync``), paused with
slots missed meanwhile, or with missed slots a tick recorded, and a resume's or a
backfill's preview confirmed as the page's two buttons do.

Time moves by back-dating a schedule's next slot: "three hours ago" is its next slot three
hours earlier, as if the beat had been down or the schedule paused since then. The test
schedules have no tolerance, so every slot a tick finds past is late.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from django.db.models import F
from django.http.response import HttpResponseBase
from django.test import Client

from tasks_app.access import Actor
from tasks_app.engine.schedule_ticks import tick
from tasks_app.engine.schedules import Missed, Schedule, ScheduleRegistry, schedules
from tasks_app.models import RunOutcome, ScheduleRun, StoredSchedule
from tasks_app.operations import schedule_sync
from tasks_app.operations import schedules as schedule_actions
from tests.console_support import HTMX, body

HOURLY = Schedule(
    name="page.hourly",
    workflow="demo.noop",
    cron="0 * * * *",
    payload={"job": "hourly"},
    slot_field="slot",
    missed=Missed.SKIP,
    tolerance=timedelta(0),
    description="An hourly job of the Schedules page's tests.",
)
NIGHTLY = Schedule(
    name="page.nightly",
    workflow="demo.noop",
    cron="30 2 * * *",
    timezone="Europe/Berlin",
    payload={"job": "nightly"},
    slot_field="slot",
    missed=Missed.LATEST,
    tolerance=timedelta(0),
)
QUARTERLY = Schedule(
    name="page.quarter-hour",
    workflow="demo.noop",
    every=timedelta(minutes=15),
    payload={"job": "quarter"},
    slot_field="slot",
    missed=Missed.EACH,
    max_missed=3,
    tolerance=timedelta(0),
)
PLAN = re.compile(r'name="plan" value="([^"]+)"')
REQUEST_ID = re.compile(r'name="request_id" value="([^"]+)"')


def store(*declared: Schedule) -> list[StoredSchedule]:
    """Store exactly these schedules, as a release whose code declares them would (any
    other stored schedule is marked removed)."""
    registry = ScheduleRegistry()
    for schedule in declared:
        registry.register(schedule)
    schedule_sync.sync(actor="cli:test", registry=registry)
    return list(StoredSchedule.objects.filter(name__in=[s.name for s in declared]))


@contextmanager
def declared(*found: Schedule) -> Iterator[list[StoredSchedule]]:
    """The schedules declared in this process's code as well (what the page compares the
    stored ones with, so it finds nothing to sync) and stored."""
    for schedule in found:
        schedules.register(schedule)
    try:
        yield store(*found)
    finally:
        for schedule in found:
            schedules.unregister(schedule.name)


def backdate(name: str, delta: timedelta) -> StoredSchedule:
    """Its next slot ``delta`` earlier: the slots in between are due and undecided."""
    StoredSchedule.objects.filter(name=name).update(next_slot=F("next_slot") - delta)
    return StoredSchedule.objects.get(name=name)


def paused_for(
    name: str, hours: int, *, reason: str = "paused for the test", actor: Actor = "cli:test"
) -> StoredSchedule:
    """Paused ``hours`` hours ago (its slots since then wait for the resume)."""
    schedule_actions.pause(name, actor=actor, reason=reason)
    return backdate(name, timedelta(hours=hours))


def missed_for(name: str, hours: int) -> list[datetime]:
    """The tick finds ``hours`` hours of slots past and records them missed (the hourly
    schedule's policy); their slots, oldest first."""
    backdate(name, timedelta(hours=hours))
    tick()
    runs = ScheduleRun.objects.filter(schedule=name, outcome=RunOutcome.MISSED).order_by("slot")
    return list(runs.values_list("slot", flat=True))


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat()


def plan_of(response: HttpResponseBase) -> str:
    found = PLAN.search(body(response))
    assert found, body(response)[:3000]
    return found.group(1)


def request_id_of(response: HttpResponseBase) -> str:
    found = REQUEST_ID.search(body(response))
    assert found, body(response)[:3000]
    return found.group(1)


def confirm(client: Client, url: str, **fields: str) -> HttpResponseBase:
    """Preview (htmx), then confirm the plan the preview made, as the page's buttons do."""
    preview = client.post(url, fields, headers=HTMX)
    assert preview.status_code == 200, body(preview)[:3000]
    return client.post(url, {**fields, "plan": plan_of(preview), "confirm": "1"})
