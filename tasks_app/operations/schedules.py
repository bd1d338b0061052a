"""On-call's actions on a schedule (``tasks_app.engine.schedules``): pause, resume, backfill
and run now. Each checks the ``manage_schedules`` permission, needs a reason, and is an
event in the audit chain.

Resuming and backfilling enqueue past slots, so each is a plan first: :func:`plan_resume`
and :func:`plan_backfill` say exactly which slots will be enqueued and which recorded as
missed ("resuming enqueues 3 missed runs: 02:00, 03:00, 04:00"), and applying the plan
(:func:`resume`, :func:`backfill`) does that and nothing else. It is refused, changing
nothing, when the schedule moved on since the preview (another resume, a tick, a sync) or
when the plan was applied already. Slots that fall due after a resume's preview are
decided by the next tick as usual.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction

from tasks_app import validation
from tasks_app.access import Actor, actor_fields, check_permission
from tasks_app.db.clock import db_now
from tasks_app.engine.enqueueing import EnqueueResult
from tasks_app.engine.schedule_ticks import count_runs, decide_slots, enqueue_slot, runs_of, start
from tasks_app.engine.schedules import (
    Missed,
    Timing,
    decide,
    parse_slot,
    run_now_key,
    slot_text,
)
from tasks_app.exceptions import InvalidInput, InvalidTransition
from tasks_app.history.events import record_event
from tasks_app.models import Event, EventKind, RunOutcome, ScheduleRun, StoredSchedule, Task

PERMISSION = "manage_schedules"
# The most slots one backfill enqueues: a wider range is refused, to be narrowed.
MAX_BACKFILL = 100
# How a resume treats the slots missed while paused: the schedule's own policy, or one of
# the policies chosen for this resume.
RESUME_MODES = ("policy", *Missed.CHOICES)
PLAN_KINDS = (EventKind.SCHEDULE_RESUMED, EventKind.SCHEDULE_BACKFILLED)
REQUEST_ID = re.compile(r"[A-Za-z0-9_-]{8,64}")


class PlanStale(InvalidTransition):
    """The schedule moved on since the plan was made, or the plan was applied already."""


def stored(name: Any) -> StoredSchedule:
    row = StoredSchedule.objects.filter(name=name).first() if isinstance(name, str) else None
    if row is None:
        raise InvalidInput("name", "unknown_schedule", f"name: no schedule {name!r} is stored")
    return row


def state_of(row: StoredSchedule) -> str:
    """What a plan checks is unchanged when it is applied."""
    text = json.dumps(
        [row.spec, slot_text(row.next_slot), str(row.paused_at), str(row.removed_at)],
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class SchedulePlan:
    """What applying a resume or a backfill will do, exactly."""

    id: str
    action: str  # "resume" or "backfill"
    name: str
    state: str
    enqueue: tuple[str, ...]  # slots as slot_text
    missed: tuple[str, ...]
    # The moment the preview decided up to (a resume's "now"; a backfill's range end).
    until: str
    mode: str = "policy"
    since: str = ""

    @property
    def text(self) -> str:
        verb = "Resuming" if self.action == "resume" else "Backfilling"
        if not self.enqueue:
            words = f"{verb} enqueues no run."
        else:
            slots = ", ".join(
                slot[11:16] if len(self.enqueue) > 1 else slot for slot in self.enqueue
            )
            runs = "run" if len(self.enqueue) == 1 else "runs"
            words = f"{verb} enqueues {len(self.enqueue)} {runs} (UTC): {slots}."
        if self.missed:
            words += f" {len(self.missed)} missed slot(s) are recorded and not run."
        return words

    def as_data(self) -> dict[str, Any]:
        return {**self.__dict__, "enqueue": list(self.enqueue), "missed": list(self.missed)}

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> SchedulePlan:
        return cls(**{**data, "enqueue": tuple(data["enqueue"]), "missed": tuple(data["missed"])})


def pause(name: Any, *, actor: Actor, reason: Any) -> StoredSchedule:
    """Stop a schedule's slots being enqueued; the slots it misses meanwhile are decided
    when it is resumed."""
    check_permission(actor, PERMISSION)
    reason = validation.require_text(reason, "reason")
    with transaction.atomic():
        row = _locked(name)
        if row.paused_at is not None:
            raise InvalidTransition(f"schedule {row.name} is paused already")
        row.paused_at = db_now()
        row.paused_by = actor_fields(actor)[0]
        row.paused_reason = reason
        row.save(update_fields=["paused_at", "paused_by", "paused_reason"])
        record_event(
            EventKind.SCHEDULE_PAUSED, task_id=None, actor=actor, reason=reason, schedule=row.name
        )
    return row


def plan_resume(name: Any, *, mode: Any = "policy", now: datetime | None = None) -> SchedulePlan:
    row = stored(name)
    if row.paused_at is None:
        raise InvalidTransition(f"schedule {row.name} is not paused")
    if mode not in RESUME_MODES:
        raise InvalidInput("mode", "choice", f"mode: one of {', '.join(RESUME_MODES)}")
    now = now or db_now()
    decision = decide(_spec_for(row, mode), row.next_slot, now)
    return SchedulePlan(
        id=uuid.uuid4().hex,
        action="resume",
        name=row.name,
        state=state_of(row),
        enqueue=tuple(slot_text(slot) for slot in decision.enqueue),
        missed=tuple(slot_text(slot) for slot in decision.missed),
        until=slot_text(now),
        mode=str(mode),
    )


def _spec_for(row: StoredSchedule, mode: str) -> dict[str, Any]:
    return row.spec if mode == "policy" else {**row.spec, "missed": mode}


def resume(name: Any, *, actor: Actor, reason: Any, plan: SchedulePlan) -> StoredSchedule:
    """Apply a resume's plan: enqueue its slots, record its missed ones, and let the tick
    go on from the slot after the preview."""
    check_permission(actor, PERMISSION)
    reason = validation.require_text(reason, "reason")
    with transaction.atomic():
        row = _checked(name, plan, "resume")
        # The same decision as the preview's: the same declaration and next slot (the
        # plan's state), up to the same moment.
        until = parse_slot(plan.until)
        decide_slots(row, until, spec=_spec_for(row, plan.mode), actor=actor)
        row.paused_at = None
        row.paused_by = ""
        row.paused_reason = ""
        row.save(update_fields=["paused_at", "paused_by", "paused_reason"])
        record_event(
            EventKind.SCHEDULE_RESUMED,
            task_id=None,
            actor=actor,
            reason=reason,
            schedule=row.name,
            plan=plan.id,
            mode=plan.mode,
            enqueued=list(plan.enqueue),
            missed=len(plan.missed),
        )
    return row


def plan_backfill(name: Any, *, since: Any, until: Any) -> SchedulePlan:
    """The slots in ``[since, until]`` already decided that have no task (missed, refused):
    those a backfill enqueues, at most :data:`MAX_BACKFILL`."""
    row = stored(name)
    if row.removed_at is not None:
        raise InvalidTransition(f"schedule {row.name} was removed from code")
    since = _moment(since, "since")
    until = _moment(until, "until")
    if until < since:
        raise InvalidInput("until", "order", "until: must not be before since")
    if since < db_now() - timedelta(days=settings.RETENTION_DAYS):
        raise InvalidInput(
            "since",
            "retention",
            f"since: within the last {settings.RETENTION_DAYS} days (RETENTION_DAYS): older "
            "runs and their tasks are pruned, so a slot there may have run already",
        )
    if until >= row.next_slot:
        raise InvalidInput(
            "until",
            "decided",
            f"until: before {slot_text(row.next_slot)}, the next slot not yet decided "
            "(a paused schedule's missed slots are the resume's)",
        )
    slots = Timing.of(row.spec).between(since, until, limit=MAX_BACKFILL + 1)
    if len(slots) > MAX_BACKFILL:
        raise InvalidInput(
            "since", "range", f"since: the range holds more than {MAX_BACKFILL} slots; narrow it"
        )
    runs = runs_of(row.name, slots)
    wanted = [slot for slot in slots if _open(runs.get(slot))]
    return SchedulePlan(
        id=uuid.uuid4().hex,
        action="backfill",
        name=row.name,
        state=state_of(row),
        enqueue=tuple(slot_text(slot) for slot in wanted),
        missed=(),
        until=slot_text(until),
        since=slot_text(since),
    )


def _open(run: ScheduleRun | None) -> bool:
    return run is None or run.outcome in (RunOutcome.MISSED, RunOutcome.REFUSED)


def _moment(value: Any, field: str) -> datetime:
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            value = None
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise InvalidInput(field, "format", f"{field}: a date and time with its zone")
    return value


def backfill(name: Any, *, actor: Actor, reason: Any, plan: SchedulePlan) -> list[ScheduleRun]:
    """Apply a backfill's plan: enqueue each of its slots still without a task."""
    check_permission(actor, PERMISSION)
    reason = validation.require_text(reason, "reason")
    with transaction.atomic():
        row = _checked(name, plan, "backfill")
        now = db_now()
        slots = [parse_slot(slot) for slot in plan.enqueue]
        runs = runs_of(row.name, slots)
        made = []
        for slot in slots:
            if not _open(runs.get(slot)):
                continue  # enqueued since the preview
            run = enqueue_slot(row.name, row.spec, slot, actor=actor, at=now, detail=reason)
            ScheduleRun.objects.filter(schedule=row.name, slot=slot).exclude(
                outcome=RunOutcome.RUN_NOW
            ).delete()
            run.save()
            made.append(run)
        count_runs(row.name, [run.outcome for run in made])
        record_event(
            EventKind.SCHEDULE_BACKFILLED,
            task_id=None,
            actor=actor,
            reason=reason,
            schedule=row.name,
            plan=plan.id,
            enqueued=[slot_text(run.slot) for run in made if run.task_id],
            tasks=[run.task_id for run in made if run.task_id],
        )
    return made


