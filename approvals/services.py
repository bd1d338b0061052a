"""Deciding approval requests, and expiring them (DESIGN rule 9 and §3).

Each decision, in one transaction with the task row locked first (the core's lock order):

1. checks the actor: the decide permission, the request's approver list (superusers skip
   it), and that the actor did not enqueue the task (superusers included);
2. refuses a request already decided (:class:`AlreadyDecided`, naming who decided);
3. re-validates the current state: the task is not cancelled, the request has not
   expired, the hash the decider saw is the request's, and the request's draft is still
   the latest draft (:class:`StaleApproval` otherwise);
4. records the decision on the request and settles the step through the core, which
   writes the decision's Event with the actor.

String actors (``"cli:alice"``) are trusted callers and skip the permission and list
checks, but not the check on deciding one's own task. A decision without an actor is
refused: it must say who made it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.db.models.functions import Now
from django.dispatch import receiver

from tasks_app import services as core
from tasks_app.exceptions import (
    AlreadyDecided,
    ApprovalExpired,
    InvalidInput,
    InvalidTransition,
    NotPermitted,
    StaleApproval,
)
from tasks_app.models import EventKind, Step, StepStatus, Task, TaskStatus
from tasks_app.services import Actor
from tasks_app.signals import steps_cancelled
from tasks_app.validation import require_text

from .models import ApprovalRequest, ApprovalStatus, ExpiryPolicy
from .steps import draft_hash as hash_of

DECIDE_PERMISSION = "approvals.decide_approvalrequest"


def approve(
    request: ApprovalRequest, *, actor: Actor, comment: str = "", draft_hash: str | None = None
) -> ApprovalRequest:
    """Let the task go on: the approval step succeeds and the next step is due."""
    return _decide(request, ApprovalStatus.APPROVED, actor, comment or "", draft_hash)


def reject(
    request: ApprovalRequest, *, actor: Actor, comment: str, draft_hash: str | None = None
) -> ApprovalRequest:
    """Stop the task: it ends cancelled. A comment is required."""
    comment = require_text(comment, "comment")
    return _decide(request, ApprovalStatus.REJECTED, actor, comment, draft_hash)


def request_changes(
    request: ApprovalRequest, *, actor: Actor, comment: str, draft_hash: str | None = None
) -> ApprovalRequest:
    """Send the draft back: a new revision of the drafting step runs with the comment,
    then a new request replaces this one. A comment is required."""
    comment = require_text(comment, "comment")
    return _decide(request, ApprovalStatus.CHANGES_REQUESTED, actor, comment, draft_hash)


def _decide(
    request: ApprovalRequest,
    verdict: ApprovalStatus,
    actor: Actor,
    comment: str,
    draft_hash: str | None,
) -> ApprovalRequest:
    _check_actor(actor)
    with transaction.atomic():
        task = core.lock_task(request.task_id)
        locked = ApprovalRequest.objects.select_for_update().get(pk=request.pk)
        refused = decide_refusal(locked, actor, task)
        if refused is not None:
            raise NotPermitted(refused)
        if locked.status != ApprovalStatus.PENDING:
            raise AlreadyDecided(
                f"approval #{locked.pk} was already {locked.get_status_display().lower()} "
                f"by {locked.decided_by or 'nobody'}"
                + (f" at {locked.decided_at:%Y-%m-%d %H:%M:%S %Z}" if locked.decided_at else ""),
                decided_by=locked.decided_by,
                status=locked.status,
            )
        _revalidate(locked, task, draft_hash)

        name, user_id = core.actor_fields(actor)
        locked.status = verdict
        locked.decided_by = name
        locked.decided_by_user_id = user_id
        locked.decided_at = core.db_now()
        locked.comment = comment
        locked.save(
            update_fields=["status", "decided_by", "decided_by_user", "decided_at", "comment"]
        )
        facts: dict[str, Any] = {"request": locked.pk, "draft_hash": locked.draft_hash}
        if verdict == ApprovalStatus.CHANGES_REQUESTED:
            core.revise(
                task,
                locked.step_id,
                back_to=locked.send_back_to,
                actor=actor,
                reason=comment,
                change_request={
                    "comment": comment,
                    "by": name,
                    "request": locked.pk,
                    "previous_draft": locked.draft,
                },
                **facts,
            )
        else:
            approved = verdict == ApprovalStatus.APPROVED
            core.close_approval_step(
                task,
                locked.step_id,
                step_status=StepStatus.SUCCEEDED if approved else StepStatus.CANCELLED,
                event_kind=EventKind.APPROVED if approved else EventKind.REJECTED,
                actor=actor,
                reason=comment,
                # What the steps after the review read: who approved which draft.
                result={
                    "approved_by": name,
                    "request": locked.pk,
                    "revision": locked.revision,
                    "draft_hash": locked.draft_hash,
                    "comment": comment,
                }
                if approved
                else None,
                revision=locked.revision,
                **facts,
            )
    return locked


def decide_refusal(request: ApprovalRequest, actor: Actor, task: Task | None = None) -> str | None:
    """Why ``actor`` may not decide ``request``, or ``None`` when they may.

    The same rules the decisions apply, for pages and lists to offer only what will be
    accepted: the decide permission, not the task's author (superusers included), and a
    place on the approver list (superusers skip it). Says nothing of the request's state.
    """
    if actor is None or (isinstance(actor, str) and not actor.strip()):
        return "a decision needs a user or a name"
    if not isinstance(actor, str) and (refused := _refused_permission(actor)) is not None:
        return refused
    task = task or request.task
    if _enqueued_by(task, actor):
        return f"you enqueued task #{task.pk}: someone else must decide on it"
    if isinstance(actor, str) or actor.is_superuser:
        return None
    group, users = request.approver_group, request.approver_users or []
    if not group and not users:
        return None
    if actor.get_username() in users:
        return None
    if group and actor.groups.filter(name=group).exists():
        return None
    allowed = " or ".join(
        part for part in (f"group {group}" if group else "", ", ".join(users)) if part
    )
    return f"approval #{request.pk} may be decided by {allowed}"


def may_decide(request: ApprovalRequest, actor: Actor, task: Task | None = None) -> bool:
    """Whether ``actor`` may decide ``request`` (:func:`decide_refusal` says why not)."""
    return decide_refusal(request, actor, task) is None


def _check_actor(actor: Actor) -> None:
    """Before anything is locked: a decision names who made it, and a user needs the
    decide permission."""
    if actor is None or (isinstance(actor, str) and not actor.strip()):
        raise InvalidInput("actor", "required", "actor: a decision needs a user or a name")
    if not isinstance(actor, str) and (refused := _refused_permission(actor)) is not None:
        raise NotPermitted(refused)


def _refused_permission(user: Any) -> str | None:
    if not user.is_authenticated or not user.has_perm(DECIDE_PERMISSION):
        return "deciding approvals needs the decide permission (group editors)"
    return None


def _enqueued_by(task: Task, actor: Actor) -> bool:
    """Whether ``actor`` enqueued ``task``: the same user, or the same name once a trusted
    caller's channel is set aside (``"cli:alice"`` is alice, both ways)."""
    name, user_id = core.actor_fields(actor)
    if user_id is not None and task.created_by_user_id == user_id:
        return True
    return _bare(task.created_by) == _bare(name)


