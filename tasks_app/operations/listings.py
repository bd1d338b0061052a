"""Read queries for the console's lists and the commands' filters: tasks, dead letters
and the audit log, each paged by keyset on ``id`` (no OFFSET, no total count)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count, Exists, Max, Min, OuterRef, Q, QuerySet

from tasks_app import validation
from tasks_app.db.clock import db_now
from tasks_app.engine.workflows import registry
from tasks_app.exceptions import InvalidInput
from tasks_app.models import (
    Event,
    PayloadSearch,
    Step,
    StepStatus,
    Task,
    TaskStatus,
    live_status_fields,
)
from tasks_app.models.fingerprints import masked_message
from tasks_app.operations.selectors import scheduled_retries, succeeded_since
from tasks_app.redaction import secret_key_in

# --- lists ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Page[T]:
    """One keyset page: rows newest first, and the ``after`` value of the next page."""

    rows: list[T]
    next_after: int | None


def keyset_page[M: Task | Event | Step](
    queryset: QuerySet[M], *, after: int | None, size: int | None = None, key: str = "id"
) -> Page[M]:
    """Rows with ``key`` below ``after``, highest first; one extra row tells whether an
    older page exists, so no count is needed."""
    size = size or settings.CONSOLE_PAGE_SIZE
    if after is not None:
        queryset = queryset.filter(**{f"{key}__lt": after})
    rows = list(queryset.order_by(f"-{key}")[: size + 1])
    more = len(rows) > size
    rows = rows[:size]
    return Page(rows, _key_of(rows[-1], key) if more else None)


def _key_of(row: Any, key: str) -> int:
    value = row
    for part in key.split("__"):
        value = getattr(value, part)
    return int(value)


# The display state of a pending task waiting for a scheduled retry; the task list's
# ``pending`` leaves those out, as the overview's cards count them apart.
RETRY_SCHEDULED = "retry_scheduled"


@dataclass(frozen=True)
class TaskFilter:
    # A task status, or RETRY_SCHEDULED.
    status: str = ""
    workflow: str = ""
    queue: str = ""
    # The start of an idempotency key.
    key: str = ""
    # A payload field as dotted path and the value it must hold (JSON, or else text).
    payload: tuple[str, Any] | None = None
    since: datetime | None = None
    until: datetime | None = None
    # Finished at or after.
    finished_since: datetime | None = None


def tasks(filters: TaskFilter) -> QuerySet[Task]:
    """Tasks matching ``filters``; the key by prefix (``LIKE 'prefix%'`` with the user's
    ``%`` and ``_`` escaped, served by ``task_key_prefix_idx`` on PostgreSQL), the payload
    field by JSON containment, which the GIN index of ``PayloadSearch`` serves there."""
    queryset = matching(
        _in_status(filters.status, filters.finished_since),
        workflow=filters.workflow,
        queue=filters.queue,
        idempotency_key__startswith=filters.key,
    )
    if filters.payload is not None:
        check_payload_filter(*filters.payload)
        queryset = queryset.filter(_payload_matches(*filters.payload))
    return in_window(queryset, filters.since, filters.until).annotate(**live_status_fields())


def _in_status(status: str, finished_since: datetime | None) -> QuerySet[Task]:
    """Tasks in ``status`` as the overview's cards count them: ``retry_scheduled`` the
    pending ones waiting for a scheduled retry, ``pending`` the others; succeeded since a
    time as ``selectors.succeeded_since`` says."""
    if status in (RETRY_SCHEDULED, TaskStatus.PENDING):
        retrying = Q(pk__in=scheduled_retries(db_now()).values("task_id"))
        pending = Task.objects.in_status(TaskStatus.PENDING)
        return pending.filter(retrying) if status == RETRY_SCHEDULED else pending.exclude(retrying)
    if status == TaskStatus.SUCCEEDED and finished_since is not None:
        return succeeded_since(finished_since)
    queryset = Task.objects.in_status(status) if status else Task.objects.all()
    if finished_since is not None:
        queryset = queryset.filter(finished_at__gte=finished_since)
    return queryset


def matching[M: Task | Event](queryset: QuerySet[M], **equal: str) -> QuerySet[M]:
    """``queryset`` narrowed by each lookup given a value (an empty filter field is no
    filter)."""
    return queryset.filter(**{lookup: value for lookup, value in equal.items() if value})


def in_window[M: Task | Event](
    queryset: QuerySet[M], since: datetime | None, until: datetime | None
) -> QuerySet[M]:
    """Rows created at or after ``since`` and before ``until``."""
    if since is not None:
        queryset = queryset.filter(created_at__gte=since)
    if until is not None:
        queryset = queryset.filter(created_at__lt=until)
    return queryset


def check_payload_filter(path: str, value: Any) -> None:
    """Raise :class:`InvalidInput` (field ``payload``) for a filter on ``path`` for
    ``value`` that breaks the rules of a payload (no ``\\u0000``, no lone surrogate, no NaN
    or Infinity, no float out of range, not too deep: what PostgreSQL cannot compare), or
    that would compare a secret's value (``redaction.secret_key_in``): whether it lists a
    task would confirm a guess of what every page shows redacted."""
    validation.validate_payload({path: value}, field="payload")
    secret = secret_key_in(path.split("."), value)
    if secret is not None:
        raise InvalidInput(
            "payload",
            f"{secret!r} is a secret by the redaction rule (REDACT_KEY_PATTERNS): "
            "no filter compares its value",
        )


def _payload_matches(path: str, value: Any) -> Q:
    parts = path.split(".")
    if connection.vendor == "postgresql":
        nested: Any = value
        for part in reversed(parts):
            nested = {part: nested}
        # PayloadSearch holds the payloads with the GIN index (kept off the task row).
        return Q(pk__in=PayloadSearch.objects.filter(payload__contains=nested).values("task_id"))
    # SQLite has no JSON containment: the same path compared by key.
    return Q(**{"payload__" + "__".join(parts): value})


def task_page(filters: TaskFilter, *, after: int | None) -> Page[Task]:
    return keyset_page(tasks(filters), after=after)


def workflow_names() -> list[str]:
    return registry.names()


# --- dead letters -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DeadFilter:
    workflow: str = ""
    queue: str = ""
    error_class: str = ""
    # A cause (``tasks_app.models.fingerprints``): the dead letters of one group.
    fingerprint: str = ""


def _dead_steps(filters: DeadFilter) -> Q:
    """The dead steps a filter's step fields select (error class, cause)."""
    condition = Q(status=StepStatus.DEAD)
    if filters.error_class:
        condition &= Q(error_class=filters.error_class)
    if filters.fingerprint:
        condition &= Q(error_fingerprint=filters.fingerprint)
    return condition


