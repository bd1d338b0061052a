"""An attempt's record: the Lease row written once, when the attempt ends, from the live lease
the claim put on its step (DESIGN rules 2 and 11)."""

from __future__ import annotations

from datetime import datetime

from tasks_app.models import Lease, Step


def close_lease(step: Step, token: int, outcome: str, now: datetime) -> None:
    """Record the attempt of ``token`` (the step's live lease) as ended at ``now`` with its
    ``outcome``: one Lease row. A lease an earlier release opened as a row at its claim is
    closed instead. The batch completion's SQL (``sql.COMPLETE_SQL``) is the twin."""
    if step.fencing_token != token or step.started_at is None:
        return  # not the step's live lease: nothing of it to record
    Lease.objects.bulk_create(
        [
            Lease(
                step=step,
                token=token,
                attempt=step.attempts,
                worker_id=step.lease_worker,
                acquired_at=step.started_at,
                expires_at=step.lease_expires_at or now,
                released_at=now,
                outcome=outcome,
            )
        ],
        update_conflicts=True,
        unique_fields=["step", "token"],
        update_fields=["released_at", "outcome", "attempt"],
    )
