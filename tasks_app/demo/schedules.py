"""The demo's schedules, declared when ``TASKS_DEMO_SCHEDULES`` is on (the embedded mode of
`make run`): a heartbeat every minute, an hourly sync, a nightly digest at 02:30 Berlin time
and a weekly report for review. ``seed_demo`` stores them, pauses the weekly report and
leaves the hourly sync with a missed slot, so the Schedules page has each state to show."""

from __future__ import annotations

from datetime import timedelta

from tasks_app.engine.schedules import Missed, Schedule, register_schedule

HEARTBEAT = register_schedule(
    Schedule(
        name="demo.heartbeat",
        workflow="demo.noop",
        every=timedelta(minutes=1),
        payload={"check": "heartbeat"},
        slot_field="slot",
        tolerance=timedelta(seconds=30),
        description="A no-op every minute: shows runs arriving.",
    )
)
HOURLY_SYNC = register_schedule(
    Schedule(
        name="demo.hourly-sync",
        workflow="demo.noop",
        cron="0 * * * *",
        payload={"sync": "catalogue"},
        slot_field="slot",
        missed=Missed.SKIP,
        description="An hourly sync; a missed hour is skipped, the next one catches up.",
    )
)
NIGHTLY_DIGEST = register_schedule(
    Schedule(
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
)
WEEKLY_REPORT = register_schedule(
    Schedule(
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
)
