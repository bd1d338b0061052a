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
same commit. ``approvals.services`` closes it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings

from approvals import signals
from approvals.models import ApprovalRequest, ApprovalStatus, ExpiryPolicy
from tasks_app.exceptions import PermanentError
from tasks_app.models import Step, Task
from tasks_app.services import db_now
from tasks_app.validation import canonical_json
from tasks_app.workflows import AwaitDecision, StepContext, StepSpec, Workflow, registry

Summary = Callable[[StepContext], str]
# A workflow's rules for a draft an editor edited: raises InvalidPayload naming the field.
DraftCheck = Callable[[dict[str, Any]], None]


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
    quorum: int = 1
    escalate_to: str = ""
    escalate_after: timedelta | None = None
    # None: the APPROVALS_REMIND_BEFORE setting; timedelta(0): no reminder.
    remind_before: timedelta | None = None
    # The draft's fields an editor may change on the review page, and the rules they obey.
    editable: tuple[str, ...] = ()
    check_draft: DraftCheck | None = None

    def times(self, opened: datetime) -> dict[str, datetime | None]:
        """When a request opened at ``opened`` expires, reminds and escalates."""
        expires = opened + self.expires_after
        before = self.remind_before
        if before is None:
            before = settings.APPROVALS_REMIND_BEFORE
        # A reminder due at the opening, or before it, would only repeat the first notice.
        remind = expires - before if timedelta(0) < before < self.expires_after else None
        escalates = opened + self.escalate_after if self.escalate_after else None
        return {"expires_at": expires, "remind_at": remind, "escalates_at": escalates}

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
                quorum=self.quorum,
                escalate_to=self.escalate_to,
                **self.times(db_now()),
            )
            # Its approvers are told by mail, by a task of its own (approvals.notices).
            signals.request_opened.send(sender=ApprovalRequest, request=request)
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
    quorum: int = 1,
    escalate_to: str | None = None,
    escalate_after: timedelta | None = None,
    remind_before: timedelta | None = None,
    editable: Iterable[str] = (),
    check_draft: DraftCheck | None = None,
    after: tuple[str, ...] | None = None,
) -> StepSpec:
    """A step that waits for a decision.

    ``draft_from``: the earlier step whose result is the draft. ``action`` and
    ``summary`` (text, or a function of the step's context) say what an approval lets
    happen. ``group`` and ``users`` are who may decide (superusers always may; with
    neither, anyone with the decide permission). ``expires_after``: how long the request
    stays open; ``on_expiry``: ``"cancel"`` (the task is cancelled) or ``"dead_letter"``
    (the task waits for on-call). ``send_back_to``: the earlier step "request changes"
    runs again (default ``draft_from``).

    ``quorum``: how many distinct people must approve (any rejection ends the request).
    ``escalate_to`` and ``escalate_after``: a second group that may decide too once the
    request has waited that long undecided (before it expires). ``remind_before``: when to
    remind the approvers before expiry (default the ``APPROVALS_REMIND_BEFORE`` setting;
    ``timedelta(0)`` for none). ``editable``: the draft's text fields an editor may change
    on the review page; ``check_draft`` (the workflow's rules for a draft) checks the edit.
    ``after``: the steps it waits for in a graph (``StepSpec.after``; by default the step
    declared before it).
    """
    if on_expiry not in ExpiryPolicy.values:
        raise ValueError(f"step {kind}: on_expiry must be one of {', '.join(ExpiryPolicy.values)}")
    if expires_after <= timedelta(0):
        raise ValueError(f"step {kind}: expires_after must be positive")
    if quorum < 1:
        raise ValueError(f"step {kind}: quorum must be at least 1")
    if bool(escalate_to) != bool(escalate_after):
        raise ValueError(f"step {kind}: escalate_to and escalate_after go together")
    if escalate_after is not None and not timedelta(0) < escalate_after < expires_after:
        raise ValueError(
            f"step {kind}: escalate_after must be positive and less than expires_after"
        )
    handler = ApprovalHandler(
        draft_from=draft_from,
        action=action,
        summary=summary,
        group=group,
        users=tuple(users),
        expires_after=expires_after,
        on_expiry=ExpiryPolicy(on_expiry),
        send_back_to=send_back_to or draft_from,
        quorum=quorum,
        escalate_to=escalate_to or "",
        escalate_after=escalate_after,
        remind_before=remind_before,
        editable=tuple(editable),
        check_draft=check_draft,
    )
    # Never claimed, so no attempts to count: one opening per time the task reaches it.
    return StepSpec(kind, handler, max_attempts=1, approval=True, after=after)


def handler_of(request: ApprovalRequest) -> ApprovalHandler | None:
    """The approval step's handler (its options) that opened ``request``, or None when its
    workflow's version is no longer registered."""
    task = request.task
    flow = registry.get(task.workflow, task.workflow_version)
    if flow is None:
        return None
    spec = flow.step(request.step.position)
    handler = spec.handler if spec is not None else None
    return handler if isinstance(handler, ApprovalHandler) else None


def check_workflow(workflow: Workflow) -> Workflow:
    """Refuse a workflow whose approval steps name steps they do not wait for (in a line,
    the steps before them; in a graph, a parallel branch's step is not one)."""
    for position, spec in enumerate(workflow.steps):
        if not isinstance(spec.handler, ApprovalHandler):
            continue
        earlier = {workflow.steps[p].kind for p in workflow.graph.ancestors(position)}
        for option in ("draft_from", "send_back_to"):
            named = getattr(spec.handler, option)
            if named not in earlier:
                raise ValueError(
                    f"workflow {workflow.name}: {spec.kind}.{option} names {named!r}, "
                    "which is not an earlier step it waits for"
                )
    return workflow
