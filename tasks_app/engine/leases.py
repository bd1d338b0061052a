"""The worker's side: claim a step under a fenced lease, heartbeat, complete, fail, and
hand back the claims of a process that died (release, or end a lease now).

Worker writes carry the fencing token of their claim; a stale token changes nothing and
is recorded as ``stale_write_rejected``."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models.functions import Now

from tasks_app.access import SYSTEM
from tasks_app.db.clock import db_now, now_plus
from tasks_app.engine.dispatch import MAX_COUNTDOWN, Doorbell, ring_on_commit
from tasks_app.engine.endings import FAILED_ATTEMPT_EVENTS, finish_attempt, next_status
from tasks_app.engine.transitions import after_success, lock_task, paused_filter, release_lease
from tasks_app.engine.waiting import open_approval_step
from tasks_app.exceptions import AWAITING_VERSION
from tasks_app.history import counting
from tasks_app.history.events import event_error, record_event
from tasks_app.models import Event, EventKind, Lease, Step, StepStatus, Task, TaskStatus

# The reason of the `cancelled` event of a task whose cancel came while its step ran and
# whose step then succeeded (COMPLETE_SQL writes the same text).
CANCELLED_WHILE_RUNNING = "cancel requested while the step ran"


@dataclass(frozen=True)
class Claim:
    step_id: int
    task_id: int
    token: int
    attempt: int
    worker_id: str
    lease_seconds: int
    queue: str = "default"
    # The step (with its task) as the claim left it, when the claim read it back anyway.
    step: Step | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, step: Step, *, worker_id: str, lease_seconds: int, keep: bool = False) -> Claim:
        """The claim just taken on ``step`` (its raised token and attempt); ``keep`` holds
        on to the step itself, when it is the row as the claim left it."""
        return cls(
            step_id=step.pk,
            task_id=step.task_id,
            token=step.fencing_token,
            attempt=step.attempts,
            worker_id=worker_id,
            lease_seconds=lease_seconds,
            queue=step.queue,
            step=step if keep else None,
        )


def claim_step(step_id: int, *, worker_id: str, lease_seconds: int | None = None) -> Claim | None:
    """Claim one step if it is pending, due by the database's clock, and its queue runs.

    Returns ``None`` when there is nothing to claim: the step ran already, is not due,
    was cancelled, or its queue is paused. That is how a duplicate or late doorbell
    does nothing.
    """
    lease = lease_seconds or settings.TASKS_LEASE_SECONDS
    task_id = Step.objects.filter(pk=step_id).values_list("task_id", flat=True).first()
    if task_id is None:
        return None
    with transaction.atomic():
        # Pruned or deleted meanwhile: a late doorbell for it does nothing.
        task = Task.objects.select_for_update().filter(pk=task_id).first()
        if task is None:
            return None
        step = (
            Step.objects.select_for_update()
            .due()
            .filter(pk=step_id)
            .exclude(paused_filter())
            .first()
        )
        if step is None:
            return None
        step.status = StepStatus.RUNNING
        step.attempts += 1
        step.fencing_token += 1
        Step.objects.filter(pk=step.pk).update(
            status=step.status,
            attempts=step.attempts,
            fencing_token=step.fencing_token,
            lease_expires_at=now_plus(lease),
            started_at=Now(),
        )
        Lease.objects.create(
            step=step,
            token=step.fencing_token,
            worker_id=worker_id,
            acquired_at=Now(),
            expires_at=now_plus(lease),
        )
        if task.status != TaskStatus.RUNNING:
            task.status = TaskStatus.RUNNING
            task.save(update_fields=["status", "updated_at"])
        record_event(
            EventKind.CLAIMED,
            task_id=task.pk,
            step_id=step.pk,
            actor=f"worker:{worker_id}",
            steps=[step],
            token=step.fencing_token,
            attempt=step.attempts,
            lease_seconds=lease,
        )
        counting.add({f"{counting.CLAIMED}:{step.queue}": 1})
    return Claim.of(step, worker_id=worker_id, lease_seconds=lease)


def _held_step(claim: Claim) -> Step | None:
    """The claimed step, locked, if this claim still holds it."""
    return (
        Step.objects.select_for_update()
        .filter(pk=claim.step_id, status=StepStatus.RUNNING, fencing_token=claim.token)
        .first()
    )


def reject_stale(claim: Claim, operation: str) -> None:
    """Record a worker write refused because its claim no longer holds the step."""
    current = Step.objects.filter(pk=claim.step_id).values("status", "fencing_token").first()
    with transaction.atomic():
        record_event(
            EventKind.STALE_WRITE_REJECTED,
            task_id=claim.task_id,
            step_id=claim.step_id,
            actor=f"worker:{claim.worker_id}",
            operation=operation,
            token=claim.token,
            current_token=current["fencing_token"] if current else None,
            current_status=current["status"] if current else None,
        )


@dataclass(frozen=True)
class HeartbeatResult:
    alive: bool
    cancel_requested: bool


def heartbeat(claim: Claim, *, lease_seconds: int | None = None) -> HeartbeatResult:
    """Extend the lease of a running step; tell the worker whether to stop."""
    lease = lease_seconds or claim.lease_seconds
    with transaction.atomic():
        renewed = Step.objects.filter(
            pk=claim.step_id, status=StepStatus.RUNNING, fencing_token=claim.token
        ).update(lease_expires_at=now_plus(lease))
        if renewed:
            Lease.objects.filter(step_id=claim.step_id, token=claim.token).update(
                expires_at=now_plus(lease)
            )
            cancel = Task.objects.filter(
                pk=claim.task_id, cancel_requested_at__isnull=False
            ).exists()
            return HeartbeatResult(alive=True, cancel_requested=cancel)
    reject_stale(claim, "heartbeat")
    return HeartbeatResult(alive=False, cancel_requested=False)


def complete_step(claim: Claim, result: Any) -> bool:
    """Record a step's result and make the next step due. False if the claim is stale."""
    with transaction.atomic():
        task = lock_task(claim.task_id)
        step = _held_step(claim)
        if step is not None:
            now = db_now()
            step.status = StepStatus.SUCCEEDED
            step.result = result
            step.finished_at = now
            step.lease_expires_at = None
            step.save(update_fields=["status", "result", "finished_at", "lease_expires_at"])
            release_lease(step, claim.token, Lease.Outcome.SUCCEEDED)
            if step.started_at is not None:
                seconds = (now - step.started_at).total_seconds()
                counting.add(counting.step_seconds([seconds], task.workflow))
            due: list[Step] = []
            reached = None
            if task.cancel_requested_at is None:
                due, reached = after_success(task, step, now)
            actor = f"worker:{claim.worker_id}"
            finish_attempt(
                task,
                step,
                EventKind.SUCCEEDED,
                actor=actor,
                also=due,
                ended_by=SYSTEM,
                ending_reason=CANCELLED_WHILE_RUNNING,
                token=claim.token,
            )
            # (A task that ended here reached no approval step: a cancel stops it first.)
            if reached is not None:
                open_approval_step(task, reached, actor=actor)
            ring_on_commit([Doorbell(s.pk, s.queue) for s in due])
            return True
    reject_stale(claim, "complete")
    return False


