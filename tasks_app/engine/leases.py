"""The worker's side: claim a step under a fenced lease, heartbeat, complete, fail, and
hand back the claims of a process that died (release, or end a lease now).

Worker writes carry the fencing token of their claim; a stale token changes nothing and
is recorded as ``stale_write_rejected``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models.functions import Now

from tasks_app.db import rows
from tasks_app.db.clock import now_plus
from tasks_app.engine.dispatch import ring_on_commit
from tasks_app.engine.endings import Ending
from tasks_app.engine.sql import STEP_COLUMNS, TASK_COLUMNS
from tasks_app.engine.states import end_attempt, start_attempt
from tasks_app.engine.transitions import lock_task, paused_filter
from tasks_app.engine.waiting import open_approval_step
from tasks_app.exceptions import AWAITING_VERSION
from tasks_app.history import counting
from tasks_app.history.events import record_event
from tasks_app.models import Event, EventKind, Lease, Step, StepStatus, Task

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
        # A step under limits is claimed as they let it (limited_claims), never here.
        step = (
            Step.objects.select_for_update()
            .due()
            .filter(pk=step_id, limit_turn__isnull=True)
            .exclude(paused_filter())
            .first()
        )
        if step is None:
            return None
        # No event: the attempt's record (its live lease, then its Lease row) records the
        # claim (history.timeline).
        start_attempt(step, worker_id=worker_id, lease_seconds=lease)
        counting.add({f"{counting.CLAIMED}:{step.queue}": 1})
    return Claim.of(step, worker_id=worker_id, lease_seconds=lease)


def _held(claim: Claim) -> tuple[Task, Step | None]:
    """The claim's task, locked first as every transition does, and its step, locked, if
    this claim still holds it."""
    task = lock_task(claim.task_id)
    step = (
        Step.objects.select_for_update()
        .filter(pk=claim.step_id, status=StepStatus.RUNNING, fencing_token=claim.token)
        .first()
    )
    return task, step


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
            cancel = Task.objects.filter(
                pk=claim.task_id, cancel_requested_at__isnull=False
            ).exists()
            return HeartbeatResult(alive=True, cancel_requested=cancel)
    reject_stale(claim, "heartbeat")
    return HeartbeatResult(alive=False, cancel_requested=False)


def complete_step(claim: Claim, result: Any) -> bool:
    """Record a step's result and make the next step due. False if the claim is stale."""
    return _end(
        claim,
        "complete",
        Ending(
            EventKind.SUCCEEDED,
            actor=f"worker:{claim.worker_id}",
            lease=Lease.Outcome.SUCCEEDED,
            token=claim.token,
            status=StepStatus.SUCCEEDED,
            result=result,
            ending_reason=CANCELLED_WHILE_RUNNING,
        ),
    )


def _end(claim: Claim, operation: str, ending: Ending) -> bool:
    """End the attempt of ``claim`` as ``ending`` says, if the claim still holds its step
    (:func:`states.end_attempt`); then open the approval step a success reached and ring
    for what became due. Else record the stale write (``operation``) and return False."""
    with transaction.atomic():
        task, step = _held(claim)
        if step is not None:
            _, reached, bells = end_attempt(task, step, ending)
            # (A task that ended here reached no approval step: a cancel stops it first.)
            for approval in reached:
                open_approval_step(task, approval, actor=ending.actor)
            ring_on_commit(bells)
            return True
    reject_stale(claim, operation)
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
    worker = f"worker:{claim.worker_id}"
    return _end(
        claim,
        "fail",
        Ending(
            None,
            actor=worker,
            lease=Lease.Outcome.FAILED,
            token=claim.token,
            retry_in=retry_in,
            error=(error_class, message),
            reason=reason,
            ended_by=worker,
        ),
    )


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
        task, step = _held(claim)
        if step is None:
            return False
        _, _, bells = end_attempt(
            task,
            step,
            Ending(
                EventKind.CLAIM_RELEASED,
                actor=actor,
                lease=Lease.Outcome.RELEASED,
                token=claim.token,
                handed_back=True,
                retry_in=retry_in,
                error=error,
                reason=reason,
                ending_reason="cancel requested while the step was claimed; its claim was released",
                data=data,
            ),
        )
        ring_on_commit(bells)
    return True


def awaiting_version_since(task_id: int, step_id: int) -> datetime | None:
    """When a worker first handed the step back for want of its workflow, version or step
    kind (the oldest such ``claim_released`` since the step was last redriven or resolved
    to run again), by the database's clock; or None. Read through the task's events in the
    order they were written (``event_task_idx``): the hand-back's ``waiting_since`` is read,
    as events written before they were stamped by the database's clock carry the writing
    process's in ``created_at``."""
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
    return bool(ended)


def claimed_steps(claimed: Sequence[Sequence[Any]]) -> list[Step]:
    """The steps a claim statement returned (``STEP_COLUMNS`` then ``TASK_COLUMNS``), each
    with its task, as model rows built without reading them again."""
    steps = []
    for row in claimed:
        step = rows.from_row(Step, STEP_COLUMNS, row[: len(STEP_COLUMNS)])
        # What `step.task = task` does, without the descriptor's checks.
        _STEP_TASK.set_cached_value(
            step, rows.from_row(Task, TASK_COLUMNS, row[len(STEP_COLUMNS) :])
        )
        steps.append(step)
    return steps


_STEP_TASK = Step._meta.get_field("task")