def dead_tasks(filters: DeadFilter) -> QuerySet[Task]:
    """Dead tasks matching ``filters`` (the bulk actions act on these)."""
    queryset = matching(Task.objects.dead(), workflow=filters.workflow, queue=filters.queue)
    if filters.error_class or filters.fingerprint:
        queryset = queryset.filter(
            Exists(Step.objects.filter(_dead_steps(filters), task=OuterRef("pk")))
        )
    return queryset


def operator_targets(
    *,
    statuses: Collection[str],
    ids: Collection[int] = (),
    workflow: str = "",
    queue: str = "",
    error_class: str = "",
    fingerprint: str = "",
    created_before: datetime | None = None,
) -> QuerySet[Task]:
    """Tasks an operator command acts on, oldest first: those in ``statuses`` (and not
    already being cancelled), narrowed to ``ids`` when given, by the dead letters' filters
    (``error_class`` and ``fingerprint`` are those of a dead step, as in
    :func:`dead_tasks`), and to those created before ``created_before``."""
    queryset = matching(
        Task.objects.filter(status__in=list(statuses), cancel_requested_at=None),
        workflow=workflow,
        queue=queue,
    )
    if ids:
        queryset = queryset.filter(pk__in=list(ids))
    if error_class or fingerprint:
        dead = DeadFilter(error_class=error_class, fingerprint=fingerprint)
        queryset = queryset.filter(pk__in=dead_tasks(dead).values("pk"))
    if created_before is not None:
        queryset = queryset.filter(created_at__lt=created_before)
    return queryset.order_by("id")


def dead_letter_page(filters: DeadFilter, *, after: int | None) -> Page[Step]:
    """The dead steps of matching tasks, newest task first, with their task."""
    steps = Step.objects.filter(
        _dead_steps(filters), task__in=dead_tasks(filters).values("pk")
    ).select_related("task")
    return keyset_page(steps, after=after, key="task_id")


@dataclass(frozen=True)
class DeadGroup:
    """The dead letters of one cause: how many, in which workflows, since and until when,
    and the newest as an example."""

    fingerprint: str
    count: int
    workflows: list[str]
    first_seen: datetime | None
    last_seen: datetime | None
    example: Step

    @property
    def error_class(self) -> str:
        return self.example.error_class

    @property
    def message(self) -> str:
        """The cause's message with what varies masked."""
        return masked_message(self.example.error_class, self.example.last_error)


def dead_groups(filters: DeadFilter) -> list[DeadGroup]:
    """The dead letters matching ``filters`` grouped by cause, the largest group first.

    Two reads, none per group: the dead steps by cause and workflow, from the dead steps'
    index alone, then one example step per cause (the newest task's). Its twin is
    :func:`dead_letter_page`, which reads the dead steps of dead tasks: a dead step's task
    is dead (``history.derive_task_status``), so both count the same dead letters, and
    ``tests/operations/test_dead_groups.py`` checks that they do."""
    steps = Step.objects.filter(_dead_steps(filters))
    if filters.workflow:
        steps = steps.filter(dead_workflow=filters.workflow)
    if filters.queue:
        steps = steps.filter(queue=filters.queue)
    parts = steps.values_list("error_fingerprint", "dead_workflow").annotate(
        count=Count("*"),
        first_seen=Min("finished_at"),
        last_seen=Max("finished_at"),
        newest_task=Max("task_id"),
    )
    causes: dict[str, dict[str, Any]] = {}
    for cause, workflow, count, first_seen, last_seen, newest_task in parts.order_by():
        group = causes.setdefault(
            cause, {"count": 0, "workflows": [], "seen": [], "newest_task": 0}
        )
        group["count"] += count
        group["workflows"].append(workflow)
        group["seen"] += [moment for moment in (first_seen, last_seen) if moment is not None]
        group["newest_task"] = max(group["newest_task"], newest_task)
    examples = {
        (step.error_fingerprint, step.task_id): step
        for step in steps.filter(
            task_id__in=[group["newest_task"] for group in causes.values()]
        ).select_related("task")
    }
    groups = [
        DeadGroup(
            fingerprint=cause,
            count=group["count"],
            workflows=sorted(group["workflows"]),
            first_seen=min(group["seen"], default=None),
            last_seen=max(group["seen"], default=None),
            example=examples[(cause, group["newest_task"])],
        )
        for cause, group in causes.items()
    ]
    return sorted(groups, key=lambda group: (-group.count, group.fingerprint))


def dead_error_classes() -> list[str]:
    """The error classes of today's dead letters, for the filter's choices: from the dead
    steps' cause index alone (a dead step's task is dead)."""
    return list(
        Step.objects.filter(status=StepStatus.DEAD)
        .values_list("error_class", flat=True)
        .distinct()
        .order_by("error_class")
    )