def _bare(name: str) -> str:
    return name.rsplit(":", 1)[-1]


def _revalidate(request: ApprovalRequest, task: Task, seen_hash: str | None) -> None:
    if task.status == TaskStatus.CANCELLED or task.cancel_requested_at is not None:
        raise InvalidTransition(f"task #{task.pk} was cancelled")
    if request.expires_at <= core.db_now():
        raise ApprovalExpired(
            f"approval #{request.pk} expired at {request.expires_at:%Y-%m-%d %H:%M %Z}"
        )
    if seen_hash is not None and seen_hash != request.draft_hash:
        raise StaleApproval(
            f"approval #{request.pk}: the draft you reviewed ({seen_hash[:12]}) is not the "
            f"draft under review ({request.draft_hash[:12]}); reload it"
        )
    latest = (
        Step.objects.filter(task=task, kind=request.draft_step)
        .exclude(status=StepStatus.SUPERSEDED)
        .order_by("-revision")
        .values_list("status", "result")
        .first()
    )
    if (
        latest is None
        or latest[0] != StepStatus.SUCCEEDED
        or hash_of(latest[1]) != request.draft_hash
    ):
        raise StaleApproval(
            f"approval #{request.pk}: its draft is no longer the latest draft of task #{task.pk}"
        )


# --- expiry, run by the sweeper -------------------------------------------------------------


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


def close_open_requests(steps: Iterable[Step], *, actor: Actor, reason: str) -> int:
    """Close the pending requests of steps that were just cancelled, in the caller's
    transaction: status ``cancelled``, decided by whoever cancelled, with their reason."""
    name, user_id = core.actor_fields(actor)
    return ApprovalRequest.objects.filter(
        step_id__in=[step.pk for step in steps], status=ApprovalStatus.PENDING
    ).update(
        status=ApprovalStatus.CANCELLED,
        decided_by=name,
        decided_by_user_id=user_id,
        decided_at=core.db_now(),
        comment=reason,
    )


@receiver(steps_cancelled, sender=Task, dispatch_uid="approvals.close_cancelled_requests")
def _on_steps_cancelled(
    sender: Any, *, steps: list[Step], actor: Actor, reason: str, **kwargs: Any
) -> None:
    close_open_requests(steps, actor=actor, reason=reason)
