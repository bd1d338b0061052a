"""The append-only history: what can happen (``EventKind``, and the kinds the audit log and
the metrics single out), the events themselves, and the audit chain's checkpoints that
retention writes. Folding events into a task's state is ``tasks_app.history``'s.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import models
from django.db.models import Q
from django.utils import timezone


class EventKind(models.TextChoices):
    """What happened, and how people read it: the labels are the audit log's and its
    export's (``get_kind_display``, ``EventKind(kind).label``), in one place."""

    ENQUEUED = "enqueued", "Enqueued"
    CLAIMED = "claimed", "Claimed"
    SUCCEEDED = "succeeded", "Succeeded"
    RETRY_SCHEDULED = "retry_scheduled", "Retry scheduled"
    LEASE_EXPIRED = "lease_expired", "Lease expired"
    CLAIM_RELEASED = "claim_released", "Claim released"
    STALE_WRITE_REJECTED = "stale_write_rejected", "Stale write rejected"
    DEAD_LETTERED = "dead_lettered", "Dead-lettered"
    APPROVAL_REQUESTED = "approval_requested", "Approval requested"
    APPROVED = "approved", "Approved"
    # One approval of several a quorum needs (the request stays open), and an editor's own
    # revision of the draft under review.
    APPROVAL_RECORDED = "approval_recorded", "Approval recorded"
    DRAFT_EDITED = "draft_edited", "Draft edited"
    # Nobody decided in time: the request is open to a second group too.
    APPROVAL_ESCALATED = "approval_escalated", "Approval escalated"
    REJECTED = "rejected", "Rejected"
    CHANGES_REQUESTED = "changes_requested", "Changes requested"
    APPROVAL_EXPIRED = "approval_expired", "Approval expired"
    REDRIVEN = "redriven", "Redriven"
    RESOLVED = "resolved", "Marked resolved"
    CANCEL_REQUESTED = "cancel_requested", "Cancel requested"
    CANCELLED = "cancelled", "Cancelled"
    QUEUE_PAUSED = "queue_paused", "Queue paused"
    QUEUE_RESUMED = "queue_resumed", "Queue resumed"
    # Flow control (tasks_app.operations.limits): a limit's numbers changed live, one key
    # of a limit paused or resumed.
    LIMIT_CHANGED = "limit_changed", "Limit changed"
    LIMIT_KEY_PAUSED = "limit_key_paused", "Limit key paused"
    LIMIT_KEY_RESUMED = "limit_key_resumed", "Limit key resumed"
    # A finished, dead or cancelled task run again from one of its steps
    # (tasks_app.operations.rewinds).
    REWOUND = "rewound", "Rewound"
    # Schedules (tasks_app.operations.schedules): a declaration stored, changed or removed
    # by a sync, and on-call's pause, resume, backfill and run now.
    SCHEDULE_SYNCED = "schedule_synced", "Schedule synced"
    SCHEDULE_PAUSED = "schedule_paused", "Schedule paused"
    SCHEDULE_RESUMED = "schedule_resumed", "Schedule resumed"
    SCHEDULE_BACKFILLED = "schedule_backfilled", "Schedule backfilled"
    SCHEDULE_RUN_NOW = "schedule_run_now", "Schedule run now"
    # Programs (tasks_app.operations.tokens, .proposals): a person's API token made or
    # revoked, and a plan a program proposed, applied (by a person, or by its token where
    # the token may) or declined.
    TOKEN_CREATED = "token_created", "API token created"
    TOKEN_REVOKED = "token_revoked", "API token revoked"
    PLAN_PROPOSED = "plan_proposed", "Plan proposed"
    PLAN_APPLIED = "plan_applied", "Plan applied"
    PLAN_DECLINED = "plan_declined", "Plan declined"


# Operator actions: kept for the longer audit retention.
OPERATOR_EVENT_KINDS = frozenset(
    {
        EventKind.APPROVED,
        EventKind.APPROVAL_RECORDED,
        EventKind.DRAFT_EDITED,
        EventKind.REJECTED,
        EventKind.CHANGES_REQUESTED,
        EventKind.REDRIVEN,
        EventKind.RESOLVED,
        EventKind.CANCEL_REQUESTED,
        EventKind.CANCELLED,
        EventKind.QUEUE_PAUSED,
        EventKind.QUEUE_RESUMED,
        EventKind.LIMIT_CHANGED,
        EventKind.LIMIT_KEY_PAUSED,
        EventKind.LIMIT_KEY_RESUMED,
        EventKind.REWOUND,
        EventKind.SCHEDULE_SYNCED,
        EventKind.SCHEDULE_PAUSED,
        EventKind.SCHEDULE_RESUMED,
        EventKind.SCHEDULE_BACKFILLED,
        EventKind.SCHEDULE_RUN_NOW,
        EventKind.TOKEN_CREATED,
        EventKind.TOKEN_REVOKED,
        EventKind.PLAN_PROPOSED,
        EventKind.PLAN_APPLIED,
        EventKind.PLAN_DECLINED,
    }
)


# Transitions that need a look when they happen (the metrics count them).
RARE_EVENT_KINDS = (
    EventKind.RETRY_SCHEDULED,
    EventKind.DEAD_LETTERED,
    EventKind.LEASE_EXPIRED,
    EventKind.CLAIM_RELEASED,
    EventKind.STALE_WRITE_REJECTED,
    EventKind.APPROVAL_EXPIRED,
    EventKind.APPROVAL_ESCALATED,
)


