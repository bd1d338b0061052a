"""Pruning history past its retention, and the one path allowed to delete events.

Finished tasks (succeeded, cancelled) that finished more than ``RETENTION_DAYS`` ago go
with their steps, leases, effects, approval requests (whatever cascades) and events, in
batches of ``RETENTION_BATCH`` tasks, each its own short transaction. Operator actions
(``OPERATOR_EVENT_KINDS``) outlive their task: their events go ``AUDIT_RETENTION_DAYS``
after they were recorded, as do those that never named a task (queue switches). Dead,
waiting, pending and running tasks are never pruned, however old. The sweeper prunes one
batch of each per sweep; ``manage.py prune_history`` prunes everything due, or says what
would go.

On PostgreSQL the append-only trigger lets a DELETE of events through only inside the
database function ``tasks_app_prune_events``, which runs as the tables' owner and takes
only what retention may take (docs/audit.md); no setting a session may set unlocks it.
Every deletion of events adds how many went, per kind, to the counter
``events_pruned:<kind>`` in the same transaction, so a count of events by kind (the stored
events plus that counter) never goes down when history is pruned. Before operator events
go, the audit chain is sealed with a checkpoint (``audit_verify.seal_before_deleting``),
so it still verifies without them.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Exists, OuterRef, QuerySet

from tasks_app.db.clock import db_now
from tasks_app.history import audit_verify, counting
from tasks_app.models import (
    OPERATOR_EVENT_KINDS,
    Event,
    ScheduleRun,
    Step,
    StoredSchedule,
    Task,
    TaskStatus,
)

logger = logging.getLogger(__name__)

# Each has its own partial index on finished_at (task_succeeded_idx, task_cancelled_idx),
# so each is looked up on its own.
PRUNABLE_STATUSES = (TaskStatus.SUCCEEDED, TaskStatus.CANCELLED)
# Sorted, as the partial audit index's condition spells it, so PostgreSQL can use it.
AUDIT_KINDS = sorted(OPERATOR_EVENT_KINDS)
PRUNED_COUNTER_PREFIX = "events_pruned:"
# Ids per DELETE statement, well below either database's limit on parameters.
DELETE_CHUNK = 1000


# --- deleting events --------------------------------------------------------------------------


def delete_events(event_ids: Sequence[int]) -> int:
    """Delete the given events; returns how many went."""
    return sum(delete_events_by_kind(event_ids).values())


def delete_events_by_kind(event_ids: Sequence[int]) -> dict[str, int]:
    """Delete the given events and add how many went, per kind, to the
    ``events_pruned:<kind>`` counters in the same transaction; returns that tally.

    ``RETURNING`` counts only the rows this statement deleted: two prunes racing for the
    same events tally each event once.

    Operator events are chained (``audit_chain``): before any of them goes, the chain is
    verified up to the newest of them and a checkpoint written, in the same transaction.
    A chain that does not verify is not sealed over: its events stay (the others go), and
    the break is logged for an auditor (``manage.py verify_audit`` names it).
    """
    if not event_ids:
        return {}
    table = Event._meta.db_table
    deleted: collections.Counter[str] = collections.Counter()
    with transaction.atomic(), connection.cursor() as cursor:
        try:
            audit_verify.seal_before_deleting(event_ids)
        except audit_verify.ChainBroken as exc:
            logger.error(
                "the audit chain is broken at %s: its events are kept, not pruned, until "
                "an auditor looks (manage.py verify_audit)",
                exc,
            )
            chained = audit_verify.chained_among(event_ids)
            event_ids = [pk for pk in event_ids if pk not in chained]
        for start in range(0, len(event_ids), DELETE_CHUNK):
            chunk = list(event_ids[start : start + DELETE_CHUNK])
            cursor.execute(*_delete_statement(table, chunk))
            deleted.update(kind for (kind,) in cursor.fetchall())
        counting.upsert({PRUNED_COUNTER_PREFIX + kind: n for kind, n in deleted.items()})
    return dict(deleted)


def _delete_statement(table: str, chunk: list[int]) -> tuple[str, list[Any]]:
    """The statement that deletes ``chunk`` and returns each deleted event's kind.

    On PostgreSQL only ``tasks_app_prune_events`` (migration 0019) may delete events: it
    runs as the tables' owner and deletes only what retention may take (events of finished
    tasks or of tasks already gone; chained events once a checkpoint sealed the chain past
    them), so it skips the rest. SQLite has no trigger and deletes as asked."""
    if connection.vendor == "postgresql":
        return "SELECT event_kind FROM tasks_app_prune_events(%s::bigint[])", [chunk]
    placeholders = ", ".join(["%s"] * len(chunk))
    return f"DELETE FROM {table} WHERE id IN ({placeholders}) RETURNING kind", chunk  # noqa: S608


# --- what is due ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cutoffs:
    # Finished tasks that finished before this go.
    finished_before: datetime
    # Operator events recorded before this go once their task is gone.
    audit_before: datetime


def cutoffs(
    *, days: int | None = None, audit_days: int | None = None, now: datetime | None = None
) -> Cutoffs:
    """The cutoffs as of ``now`` (by default the database's clock), from the settings
    unless given."""
    days = settings.RETENTION_DAYS if days is None else days
    audit_days = settings.AUDIT_RETENTION_DAYS if audit_days is None else audit_days
    now = db_now() if now is None else now
    return Cutoffs(now - timedelta(days=days), now - timedelta(days=audit_days))


def prunable_tasks(cut: Cutoffs) -> QuerySet[Task]:
    return Task.objects.filter(status__in=PRUNABLE_STATUSES, finished_at__lt=cut.finished_before)


def _events_going_with(task_ids: Iterable[int] | QuerySet[Any], cut: Cutoffs) -> QuerySet[Event]:
    """The events of these tasks that go with them: all but operator actions still inside
    the audit retention."""
    return Event.objects.filter(task_id__in=task_ids).exclude(
        kind__in=AUDIT_KINDS, created_at__gte=cut.audit_before
    )


def _audit_events_due(cut: Cutoffs) -> QuerySet[Event]:
    """Operator events past the audit retention whose task is gone (or that never named
    one: ``id = NULL`` matches no task). Those of a task still stored stay with it."""
    # A plain NOT EXISTS, without an OR beside it, so PostgreSQL plans it as an anti-join
    # probing the task's primary key per event rather than hashing every task id.
    task_stored = Exists(Task.objects.filter(pk=OuterRef("task_id")))
    return Event.objects.filter(kind__in=AUDIT_KINDS, created_at__lt=cut.audit_before).filter(
        ~task_stored
    )


# --- pruning ----------------------------------------------------------------------------------


@dataclass
class PruneReport:
    """What a prune removed, or what a dry run found due."""

    # Tasks by status.
    tasks: collections.Counter[str] = field(default_factory=collections.Counter)
    # Rows that went with them, by model label ("tasks_app.Step", ...). A dry run counts
    # only the steps.
    rows: collections.Counter[str] = field(default_factory=collections.Counter)
    # Their events, by kind.
    events: collections.Counter[str] = field(default_factory=collections.Counter)
    # Operator events of those tasks kept for the audit retention.
    kept_for_audit: int = 0
    # Operator events past the audit retention whose task was already gone, by kind.
    audit_events: collections.Counter[str] = field(default_factory=collections.Counter)

    @property
    def task_count(self) -> int:
        return sum(self.tasks.values())

    def add(self, other: PruneReport) -> None:
        self.tasks.update(other.tasks)
        self.rows.update(other.rows)
        self.events.update(other.events)
        self.kept_for_audit += other.kept_for_audit
        self.audit_events.update(other.audit_events)


def prune_task_batch(cut: Cutoffs, *, size: int) -> PruneReport:
    """Prune up to ``size`` finished tasks past the cutoff in one short transaction.

    1. Lock them, oldest first, skipping rows another transaction holds (``FOR UPDATE
       SKIP LOCKED`` on PostgreSQL; SQLite runs one writer at a time). The lock re-reads
       each row and re-checks the filter, so a task that changed meanwhile is not taken.
    2. Delete their events, keeping operator actions still inside the audit retention.
    3. Delete the tasks, and with them whatever cascades (steps, leases, effects,
       approval requests): the idempotency keys are free again.
    """
    report = PruneReport()
    with transaction.atomic():
        locked: list[tuple[int, str]] = []
        for status in PRUNABLE_STATUSES:
            if len(locked) >= size:
                break
            locked += (
                Task.objects.select_for_update(skip_locked=True)
                .filter(status=status, finished_at__lt=cut.finished_before)
                .order_by("finished_at")
                .values_list("pk", "status")[: size - len(locked)]
            )
        if not locked:
            return report
        ids = [pk for pk, _ in locked]
        report.tasks.update(status for _, status in locked)
        going = list(_events_going_with(ids, cut).values_list("pk", flat=True))
        report.events.update(delete_events_by_kind(going))
        report.kept_for_audit = Event.objects.filter(task_id__in=ids).count()
        # Only the key is read: the cascade reads what it needs of the rows below.
        _, deleted = Task.objects.filter(pk__in=ids).only("pk").delete()
        report.rows.update({label: n for label, n in deleted.items() if label != "tasks_app.Task"})
    return report


def prune_audit_batch(cut: Cutoffs, *, size: int) -> dict[str, int]:
    """Delete up to ``size`` operator events past the audit retention whose task is gone,
    oldest first; returns how many went, by kind. Events are never updated, so nothing
    needs locking: a racing prune's events are counted by whoever deleted them."""
    with transaction.atomic():
        ids = list(
            _audit_events_due(cut).order_by("created_at").values_list("pk", flat=True)[:size]
        )
        return delete_events_by_kind(ids)


def prune(cut: Cutoffs, *, size: int | None = None) -> PruneReport:
    """Prune everything due, batch after batch: the finished tasks, then the operator
    events past the audit retention."""
    size = size or settings.RETENTION_BATCH
    report = PruneReport()
    while True:
        batch = prune_task_batch(cut, size=size)
        report.add(batch)
        if batch.task_count < size:
            break
    while True:
        gone = prune_audit_batch(cut, size=size)
        report.audit_events.update(gone)
        if sum(gone.values()) < size:
            break
    return report


def preview(cut: Cutoffs) -> PruneReport:
    """What :func:`prune` would remove, counted and left in place."""
    tasks = prunable_tasks(cut)
    task_ids = tasks.values("pk")
    report = PruneReport()
    report.tasks.update(dict(tasks.order_by().values_list("status").annotate(n=Count("pk"))))
    report.rows["tasks_app.Step"] = Step.objects.filter(task__in=task_ids).count()
    report.events.update(_by_kind(_events_going_with(task_ids, cut)))
    report.kept_for_audit = Event.objects.filter(
        task_id__in=task_ids, kind__in=AUDIT_KINDS, created_at__gte=cut.audit_before
    ).count()
    report.audit_events.update(_by_kind(_audit_events_due(cut)))
    return report


def _by_kind(events: QuerySet[Event]) -> dict[str, int]:
    return dict(events.order_by().values_list("kind").annotate(n=Count("pk")))


# --- the sweeper's share ----------------------------------------------------------------------


def sweep_tasks(limit: int) -> int:
    """The sweeper's job: one batch of ``RETENTION_BATCH`` finished tasks per sweep, so a
    backlog drains over successive sweeps and an idle system does a few index probes. The
    sweep's ``limit`` bounds its row-by-row work; retention's batch is its own setting."""
    report = prune_task_batch(cutoffs(), size=settings.RETENTION_BATCH)
    if report.task_count:
        logger.info(
            "pruned %d finished task(s) and %d event(s); %d operator event(s) kept for audit",
            report.task_count,
            sum(report.events.values()),
            report.kept_for_audit,
        )
    return report.task_count


def sweep_audit_events(limit: int) -> int:
    """The sweeper's job: one batch of operator events past the audit retention."""
    gone = sum(prune_audit_batch(cutoffs(), size=settings.RETENTION_BATCH).values())
    if gone:
        logger.info("pruned %d operator event(s) past the audit retention", gone)
    return gone


def schedule_runs_before() -> datetime:
    """Schedule runs whose slot is older than this go: a day past ``RETENTION_DAYS``, so a
    backfill, which reaches back ``RETENTION_DAYS`` at most, never finds a slot's run gone
    while its task may still hold the slot's key."""
    return db_now() - timedelta(days=settings.RETENTION_DAYS + 1)


def sweep_schedule_runs(limit: int) -> int:
    """The sweeper's job: up to ``RETENTION_BATCH`` schedule runs past the retention, by
    schedule (each an index range of its slots)."""
    before = schedule_runs_before()
    gone = 0
    for name in StoredSchedule.objects.values_list("name", flat=True):
        old = ScheduleRun.objects.filter(schedule=name, slot__lt=before).order_by("slot")
        ids = list(old.values_list("pk", flat=True)[: settings.RETENTION_BATCH - gone])
        if ids:
            gone += ScheduleRun.objects.filter(pk__in=ids).delete()[0]
        if gone >= settings.RETENTION_BATCH:
            break
    if gone:
        logger.info("pruned %d schedule run(s) past the retention", gone)
    return gone
