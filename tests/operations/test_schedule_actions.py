"""On-call's actions on a schedule (``tasks_app.operations.schedules``): pause, resume and
backfill as previewed plans applied exactly and once, run now enqueued once per request;
each needs the permission and a reason and is an event in the audit chain."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User

from tasks_app.engine.schedule_ticks import tick
from tasks_app.engine.schedules import Missed, Schedule
from tasks_app.exceptions import InvalidInput, InvalidTransition, NotPermitted
from tasks_app.history import audit_verify
from tasks_app.models import Event, EventKind, RunOutcome, ScheduleRun, StoredSchedule, Task
from tasks_app.operations import schedule_sync
from tasks_app.operations import schedules as actions
from tasks_app.operations.schedule_use import standing
from tests.schedule_support import at, registry_of, runs, store, tasks_of

NAME = "test.report"
REPORT = Schedule(
    name=NAME,
    workflow="demo.noop",
    every=timedelta(hours=1),
    slot_field="slot",
    missed=Missed.EACH,
    max_missed=10,
)


@pytest.fixture
def report(db: None, settings: Any) -> str:
    # Its slots are in March 2026: a backfill reaches back as far as the retention.
    settings.RETENTION_DAYS = 36_500
    store(REPORT, starting=at("2026-03-29 01:00"))
    tick(at("2026-03-29 01:00:05"))
    return NAME


def paused_three_hours(oncall: User) -> None:
    """Paused after its 01:00 run; it is 04:30 now, so 02:00, 03:00 and 04:00 wait."""
    actions.pause(NAME, actor=oncall, reason="remote maintenance")


def kinds() -> list[str]:
    return list(
        Event.objects.filter(kind__startswith="schedule_")
        .exclude(kind=EventKind.SCHEDULE_SYNCED)
        .order_by("id")
        .values_list("kind", flat=True)
    )


def test_a_pause_stops_the_ticks_and_is_recorded_with_who_and_why(
    report: str, oncall: User
) -> None:
    paused_three_hours(oncall)
    assert tick(at("2026-03-29 04:30")).schedules == []
    row = StoredSchedule.objects.get(name=NAME)
    assert (row.paused_by, row.paused_reason) == ("olivia-oncall", "remote maintenance")
    event = Event.objects.get(kind=EventKind.SCHEDULE_PAUSED)
    assert (event.actor, event.reason, event.data["schedule"]) == (
        "olivia-oncall",
        "remote maintenance",
        NAME,
    )
    with pytest.raises(InvalidTransition, match="paused already"):
        actions.pause(NAME, actor=oncall, reason="again")
    standing_now = standing(row, at("2026-03-29 04:30"))
    assert standing_now.state == "paused"
    assert [f"{slot:%H:%M}" for slot in standing_now.waiting] == ["02:00", "03:00", "04:00"]


def test_resuming_enqueues_exactly_the_previewed_missed_runs(report: str, oncall: User) -> None:
    paused_three_hours(oncall)
    plan = actions.plan_resume(NAME, now=at("2026-03-29 04:30"))
    assert plan.text == "Resuming enqueues 3 runs (UTC): 02:00, 03:00, 04:00."
    actions.resume(NAME, actor=oncall, reason="maintenance over", plan=plan)
    assert runs(NAME, RunOutcome.ENQUEUED) == ["01:00", "02:00", "03:00", "04:00"]
    assert len(tasks_of(NAME)) == 4
    row = StoredSchedule.objects.get(name=NAME)
    assert row.paused_at is None and row.next_slot == at("2026-03-29 05:00")
    event = Event.objects.get(kind=EventKind.SCHEDULE_RESUMED)
    assert event.data["plan"] == plan.id
    assert event.data["enqueued"] == [
        "2026-03-29T02:00:00Z",
        "2026-03-29T03:00:00Z",
        "2026-03-29T04:00:00Z",
    ]
    # The tick goes on from the next slot; the plan is spent.
    tick(at("2026-03-29 05:00:05"))
    assert len(tasks_of(NAME)) == 5
    with pytest.raises(actions.PlanStale):
        actions.resume(NAME, actor=oncall, reason="again", plan=plan)


def test_a_resume_may_skip_the_missed_runs_instead(report: str, oncall: User) -> None:
    paused_three_hours(oncall)
    plan = actions.plan_resume(NAME, mode=Missed.SKIP, now=at("2026-03-29 04:30"))
    assert plan.text == "Resuming enqueues no run. 3 missed slot(s) are recorded and not run."
    actions.resume(NAME, actor=oncall, reason="not needed", plan=plan)
    assert runs(NAME, RunOutcome.MISSED) == ["02:00", "03:00", "04:00"]
    assert len(tasks_of(NAME)) == 1
    # The schedule keeps its own policy for what comes later.
    assert StoredSchedule.objects.get(name=NAME).spec["missed"] == Missed.EACH


def test_a_plan_made_before_the_schedule_changed_is_refused_and_changes_nothing(
    report: str, oncall: User
) -> None:
    paused_three_hours(oncall)
    plan = actions.plan_resume(NAME, now=at("2026-03-29 04:30"))
    faster = Schedule(**{**REPORT.__dict__, "every": timedelta(minutes=30)})
    schedule_sync.sync(actor="system:release", registry=registry_of(faster))
    with pytest.raises(actions.PlanStale, match="changed since the preview"):
        actions.resume(NAME, actor=oncall, reason="go", plan=plan)
    assert StoredSchedule.objects.get(name=NAME).paused_at is not None
    assert len(tasks_of(NAME)) == 1


def test_a_backfill_enqueues_the_missed_slots_it_previewed(report: str, oncall: User) -> None:
    skip = Schedule(**{**REPORT.__dict__, "missed": Missed.SKIP})
    schedule_sync.sync(actor="cli:test", registry=registry_of(skip))
    tick(at("2026-03-29 04:30"))
    assert runs(NAME, RunOutcome.MISSED) == ["02:00", "03:00", "04:00"]
    plan = actions.plan_backfill(NAME, since="2026-03-29T00:30Z", until="2026-03-29T03:30Z")
    assert plan.enqueue == ("2026-03-29T02:00:00Z", "2026-03-29T03:00:00Z")
    actions.backfill(NAME, actor=oncall, reason="the report is needed", plan=plan)
    assert runs(NAME, RunOutcome.ENQUEUED) == ["01:00", "02:00", "03:00"]
    assert runs(NAME, RunOutcome.MISSED) == ["04:00"]
    backfilled = ScheduleRun.objects.get(schedule=NAME, slot=at("2026-03-29 02:00"))
    assert (backfilled.decided_by, backfilled.detail) == ("olivia-oncall", "the report is needed")
    event = Event.objects.get(kind=EventKind.SCHEDULE_BACKFILLED)
    assert event.data["tasks"] == [task.pk for task in tasks_of(NAME)[1:]]
    with pytest.raises(actions.PlanStale, match="already confirmed"):
        actions.backfill(NAME, actor=oncall, reason="again", plan=plan)
    assert len(tasks_of(NAME)) == 3


def test_a_backfill_refuses_a_range_it_cannot_take(report: str) -> None:
    with pytest.raises(InvalidInput) as late:
        actions.plan_backfill(NAME, since="2026-03-29T00:00Z", until="2026-03-29T09:00Z")
    assert (late.value.field, late.value.rule) == ("until", "decided")
    with pytest.raises(InvalidInput) as wide:
        actions.plan_backfill(NAME, since="2026-01-01T00:00Z", until="2026-03-29T01:30Z")
    assert (wide.value.field, wide.value.rule) == ("since", "range")
    with pytest.raises(InvalidInput) as bad:
        actions.plan_backfill(NAME, since="yesterday", until="2026-03-29T01:30Z")
    assert (bad.value.field, bad.value.rule) == ("since", "format")


def test_run_now_enqueues_once_per_request_even_while_paused(report: str, oncall: User) -> None:
    paused_three_hours(oncall)
    first = actions.run_now(NAME, actor=oncall, reason="check the fix", request_id="req-000001")
    again = actions.run_now(NAME, actor=oncall, reason="check the fix", request_id="req-000001")
    assert first.created and not again.created and first.task.pk == again.task.pk
    assert first.task.idempotency_key == f"schedule:{NAME}:now:req-000001"
    assert "slot" in first.task.payload
    assert ScheduleRun.objects.filter(outcome=RunOutcome.RUN_NOW).count() == 1
    other = actions.run_now(NAME, actor=oncall, reason="once more", request_id="req-000002")
    assert other.created
    assert kinds() == ["schedule_paused", "schedule_run_now", "schedule_run_now"]


def test_every_action_needs_the_permission_and_a_reason(
    report: str, oncall: User, auditor: User
) -> None:
    for action in (
        lambda: actions.pause(NAME, actor=auditor, reason="r"),
        lambda: actions.run_now(NAME, actor=auditor, reason="r"),
    ):
        with pytest.raises(NotPermitted):
            action()
    with pytest.raises(InvalidInput) as empty:
        actions.pause(NAME, actor=oncall, reason="  ")
    assert empty.value.field == "reason"
    paused_three_hours(oncall)
    plan = actions.plan_resume(NAME, now=at("2026-03-29 04:30"))
    with pytest.raises(NotPermitted):
        actions.resume(NAME, actor=auditor, reason="r", plan=plan)
    with pytest.raises(InvalidInput):
        actions.run_now("no.such", actor=oncall, reason="r")
    assert Task.objects.count() == 1
    assert kinds() == ["schedule_paused"]


def test_the_actions_are_in_the_audit_chain(report: str, oncall: User) -> None:
    paused_three_hours(oncall)
    plan = actions.plan_resume(NAME, now=at("2026-03-29 04:30"))
    actions.resume(NAME, actor=oncall, reason="back", plan=plan)
    actions.run_now(NAME, actor=oncall, reason="now")
    chained = Event.objects.filter(kind__startswith="schedule_", chain_hash__isnull=False)
    assert sorted(chained.values_list("kind", flat=True)) == [
        "schedule_paused",
        "schedule_resumed",
        "schedule_run_now",
        "schedule_synced",
    ]
    assert audit_verify.verify().ok
