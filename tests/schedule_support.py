"""Schedules for tests: a registry of their own stored as ``sync_schedules`` stores code's,
its next slot put where a test wants time to start, and what was decided read back."""

from __future__ import annotations

from datetime import UTC, datetime

from tasks_app.engine.schedules import Schedule, ScheduleRegistry, Timing, slot_key
from tasks_app.models import RunOutcome, ScheduleRun, StoredSchedule, Task
from tasks_app.operations import schedule_sync


def at(text: str) -> datetime:
    """A UTC moment written as ``2026-03-29 01:00`` (or with seconds)."""
    pattern = "%Y-%m-%d %H:%M:%S" if text.count(":") == 2 else "%Y-%m-%d %H:%M"
    return datetime.strptime(text, pattern).replace(tzinfo=UTC)


def registry_of(*schedules: Schedule) -> ScheduleRegistry:
    """A registry declaring ``schedules``, as code would."""
    registry = ScheduleRegistry()
    for schedule in schedules:
        registry.register(schedule)
    return registry


def store(*schedules: Schedule, starting: datetime | None = None) -> ScheduleRegistry:
    """Store ``schedules`` (and nothing else) as a sync would; with ``starting``, each one's
    next slot is its first slot from that moment, as if synced then."""
    registry = registry_of(*schedules)
    schedule_sync.sync(actor="cli:test", registry=registry)
    if starting is not None:
        for schedule in schedules:
            row = StoredSchedule.objects.get(name=schedule.name)
            row.next_slot = next(Timing.of(row.spec).from_(starting))
            row.save(update_fields=["next_slot"])
    return registry


def runs(name: str, outcome: str | None = None) -> list[str]:
    """The slots ``name`` decided (as ``HH:MM`` UTC), oldest first, of one outcome."""
    found = ScheduleRun.objects.filter(schedule=name).exclude(outcome=RunOutcome.RUN_NOW)
    if outcome is not None:
        found = found.filter(outcome=outcome)
    return [f"{run.slot:%H:%M}" for run in found.order_by("slot")]


def tasks_of(name: str) -> list[Task]:
    return list(Task.objects.filter(idempotency_key__startswith=f"schedule:{name}:").order_by("id"))


def task_at(name: str, slot: datetime) -> Task | None:
    return Task.objects.filter(idempotency_key=slot_key(name, slot)).first()
