"""Checks that the stored state agrees with its history and with the clock.

Each check names something that never holds in a healthy system, however busy:

- ``history``: a task whose stored state differs from the fold of its events (a
  transition written without its event, or a status edited by hand);
- ``lease``: a step still ``running`` after its lease ran out, by more than the
  sweeper's grace (the sweeper reaps such steps);
- ``dead_letter``: a dead step without its ``dead_lettered`` event since it last ran;
- ``effect``: an effect ``started`` longer ago than a lease whose step neither runs, nor
  waits for its next attempt (which calls again or dead-letters), nor is dead (where a
  person resolves it): nothing will ever decide whether it happened;
- ``approval``: a pending approval request past its expiry, by more than the sweeper's
  grace (the sweeper expires them);
- ``undecodable``: a task's payload, or a step's result or change request, that Python
  cannot decode (``tasks_app.models.json_columns``; stored by SQL, nested past the decoder's
  recursion limit): its task, step and column are named;
- ``enqueued``: a task whose history does not start with ``enqueued``, or whose first steps
  (revision 0, which record the enqueue with the task row) are not one per position from 0;
- ``fencing``: a step's ``claimed`` events whose tokens do not strictly increase, or a
  step whose stored ``fencing_token`` is below a token one of its events names;
- ``claim``: a claim (token t) with no later event of its step carrying token t that
  ends the attempt (``succeeded``, ``retry_scheduled``, ``dead_lettered``, ``cancelled``,
  ``lease_expired``, ``claim_released``), while the step does not run on token t any more;
- ``order``: a step made due, run or ended before every step it waits for had succeeded
  (:mod:`tasks_app.observability.graph_checks`: the step before it in a line, each of its
  branches in a graph);
- ``effect_key``: an external write that could be made twice: one outside its step's key,
  or a step key two standing rows hold (the same module);
- ``terminal``: an event ending a run (``task_status`` succeeded, cancelled or dead) that
  an earlier one already ended, with nothing in between making the task pending, running
  or waiting again (a dead task cancelled or resolved as done, and the ``cancelled`` or
  ``dead_lettered`` event written beside the transition that ended the run, are fine).

The last four live in :mod:`tasks_app.observability.history_checks`. It stays fast on a long
history: the lease and approval checks read the partial indexes on running steps and pending
requests; the others look at active tasks (not succeeded or cancelled) and the tasks created or
finished since a point in time (everything on request), folded in batches: each batch is read in
four queries, in one snapshot, and checked without further queries. "Now" is the database's clock
(DESIGN rule 3).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.apps import apps
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q

from tasks_app.db.clock import db_now
from tasks_app.history import StepState, TaskState, fold_events, timeline
from tasks_app.models import (
    ACTIVE_TASK_STATUSES,
    Effect,
    EventKind,
    Step,
    StepStatus,
    Task,
)
from tasks_app.models.json_columns import is_undecodable
from tasks_app.observability.graph_checks import StepRow, effect_key_findings, order_findings
from tasks_app.observability.history_checks import (
    EventRow,
    first_steps_findings,
    history_findings,
)
from tasks_app.observability.history_checks import Finding as Finding

DEFAULT_WINDOW = timedelta(hours=24)
BATCH_SIZE = 500
# Steps whose unfinished effect something will still decide: the running attempt, the
# next one (which calls again with the same key, or dead-letters as outcome unknown), or
# the person who resolves a dead step.
EFFECT_SETTLERS = frozenset({StepStatus.RUNNING, StepStatus.PENDING, StepStatus.DEAD})


@dataclass(frozen=True)
class InvariantReport:
    now: datetime
    # Tasks created or finished since then were checked with the active ones; None: all.
    since: datetime | None
    tasks_checked: int
    findings: list[Finding]

    @property
    def ok(self) -> bool:
        return not self.findings


def sweep_grace() -> timedelta:
    """How late the sweeper may be before a lease or an expiry it missed is a finding."""
    return timedelta(seconds=settings.TASKS_SWEEP_SECONDS * 2)


def check(
    *, since: datetime | timedelta | None = DEFAULT_WINDOW, batch_size: int = BATCH_SIZE
) -> InvariantReport:
    """Run every check. ``since`` bounds the finished history looked at (a time, or a
    window back from now); ``None`` looks at every task."""
    now = db_now()
    start = now - since if isinstance(since, timedelta) else since
    findings = [*overdue_leases(now), *overdue_approvals(now)]
    checked = 0
    for ids in task_batches(start, batch_size):
        with _snapshot():
            findings += check_tasks(ids, now)
        checked += len(ids)
    findings.sort(key=lambda finding: (finding.task_id or 0, finding.check))
    return InvariantReport(now=now, since=start, tasks_checked=checked, findings=findings)


def task_batches(start: datetime | None, size: int) -> Iterator[list[int]]:
    """Ids of the tasks to fold, ``size`` at a time, in id order: every task when
    ``start`` is None, else the active ones and those created or finished since."""
    if start is None:
        after = 0
        while ids := list(
            Task.objects.filter(pk__gt=after).order_by("pk").values_list("pk", flat=True)[:size]
        ):
            yield ids
            after = ids[-1]
        return
    # One read of the scope: its ids are few beside a long finished history.
    scope = list(
        Task.objects.filter(
            Q(status__in=ACTIVE_TASK_STATUSES)
            | Q(created_at__gte=start)
            | Q(finished_at__gte=start)
        )
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    for index in range(0, len(scope), size):
        yield scope[index : index + size]


@contextmanager
def _snapshot() -> Iterator[None]:
    """Read a batch's tasks, steps and events as of one moment, so a transition committed
    between two of the reads is not mistaken for a disagreement. (Inside a transaction
    already, as in tests, the reads share that one.)"""
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        yield
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield


# --- the checks that look at whole tasks ------------------------------------------------------


def check_tasks(ids: Sequence[int], now: datetime) -> list[Finding]:
    """The ``history``, ``dead_letter`` and ``effect`` checks of the tasks ``ids``, and
    those of :mod:`tasks_app.observability.history_checks` (``enqueued``, ``fencing``, ``claim``,
    ``terminal``)."""
    statuses: dict[int, str] = {}
    findings: list[Finding] = []
    for pk, status, payload in Task.objects.filter(pk__in=ids).values_list(
        "pk", "status", "payload"
    ):
        statuses[pk] = status
        findings += _undecodable(pk, None, {"payload": payload})
    steps: dict[int, dict[int, StepState]] = {pk: {} for pk in statuses}
    first_positions: dict[int, list[int]] = {pk: [] for pk in statuses}
    placed: dict[int, list[StepRow]] = {pk: [] for pk in statuses}
    for (
        pk, task_id, position, revision, item, status, attempts, token, result, change,
        after, started_at, finished_at, key,
    ) in Step.objects.filter(task_id__in=ids).values_list(
        "pk", "task_id", "position", "revision", "item", "status", "attempts",
        "fencing_token", "result", "change_request", "after", "started_at", "finished_at",
        "idempotency_key",
    ):  # fmt: skip
        if task_id in steps:
            steps[task_id][pk] = StepState(status, attempts, token)
            placed[task_id].append(
                StepRow(pk, position, status, after, started_at, finished_at, key)
            )
            if revision == 0 and item == 0:  # (a fan-out's later items came later)
                first_positions[task_id].append(position)
            findings += _undecodable(task_id, pk, {"result": result, "change_request": change})
    effects: dict[int, list[tuple[str, int]]] = {}
    for key, step_id, task_id in Effect.objects.filter(step__task_id__in=ids).values_list(
        "key", "step_id", "step__task_id"
    ):
        effects.setdefault(task_id, []).append((key, step_id))
    # Tasks pruned since the ids were read are left out.
    events: dict[int, list[EventRow]] = {
        owner: [
            EventRow(entry.pk, entry.step_id, entry.kind, entry.data or {}) for entry in entries
        ]
        for owner, entries in timeline.histories(statuses).items()
    }

    for task_id, status in statuses.items():
        stored = TaskState.stored(status, steps[task_id])
        folded = fold_events((event.kind, event.data) for event in events[task_id])
        if folded != stored:
            findings.append(Finding("history", task_id, _difference(stored, folded)))
        findings += _unlettered(task_id, steps[task_id], events[task_id])
        findings += history_findings(task_id, steps[task_id], events[task_id])
        findings += first_steps_findings(task_id, first_positions[task_id])
        findings += order_findings(task_id, placed[task_id])
        findings += effect_key_findings(task_id, placed[task_id], effects.get(task_id, []))
    decided_by_nobody = [
        pk
        for task_steps in steps.values()
        for pk, state in task_steps.items()
        if state.status not in EFFECT_SETTLERS
    ]
    findings += orphaned_effects(decided_by_nobody, now)
    return findings


def _undecodable(task_id: int, step_id: int | None, columns: dict[str, object]) -> list[Finding]:
    """A finding for each of a row's JSON ``columns`` that Python cannot decode."""
    row = f"task {task_id}" if step_id is None else f"step {step_id}"
    return [
        Finding("undecodable", task_id, f"column {column} of {row} {value}")
        for column, value in columns.items()
        if is_undecodable(value)
    ]


