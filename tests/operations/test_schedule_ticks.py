"""The tick (``tasks_app.engine.schedule_ticks``) against the database, the clock injected:
each slot enqueued once however many ticks decide it, two beats at once included; the
Berlin 02:30 schedule across both clock changes; each missed-run policy after three hours
down; and the sync that stores code's declarations (``operations.schedule_sync``), a
schedule removed from code stopping with its history kept."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import transaction

from tasks_app import services
from tasks_app.db.clock import db_now
from tasks_app.engine.schedule_ticks import decide_slots, tick
from tasks_app.engine.schedules import Missed, Schedule, slot_key
from tasks_app.exceptions import InvalidInput
from tasks_app.models import Event, EventKind, RunOutcome, ScheduleRun, StoredSchedule, Task
from tasks_app.operations import retention, schedule_sync, schedules
from tasks_app.operations.schedule_use import standing
from tests.conftest import together
from tests.schedule_support import at, registry_of, runs, store, task_at, tasks_of

HOURLY = Schedule(
    name="test.hourly",
    workflow="demo.noop",
    every=timedelta(hours=1),
    payload={"job": "sync"},
    slot_field="slot",
    missed=Missed.EACH,
)


def hourly(policy: str, max_missed: int = 10) -> Schedule:
    return Schedule(
        name=f"test.{policy}",
        workflow="demo.noop",
        every=timedelta(hours=1),
        missed=policy,
        max_missed=max_missed,
    )


def test_a_slot_becomes_one_task_with_its_key_and_time(db: None) -> None:
    store(HOURLY, starting=at("2026-03-29 01:00"))
    tick(at("2026-03-29 01:00:04"))
    task = task_at("test.hourly", at("2026-03-29 01:00"))
    assert task is not None and task.created_by == "system:schedules"
    assert task.idempotency_key == "schedule:test.hourly:2026-03-29T01:00:00Z"
    assert task.payload == {"job": "sync", "slot": "2026-03-29T01:00:00Z"}
    assert StoredSchedule.objects.get(name="test.hourly").next_slot == at("2026-03-29 02:00")


def test_ticking_again_and_again_enqueues_each_slot_once(db: None) -> None:
    store(HOURLY, starting=at("2026-03-29 01:00"))
    moment = at("2026-03-29 00:59")
    while moment < at("2026-03-29 03:30"):
        tick(moment)
        moment += timedelta(minutes=1)
    assert runs("test.hourly", RunOutcome.ENQUEUED) == ["01:00", "02:00", "03:00"]
    assert len(tasks_of("test.hourly")) == 3


@pytest.mark.django_db(transaction=True)
def test_two_beats_ticking_the_same_slots_at_once_enqueue_each_once() -> None:
    store(HOURLY, hourly(Missed.SKIP), starting=at("2026-03-29 01:00"))
    now = at("2026-03-29 03:01")
    for _ in range(3):
        assert together(lambda: tick(now), lambda: tick(now)) == []
    for name in ("test.hourly", "test.skip"):
        assert runs(name) == ["01:00", "02:00", "03:00"]
    assert len(tasks_of("test.hourly")) == 3
    assert runs("test.skip", RunOutcome.ENQUEUED) == ["03:00"]
    assert len(tasks_of("test.skip")) == 1


def test_a_tick_that_read_a_stale_schedule_still_enqueues_nothing_twice(db: None) -> None:
    # The row lock keeps ticks apart; were one to decide from what it read before another
    # committed, the slot's key and its run's uniqueness are the last line.
    store(HOURLY, starting=at("2026-03-29 01:00"))
    stale = StoredSchedule.objects.get(name="test.hourly")
    tick(at("2026-03-29 02:00:10"))
    with transaction.atomic():
        decide_slots(stale, at("2026-03-29 02:00:10"))
    assert runs("test.hourly") == ["01:00", "02:00"]
    assert len(tasks_of("test.hourly")) == 2


@pytest.mark.parametrize(
    ("day", "expected"),
    [
        # Spring: 02:30 does not exist; it runs once, at 03:00 CEST (01:00 UTC).
        ("2026-03-29", "2026-03-29T01:00:00Z"),
        # Autumn: 02:30 happens twice; it runs once, at the first (00:30 UTC).
        ("2026-10-25", "2026-10-25T00:30:00Z"),
    ],
)
def test_a_berlin_0230_schedule_runs_once_on_the_clock_change_nights(
    db: None, day: str, expected: str
) -> None:
    digest = Schedule(
        name="test.digest",
        workflow="demo.noop",
        cron="30 2 * * *",
        timezone="Europe/Berlin",
        slot_field="slot",
    )
    night = at(f"{day} 00:00") - timedelta(hours=2)
    store(digest, starting=night)
    # A tick every five minutes through the night, as the sweeper would.
    moment = night
    while moment < night + timedelta(hours=6):
        tick(moment)
        moment += timedelta(minutes=5)
    assert [task.idempotency_key for task in tasks_of("test.digest")] == [
        f"schedule:test.digest:{expected}"
    ]
    assert [task.payload["slot"] for task in tasks_of("test.digest")] == [expected]
    assert not ScheduleRun.objects.exclude(outcome=RunOutcome.ENQUEUED).exists()


@pytest.mark.parametrize(
    ("policy", "max_missed", "enqueued", "missed"),
    [
        (Missed.SKIP, 10, ["01:00"], ["02:00", "03:00", "04:00"]),
        (Missed.LATEST, 10, ["01:00", "04:00"], ["02:00", "03:00"]),
        (Missed.EACH, 10, ["01:00", "02:00", "03:00", "04:00"], []),
        (Missed.EACH, 2, ["01:00", "03:00", "04:00"], ["02:00"]),
    ],
)
def test_each_missed_run_policy_after_three_hours_down(
    db: None, policy: str, max_missed: int, enqueued: list[str], missed: list[str]
) -> None:
    schedule = hourly(policy, max_missed)
    store(schedule, starting=at("2026-03-29 01:00"))
    tick(at("2026-03-29 01:00:05"))
    # Nothing ticks from 01:00:05 until 04:30 (the beat or the maintenance worker down).
    report = tick(at("2026-03-29 04:30"))
    assert runs(schedule.name, RunOutcome.ENQUEUED) == enqueued
    assert runs(schedule.name, RunOutcome.MISSED) == missed
    assert report.missed == len(missed)
    row = StoredSchedule.objects.get(name=schedule.name)
    assert row.missed_total == len(missed)
    assert row.next_slot == at("2026-03-29 05:00")
    assert sorted(task.payload == {} for task in tasks_of(schedule.name)) == [True] * len(enqueued)


def test_a_refused_slot_is_recorded_and_the_others_still_run(db: None) -> None:
    store(HOURLY, starting=at("2026-03-29 01:00"))
    # Someone took the 02:00 slot's key with another payload.
    key = slot_key("test.hourly", at("2026-03-29 02:00"))
    services.enqueue("demo.noop", {"other": 1}, idempotency_key=key)
    tick(at("2026-03-29 03:00:10"))
    assert runs("test.hourly", RunOutcome.ENQUEUED) == ["01:00", "03:00"]
    refused = ScheduleRun.objects.get(schedule="test.hourly", outcome=RunOutcome.REFUSED)
    assert "idempotency" in refused.detail.lower()


def test_a_paused_schedule_is_not_ticked(db: None) -> None:
    store(HOURLY, starting=at("2026-03-29 01:00"))
    StoredSchedule.objects.filter(name="test.hourly").update(paused_at=at("2026-03-29 00:00"))
    assert tick(at("2026-03-29 05:00")).schedules == []
    assert not ScheduleRun.objects.exists()


def sync_events() -> list[tuple[str, str, str, str]]:
    return [
        (event.data["schedule"], event.data["change"], event.actor, event.reason)
        for event in Event.objects.filter(kind=EventKind.SCHEDULE_SYNCED).order_by("id")
    ]


def test_a_sync_records_each_added_changed_and_removed_schedule(db: None) -> None:
    store(HOURLY, hourly(Missed.SKIP))
    again = registry_of(HOURLY, hourly(Missed.SKIP))
    assert schedule_sync.sync(actor="cli:test", registry=again) == []
    changed = Schedule(**{**HOURLY.__dict__, "payload": {"job": "full-sync"}})
    made = schedule_sync.sync(actor="system:release", reason="v2", registry=registry_of(changed))
    assert [str(change) for change in made] == [
        "test.hourly: changed payload",
        "test.skip: removed",
    ]
    assert sync_events() == [
        ("test.hourly", "added", "cli:test", "deploy"),
        ("test.skip", "added", "cli:test", "deploy"),
        ("test.hourly", "changed", "system:release", "v2"),
        ("test.skip", "removed", "system:release", "v2"),
    ]
    event = Event.objects.filter(kind=EventKind.SCHEDULE_SYNCED).order_by("id")[2]
    assert event.data["fields"] == {"payload": [{"job": "sync"}, {"job": "full-sync"}]}
    assert StoredSchedule.objects.get(name="test.hourly").spec["payload"] == {"job": "full-sync"}


def test_a_schedule_removed_from_code_stops_and_keeps_its_history(db: None) -> None:
    store(HOURLY, starting=at("2026-03-29 01:00"))
    tick(at("2026-03-29 02:00:10"))
    schedule_sync.sync(actor="system:release", registry=registry_of())
    row = StoredSchedule.objects.get(name="test.hourly")
    assert row.removed_at is not None
    assert tick(at("2026-03-29 09:00")).schedules == []
    assert runs("test.hourly") == ["01:00", "02:00"]
    assert len(tasks_of("test.hourly")) == 2
    assert standing(row, at("2026-03-29 09:00")).state == "removed"
    assert [change for _, change, _, _ in sync_events()] == ["added", "removed"]
    # Declared again, it starts from then: the hours it was gone are not made up.
    schedule_sync.sync(actor="system:release", registry=registry_of(HOURLY))
    again = StoredSchedule.objects.get(name="test.hourly")
    assert again.removed_at is None and again.next_slot > at("2026-03-29 09:00")


def test_a_declaration_the_enqueue_would_refuse_stops_the_sync_and_stores_nothing(
    db: None,
) -> None:
    unknown = Schedule(name="test.unknown", workflow="no.such.workflow", every=timedelta(hours=1))
    bad_queue = Schedule(
        name="test.queue", workflow="demo.noop", every=timedelta(hours=1), queue="nowhere"
    )
    for schedule, field in ((unknown, "workflow"), (bad_queue, "queue")):
        with pytest.raises(InvalidInput) as refused:
            schedule_sync.sync(actor="cli:test", registry=registry_of(HOURLY, schedule))
        assert refused.value.field == field
        assert schedule.name in str(refused.value)
    assert not StoredSchedule.objects.exists()
    assert not Event.objects.exists()


def test_the_sync_command_checks_then_stores(db: None, capsys: pytest.CaptureFixture[str]) -> None:
    from tasks_app.engine import schedules as declared

    declared.schedules.register(HOURLY)
    try:
        with pytest.raises(SystemExit) as pending:
            call_command("sync_schedules", "--check")
        assert pending.value.code == 1
        call_command("sync_schedules", "--actor", "system:release")
        call_command("sync_schedules", "--check")
    finally:
        declared.schedules.unregister(HOURLY.name)
    out = capsys.readouterr().out
    assert "test.hourly: added" in out and "stored as code declares them" in out
    assert Task.objects.count() == 0
    assert sync_events()[-1][:3] == ("test.hourly", "added", "system:release")


def test_runs_past_the_retention_are_pruned_and_a_backfill_cannot_reach_them(
    db: None, settings: Any
) -> None:
    settings.RETENTION_DAYS = 2
    now = db_now()
    store(HOURLY, starting=now - timedelta(days=4))
    tick(now)
    assert retention.sweep_schedule_runs(500) > 0
    oldest = ScheduleRun.objects.filter(schedule=HOURLY.name).earliest("slot").slot
    assert now - timedelta(days=3, hours=1) <= oldest
    with pytest.raises(InvalidInput) as refused:
        schedules.plan_backfill(
            HOURLY.name, since=now - timedelta(days=2, hours=1), until=now - timedelta(days=1)
        )
    assert (refused.value.field, refused.value.rule) == ("since", "retention")


def test_a_schedule_that_cannot_be_decided_does_not_hold_back_the_others(db: None) -> None:
    other = hourly(Missed.EACH)
    store(HOURLY, other, starting=at("2026-03-29 01:00"))
    # A declaration this code cannot read (stored by another version, say).
    broken = StoredSchedule.objects.get(name=HOURLY.name)
    StoredSchedule.objects.filter(name=HOURLY.name).update(spec={**broken.spec, "every": "x"})
    report = tick(at("2026-03-29 01:00:05"))
    assert report.failed == [HOURLY.name]
    assert runs(other.name, RunOutcome.ENQUEUED) == ["01:00"]
    assert StoredSchedule.objects.get(name=HOURLY.name).next_slot == at("2026-03-29 01:00")
