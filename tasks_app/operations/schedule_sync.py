"""Storing the schedules code declares (``manage.py sync_schedules``, which the release
runs after migrating): each added, changed or removed schedule is one change, written with
an event in the audit chain that says what changed.

- added: stored with its next slot the first one from now (nothing before it runs);
- changed: its declaration replaced; if its timing changed (cron, time zone or interval),
  its next slot is the first of the new timing from now;
- removed from code: marked removed, so no tick runs it; its runs and events stay, and
  declaring it again adds it back from that moment;
- a pause is the operator's and survives every sync.

Each declaration is checked as an enqueue of its first slot would be (the workflow
registered, the payload by the general and the workflow's rules, the queue and priority),
so a bad one stops the release before anything is stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction

from tasks_app.access import Actor
from tasks_app.db.clock import db_now
from tasks_app.engine.enqueueing import check_enqueue
from tasks_app.engine.schedule_ticks import slot_payload
from tasks_app.engine.schedules import Schedule, ScheduleRegistry, Timing, schedules
from tasks_app.exceptions import InvalidInput
from tasks_app.history.events import record_event
from tasks_app.models import EventKind, StoredSchedule

TIMING = ("cron", "timezone", "every")


@dataclass(frozen=True)
class Change:
    name: str
    change: str  # added, changed, removed
    # The fields that changed, as {field: [before, after]} (a change only).
    fields: dict[str, list[Any]]

    def __str__(self) -> str:
        if self.change == "changed":
            return f"{self.name}: changed {', '.join(sorted(self.fields))}"
        return f"{self.name}: {self.change}"


def check_declaration(schedule: Schedule, now: datetime) -> None:
    spec = schedule.spec()
    first = next(Timing.of(spec).after(now))
    try:
        check_enqueue(
            spec["workflow"],
            slot_payload(spec, first),
            queue=spec["queue"],
            priority=spec["priority"],
        )
    except InvalidInput as exc:
        raise InvalidInput(exc.field, exc.rule, f"schedule {schedule.name}: {exc}") from exc


def changes(declared: dict[str, Schedule], stored: dict[str, StoredSchedule]) -> list[Change]:
    """What a sync would change, by name."""
    found = []
    for name, schedule in declared.items():
        row = stored.get(name)
        spec = schedule.spec()
        if row is None or row.removed_at is not None:
            found.append(Change(name, "added", {}))
        elif row.spec != spec:
            fields = {
                key: [row.spec.get(key), spec.get(key)]
                for key in sorted({*row.spec, *spec})
                if row.spec.get(key) != spec.get(key)
            }
            found.append(Change(name, "changed", fields))
    for name, row in stored.items():
        if name not in declared and row.removed_at is None:
            found.append(Change(name, "removed", {}))
    return found


def pending_changes(registry: ScheduleRegistry | None = None) -> list[Change]:
    """What ``sync_schedules`` would change now: code here differs from what is stored."""
    declared = (registry or schedules).all()
    return changes(declared, {row.name: row for row in StoredSchedule.objects.all()})


def sync(
    *, actor: Actor, reason: str = "deploy", registry: ScheduleRegistry | None = None
) -> list[Change]:
    """Store what code declares; return the changes made (none when nothing differs)."""
    declared = (registry or schedules).all()
    now = db_now()
    for schedule in declared.values():
        check_declaration(schedule, now)
    with transaction.atomic():
        stored = {row.name: row for row in StoredSchedule.objects.select_for_update()}
        made = changes(declared, stored)
        for change in made:
            apply_change(change, declared.get(change.name), stored.get(change.name), now)
            record_event(
                EventKind.SCHEDULE_SYNCED,
                task_id=None,
                actor=actor,
                reason=reason,
                schedule=change.name,
                change=change.change,
                fields=change.fields,
            )
    return made


def apply_change(
    change: Change, schedule: Schedule | None, row: StoredSchedule | None, now: datetime
) -> None:
    if change.change == "removed":
        assert row is not None
        row.removed_at = now
        row.changed_at = now
        row.save(update_fields=["removed_at", "changed_at"])
        return
    assert schedule is not None
    spec = schedule.spec()
    first = next(Timing.of(spec).from_(now))
    if row is None:
        StoredSchedule.objects.create(
            name=schedule.name,
            spec=spec,
            workflow=schedule.workflow,
            next_slot=first,
            declared_at=now,
            changed_at=now,
        )
        return
    retimed = change.change == "added" or any(key in change.fields for key in TIMING)
    row.spec = spec
    row.workflow = schedule.workflow
    row.removed_at = None
    row.changed_at = now
    if retimed:
        row.next_slot = first
    row.save()
