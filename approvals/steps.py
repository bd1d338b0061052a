"""The approval step kind: a workflow step that waits for a person's decision.

Declare one with :func:`approval_step` in a workflow's steps, after the step that writes
the draft::

    Workflow(
        "publish_article", 1,
        steps=(
            StepSpec("generate_draft", generate_draft),
            approval_step(
                "editor_review",
                draft_from="generate_draft",
                action="publish",
                summary=lambda ctx: f"Publish {ctx.payload['title']!r}",
                group="editors",
                expires_after=timedelta(hours=48),
                on_expiry="dead_letter",
            ),
            StepSpec("publish", publish),
        ),
    )

No worker runs it. In the transaction that makes the task reach it (the drafting step's
success, a redrive, an approval before it), the core calls its handler, which reads the
draft (the ``draft_from`` step's result); the step goes ``blocked`` ->
``waiting_approval`` and an :class:`~approvals.models.ApprovalRequest` is written in the
same commit. ``approvals.services`` settles it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from tasks_app.exceptions import PermanentError
from tasks_app.models import Step, Task
from tasks_app.services import db_now
from tasks_app.validation import canonical_json
from tasks_app.workflows import AwaitDecision, StepContext, StepSpec, Workflow

from .models import ApprovalRequest, ApprovalStatus, ExpiryPolicy

Summary = Callable[[StepContext], str]


def draft_hash(draft: Any) -> str:
    """SHA-256 of the draft's canonical JSON: what a decision is checked against."""
    return hashlib.sha256(canonical_json(draft).encode()).hexdigest()


@dataclass(frozen=True)
class ApprovalHandler:
    """The approval step's handler, holding its options."""

    draft_from: str
    action: str
    summary: str | Summary
    group: str | None
    users: tuple[str, ...]
    expires_after: timedelta
    on_expiry: ExpiryPolicy
    send_back_to: str

    def __call__(self, ctx: StepContext) -> AwaitDecision:
        draft = ctx.results.get(self.draft_from)
        if draft is None:
            raise PermanentError(f"no draft to review: step {self.draft_from!r} has no result")
        digest = draft_hash(draft)
        summary = self.summary(ctx) if callable(self.summary) else self.summary

        def open_request(task: Task, step: Step) -> dict[str, Any]:
            request = ApprovalRequest.objects.create(
                task=task,
                step=step,
                revision=step.revision,
                status=ApprovalStatus.PENDING,
                action=self.action,
                summary=summary,
                draft=draft,
                draft_hash=digest,
                draft_step=self.draft_from,
                send_back_to=self.send_back_to,
                approver_group=self.group or "",
                approver_users=list(self.users),
                on_expiry=self.on_expiry,
                requested_by=task.created_by,
                requested_by_user_id=task.created_by_user_id,
                expires_at=db_now() + self.expires_after,
            )
            return {
                "request": request.pk,
                "revision": request.revision,
                "draft_hash": digest,
                "expires_at": request.expires_at.isoformat(),
            }

        return AwaitDecision(open_request)


def approval_step(
    kind: str,
    *,
    draft_from: str,
    action: str,
    summary: str | Summary,
    group: str | None = None,
    users: Iterable[str] = (),
    expires_after: timedelta,
    on_expiry: str,
    send_back_to: str | None = None,
) -> StepSpec:
    """A step that waits for a decision.

    ``draft_from``: the earlier step whose result is the draft. ``action`` and
    ``summary`` (text, or a function of the step's context) say what an approval lets
    happen. ``group`` and ``users`` are who may decide (superusers always may; with
    neither, anyone with the decide permission). ``expires_after``: how long the request
    stays open; ``on_expiry``: ``"cancel"`` (the task is cancelled) or ``"dead_letter"``
    (the task waits for on-call). ``send_back_to``: the earlier step "request changes"
    runs again (default ``draft_from``).
    """
    if on_expiry not in ExpiryPolicy.values:
        raise ValueError(f"step {kind}: on_expiry must be one of {', '.join(ExpiryPolicy.values)}")
    if expires_after <= timedelta(0):
        raise ValueError(f"step {kind}: expires_after must be positive")
    handler = ApprovalHandler(
        draft_from=draft_from,
        action=action,
        summary=summary,
        group=group,
        users=tuple(users),
        expires_after=expires_after,
        on_expiry=ExpiryPolicy(on_expiry),
        send_back_to=send_back_to or draft_from,
    )
    # Never claimed, so no attempts to count: one opening per time the task reaches it.
    return StepSpec(kind, handler, max_attempts=1, approval=True)


def check_workflow(workflow: Workflow) -> Workflow:
    """Refuse a workflow whose approval steps name steps that do not come before them."""
    for position, spec in enumerate(workflow.steps):
        if not isinstance(spec.handler, ApprovalHandler):
            continue
        earlier = {s.kind for s in workflow.steps[:position]}
        for option in ("draft_from", "send_back_to"):
            named = getattr(spec.handler, option)
            if named not in earlier:
                raise ValueError(
                    f"workflow {workflow.name}: {spec.kind}.{option} names {named!r}, "
                    "which is not an earlier step"
                )
    return workflow