def _difference(stored: TaskState, folded: TaskState) -> str:
    def show(state: StepState | None) -> str:
        return "none" if state is None else f"{state.status}/{state.attempts}/{state.fencing_token}"

    parts = []
    if stored.status != folded.status:
        parts.append(f"status {stored.status} (events say {folded.status})")
    for step_id in sorted(stored.steps.keys() | folded.steps.keys()):
        mine, theirs = stored.steps.get(step_id), folded.steps.get(step_id)
        if mine != theirs:
            parts.append(f"step {step_id} {show(mine)} (events say {show(theirs)})")
    return "stored state differs from its events: " + "; ".join(parts)


def _unlettered(
    task_id: int, steps: dict[int, StepState], events: Sequence[EventRow]
) -> list[Finding]:
    """Dead steps with no ``dead_lettered`` event since the last event that had them in
    another status (a redrive or a resolve revives a step; dying again letters it again)."""
    revived: dict[int, int] = {}
    lettered: dict[int, int] = {}
    for index, event in enumerate(events):
        if event.kind == EventKind.DEAD_LETTERED and event.step_id is not None:
            lettered[event.step_id] = index
        for step_id, (status, _, _) in (event.data.get("steps") or {}).items():
            if status != StepStatus.DEAD:
                revived[int(step_id)] = index
    return [
        Finding("dead_letter", task_id, f"step {pk} is dead without its dead_lettered event")
        for pk, state in steps.items()
        if state.status == StepStatus.DEAD and lettered.get(pk, -1) <= revived.get(pk, -1)
    ]