def fail_step(
    claim: Claim,
    *,
    error_class: str,
    message: str,
    retry_in: float | None,
    reason: str,
) -> bool:
    """Record a failed attempt: retry after ``retry_in`` seconds while attempts remain,
    else dead-letter with ``reason``. ``retry_in=None`` dead-letters at once.
    """
    with transaction.atomic():
        task = lock_task(claim.task_id)
        step = _held_step(claim)
        if step is not None:
            step.last_error = message[:10_000]
            step.error_class = error_class[:200]
            step.lease_expires_at = None
            release_lease(step, claim.token, Lease.Outcome.FAILED)
            bells: list[Doorbell] = []
            step.status = next_status(task, step, may_retry=retry_in is not None)
            kind = FAILED_ATTEMPT_EVENTS[step.status]
            if step.status == StepStatus.PENDING and retry_in is not None:
                step.available_at = db_now() + timedelta(seconds=retry_in)
                if retry_in <= MAX_COUNTDOWN:
                    step.dispatched_at = step.available_at
                    bells.append(Doorbell(step.pk, step.queue, retry_in))
                else:
                    # No doorbell that far out: the sweeper rings as soon as it is due.
                    step.dispatched_at = None
            else:
                step.finished_at = db_now()
                if step.status == StepStatus.DEAD and retry_in is not None:
                    reason = "max_attempts"
            step.save()
            worker = f"worker:{claim.worker_id}"
            # Its own event is the task's ending (cancelled, dead_lettered) when it ends it.
            finish_attempt(
                task,
                step,
                kind,
                actor=worker,
                reason=reason if kind == EventKind.DEAD_LETTERED else "",
                ended_by=worker,
                ending_reason=reason,
                token=claim.token,
                error_class=step.error_class,
                error=event_error(step.last_error),
                retry_in=retry_in if kind == EventKind.RETRY_SCHEDULED else None,
            )
            ring_on_commit(bells)
            return True
    reject_stale(claim, "fail")
    return False


