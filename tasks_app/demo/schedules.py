"""The demo's schedules, declared when ``TASKS_DEMO_SCHEDULES`` is on (the embedded mode of
`make run`): a heartbeat every minute, an hourly sync, a nightly digest at 02:30 Berlin time
and a weekly report for review. ``seed_demo`` stores them, pauses the weekly report and
leaves the hourly sync with a missed slot, so the Schedules page has each state to show."""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction

from tasks_app.db.clock import db_now
from tasks_app.engine.schedule_ticks import tick
from tasks_app.engine.schedules import (
    Missed,
    Schedule,
    ScheduleRegistry,
    Timing,
    register_schedule,
)
from tasks_app.models import Event, EventKind, ScheduleRun, StoredSchedule
from tasks_app.operations import schedule_sync, schedules

HEARTBEAT = Schedule(
    name="demo.heartbeat",
    workflow="demo.noop",
    every=timedelta(minutes=1),
    payload={"check": "heartbeat"},
    slot_field="slot",
    tolerance=timedelta(seconds=30),
    description="A no-op every minute: shows runs arriving.",
)
HOURLY_SYNC = Schedule(
    name="demo.hourly-sync",
    workflow="demo.noop",
    cron="0 * * * *",
    payload={"sync": "catalogue"},
    slot_field="slot",
    missed=Missed.SKIP,
    description="An hourly sync; a missed hour is skipped, the next one catches up.",
)
NIGHTLY_DIGEST = Schedule(
    name="demo.nightly-digest",
    workflow="demo.noop",
    cron="30 2 * * *",
    timezone="Europe/Berlin",
    payload={"digest": "nightly"},
    slot_field="slot",
    missed=Missed.LATEST,
    tolerance=timedelta(minutes=15),
    description="A digest at 02:30 Berlin time; after an outage it runs once.",
)
WEEKLY_REPORT = Schedule(
    name="demo.weekly-report",
    workflow="publish_article",
    cron="0 8 * * MON",
    timezone="Europe/Berlin",
    payload={
        "article_id": "weekly-report",
        "title": "The week in review",
        "brief": "What the team shipped this week.",
    },
    missed=Missed.EACH,
    max_missed=3,
    description="A report an editor reviews each Monday at 08:00 Berlin time.",
)


DEMO_SCHEDULES = (HEARTBEAT, HOURLY_SYNC, NIGHTLY_DIGEST, WEEKLY_REPORT)


def declare() -> None:
    """Declare the demo's schedules, as a project declares its own in a workflows module."""
    for schedule in DEMO_SCHEDULES:
        register_schedule(schedule)


def seed(actor: str, registry: ScheduleRegistry | None = None) -> str:
    """Store the demo's schedules as the release would; the first time, pause the weekly
    report (never again once someone resumed it) and leave the hourly sync with missed
    slots (its next slot moved back two hours before a tick, as if the maintenance worker
    had been down). Says what it did."""
    changes = schedule_sync.sync(actor=actor, reason="demo", registry=registry)
    weekly = StoredSchedule.objects.get(name=WEEKLY_REPORT.name)
    ever_paused = Event.objects.filter(kind=EventKind.SCHEDULE_PAUSED, data__schedule=weekly.name)
    if weekly.paused_at is None and not ever_paused.exists():
        schedules.pause(weekly.name, actor=actor, reason="the editors are away this month")
    hourly = StoredSchedule.objects.get(name=HOURLY_SYNC.name)
    if not ScheduleRun.objects.filter(schedule=hourly.name).exists():
        now = db_now()
        with transaction.atomic():
            hourly.next_slot = next(Timing.of(hourly.spec).from_(now - timedelta(hours=2)))
            hourly.save(update_fields=["next_slot"])
        tick(now)
    return f"{len(StoredSchedule.objects.all())} stored, {len(changes)} changed by this run"
