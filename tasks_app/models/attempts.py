"""A step's attempts as people read them: its Lease rows, one per attempt that ended, and the
live lease of an attempt still running, which sits on the step row itself (DESIGN rule 2)."""

from __future__ import annotations

from collections.abc import Iterable

from tasks_app.models.statuses import StepStatus
from tasks_app.models.work import Lease, Step


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