def release_claim(
    claim: Claim,
    *,
    actor: str,
    reason: str,
    retry_in: float = 0,
    error: tuple[str, str] | None = None,
    **data: Any,
) -> bool:
    """Hand a claimed step back without charging its attempt: its worker stopped holding it
    for no fault of the step (the process died running another step of the same batch).

    Fenced like every worker write: only a claim whose token still holds the step is
    released; otherwise its worker recorded the outcome before it went, and nothing
    changes (False, and no event: the one writing here is not that worker). The step is
    due again at once, with the attempts it had before the claim and the same fencing
    token, or cancelled if a cancel was requested meanwhile; ``claim_released`` records it
    (with ``data``, such as whether the handler had run) and its doorbell rings. With
    ``retry_in`` it is due that many seconds later instead; ``error`` (class, message) says
    on the step why it waits.
    """
    with transaction.atomic():
        task = lock_task(claim.task_id)
        step = _held_step(claim)
        if step is None:
            return False
        release_lease(step, claim.token, Lease.Outcome.RELEASED)
        now = db_now()
        step.lease_expires_at = None
        # The claim raised the attempts by one; the token stays raised (it never goes back).
        step.attempts = max(step.attempts - 1, 0)
        if task.cancel_requested_at is not None:
            step.status, outcome = StepStatus.CANCELLED, "cancelled"
            step.finished_at = now
        else:
            step.status, outcome = StepStatus.PENDING, "pending"
            step.dispatched_at = now
            step.available_at = now + timedelta(seconds=retry_in)
        fields = ["status", "attempts", "lease_expires_at", "finished_at"]
        fields += ["available_at", "dispatched_at"]
        if error is not None:
            step.error_class, step.last_error = error
            fields += ["error_class", "last_error"]
        step.save(update_fields=fields)
        finish_attempt(
            task,
            step,
            EventKind.CLAIM_RELEASED,
            actor=actor,
            reason=reason,
            ended_by=SYSTEM,
            ending_reason="cancel requested while the step was claimed; its claim was released",
            token=claim.token,
            outcome=outcome,
            **data,
        )
        if step.status != StepStatus.CANCELLED:
            ring_on_commit([Doorbell(step.pk, step.queue, countdown=retry_in)])
    return True


def awaiting_version_since(task_id: int, step_id: int) -> datetime | None:
    """When a worker first handed the step back for want of its workflow, version or step
    kind (the oldest such ``claim_released`` since the step was last redriven or resolved
    to run again), by the database's clock; or None. Read through the task's events in the
    order they were written (``event_task_idx``): their ``created_at`` is the writing
    process's clock, so the hand-back's ``waiting_since`` (the database's) is read instead."""
    events = Event.objects.filter(task_id=task_id)
    # A redrive (or a resolve to run again) is the task's event; the steps it made runnable
    # are in its data.
    last_run = (
        events.filter(
            kind__in=[EventKind.REDRIVEN, EventKind.RESOLVED], data__steps__has_key=str(step_id)
        )
        .order_by("-pk")
        .values_list("pk", flat=True)
        .first()
    )
    waits = events.filter(step_id=step_id, kind=EventKind.CLAIM_RELEASED, reason=AWAITING_VERSION)
    if last_run is not None:
        waits = waits.filter(pk__gt=last_run)
    first = waits.order_by("pk").values_list("created_at", "data").first()
    if first is None:
        return None
    created_at, data = first
    since = (data or {}).get("waiting_since")
    return datetime.fromisoformat(since) if isinstance(since, str) else created_at


def expire_lease_now(claim: Claim) -> bool:
    """End a claim's lease now, for a worker known to be gone: the sweeper reaps the step
    at its next sweep (``lease_expired``, the attempt charged) instead of after the rest of
    the lease. Fenced by the claim's token; False when it no longer holds the step."""
    with transaction.atomic():
        ended = Step.objects.filter(
            pk=claim.step_id, status=StepStatus.RUNNING, fencing_token=claim.token
        ).update(lease_expires_at=Now())
        if ended:
            Lease.objects.filter(step_id=claim.step_id, token=claim.token).update(expires_at=Now())
    return bool(ended)
