"""A task as it stood after any point of its history, with what the core's reader
(``tasks_app.history.as_of``) leaves to this app: the draft under review and the approval
requests as they were then.

1. A request is open from the ``approval_requested`` entry naming it, and has its stored
   status (a request is decided once) from the first later entry that decides it (names it
   as approved, rejected, sent back, edited or expired) or takes its step out of waiting
   (a cancel); by its own times where no entry says.
2. Who had approved it: the first votes, as many as a quorum's ``approval_recorded``
   entries had counted by then; all of them once it was decided.
3. The draft: the result of the drafting row (of a step an approval step reviews) that
   succeeded last by then: the first draft, a revision after "request changes", or an
   editor's edit, which is a drafting row of its own.

Reading adds two queries to the core's (the requests, their votes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from approvals.models import ApprovalRequest, ApprovalStatus, ApprovalVote
from approvals.steps import ApprovalHandler
from tasks_app.history import as_of
from tasks_app.history.as_of import ApprovalAsOf, Snapshot, TaskRecord
from tasks_app.history.as_of_changes import difference
from tasks_app.history.timeline import HistoryEntry
from tasks_app.models import EventKind, StepStatus, Task
from tasks_app.workflows import registry

__all__ = ["AsOfRecord", "difference", "read", "state_after"]

# The entries that decide the request they name.
DECIDING = frozenset(
    {
        EventKind.APPROVED,
        EventKind.REJECTED,
        EventKind.CHANGES_REQUESTED,
        EventKind.DRAFT_EDITED,
        EventKind.APPROVAL_EXPIRED,
    }
)


@dataclass(frozen=True)
class RequestSpan:
    request: ApprovalRequest
    voters: tuple[str, ...]
    # The points from which it was open and decided (None: not by any point).
    opened: int | None
    decided: int | None
    # (point, approvals counted by then), from its quorum's ``approval_recorded`` entries.
    counted: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class AsOfRecord:
    core: TaskRecord
    requests: tuple[RequestSpan, ...]
    # The kinds of the steps whose results are drafts under review.
    drafting: frozenset[str]

    @property
    def entries(self) -> list[HistoryEntry]:
        return self.core.entries


def read(task: Task) -> AsOfRecord:
    """``task``'s history and every row its points are read from (the core's queries, the
    requests and their votes)."""
    core = as_of.read(task)
    requests = list(ApprovalRequest.objects.filter(task_id=task.pk).order_by("id"))
    voters: dict[int, list[str]] = {request.pk: [] for request in requests}
    for request_id, voter in (
        ApprovalVote.objects.filter(request_id__in=list(voters))
        .order_by("id")
        .values_list("request_id", "voter")
    ):
        voters[request_id].append(voter)
    return AsOfRecord(
        core=core,
        requests=tuple(_span(core, request, tuple(voters[request.pk])) for request in requests),
        drafting=frozenset(request.draft_step for request in requests) | _drafting_kinds(task),
    )


def _drafting_kinds(task: Task) -> frozenset[str]:
    """The steps the task's workflow has its approval steps review (none where its version is
    no longer registered: its requests name theirs)."""
    flow = registry.get(task.workflow, task.workflow_version)
    steps = flow.steps if flow is not None else ()
    return frozenset(
        spec.handler.draft_from for spec in steps if isinstance(spec.handler, ApprovalHandler)
    )


def _span(core: TaskRecord, request: ApprovalRequest, voters: tuple[str, ...]) -> RequestSpan:
    opened: int | None = None
    decided: int | None = None
    counted: list[tuple[int, int]] = []
    for index, entry in enumerate(core.entries):
        data = entry.data or {}
        names = data.get("request") == request.pk
        if names and entry.kind == EventKind.APPROVAL_REQUESTED and opened is None:
            opened = index
        elif opened is None or decided is not None:
            continue
        elif names and entry.kind == EventKind.APPROVAL_RECORDED:
            counted.append((index, int(data.get("approvals") or 0)))
        elif (names and entry.kind in DECIDING) or _leaves_waiting(entry, request.step_id):
            decided = index
    if opened is None:
        opened = core.index_at(request.created_at)
    if decided is None and request.status != ApprovalStatus.PENDING and request.decided_at:
        decided = core.index_at(request.decided_at)
    if opened is not None and decided is not None:
        decided = max(decided, opened)
    return RequestSpan(request, voters, opened, decided, tuple(counted))


def _leaves_waiting(entry: HistoryEntry, step_id: int) -> bool:
    """Whether ``entry`` takes step ``step_id`` out of waiting for a decision."""
    return any(
        pk == step_id and status != StepStatus.WAITING_APPROVAL
        for pk, (status, _, _) in as_of.changed_steps(entry)
    )


def state_after(record: AsOfRecord, index: int) -> Snapshot:
    """The task as it stood after entry ``index`` of its history, its draft and approval
    requests included; IndexError outside the history."""
    snapshot = as_of.state_after(record.core, index)
    return replace(
        snapshot,
        draft=_draft(record, snapshot, index),
        approvals=tuple(
            shown for span in record.requests if (shown := _request(span, index)) is not None
        ),
    )


def _request(span: RequestSpan, index: int) -> ApprovalAsOf | None:
    if span.opened is None or span.opened > index:
        return None
    request = span.request
    if span.decided is not None and span.decided <= index:
        return ApprovalAsOf(
            request.pk, request.revision, request.status, span.voters, request.decided_by
        )
    counted = max((count for at, count in span.counted if at <= index), default=0)
    return ApprovalAsOf(request.pk, request.revision, ApprovalStatus.PENDING, span.voters[:counted])


def _draft(record: AsOfRecord, snapshot: Snapshot, index: int) -> Any:
    """The result of the drafting row that succeeded last by ``index``, None if none had."""
    succeeded = record.core.first_success
    written: Sequence[tuple[int, int]] = sorted(
        (succeeded[step.pk], step.pk)
        for step in snapshot.steps
        if step.kind in record.drafting and succeeded.get(step.pk, index + 1) <= index
    )
    if not written:
        return None
    row = record.core.rows.get(written[-1][1])
    return row.result if row is not None else None
