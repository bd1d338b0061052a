"""The tick: every active schedule whose next slot has come decides its slots up to now,
enqueues those its policy runs and records the rest as missed (``engine.schedules``).

It is a job of the sweeper (``tasks_app.apps`` registers :func:`sweep_job`): beat sends
the sweep to the maintenance queue every ``TASKS_SWEEP_SECONDS`` and the maintenance worker
runs it, so the processes that already run do it and none is added.

A slot is enqueued once however many ticks decide it: each schedule is decided under its
row's lock (a second tick at the same moment skips it), its next slot moves in the same
transaction as the enqueues, a slot's run row is unique, and the task's idempotency key
``schedule:<name>:<slot UTC>`` is the last line.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import DatabaseError, transaction

from tasks_app.access import Actor, actor_fields
from tasks_app.db.clock import db_now
from tasks_app.engine.enqueueing import EnqueueResult, enqueue
from tasks_app.engine.schedules import decide, slot_key, slot_text
from tasks_app.exceptions import IdempotencyConflict, InvalidInput
from tasks_app.history import counting
from tasks_app.models import RunOutcome, ScheduleRun, StoredSchedule

logger = logging.getLogger(__name__)

TICKER = "system:schedules"
# The most missed slots one decision stores a row for (the newest); the rest are counted.
MISSED_ROWS = 1_000


@dataclass
class TickReport:
    enqueued: int = 0
    missed: int = 0
    refused: int = 0
    schedules: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, int]:
        return {"enqueued": self.enqueued, "missed": self.missed, "refused": self.refused}


def sweep_job(limit: int) -> int:
    """The sweeper's part (``tasks_app.engine.sweeper``): a tick of at most ``limit``
    schedules; how many slots it enqueued."""
    return tick(limit=limit).enqueued


def tick(now: datetime | None = None, *, limit: int = 500) -> TickReport:
    """Decide every active schedule's slots up to ``now`` (the database's clock)."""
    now = now or db_now()
    report = TickReport()
    due = (
        StoredSchedule.objects.filter(
            removed_at__isnull=True, paused_at__isnull=True, next_slot__lte=now
        )
        .order_by("next_slot")
        .values_list("name", flat=True)
    )
    for name in list(due[:limit]):
        try:
            with transaction.atomic():
                row = (
                    StoredSchedule.objects.select_for_update(skip_locked=True)
                    .filter(name=name, removed_at__isnull=True, paused_at__isnull=True)
                    .filter(next_slot__lte=now)
                    .first()
                )
                if row is None:
                    continue  # another tick holds it, or decided it already
                decide_slots(row, now, report)
        except DatabaseError:
            raise  # the database is gone: the sweep fails and says so
        except Exception:
            # One schedule that cannot be decided (a declaration this code cannot read)
            # must not hold back the ones after it; it stays due, and late, for on-call.
            logger.exception("schedule %s: its slots could not be decided", name)
            report.failed.append(name)
    if report.schedules:
        logger.info(
            "schedules: %d enqueued, %d missed, %d refused (%s)",
            report.enqueued,
            report.missed,
            report.refused,
            ", ".join(report.schedules),
        )
    return report


def decide_slots(
    row: StoredSchedule,
    now: datetime,
    report: TickReport | None = None,
    *,
    spec: Mapping[str, Any] | None = None,
    actor: Actor = TICKER,
) -> None:
    """Decide ``row``'s slots from its next one up to ``now`` (under ``spec``, by default
    its own); the caller holds its lock."""
    spec = spec or row.spec
    decision = decide(spec, row.next_slot, now)
    runs = [enqueue_slot(row.name, spec, slot, actor=actor, at=now) for slot in decision.enqueue]
    runs += [
        ScheduleRun(
            schedule=row.name,
            slot=slot,
            outcome=RunOutcome.MISSED,
            decided_at=now,
            decided_by=actor_fields(actor)[0],
            detail=f"older than the tolerance when it was decided (policy {spec['missed']})",
        )
        for slot in decision.missed[-MISSED_ROWS:]
    ]
    ScheduleRun.objects.bulk_create(runs, ignore_conflicts=True)
    missed = len(decision.missed) + (1 if decision.uncounted else 0)
    row.next_slot = decision.next_slot
    row.last_tick_at = now
    row.missed_total += missed
    row.save(update_fields=["next_slot", "last_tick_at", "missed_total"])
    # Missed slots counted as missed_total counts them: their rows stop at MISSED_ROWS.
    decided = [run.outcome for run in runs if run.outcome != RunOutcome.MISSED]
    count_runs(row.name, decided + [RunOutcome.MISSED] * missed)
    if report is None:
        return
    report.schedules.append(row.name)
    report.missed += len(decision.missed)
    for run in runs:
        if run.outcome == RunOutcome.ENQUEUED:
            report.enqueued += 1
        elif run.outcome == RunOutcome.REFUSED:
            report.refused += 1


def count_runs(name: str, outcomes: Iterable[str]) -> None:
    """Count runs of ``name`` by outcome for the metrics, once the transaction commits
    (``counting.SCHEDULE_RUN``): counting the runs on each scrape would read them all."""
    counting.add(collections.Counter(f"{counting.SCHEDULE_RUN}:{name}:{o}" for o in outcomes))


def slot_payload(spec: Mapping[str, Any], slot: datetime) -> dict[str, Any]:
    payload = dict(spec.get("payload") or {})
    if spec.get("slot_field"):
        payload[spec["slot_field"]] = slot_text(slot)
    return payload


def enqueue_slot(
    name: str,
    spec: Mapping[str, Any],
    slot: datetime,
    *,
    actor: Actor,
    at: datetime,
    key: str | None = None,
    outcome: str = RunOutcome.ENQUEUED,
    detail: str = "",
) -> ScheduleRun:
    """Enqueue one slot's task (its key names the slot, or ``key``) and say how it went, as
    the run row to store; a refusal is recorded, not raised, so one bad slot does not stop
    the others."""
    run = ScheduleRun(
        schedule=name,
        slot=slot,
        outcome=outcome,
        decided_at=at,
        decided_by=actor_fields(actor)[0],
        detail=detail,
    )
    try:
        with transaction.atomic():
            result = start(name, spec, slot, actor=actor, key=key or slot_key(name, slot))
    except (InvalidInput, IdempotencyConflict) as exc:
        logger.warning("schedule %s: slot %s refused: %s", name, slot_text(slot), exc)
        run.outcome = RunOutcome.REFUSED
        run.detail = str(exc)
        return run
    run.task_id = result.task.pk
    return run


def start(
    name: str, spec: Mapping[str, Any], slot: datetime, *, actor: Actor, key: str
) -> EnqueueResult:
    return enqueue(
        spec["workflow"],
        slot_payload(spec, slot),
        idempotency_key=key,
        queue=spec.get("queue") or "default",
        priority=int(spec.get("priority") or 0),
        actor=actor,
    )


def runs_of(name: str, slots: Iterable[datetime]) -> dict[datetime, ScheduleRun]:
    """The recorded runs of ``name`` at ``slots`` (not "run now"), by slot."""
    return {
        run.slot: run
        for run in ScheduleRun.objects.filter(schedule=name, slot__in=list(slots)).exclude(
            outcome=RunOutcome.RUN_NOW
        )
    }