def _locked(name: Any) -> StoredSchedule:
    row = StoredSchedule.objects.select_for_update().filter(name=stored(name).name).get()
    if row.removed_at is not None:
        raise InvalidTransition(f"schedule {row.name} was removed from code")
    return row


def _checked(name: Any, plan: SchedulePlan, action: str) -> StoredSchedule:
    row = _locked(name)
    if plan.action != action or plan.name != row.name:
        raise PlanStale("this plan is for another action or schedule: preview again")
    applied = Event.objects.filter(kind__in=PLAN_KINDS, data__plan=plan.id)
    if applied.exists():
        raise PlanStale("this preview was already confirmed and applied")
    if state_of(row) != plan.state:
        raise PlanStale(f"schedule {row.name} changed since the preview: preview again")
    return row


def run_now(name: Any, *, actor: Actor, reason: Any, request_id: Any = None) -> EnqueueResult:
    """Enqueue one run outside the slots, now (paused or not). ``request_id`` makes a
    repeated request (a double click, a retried form) enqueue once."""
    check_permission(actor, PERMISSION)
    reason = validation.require_text(reason, "reason")
    request_id = request_id or uuid.uuid4().hex
    if not isinstance(request_id, str) or not REQUEST_ID.fullmatch(request_id):
        raise InvalidInput("request_id", "format", "request_id: 8 to 64 of A-Z, a-z, 0-9, _ or -")
    with transaction.atomic():
        row = _locked(name)
        now = db_now()
        key = run_now_key(row.name, request_id)
        # The same request again (a second click, a retried form) finds its task; its
        # payload holds the moment it ran, which a later enqueue's would not match.
        earlier = Task.objects.filter(idempotency_key=key).first()
        if earlier is not None:
            return EnqueueResult(earlier, False)
        result = start(row.name, row.spec, now, actor=actor, key=key)
        if result.created:
            ScheduleRun.objects.create(
                schedule=row.name,
                slot=now,
                outcome=RunOutcome.RUN_NOW,
                task_id=result.task.pk,
                decided_at=now,
                decided_by=actor_fields(actor)[0],
                detail=reason,
            )
            count_runs(row.name, [RunOutcome.RUN_NOW])
            record_event(
                EventKind.SCHEDULE_RUN_NOW,
                task_id=None,
                actor=actor,
                reason=reason,
                schedule=row.name,
                tasks=[result.task.pk],
            )
    return result