class AppendOnlyError(Exception):
    """Events are history: they are never updated, and deleted only by retention."""


class EventQuerySet(models.QuerySet["Event"]):
    def update(self, **kwargs: Any) -> int:
        raise AppendOnlyError("events are append-only: UPDATE is refused")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError("events are append-only: DELETE belongs to retention")

    def for_task(self, task_id: int) -> EventQuerySet:
        return self.filter(task_id=task_id).order_by("id")


class Event(models.Model):
    """One transition, written in the transaction that made it.

    ``task_id``, ``step_id`` and ``actor_user_id`` are plain columns, not foreign keys, so
    an event never needs an UPDATE when those rows are pruned or deleted.
    ``data["steps"]`` holds the new ``[status, attempts, fencing_token]`` of every step the
    transition changed; :func:`tasks_app.history.fold` replays them.

    Operator actions (``OPERATOR_EVENT_KINDS``) are chained (``tasks_app.history.audit_chain``):
    ``chain_hash`` is the SHA-256 of the event's canonical form, which includes
    ``chain_previous``, the hash of the operator event before it. Other events leave both
    empty.
    """

    id = models.BigAutoField(primary_key=True)
    task_id = models.BigIntegerField(null=True, blank=True)
    step_id = models.BigIntegerField(null=True, blank=True)
    kind = models.CharField(max_length=40, choices=EventKind.choices)
    actor = models.CharField(max_length=150)
    actor_user_id = models.IntegerField(null=True, blank=True)
    reason = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)
    # A default rather than ``auto_now_add``, which would overwrite the moment the audit
    # chain hashed before the insert; nothing else sets it.
    created_at = models.DateTimeField(default=timezone.now, editable=False, blank=True)
    # NULL, not "", outside the chain: worker events and those from before it began.
    chain_previous = models.CharField(  # noqa: DJ001
        max_length=64, null=True, blank=True, editable=False
    )
    chain_hash = models.CharField(max_length=64, null=True, blank=True, editable=False)  # noqa: DJ001

    objects: ClassVar[EventQuerySet] = EventQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["id"]
        indexes = [
            # A task's timeline, in order.
            models.Index(fields=["task_id", "id"], name="event_task_idx"),
            # The audit log: operator actions by time and by actor. Partial, so the many
            # worker events (claimed, succeeded, ...) pay for none of these indexes.
            models.Index(
                fields=["created_at"],
                name="event_audit_created_idx",
                condition=Q(kind__in=sorted(OPERATOR_EVENT_KINDS)),
            ),
            # (The actor filter, a prefix in any case, ``UPPER(actor) LIKE 'OLI%'``, is
            # served by event_audit_actor_prefix_idx: PostgreSQL's only, built by
            # migration 0016 (0018 rebuilt it with two more kinds) and not declared here;
            # its kind list is this one's twin, checked by test_audit_chain.)
            # The audit chain: its head (the newest operator event) and its walk in id
            # order; the audit log's newest operator actions of one kind.
            models.Index(
                fields=["id"],
                name="event_operator_idx",
                condition=Q(kind__in=sorted(OPERATOR_EVENT_KINDS)),
            ),
            # The overview's retries, dead letters and lease expiries of the last hour:
            # rare kinds, so the index stays small beside the many routine events.
            models.Index(
                fields=["created_at"],
                name="event_trouble_idx",
                condition=Q(kind__in=["dead_lettered", "lease_expired", "retry_scheduled"]),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} task={self.task_id} step={self.step_id} by {self.actor}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding or kwargs.get("force_update") or kwargs.get("update_fields"):
            raise AppendOnlyError("events are append-only: UPDATE is refused")
        # Always an INSERT: Django would try an UPDATE first for a new instance that carries
        # an existing id, which only the PostgreSQL trigger would stop.
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError("events are append-only: DELETE belongs to retention")


class AuditCheckpointQuerySet(models.QuerySet["AuditCheckpoint"]):
    def update(self, **kwargs: Any) -> int:
        raise AppendOnlyError("audit checkpoints are append-only: UPDATE is refused")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError("audit checkpoints are append-only: DELETE is refused")


class AuditCheckpoint(models.Model):
    """Written by retention before it deletes chained events
    (``tasks_app.history.audit_verify``): the chain is sealed up to ``last_event_id``,
    whose hash was ``last_hash``; ``kept`` lists ``[id, hash]`` of the chained events up to
    there still stored (those of tasks still kept), so verification starts here.
    Append-only, like events."""

    last_event_id = models.BigIntegerField()
    last_hash = models.CharField(max_length=64)
    kept = models.JSONField(default=list, blank=True)
    # Chained events this checkpoint's prune deleted.
    pruned_count = models.PositiveIntegerField()
    created_at = models.DateTimeField(default=timezone.now, editable=False, blank=True)

    objects: ClassVar[AuditCheckpointQuerySet] = AuditCheckpointQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"audit checkpoint at event {self.last_event_id}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding or kwargs.get("force_update") or kwargs.get("update_fields"):
            raise AppendOnlyError("audit checkpoints are append-only: UPDATE is refused")
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError("audit checkpoints are append-only: DELETE is refused")
