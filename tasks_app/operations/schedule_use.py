"""Where each schedule stands, as the Schedules page, its metrics and ``manage.py`` read it:
its next runs, its last runs with their tasks' outcome, its missed slots, and how late its
oldest undecided slot is (the beat or the maintenance worker down)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import F

from tasks_app.db.clock import db_now
from tasks_app.engine.schedules import Timing, tolerance_of
from tasks_app.models import RunOutcome, ScheduleRun, StoredSchedule, Task

NEXT_RUNS = 5
LAST_RUNS = 10
# Undecided slots a paused schedule lists (its resume decides them).
WAITING_LISTED = 50


@dataclass(frozen=True)
class Run:
    run: ScheduleRun
    # The task's status now, or "" when it has none or it was pruned.
    status: str


@dataclass(frozen=True)
class Standing:
    schedule: StoredSchedule
    next_runs: list[datetime]
    last_runs: list[Run]
    missed: list[ScheduleRun]
    # Slots due and not yet decided: a paused schedule's, or a late tick's.
    waiting: list[datetime]
    waiting_more: bool
    # How far the oldest undecided slot is past its time plus the tolerance (0: on time).
    overdue: timedelta

    @property
    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.schedule.spec
        return spec

    @property
    def state(self) -> str:
        if self.schedule.removed_at is not None:
            return "removed"
        if self.schedule.paused_at is not None:
            return "paused"
        return "late" if self.overdue > timedelta(0) else "active"

    @property
    def timing(self) -> str:
        spec = self.spec
        if spec.get("cron"):
            return f"cron {spec['cron']} ({spec.get('timezone') or 'UTC'})"
        return f"every {describe_seconds(float(spec['every']))}"


def describe_seconds(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)} {unit}"
    return f"{int(seconds)} s"


def overdue_of(row: StoredSchedule, now: datetime) -> timedelta:
    """How long a slot has waited past its tolerance without a tick deciding it (only an
    active schedule's: a paused one waits on purpose)."""
    if not row.active:
        return timedelta(0)
    return max(now - row.next_slot - tolerance_of(row.spec), timedelta(0))


def standing(row: StoredSchedule, now: datetime | None = None) -> Standing:
    now = now or db_now()
    timing = Timing.of(row.spec)
    next_runs = (
        [] if row.removed_at is not None else timing.next(max(now, row.next_slot), NEXT_RUNS)
    )
    if row.removed_at is None and row.next_slot > now:
        next_runs = [row.next_slot, *next_runs][:NEXT_RUNS]
    recent = list(
        ScheduleRun.objects.filter(schedule=row.name)
        .exclude(outcome=RunOutcome.MISSED)
        .order_by("-decided_at", "-slot")[:LAST_RUNS]
    )
    statuses = dict(
        Task.objects.filter(pk__in=[run.task_id for run in recent if run.task_id]).values_list(
            "pk", "status"
        )
    )
    waiting = (
        [] if row.removed_at is not None else timing.between(row.next_slot, now, WAITING_LISTED + 1)
    )
    return Standing(
        schedule=row,
        next_runs=next_runs,
        last_runs=[Run(run, statuses.get(run.task_id or 0, "")) for run in recent],
        missed=list(
            ScheduleRun.objects.filter(schedule=row.name, outcome=RunOutcome.MISSED).order_by(
                "-slot"
            )[:LAST_RUNS]
        ),
        waiting=waiting[:WAITING_LISTED],
        waiting_more=len(waiting) > WAITING_LISTED,
        overdue=overdue_of(row, now),
    )


def all_standing(now: datetime | None = None) -> list[Standing]:
    """Every stored schedule, removed ones last."""
    now = now or db_now()
    rows = StoredSchedule.objects.order_by(F("removed_at").asc(nulls_first=True), "name")
    return [standing(row, now) for row in rows]
