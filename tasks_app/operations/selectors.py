"""Read queries for the console's figures and one task's whole story (the lists are in
``tasks_app.operations.listings``).

Every query here stays cheap as finished history grows: counts run over active work
(the partial indexes on pending, running, waiting and dead rows) or over a bounded time
window (the last hour or day, served by indexes on ``finished_at`` and on the rare event
kinds), never over the whole history.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, Min, Q, QuerySet
from django.db.models.functions import TruncMinute

from tasks_app.db.clock import db_now
from tasks_app.exceptions import AWAITING_VERSION
from tasks_app.history import timeline
from tasks_app.history.timeline import HistoryEntry
from tasks_app.models import (
    Effect,
    Event,
    EventKind,
    Lease,
    QueueState,
    Step,
    StepStatus,
    Task,
    TaskStatus,
    leases_of,
)
from tasks_app.operations import task_actions as task_actions_rule

# --- the overview -----------------------------------------------------------------------------


@dataclass(frozen=True)
class MinuteCount:
    minute: datetime
    count: int


@dataclass(frozen=True)
class Overview:
    now: datetime
    # Where "last hour" and "last day" begin: the lists the cards open start there too.
    hour_ago: datetime
    day_ago: datetime
    pending: int
    running: int
    retry_scheduled: int
    waiting_approval: int
    dead: int
    succeeded_last_hour: int
    succeeded_last_day: int
    oldest_due_at: datetime | None
    retries_last_hour: int
    dead_lettered_last_hour: int
    # Tasks that succeeded per minute over the last hour, oldest minute first (60 entries).
    throughput: list[MinuteCount]
    paused: list[QueueState]

    @property
    def oldest_due_age(self) -> timedelta | None:
        return None if self.oldest_due_at is None else max(self.now - self.oldest_due_at, ZERO)

    @property
    def retry_rate(self) -> float | None:
        """Retries per task finished in the last hour (None when nothing finished)."""
        return _ratio(self.retries_last_hour, self.succeeded_last_hour)

    @property
    def dead_letter_rate(self) -> float | None:
        return _ratio(self.dead_lettered_last_hour, self.succeeded_last_hour)


ZERO = timedelta(0)
# Rare event kinds counted per time window (an index of their own keeps it cheap).
TROUBLE_EVENT_KINDS = (EventKind.RETRY_SCHEDULED, EventKind.DEAD_LETTERED, EventKind.LEASE_EXPIRED)


def _ratio(part: int, whole: int) -> float | None:
    return part / (part + whole) if part + whole else None


def overview() -> Overview:
    # Counts are COUNT(*) (not of a column), so PostgreSQL answers them from the partial
    # indexes alone, without visiting the rows.
    now = db_now()
    hour_ago, day_ago = now - timedelta(hours=1), now - timedelta(days=1)
    by_status = dict(Task.objects.active().values_list("status").annotate(n=Count("*")).order_by())
    # Running is read from the steps (a claim does not rewrite its task's row): few rows.
    running = Task.objects.running().count()
    retry_scheduled = scheduled_retries(now).values("task_id").distinct().count()
    trouble = dict(
        Event.objects.filter(kind__in=TROUBLE_EVENT_KINDS, created_at__gte=hour_ago)
        .values_list("kind")
        .annotate(n=Count("*"))
        .order_by()
    )
    paused = list(QueueState.objects.filter(paused=True).order_by("name"))
    return Overview(
        now=now,
        hour_ago=hour_ago,
        day_ago=day_ago,
        pending=by_status.get(TaskStatus.PENDING, 0) - running - retry_scheduled,
        running=running,
        retry_scheduled=retry_scheduled,
        waiting_approval=by_status.get(TaskStatus.WAITING_APPROVAL, 0),
        dead=by_status.get(TaskStatus.DEAD, 0),
        succeeded_last_hour=succeeded_since(hour_ago).count(),
        succeeded_last_day=succeeded_since(day_ago).count(),
        oldest_due_at=_due_steps(now)
        .exclude(queue__in=[state.name for state in paused])
        .aggregate(oldest=Min("available_at"))["oldest"],
        retries_last_hour=trouble.get(EventKind.RETRY_SCHEDULED, 0),
        dead_lettered_last_hour=trouble.get(EventKind.DEAD_LETTERED, 0),
        throughput=_throughput(now),
        paused=paused,
    )


# --- the definitions the overview's cards and the lists they open share ------------------------


def succeeded_since(since: datetime) -> QuerySet[Task]:
    """Tasks that succeeded at or after ``since`` (``task_succeeded_idx`` serves it): what the
    overview's "succeeded" cards count, the task list they open lists and the workflows
    pages count per workflow."""
    return Task.objects.filter(status=TaskStatus.SUCCEEDED, finished_at__gte=since)


def succeeded_by_workflow(since: datetime) -> dict[str, int]:
    """:func:`succeeded_since`, counted per workflow."""
    return dict(succeeded_since(since).values_list("workflow").annotate(n=Count("*")).order_by())


def scheduled_retries(now: datetime) -> QuerySet[Step]:
    """Steps waiting for a scheduled retry (the display state "retry scheduled"): pending,
    claimed before, and not due until later: a retry after a failed attempt, or a dead
    step an operator redrove to run after a delay (its attempts start again from 0, its
    token does not); not a step handed back to wait for its workflow version."""
    claimed_before = Q(attempts__gt=0) | (Q(fencing_token__gt=0) & ~Q(error_class=AWAITING_VERSION))
    return Step.objects.filter(claimed_before, status=StepStatus.PENDING, available_at__gt=now)


def _due_steps(now: datetime) -> QuerySet[Step]:
    return Step.objects.due(now)


def _throughput(now: datetime) -> list[MinuteCount]:
    """Tasks that succeeded in each of the last 60 whole minutes and the current one."""
    start = now.replace(second=0, microsecond=0) - timedelta(minutes=59)
    counts = {
        _minute(row["minute"]): row["n"]
        for row in succeeded_since(start)
        .annotate(minute=TruncMinute("finished_at"))
        .values("minute")
        .annotate(n=Count("*"))
        .order_by()
    }
    minutes = [start + timedelta(minutes=i) for i in range(60)]
    return [MinuteCount(minute, counts.get(minute, 0)) for minute in minutes]


def _minute(value: datetime) -> datetime:
    return value.replace(second=0, microsecond=0)


# --- queues -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueRow:
    name: str
    due: int
    scheduled: int
    running: int
    oldest_due_at: datetime | None
    state: QueueState | None
    now: datetime

    @property
    def paused(self) -> bool:
        return self.state is not None and self.state.paused

    @property
    def oldest_due_age(self) -> timedelta | None:
        return None if self.oldest_due_at is None else max(self.now - self.oldest_due_at, ZERO)


def queues() -> list[QueueRow]:
    """Every configured queue with its depth, lag, running steps and switch."""
    now = db_now()
    pending: dict[str, dict[str, Any]] = {
        row["queue"]: dict(row)
        for row in Step.objects.filter(status=StepStatus.PENDING)
        .values("queue")
        .annotate(
            due=Count("available_at", filter=Q(available_at__lte=now)),
            scheduled=Count("available_at", filter=Q(available_at__gt=now)),
            oldest=Min("available_at", filter=Q(available_at__lte=now)),
        )
        .order_by()
    }
    running = dict(
        Step.objects.filter(status=StepStatus.RUNNING)
        .values_list("queue")
        .annotate(n=Count("*"))
        .order_by()
    )
    states = {state.name: state for state in QueueState.objects.all()}
    none: dict[str, Any] = {}
    return [
        QueueRow(
            name=name,
            due=pending.get(name, none).get("due", 0),
            scheduled=pending.get(name, none).get("scheduled", 0),
            running=running.get(name, 0),
            oldest_due_at=pending.get(name, none).get("oldest"),
            state=states.get(name),
            now=now,
        )
        for name in settings.TASKS_QUEUES
    ]


# --- one task ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LedgerEntry:
    """One external write of a step as the effects ledger holds it."""

    name: str
    effect: Effect

    @property
    def applied(self) -> bool:
        """It happened (its result is recorded): a rerun skips it by its key."""
        return self.effect.status == Effect.Status.DONE


@dataclass(frozen=True)
class StepRow:
    step: Step
    leases: list[Lease]
    # The lease held now (a running step), if any.
    current_lease: Lease | None
    # Its external writes, oldest first.
    effects: list[LedgerEntry] = field(default_factory=list)

    @property
    def applied(self) -> list[LedgerEntry]:
        return [entry for entry in self.effects if entry.applied]

    @property
    def in_doubt(self) -> list[LedgerEntry]:
        """Started with no recorded outcome: a rerun calls them again (with the same key)."""
        return [entry for entry in self.effects if not entry.applied]

    @property
    def error_is_current(self) -> bool:
        """Whether its stored error says what the step is now: it died of it, or an
        attempt since the last redrive failed with it (a redrive starts the attempts again
        and leaves the old error stored), or it waits for a worker with its version. Not
        once it has succeeded or been cancelled."""
        step = self.step
        if not step.error_class:
            return False
        if step.status == StepStatus.DEAD:
            return True
        if step.status == StepStatus.PENDING:
            return step.attempts > 0 or step.error_class == AWAITING_VERSION
        # A running step's attempts count the claim it is in.
        return step.status == StepStatus.RUNNING and step.attempts > 1


@dataclass(frozen=True)
class TaskDetail:
    task: Task
    steps: list[StepRow]
    events: list[HistoryEntry]
    now: datetime
    # The first dead step (the one redrive and resolve act on), if any.
    dead_step: Step | None = None
    # A step handed back to wait for a worker that has its workflow version, if any.
    awaiting_version: Step | None = None

    @property
    def dead_row(self) -> StepRow | None:
        """The row of the dead step, with its leases and external writes."""
        return next((row for row in self.steps if row.step == self.dead_step), None)

    @property
    def outcome_unknown(self) -> bool:
        return self.dead_step is not None and task_actions_rule.is_outcome_unknown(self.dead_step)


@dataclass(frozen=True)
class TaskActions:
    """What a viewer may do to a task now: the rows of ``task_actions.ACTIONS`` whose rule
    allows it and whose permission they hold (the services check both again on every POST),
    in the table's order, and grouped by the task page's form they share (``forms``)."""

    offered: tuple[task_actions_rule.ActionSpec, ...]

    @property
    def allowed(self) -> frozenset[str]:
        return frozenset(spec.name for spec in self.offered)

    @property
    def forms(self) -> dict[str, list[task_actions_rule.ActionSpec]]:
        grouped: dict[str, list[task_actions_rule.ActionSpec]] = {}
        for spec in self.offered:
            grouped.setdefault(spec.form, []).append(spec)
        return grouped

    @property
    def any(self) -> bool:
        return bool(self.offered)


def task_actions(detail: TaskDetail, user: Any) -> TaskActions:
    allowed = task_actions_rule.allowed(detail.task, detail.dead_step)
    return TaskActions(
        tuple(
            spec
            for spec in task_actions_rule.ACTIONS.values()
            if spec.name in allowed and user.has_perm(f"tasks_app.{spec.permission}")
        )
    )


def ledger(steps: list[Step]) -> dict[int, list[LedgerEntry]]:
    """Each step's external writes, as the effects ledger holds them."""
    keys = {step.pk: step.idempotency_key for step in steps}
    entries: dict[int, list[LedgerEntry]] = {}
    for effect in Effect.objects.filter(step_id__in=list(keys)).order_by("created_at", "pk"):
        prefix = keys[effect.step_id] + ":"
        name = effect.key[len(prefix) :] if effect.key.startswith(prefix) else effect.key
        entries.setdefault(effect.step_id, []).append(LedgerEntry(name, effect))
    return entries


