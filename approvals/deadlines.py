"""What happens to an open request as time passes, run by the sweeper: a reminder before it
expires, escalation to a second group, expiry itself, and the approvers' digest. Each reads
the database clock and touches a request once: the request row records that it was
reminded, escalated or expired, under its task's lock."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now

from approvals import notices
from approvals.models import ApprovalRequest, ApprovalStatus, ExpiryPolicy
from tasks_app import services as core
from tasks_app.models import EventKind, StepStatus


def remind_due(limit: int = 500) -> int:
    """Remind the approvers of each open request whose reminder is due; once each."""
    return _each_due(Q(remind_at__lte=Now(), reminded_at__isnull=True), _remind, limit)


def escalate_due(limit: int = 500) -> int:
    """Open each request undecided at its escalation time to its second group too: marked
    so, recorded on its task's timeline, and the second group told."""
    return _each_due(Q(escalates_at__lte=Now(), escalated_at__isnull=True), _escalate, limit)


def _each_due(due: Q, act: Callable[[ApprovalRequest], None], limit: int) -> int:
    pending = ApprovalRequest.objects.filter(due, status=ApprovalStatus.PENDING)
    done = 0
    for pk, task_id in pending.order_by("id").values_list("pk", "task_id")[:limit]:
        with transaction.atomic():
            # Never waits on a task someone is deciding: the next sweep comes back to it.
            task = core.try_lock_task(task_id)
            if task is None:
                continue
            request = (
                ApprovalRequest.objects.select_for_update()
                .select_related("task")
                .filter(due, pk=pk, status=ApprovalStatus.PENDING)
                .first()
            )
            if request is None:
                continue
            act(request)
            done += 1
    return done


def _remind(request: ApprovalRequest) -> None:
    request.reminded_at = core.db_now()
    request.save(update_fields=["reminded_at"])
    notices.schedule(request, "reminder")  # to those who have not approved it yet


def _escalate(request: ApprovalRequest) -> None:
    request.escalated_at = core.db_now()
    request.save(update_fields=["escalated_at"])
    core.record_event(
        EventKind.APPROVAL_ESCALATED,
        task_id=request.task_id,
        step_id=request.step_id,
        actor=core.SWEEPER,
        reason=f"undecided since {request.created_at.isoformat()}",
        task_status=request.task.status,
        request=request.pk,
        escalate_to=request.escalate_to,
    )
    notices.schedule(request, "escalated")


def expire_due(limit: int = 500) -> int:
    """Apply the expiry policy to pending requests past their time (database clock):
    ``cancel`` cancels the task, ``dead_letter`` makes the approval step dead for on-call."""
    due = list(
        ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING, expires_at__lte=Now())
        .order_by("expires_at")
        .values_list("pk", "task_id")[:limit]
    )
    expired = 0
    for pk, task_id in due:
        with transaction.atomic():
            # The sweeper never waits on a row someone holds: a task or request being
            # decided right now is expired (or not) at the next sweep.
            task = core.try_lock_task(task_id)
            if task is None:
                continue
            # Re-checked under the lock: it may have been decided meanwhile.
            request = (
                ApprovalRequest.objects.select_for_update(skip_locked=True)
                .filter(pk=pk, status=ApprovalStatus.PENDING, expires_at__lte=Now())
                .first()
            )
            if request is None:
                continue
            request.status = ApprovalStatus.EXPIRED
            request.decided_by = core.SWEEPER
            request.decided_at = core.db_now()
            request.save(update_fields=["status", "decided_by", "decided_at"])
            dead = request.on_expiry == ExpiryPolicy.DEAD_LETTER
            core.close_approval_step(
                task,
                request.step_id,
                step_status=StepStatus.DEAD if dead else StepStatus.CANCELLED,
                event_kind=EventKind.APPROVAL_EXPIRED,
                actor=core.SWEEPER,
                reason="approval_expired",
                error=f"approval #{request.pk} expired at {request.expires_at.isoformat()} "
                "without a decision",
                request=request.pk,
                revision=request.revision,
                policy=request.on_expiry,
            )
            expired += 1
    return expired


def digest_due(limit: int = 500) -> int:
    """With ``APPROVALS_MAIL_DIGEST``: once per digest window, a digest for everyone an
    open request waits for (the notice's key is the window's start, so each window sends
    one). Returns 1 when a window's digest was enqueued now, else 0."""
    if not settings.APPROVALS_MAIL_DIGEST:
        return 0
    window = digest_window(core.db_now())
    key = f"approvals:digest:{window}"
    if core.get_task(idempotency_key=key) is not None:
        return 0
    to: set[str] = set()
    for request in ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING).select_related(
        "task"
    )[:limit]:
        to.update(notices.recipients(request, "opened"))
    if not to:
        return 0
    notices.schedule_digest(window, sorted(to))
    return 1


def digest_window(now: datetime) -> str:
    """The start of the digest window ``now`` falls in (UTC, ISO 8601)."""
    size = timedelta(minutes=settings.APPROVALS_DIGEST_MINUTES)
    epoch = datetime(2000, 1, 1, tzinfo=UTC)
    start = epoch + ((now - epoch) // size) * size
    return start.isoformat()
