"""Schedules as the database knows them (``tasks_app.engine.schedules``): each declared
schedule with where its ticking stands, and each slot it decided.

A schedule's row is written by ``sync_schedules`` (its declaration), the tick (its next
slot) and on-call (pause and resume); it is never deleted: a schedule removed from code is
marked removed and keeps its runs.
"""

from __future__ import annotations

from django.db import models


class StoredSchedule(models.Model):
    name = models.CharField(max_length=64, primary_key=True)
    # The declaration as code gave it at the last sync (engine.schedules.Schedule.spec).
    spec = models.JSONField()
    workflow = models.CharField(max_length=200)
    # The oldest slot not yet decided: a tick decides every slot from it up to now.
    next_slot = models.DateTimeField()
    paused_at = models.DateTimeField(null=True, blank=True)
    paused_by = models.CharField(max_length=200, blank=True)
    paused_reason = models.TextField(blank=True)
    # Set when a sync no longer finds it in code; cleared if code declares it again.
    removed_at = models.DateTimeField(null=True, blank=True)
    declared_at = models.DateTimeField()
    changed_at = models.DateTimeField()
    last_tick_at = models.DateTimeField(null=True, blank=True)
    # Every slot decided as missed, also those a long gap left unlisted.
    missed_total = models.PositiveBigIntegerField(default=0)

    class Meta:
        indexes = [
            # The tick's query: active schedules whose next slot has come.
            models.Index(
                fields=["next_slot"],
                name="schedule_due_idx",
                condition=models.Q(removed_at__isnull=True, paused_at__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"schedule {self.name}"

    @property
    def active(self) -> bool:
        return self.removed_at is None and self.paused_at is None


class RunOutcome(models.TextChoices):
    ENQUEUED = "enqueued", "Enqueued"
    MISSED = "missed", "Missed"
    # The enqueue was refused (the workflow's rules, a key taken with another payload).
    REFUSED = "refused", "Refused"
    RUN_NOW = "run_now", "Run now"


class ScheduleRun(models.Model):
    """One slot a schedule decided, or one "run now". Its references are plain columns, so
    it outlives its task's pruning."""

    schedule = models.CharField(max_length=64)
    slot = models.DateTimeField()
    outcome = models.CharField(max_length=16, choices=RunOutcome.choices)
    task_id = models.BigIntegerField(null=True, blank=True)
    decided_at = models.DateTimeField()
    decided_by = models.CharField(max_length=200)
    # Why it was missed or refused, or the reason an operator gave.
    detail = models.TextField(blank=True)

    class Meta:
        constraints = [
            # A slot is decided once; "run now" is not a slot.
            models.UniqueConstraint(
                fields=["schedule", "slot"],
                condition=~models.Q(outcome="run_now"),
                name="schedulerun_one_per_slot",
            ),
        ]
        indexes = [models.Index(fields=["schedule", "-slot"], name="schedulerun_recent_idx")]

    def __str__(self) -> str:
        return f"{self.schedule} {self.slot:%Y-%m-%d %H:%M:%S} {self.outcome}"
