"""Deciding approval requests (approving, with a quorum; rejecting; sending back; an
editor's own edit), and closing those of a cancelled task (DESIGN rule 9 and §3). What
time does to a request (expiry, reminders, escalation) is ``approvals.deadlines``.

Each decision, in one transaction with the task row locked first (the core's lock order):

1. checks the actor: the decide permission, the request's approver list (superusers skip
   it), and that the actor did not enqueue the task (superusers included);
2. refuses a request already decided (:class:`AlreadyDecided`, naming who decided);
3. re-validates the current state: the task is not cancelled, the request has not
   expired, the hash the decider saw is the request's, and the request's draft is still
   the latest draft (:class:`StaleApproval` otherwise);
4. records the decision on the request and closes the step through the core, which
   writes the decision's Event with the actor.

String actors (``"cli:alice"``) are trusted callers and skip the permission and list
checks, but not the check on deciding one's own task. A decision without an actor is
refused: it must say who made it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.dispatch import receiver

from approvals.models import ApprovalRequest, ApprovalStatus, ApprovalVote, decision_text
from approvals.people import enqueued, same_person, wrote_draft
from approvals.steps import draft_hash as hash_of
from approvals.steps import handler_of
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


def edit_draft(
    request: ApprovalRequest,
    *,
    actor: Actor,
    changes: dict[str, Any],
    comment: str = "",
    draft_hash: str | None = None,
) -> ApprovalRequest | None:
    """An editor's own revision of the draft under review: the fields in ``changes``
    replace the draft's, checked by the workflow's rules for a draft; the request closes as
    ``edited`` and the task goes on from the edited draft, as a new revision written by
    the editor. Returns the request for the edited revision (None when steps run before its
    approval step opens again). The same people may edit as may decide; the draft they
    edited must be the one under review (``draft_hash``).
    """
    _check_actor(actor)
    comment = (comment or "").strip()
    with transaction.atomic():
        task = core.lock_task(request.task_id)
        locked = (ApprovalRequest.objects.select_for_update().select_related("task", "step")).get(
            pk=request.pk
        )
        _check_pending(locked, actor, task)
        _revalidate(locked, task, draft_hash)
        edited, fields = _edited_draft(locked, changes)
        name = _close(locked, ApprovalStatus.EDITED, actor, comment)
        new_hash = hash_of(edited)
        core.replace_draft(
            task,
            locked.step_id,
            draft_from=locked.draft_step,
            draft=edited,
            actor=actor,
            reason=comment,
            request=locked.pk,
            draft_hash=locked.draft_hash,
            edited_hash=new_hash,
            fields=fields,
        )
        successor = ApprovalRequest.objects.filter(
            task=task, status=ApprovalStatus.PENDING, draft_hash=new_hash
        ).first()
        if successor is not None:
            successor.draft_author = name
            successor.save(update_fields=["draft_author"])
    return successor


def _edited_draft(request: ApprovalRequest, changes: dict[str, Any]) -> tuple[Any, list[str]]:
    """The request's draft with ``changes``, once they pass the rules: editable fields of
    the workflow's approval step only, text, something changed, and the workflow's own
    rules for a draft (``check_draft``). Returns it with the names of the changed fields."""
    handler = handler_of(request)
    editable = handler.editable if handler is not None else ()
    if not editable or not isinstance(request.draft, dict):
        raise InvalidInput(
            "draft", "editable", "draft: this workflow's drafts cannot be edited in review"
        )
    for field in sorted(set(changes) - set(editable)):
        raise InvalidInput(
            f"draft.{field}",
            "editable",
            f"draft.{field}: not a field an editor may change ({', '.join(editable)})",
        )
    for field, value in changes.items():
        if not isinstance(value, str):
            raise InvalidInput(f"draft.{field}", "text", f"draft.{field}: must be text")
    edited = {**request.draft, **changes}
    fields = [field for field in editable if edited.get(field) != request.draft.get(field)]
    if not fields:
        raise InvalidInput("draft", "changed", "draft: nothing changed")
    if handler is not None and handler.check_draft is not None:
        handler.check_draft(edited)
    return edited, fields


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
        _check_pending(locked, actor, task)
        _revalidate(locked, task, draft_hash)

        voters: list[str] = []
        if verdict == ApprovalStatus.APPROVED:
            voters = _vote(locked, task, actor, comment)
            if len(voters) < locked.quorum:
                return locked
        # With a quorum, everyone who approved, in the order they did.
        name = _close(locked, verdict, actor, comment, by=", ".join(voters))
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
                    "approved_by": locked.decided_by,
                    "approvers": voters,
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


def _close(
    locked: ApprovalRequest, status: str, actor: Actor, comment: str, *, by: str = ""
) -> str:
    """Record on the locked request how it closed, who closed it (``by``, else the actor's
    name) and when; returns the actor's name."""
    name, user_id = core.actor_fields(actor)
    locked.status = status
    locked.decided_by = (by or name)[:150]
    locked.decided_by_user_id = user_id
    locked.decided_at = core.db_now()
    locked.comment = comment
    locked.save(update_fields=["status", "decided_by", "decided_by_user", "decided_at", "comment"])
    return name