def orphaned_effects(step_ids: Sequence[int], now: datetime) -> list[Finding]:
    """Effects of ``step_ids`` started longer ago than a lease and never finished."""
    if not step_ids:
        return []
    cutoff = now - timedelta(seconds=settings.TASKS_LEASE_SECONDS)
    rows = (
        Effect.objects.filter(
            step_id__in=step_ids, status=Effect.Status.STARTED, created_at__lt=cutoff
        )
        .order_by("pk")
        .values_list("key", "step_id", "step__task_id", "step__status", "created_at")
    )
    return [
        Finding(
            "effect",
            task_id,
            f"effect {key} started at {started.isoformat()} and never finished, and its "
            f"step {step_id} is {status}: nothing will decide whether it happened",
        )
        for key, step_id, task_id, status, started in rows
    ]


# --- the checks on active work, read from their partial indexes ----------------------------------


def overdue_leases(now: datetime) -> list[Finding]:
    cutoff = now - sweep_grace()
    rows = (
        Step.objects.filter(status=StepStatus.RUNNING)
        .filter(Q(lease_expires_at__lt=cutoff) | Q(lease_expires_at=None))
        .order_by("pk")
        .values_list("pk", "task_id", "fencing_token", "lease_expires_at")
    )
    return [
        Finding(
            "lease",
            task_id,
            f"step {pk} is running without a lease (token {token})"
            if expired is None
            else f"step {pk} is running on a lease that expired at {expired.isoformat()} "
            f"(token {token}); the sweeper reaps those within {sweep_grace()}",
        )
        for pk, task_id, token, expired in rows
    ]


def overdue_approvals(now: datetime) -> list[Finding]:
    # The core does not import the approvals app (it builds on the core); its model is
    # looked up only when it is installed.
    if not apps.is_installed("approvals"):
        return []
    requests = apps.get_model("approvals", "ApprovalRequest")
    rows = (
        requests.objects.filter(status="pending", expires_at__lt=now - sweep_grace())
        .order_by("pk")
        .values_list("pk", "task_id", "step_id", "expires_at")
    )
    return [
        Finding(
            "approval",
            task_id,
            f"approval request {pk} (step {step_id}) is pending past its expiry at "
            f"{expires.isoformat()}; the sweeper expires those within {sweep_grace()}",
        )
        for pk, task_id, step_id, expires in rows
    ]