@dataclass(frozen=True)
class LedgerSummary:
    """What the ledger holds for the dead steps of many tasks (a bulk action's preview)."""

    # Tasks whose dead step has an external write started with no recorded outcome.
    in_doubt: list[int]
    # Tasks whose dead step has writes that happened (a rerun skips them by key).
    applied: list[int]


def dead_step_ledger(task_ids: Collection[int]) -> LedgerSummary:
    """The effects of the dead steps of ``task_ids``: one read, grouped by task."""
    rows = (
        Effect.objects.filter(step__task_id__in=list(task_ids), step__status=StepStatus.DEAD)
        .values_list("step__task_id", "status")
        .distinct()
    )
    in_doubt: set[int] = set()
    applied: set[int] = set()
    for task_id, status in rows:
        (applied if status == Effect.Status.DONE else in_doubt).add(task_id)
    return LedgerSummary(in_doubt=sorted(in_doubt), applied=sorted(applied))


def task_detail(task: Task) -> TaskDetail:
    steps = list(task.steps.order_by("position", "revision", "item"))
    leases = leases_of(steps)
    effects = ledger(steps)
    rows = []
    for step in steps:
        held = [lease for lease in leases.get(step.pk, []) if lease.released_at is None]
        current = held[-1] if held and step.status == StepStatus.RUNNING else None
        rows.append(StepRow(step, leases.get(step.pk, []), current, effects.get(step.pk, [])))
    dead = next((step for step in steps if step.status == StepStatus.DEAD), None)
    waiting = task.steps.awaiting_version().order_by("position").first()
    return TaskDetail(
        task=task,
        steps=rows,
        events=timeline.history(task.pk),
        now=db_now(),
        dead_step=dead,
        awaiting_version=waiting,
    )