def _check_pending(locked: ApprovalRequest, actor: Actor, task: Task) -> None:
    """Under the locks: ``actor`` may decide the request, and it is still open."""
    refused = decide_refusal(locked, actor, task)
    if refused is not None:
        raise NotPermitted(refused)
    if locked.status != ApprovalStatus.PENDING:
        raise AlreadyDecided(
            f"approval #{locked.pk} is already decided: {decision_text(locked)}"
            + (f" at {locked.decided_at:%Y-%m-%d %H:%M:%S %Z}" if locked.decided_at else ""),
            decided_by=locked.decided_by,
            status=locked.status,
        )


def _vote(locked: ApprovalRequest, task: Task, actor: Actor, comment: str) -> list[str]:
    """Record ``actor``'s approval of the locked request's draft; returns everyone who has
    approved it so far, in order. A person counts once: a second approval by the same
    person is refused. Short of the quorum, the approval is recorded as an event and the
    request stays open."""
    name, user_id = core.actor_fields(actor)
    votes = list(locked.votes.order_by("id").values_list("voter", "voter_user_id"))
    voters = [voter for voter, _ in votes]
    if any(same_person((name, user_id), vote) for vote in votes):
        raise AlreadyDecided(
            f"you already approved approval #{locked.pk}; "
            + waiting_on_others(locked.quorum, len(voters)),
            decided_by=name,
            status=locked.status,
        )
    ApprovalVote.objects.create(
        request=locked,
        voter=name,
        voter_user_id=user_id,
        draft_hash=locked.draft_hash,
        comment=comment,
    )
    voters.append(name)
    if len(voters) < locked.quorum:
        core.record_event(
            EventKind.APPROVAL_RECORDED,
            task_id=task.pk,
            step_id=locked.step_id,
            actor=actor,
            reason=comment,
            task_status=task.status,
            request=locked.pk,
            draft_hash=locked.draft_hash,
            approvals=len(voters),
            quorum=locked.quorum,
        )
    return voters


def waiting_on_others(quorum: int, approvals: int) -> str:
    """What a request short of its ``quorum`` waits for once someone approved it ("it needs
    1 more approval from someone else")."""
    count = quorum - approvals
    return f"it needs {count} more approval{'s' if count != 1 else ''} from someone else"


def decide_refusal(request: ApprovalRequest, actor: Actor, task: Task | None = None) -> str | None:
    """Why ``actor`` may not decide ``request``, or ``None`` when they may.

    The same rules the decisions apply, for pages and lists to offer only what will be
    accepted: the decide permission, neither the task's enqueuer nor the draft's author
    (superusers included; one person however their name is spelled, :func:`same_person`),
    and a place on the approver list (superusers skip it). Says nothing of the request's
    state.
    """
    if (refused := _actor_refusal(actor)) is not None or actor is None:
        return refused or NO_ACTOR
    task = task or request.task
    if enqueued(task, actor):
        return f"you enqueued task #{task.pk}: someone else must decide on it"
    if wrote_draft(request, actor):
        return (
            f"you wrote this draft of task #{task.pk} (revision {request.revision}): "
            "someone else must review it"
        )
    if isinstance(actor, str) or actor.is_superuser:
        return None
    groups, users = request.groups, request.approver_users or []
    if not groups and not users:
        return None
    if actor.get_username() in users:
        return None
    if groups and actor.groups.filter(name__in=groups).exists():
        return None
    allowed = " or ".join([*(f"group {group}" for group in groups), *users])
    return f"approval #{request.pk} may be decided by {allowed}"


def may_decide(request: ApprovalRequest, actor: Actor, task: Task | None = None) -> bool:
    """Whether ``actor`` may decide ``request`` (:func:`decide_refusal` says why not)."""
    return decide_refusal(request, actor, task) is None


NO_ACTOR = "a decision needs a user or a name"


def _check_actor(actor: Actor) -> None:
    """Before anything is locked: a decision names who made it, and a user needs the
    decide permission."""
    refused = _actor_refusal(actor)
    if refused == NO_ACTOR:
        raise InvalidInput("actor", "required", f"actor: {NO_ACTOR}")
    if refused is not None:
        raise NotPermitted(refused)


def _actor_refusal(actor: Actor) -> str | None:
    """The checks of the actor alone: named, and a user with the decide permission."""
    if actor is None or (isinstance(actor, str) and not actor.strip()):
        return NO_ACTOR
    if isinstance(actor, str):
        return None
    if not actor.is_authenticated or not actor.has_perm(DECIDE_PERMISSION):
        return "deciding approvals needs the decide permission (group editors)"
    return None


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
    latest = Step.objects.filter(task=task).current_one(kind=request.draft_step)
    if (
        latest is None
        or latest.status != StepStatus.SUCCEEDED
        or hash_of(latest.result) != request.draft_hash
    ):
        raise StaleApproval(
            f"approval #{request.pk}: its draft is no longer the latest draft of task #{task.pk}"
        )


# --- requests closed with their task -------------------------------------------------------


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
