"""The audit log: its filter, its pages and its export's rows, newest first.

It lists events (keyset on their id). One task's whole history (a task chosen and no action,
actor or bulk action) is its timeline (``tasks_app.history.timeline``), paged by position.
Enqueues, claims and successes are read from the rows that record them, not from Event rows:
chosen as the action, ``enqueued`` lists the task rows (keyset on the task's id; the actor is
the producer, the time the task's creation), ``claimed`` and ``succeeded`` the attempts'
Lease rows (keyset on the row's id) and, on the first page of claims, the claims of the
steps running now, whose lease is still on the step (the actor is ``worker:<worker id>``,
the time the claim's or the success's). Each reads as the event it stands for, and the other
filters apply as to events; a bulk action's plan holds none. Otherwise the Event rows that
repeat such a record (history written before) are left out.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from typing import Any

from django.conf import settings
from django.db.models import QuerySet

from tasks_app.history import timeline
from tasks_app.history.timeline import (
    DERIVED_KINDS,
    DerivedEvent,
    HistoryEntry,
    enqueued,
    lease_transitions,
)
from tasks_app.models import (
    OPERATOR_EVENT_KINDS,
    Event,
    EventKind,
    Lease,
    Step,
    StepStatus,
    Task,
    leases_of,
)
from tasks_app.operations.listings import Page, in_window, keyset_page, matching


@dataclass(frozen=True)
class AuditFilter:
    # The start of the actor's name, in any case.
    actor: str = ""
    kind: str = ""
    workflow: str = ""
    # The events of one task.
    task: int | None = None
    since: datetime | None = None
    until: datetime | None = None
    # The events of one bulk action (each carries its plan's id).
    plan: str = ""


def audit_events(filters: AuditFilter) -> QuerySet[Event]:
    """Events matching ``filters``. The actor is a prefix in any case (``UPPER(actor) LIKE
    'OLI%'`` with the user's ``%`` and ``_`` escaped), served on PostgreSQL by
    ``event_audit_actor_prefix_idx``, which holds operator actions only: so unless an
    action is chosen, the actor filter lists operator actions, the ones people (and the
    system on their behalf) take; the workers' own events are found by their action.

    Not the enqueues, claims and successes: their Event rows repeat the rows that record
    them, which are read for them (:func:`derived_page`)."""
    queryset = matching(Event.objects.all(), kind=filters.kind)
    if not filters.kind:
        queryset = queryset.exclude(kind__in=DERIVED_KINDS)
    if filters.task is not None:
        queryset = queryset.filter(task_id=filters.task)
    if filters.actor:
        queryset = queryset.filter(actor__istartswith=filters.actor)
        if not filters.kind:
            queryset = queryset.filter(kind__in=sorted(OPERATOR_EVENT_KINDS))
    if filters.plan:
        # Operator actions (the audit indexes' own condition), then the plan in their data.
        queryset = queryset.filter(kind__in=sorted(OPERATOR_EVENT_KINDS), data__plan=filters.plan)
    if filters.workflow:
        queryset = queryset.filter(
            task_id__in=Task.objects.filter(workflow=filters.workflow).values("pk")
        )
    return in_window(queryset, filters.since, filters.until)


def _whole_history(filters: AuditFilter) -> bool:
    """Whether ``filters`` ask for one task's whole history: a task and no action, actor or
    bulk action chosen (those list events)."""
    return filters.task is not None and not (filters.kind or filters.actor or filters.plan)


def task_history(filters: AuditFilter) -> list[HistoryEntry]:
    """One task's history as the task page's timeline shows it, newest first, within the
    time window and of the workflow ``filters`` name."""
    assert filters.task is not None
    if (
        filters.workflow
        and not Task.objects.filter(pk=filters.task, workflow=filters.workflow).exists()
    ):
        return []
    return [
        entry
        for entry in reversed(timeline.history(filters.task))
        if (filters.since is None or entry.created_at >= filters.since)
        and (filters.until is None or entry.created_at < filters.until)
    ]


def audit_page(filters: AuditFilter, *, after: int | None) -> Page[HistoryEntry]:
    """One page of the audit log, newest first. One task's whole history pages by position
    (``after`` is how many rows earlier pages showed)."""
    if _whole_history(filters):
        size, start = settings.CONSOLE_PAGE_SIZE, after or 0
        entries = task_history(filters)
        more = len(entries) > start + size
        return Page(entries[start : start + size], start + size if more else None)
    if read_from_rows(filters):
        return derived_page(filters, after=after)
    events = keyset_page(audit_events(filters), after=after)
    return Page(list[HistoryEntry](events.rows), events.next_after)


def audit_entries(filters: AuditFilter) -> Iterator[HistoryEntry]:
    """The whole audit log ``filters`` choose, newest first, read a chunk at a time."""
    if _whole_history(filters):
        yield from task_history(filters)
    elif read_from_rows(filters):
        yield from all_derived_events(filters)
    else:
        yield from audit_events(filters).order_by("-id").iterator(chunk_size=2000)


def task_workflows(task_ids: Mapping[int, Any] | list[int]) -> dict[int, str]:
    """Workflow names of the given tasks (for audit rows, whose task may be pruned)."""
    return dict(Task.objects.filter(pk__in=list(task_ids)).values_list("pk", "workflow"))


# --- enqueues, claims and successes, from the rows that record them ------------------------


WORKER = "worker:"
CHUNK = 2000


def read_from_rows(filters: AuditFilter) -> bool:
    """Whether the action chosen is one the task and attempt rows record."""
    return filters.kind in DERIVED_KINDS


def enqueued_tasks(filters: AuditFilter) -> QuerySet[Task]:
    """The tasks whose enqueue matches ``filters``: its producer's name (a prefix in any
    case), the task, its workflow, its time."""
    if filters.plan:
        return Task.objects.none()
    tasks = Task.objects.filter(**_window("created_at", filters.since, filters.until))
    if filters.actor:
        tasks = tasks.filter(created_by__istartswith=filters.actor)
    if filters.task is not None:
        tasks = tasks.filter(pk=filters.task)
    if filters.workflow:
        tasks = tasks.filter(workflow=filters.workflow)
    return tasks


def _enqueues(tasks: list[Task]) -> list[DerivedEvent]:
    first: dict[int, list[Step]] = {task.pk: [] for task in tasks}
    for step in Step.objects.filter(task__in=tasks, revision=0).only("id", "task_id", "position"):
        first[step.task_id].append(step)
    return [enqueued(task, first[task.pk]) for task in tasks]


def derived_page(filters: AuditFilter, *, after: int | None) -> Page[HistoryEntry]:
    """One page of the enqueues, claims or successes matching ``filters``, newest first."""
    if filters.kind != EventKind.ENQUEUED:
        return attempt_page(filters, after=after)
    tasks = enqueued_tasks(filters)
    page = keyset_page(tasks, after=after)
    return Page(list[HistoryEntry](_enqueues(page.rows)), page.next_after)


def all_derived_events(filters: AuditFilter) -> Iterator[DerivedEvent]:
    """Every enqueue, claim or success matching ``filters``, newest first."""
    if filters.kind != EventKind.ENQUEUED:
        yield from all_attempt_events(filters)
        return
    tasks = enqueued_tasks(filters).order_by("-pk").iterator(chunk_size=CHUNK)
    while chunk := list(islice(tasks, CHUNK)):
        yield from _enqueues(chunk)


def _worker_prefix(actor: str) -> str | None:
    """The worker id prefix an actor filter asks for: "" for every worker, None for none."""
    lowered = actor.lower()
    if WORKER.startswith(lowered):
        return ""
    if lowered.startswith(WORKER):
        return actor[len(WORKER) :]
    return None


def _window(field: str, since: datetime | None, until: datetime | None) -> dict[str, datetime]:
    bounds = {}
    if since is not None:
        bounds[f"{field}__gte"] = since
    if until is not None:
        bounds[f"{field}__lt"] = until
    return bounds


def _narrowed[M: (Lease, Step)](
    rows: QuerySet[M], filters: AuditFilter, *, worker: str, task: str, at: str
) -> QuerySet[M]:
    """``rows`` narrowed to the worker prefix, task, workflow and time window ``filters``
    choose, each named by its field on ``rows``."""
    rows = rows.filter(**_window(at, filters.since, filters.until))
    prefix = _worker_prefix(filters.actor)
    if prefix:
        rows = rows.filter(**{f"{worker}__istartswith": prefix})
    if filters.task is not None:
        rows = rows.filter(**{f"{task}_id": filters.task})
    if filters.workflow:
        rows = rows.filter(**{f"{task}__workflow": filters.workflow})
    return rows


def _none_match(filters: AuditFilter) -> bool:
    """Whether ``filters`` rule out every attempt's record: an actor other than a worker, or
    a bulk action (whose plan holds none)."""
    return _worker_prefix(filters.actor) is None or bool(filters.plan)


def attempt_leases(filters: AuditFilter) -> QuerySet[Lease]:
    """The Lease rows whose claims (or successes) match ``filters``."""
    if _none_match(filters):
        return Lease.objects.none()
    leases = Lease.objects.select_related("step")
    at = "acquired_at"
    if filters.kind == EventKind.SUCCEEDED:
        leases, at = leases.filter(outcome=Lease.Outcome.SUCCEEDED), "released_at"
    return _narrowed(leases, filters, worker="worker_id", task="step__task", at=at)


def live_claims(filters: AuditFilter) -> list[DerivedEvent]:
    """The claims of the steps running now that match ``filters`` (none for successes),
    newest first."""
    if filters.kind != EventKind.CLAIMED or _none_match(filters):
        return []
    running_now = Step.objects.filter(status=StepStatus.RUNNING, started_at__isnull=False)
    steps = _narrowed(running_now, filters, worker="lease_worker", task="task", at="started_at")
    running = list(steps.order_by("-started_at", "-id"))
    attempts = leases_of(running)
    return [
        _as_event(step.task_id, lease, filters.kind)
        for step in running
        for lease in attempts[step.pk][-1:]
        if lease.pk is None
    ]


def _as_event(task_id: int, lease: Lease, kind: str) -> DerivedEvent:
    return next(entry for entry in lease_transitions(task_id, lease) if entry.kind == kind)


def attempt_page(filters: AuditFilter, *, after: int | None) -> Page[HistoryEntry]:
    """One page of the claims or successes matching ``filters``, newest first; the claims
    running now lead the first page."""
    size = settings.CONSOLE_PAGE_SIZE
    leases = attempt_leases(filters)
    if after is not None:
        leases = leases.filter(pk__lt=after)
    rows = list(leases.order_by("-pk")[: size + 1])
    more = len(rows) > size
    rows = rows[:size]
    entries: list[HistoryEntry] = [*live_claims(filters)] if after is None else []
    entries += [_as_event(lease.step.task_id, lease, filters.kind) for lease in rows]
    return Page(entries, rows[-1].pk if more and rows else None)


def all_attempt_events(filters: AuditFilter) -> Iterator[DerivedEvent]:
    """Every claim or success matching ``filters``, newest first."""
    yield from live_claims(filters)
    for lease in attempt_leases(filters).order_by("-pk").iterator(chunk_size=CHUNK):
        yield _as_event(lease.step.task_id, lease, filters.kind)


EXPORT_ID = re.compile(r"^(?:(enqueued):(\d+)|(claimed|succeeded):(\d+):(\d+))$")


def is_export_id(text: str) -> bool:
    """Whether ``text`` names a derived transition as an export does (:func:`export_id`)."""
    return EXPORT_ID.match(text) is not None


def derived_record(text: str) -> DerivedEvent | None:
    """The transition an export row's id names (:func:`export_id`) as its row records it
    now, or None when there is none (retention deleted it with its task)."""
    match = EXPORT_ID.match(text)
    if match is None:
        return None
    if match[1]:
        task = Task.objects.filter(pk=int(match[2])).first()
        return _enqueues([task])[0] if task else None
    kind, step_id, token = match[3], int(match[4]), int(match[5])
    step = Step.objects.filter(pk=step_id).first()
    if step is None:
        return None
    for lease in leases_of([step])[step.pk]:
        if lease.token == token:
            shown = lease_transitions(step.task_id, lease)
            return next((entry for entry in shown if entry.kind == kind), None)
    return None


def export_id(entry: DerivedEvent) -> str:
    """How an export names a transition a row records: an enqueue by its task
    (``enqueued:<task>``), a claim or success by its step and token (an attempt is its
    step's token: ``claimed:<step>:<token>``)."""
    if entry.step_id is None:
        return f"{entry.kind}:{entry.task_id}"
    return f"{entry.kind}:{entry.step_id}:{entry.data['token']}"
