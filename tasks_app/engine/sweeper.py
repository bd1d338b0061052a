"""The sweeper: reap expired leases, ring again for due steps whose doorbell was lost,
prune history past its retention, and run the periodic jobs other apps register."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, transaction
from django.db.models import Q
from django.db.models.functions import Now

from tasks_app.access import SWEEPER
from tasks_app.db.clock import db_now
from tasks_app.db.lock_conflicts import is_lock_conflict, lock_wait
from tasks_app.engine import presence
from tasks_app.engine.dispatch import Doorbell, ring_on_commit
from tasks_app.engine.endings import Ending
from tasks_app.engine.states import end_attempt
from tasks_app.engine.transitions import paused_filter, try_lock_task
from tasks_app.exceptions import LEASE_EXPIRED, UNDECODABLE_PAYLOAD
from tasks_app.models import EventKind, Lease, Step, StepStatus
from tasks_app.models.json_columns import first_undecodable

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepReport:
    reaped: int
    redispatched: int
    # What the jobs other apps registered did (name -> count), e.g. expired approvals.
    jobs: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, int]:
        return {"reaped": self.reaped, "redispatched": self.redispatched, **self.jobs}


SweepJob = Callable[[int], int]


_sweep_jobs: dict[str, SweepJob] = {}


def register_sweep_job(name: str, job: SweepJob) -> None:
    """Have the sweeper also run ``job(limit)`` (returning how many rows it handled); an
    app building on the core registers its periodic work here, as approvals does for
    expiry."""
    _sweep_jobs[name] = job


def sweep(*, limit: int = 500) -> SweepReport:
    """One sweep: reap, ring again, then the registered jobs.

    The sweeper never waits on a row another transaction holds (``tasks_app.db.lock_conflicts``):
    it skips such rows and comes back to them next time, and each part runs under
    ``TASKS_SWEEPER_LOCK_TIMEOUT_MS``, so one part stopped by a held lock leaves the others
    to run. A part that fails on anything but the database (a row it cannot process) is
    logged and leaves the others to run too; a part that fails on the database (gone)
    fails the sweep.
    """
    with lock_wait(settings.TASKS_SWEEPER_LOCK_TIMEOUT_MS):
        reaped = _part("reap", reap_expired_leases, limit)
        redispatched = _part("redispatch", redispatch_due, limit)
        jobs = {name: _part(name, job, limit) for name, job in list(_sweep_jobs.items())}
    report = SweepReport(reaped=reaped, redispatched=redispatched, jobs=jobs)
    # What readiness asks about: the sweeper is running and reaches the database.
    presence.sweeper_ran()
    return report


def _part(name: str, work: SweepJob, limit: int) -> int:
    try:
        return work(limit)
    except DatabaseError as exc:
        if not is_lock_conflict(exc):
            raise
        logger.warning("sweep: %s waited too long for a lock (%s); next sweep", name, exc)
        return 0
    except Exception:
        # One row a part cannot process (a value no decoder reads) must not stop the
        # sweeper for everyone: the other parts run, and this one runs again next sweep.
        logger.exception("sweep: %s failed; the other parts run, and it again next sweep", name)
        return 0


def reap_expired_leases(limit: int = 500) -> int:
    """Return steps whose lease ran out (by the database's clock) to pending, or dead-letter
    them when their attempts are spent. Either way the step records ``LEASE_EXPIRED`` as
    its error: a pending one is then claimed in a batch of its own, so if it kills the
    process running it, it takes no other step's attempt along. A task or step another
    transaction holds is left for the next sweep."""
    expired = list(
        Step.objects.filter(status=StepStatus.RUNNING, lease_expires_at__lt=Now())
        .order_by("lease_expires_at")
        .values_list("pk", "task_id", "fencing_token")[:limit]
    )
    reaped = 0
    for step_id, task_id, token in expired:
        try:
            reaped += _reap(step_id, task_id, token)
        except DatabaseError:
            raise
        except Exception:
            # A row that cannot be processed is skipped, by id, in this sweep (it has
            # rolled back): the other expired leases are still reaped.
            logger.exception("sweep: step %s could not be reaped; left for the next sweep", step_id)
    return reaped


def _reap(step_id: int, task_id: int, token: int) -> int:
    """Reap one expired lease (1), or leave it (0) when its task or step is held or it is
    no longer expired. A step whose payload or change request cannot be decoded
    (``models.json_columns``) is dead-lettered as ``undecodable_payload``, not tried again:
    no attempt could read it."""
    with transaction.atomic():
        task = try_lock_task(task_id)
        if task is None:
            return 0
        # Re-checked under the lock: the worker may have finished or renewed meanwhile.
        step = (
            Step.objects.select_for_update(skip_locked=True)
            .filter(
                pk=step_id,
                status=StepStatus.RUNNING,
                fencing_token=token,
                lease_expires_at__lt=Now(),
            )
            .first()
        )
        if step is None:
            return 0
        unreadable = first_undecodable(
            {
                f"payload of task {task.pk}": task.payload,
                f"change request of step {step.pk}": step.change_request,
            }
        )
        expired = f"lease of token {token} expired on attempt {step.attempts}"
        cause = LEASE_EXPIRED if unreadable is None else UNDECODABLE_PAYLOAD
        _, _, bells = end_attempt(
            task,
            step,
            Ending(
                EventKind.LEASE_EXPIRED,
                actor=SWEEPER,
                lease=Lease.Outcome.EXPIRED,
                token=token,
                # An unreadable step is not tried again: no attempt could read it.
                retry_in=0 if unreadable is None else None,
                error=(cause, expired if unreadable is None else f"{unreadable}; {expired}"),
                error_when_cancelled=False,
                ended_by=SWEEPER,
                ending_reason=cause,
                cancelled_reason="cancel requested while the step ran; its lease expired",
            ),
        )
        ring_on_commit(bells)
        return 1


def redispatch_due(limit: int = 500) -> int:
    """Ring again for due steps whose doorbell may have been lost.

    A step is rung at most once per ``TASKS_REDISPATCH_SECONDS`` (``dispatched_at``), and
    at most ``limit`` per sweep, so a broker outage does not turn into a flood. The rows
    are locked as they are chosen, skipping any another transaction holds (a worker
    completing it, a person acting on it): the sweeper never waits on them, so it cannot
    deadlock with a completion, and the lock re-checks that each is still due.
    """
    interval = timedelta(seconds=settings.TASKS_REDISPATCH_SECONDS)
    with transaction.atomic():
        now = db_now()
        due = list(
            Step.objects.due(now)
            .filter(Q(dispatched_at=None) | Q(dispatched_at__lte=now - interval))
            .exclude(paused_filter())
            .select_for_update(skip_locked=True, of=("self",))
            .order_by("-priority", "available_at")
            .values_list("pk", "queue")[:limit]
        )
        if not due:
            return 0
        Step.objects.filter(pk__in=[pk for pk, _ in due]).update(dispatched_at=now)
        ring_on_commit([Doorbell(pk, queue) for pk, queue in due])
    return len(due)
