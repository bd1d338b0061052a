"""Read queries over approval requests, for pages and commands."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, QuerySet

from approvals.models import ApprovalRequest, ApprovalStatus, ApprovalVote
from approvals.people import same_person
from approvals.services import decide_refusal, waiting_on_others
from approvals.steps import handler_of
from tasks_app.models import Step, graphs
from tasks_app.redaction import redact
from tasks_app.services import Actor, actor_fields


def pending_requests() -> QuerySet[ApprovalRequest]:
    """Requests waiting for a decision, the soonest to expire first, each with how many
    approvals it has (``approvals``)."""
    return (
        ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING)
        .select_related("task")
        .annotate(approvals=Count("votes"))
        .order_by("expires_at", "id")
    )


def decidable_by(actor: Actor) -> list[ApprovalRequest]:
    """The pending requests ``actor`` may decide (:func:`services.may_decide`), the
    longest waiting first."""
    return inbox(actor).mine


@dataclass(frozen=True)
class Inbox:
    """The pending requests as one person sees them: those they may decide, and the others
    with why not ("you enqueued task #12: someone else must decide on it"), each the
    longest waiting first."""

    mine: list[ApprovalRequest]
    others: list[tuple[ApprovalRequest, str]]


def inbox(actor: Actor) -> Inbox:
    mine: list[ApprovalRequest] = []
    others: list[tuple[ApprovalRequest, str]] = []
    reader = actor_fields(actor)
    approved = {
        request_id
        for request_id, voter, voter_user_id in ApprovalVote.objects.filter(
            request__status=ApprovalStatus.PENDING
        ).values_list("request_id", "voter", "voter_user_id")
        if same_person(reader, (voter, voter_user_id))
    }
    for request in pending_requests().order_by("created_at", "id"):
        why = decide_refusal(request, actor)
        if why is None and request.pk in approved:
            why = already_approved(request)
        if why is None:
            mine.append(request)
        else:
            others.append((request, why))
    return Inbox(mine, others)


def names_approver(user: Any) -> bool:
    """Whether an open request names ``user`` as its approver: by username, or by one of
    their groups (the second group once escalated)."""
    groups = set(user.groups.values_list("name", flat=True))
    return any(
        user.get_username() in (request.approver_users or []) or groups & set(request.groups)
        for request in ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING).only(
            "approver_users", "approver_group", "escalate_to", "escalated_at"
        )
    )


def already_approved(request: ApprovalRequest) -> str:
    """Why a request the reader approved still waits: for others' approvals."""
    return f"you approved it; {waiting_on_others(request.quorum, request.votes.count())}"


# --- the review page --------------------------------------------------------------------------


@dataclass(frozen=True)
class DiffPart:
    op: str  # "equal", "insert" or "delete"
    text: str


@dataclass(frozen=True)
class DraftField:
    name: str
    text: str
    # Against the previous revision's draft; None when there is none or nothing changed.
    diff: list[DiffPart] | None


@dataclass(frozen=True)
class Review:
    request: ApprovalRequest
    fields: list[DraftField]
    previous: ApprovalRequest | None
    # Decided requests of the same task before this one, oldest first (their comments).
    earlier: list[ApprovalRequest]
    # The step an approval lets run next, or None when the approval ends the task.
    next_step: Step | None
    # Who has approved this request so far (a quorum counts them), oldest first.
    votes: list[ApprovalVote]
    # The draft's fields an editor may change here, with their text; empty when none.
    editable: list[DraftField]

    @property
    def changed(self) -> bool:
        return any(field.diff is not None for field in self.fields)


_WORDS = re.compile(r"\s+|[^\s]+")


def word_diff(old: str, new: str) -> list[DiffPart]:
    """The word-level changes from ``old`` to ``new`` (whitespace kept as its own token)."""
    before, after = _WORDS.findall(old), _WORDS.findall(new)
    parts: list[DiffPart] = []
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    for op, a1, a2, b1, b2 in matcher.get_opcodes():
        if op == "equal":
            parts.append(DiffPart("equal", "".join(before[a1:a2])))
            continue
        if a2 > a1:
            parts.append(DiffPart("delete", "".join(before[a1:a2])))
        if b2 > b1:
            parts.append(DiffPart("insert", "".join(after[b1:b2])))
    return parts


def _text(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)


def _fields(draft: Any, previous: Any) -> list[DraftField]:
    if not isinstance(draft, dict):
        draft, previous = {"draft": draft}, {"draft": previous} if previous is not None else None
    fields = []
    for name, value in draft.items():
        text = _text(value)
        old = previous.get(name) if isinstance(previous, dict) else None
        diff = None
        if old is not None and _text(old) != text:
            diff = word_diff(_text(old), text)
        fields.append(DraftField(str(name), text, diff))
    return fields


def review(request: ApprovalRequest) -> Review:
    """Everything an editor needs to decide ``request`` (the draft with secret keys
    redacted; the decision carries the hash of the stored draft)."""
    earlier = list(
        ApprovalRequest.objects.filter(task_id=request.task_id, id__lt=request.pk).order_by("id")
    )
    previous = next(
        (
            other
            for other in reversed(earlier)
            if other.revision < request.revision and other.draft is not None
        ),
        None,
    )
    # The first step that waits for the decision (in a line, the one after it).
    following = Step.objects.current().filter(task_id=request.task_id).order_by("position")
    next_step = next((s for s in following if request.step.position in graphs.waits_for(s)), None)
    fields = _fields(redact(request.draft), redact(previous.draft) if previous else None)
    handler = handler_of(request)
    editable = set(handler.editable) if handler is not None else set()
    return Review(
        request=request,
        # Secret keys are no editor's business: their values are redacted, as on every page.
        fields=fields,
        previous=previous,
        earlier=earlier,
        next_step=next_step,
        votes=list(request.votes.order_by("id")),
        editable=[field for field in fields if field.name in editable],
    )
