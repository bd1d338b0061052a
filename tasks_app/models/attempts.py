"""A step's attempts: the Lease model, one row per attempt that ended, and the attempts as
people read them, those rows and the live lease of an attempt still running, which sits on
the step row itself (DESIGN rule 2)."""

from __future__ import annotations

from collections.abc import Iterable

from django.db import models

from tasks_app.models.statuses import StepStatus
from tasks_app.models.work import Step


class Lease(models.Model):
    """One attempt of a step: written when the attempt ends, with how it ended (the lease of
    an attempt still running is the step's own: :func:`leases_of` reads both)."""

    class Outcome(models.TextChoices):
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        EXPIRED = "expired"
        CANCELLED = "cancelled"
        # Handed back unfinished, without charging the attempt (leases.release_claim).
        RELEASED = "released"

    # No index of its own: the (step, token) constraint leads with step.
    step = models.ForeignKey(Step, on_delete=models.CASCADE, related_name="leases", db_index=False)
    token = models.PositiveBigIntegerField()
    # The step's attempt count under this lease (its claim's ``attempt``); 0 on rows written
    # before it was kept, whose claims have events of their own.
    attempt = models.IntegerField(default=0, db_default=0)
    worker_id = models.CharField(max_length=200)
    acquired_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    released_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=20, choices=Outcome.choices, blank=True)

    class Meta:
        ordering = ["step_id", "token"]
        # Only the (step, token) constraint and the key: renewing and releasing a lease
        # change no indexed column, so on PostgreSQL they are heap-only updates, kept in
        # the row's page by the table's fillfactor (migration 0007).
        constraints = [
            models.UniqueConstraint(fields=["step", "token"], name="lease_step_token"),
        ]

    def __str__(self) -> str:
        return f"lease {self.token} of step {self.step_id} by {self.worker_id}"


def leases_of(steps: Iterable[Step]) -> dict[int, list[Lease]]:
    """The attempts of ``steps`` by step id, oldest first: the Lease rows, then for a step
    running its live lease (unsaved, not released), unless a row records it already (one an
    earlier release opened at the claim)."""
    steps = list(steps)
    attempts: dict[int, list[Lease]] = {step.pk: [] for step in steps}
    for lease in Lease.objects.filter(step__in=[step.pk for step in steps]).order_by(
        "step_id", "token"
    ):
        attempts[lease.step_id].append(lease)
    for step in steps:
        if step.status != StepStatus.RUNNING or step.started_at is None:
            continue
        if any(lease.token == step.fencing_token for lease in attempts[step.pk]):
            continue
        live = Lease(
            step=step,
            token=step.fencing_token,
            attempt=step.attempts,
            worker_id=step.lease_worker,
            acquired_at=step.started_at,
            expires_at=step.lease_expires_at or step.started_at,
            released_at=None,
            outcome="",
        )
        attempts[step.pk].append(live)
    return attempts
