"""A task as it stood after any point of its history (what changed between two points is
``as_of_changes``).

A point is an entry of ``timeline.history`` (0 is the enqueue). Each part of the task is
read from what recorded it, so a point shows what was known then, whatever changed since:

1. its status, and each step row's status, attempts and token: the fold of the history up
   to that point (``replay.fold_events``, the fold the invariant check holds to the rows);
   a row exists from the entry that first names it (the enqueue, a revision, a fan-out);
2. the payload: the task's, walked back through the edits made to it (the event of each,
   a redrive's or a rewind's, keeps the old and the new payload);
3. the attempts: a Lease row from its claim's entry, with its outcome from the entry that
   left its step with its token and no longer running (by their times where no entry says);
4. the external writes: an Effect row by its ``created_at`` and ``finished_at``, kept
   between the claim that started it and the end of that attempt, since the ledger is
   stamped by the worker's clock and the history by the database's. A row since deleted
   (a call a person said did not happen is forgotten; a refused call leaves none) is not
   known.

The draft and the approval requests are ``approvals.as_of``'s, which fills them in: this
layer knows no approvals table and leaves them empty. A step's result counts from the
point its row first succeeded (nothing leaves ``succeeded``, so the stored result is the
one it had then): :attr:`TaskRecord.first_success`.

Reading a task costs a fixed number of queries however long its history
(:func:`read`); a point is then worked out in memory (:func:`state_after`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import accumulate
from typing import Any

from tasks_app.history.replay import fold_events
from tasks_app.history.timeline import HistoryEntry, history
from tasks_app.models import Effect, Lease, Step, StepStatus, Task, leases_of


@dataclass(frozen=True)
class Point:
    """The entry a state follows: its place in the history and what it says happened."""

    index: int
    kind: str
    created_at: datetime
    actor: str
    reason: str


@dataclass(frozen=True)
class StepAsOf:
    pk: int
    kind: str
    position: int
    revision: int
    item: int
    status: str
    attempts: int
    token: int

    @property
    def label(self) -> str:
        """``kind``; ``kind r1`` for a revision's row, ``kind #3`` for a fan-out's third item."""
        revision = f" r{self.revision}" if self.revision else ""
        item = f" #{self.item + 1}" if self.item else ""
        return f"{self.kind}{revision}{item}"


@dataclass(frozen=True)
class AttemptAsOf:
    step_id: int
    step: str
    token: int
    worker: str
    acquired_at: datetime
    # How it ended, "" while it was still held at that point.
    outcome: str

    @property
    def shown(self) -> str:
        return self.outcome or "held"


@dataclass(frozen=True)
class EffectAsOf:
    key: str
    step: str
    status: str


@dataclass(frozen=True)
class ApprovalAsOf:
    pk: int
    revision: int
    status: str
    # Who had approved it by then, in order (a quorum counts several).
    voters: tuple[str, ...] = ()
    decided_by: str = ""


@dataclass(frozen=True)
class Snapshot:
    point: Point
    status: str
    steps: tuple[StepAsOf, ...]
    payload: Any
    attempts: tuple[AttemptAsOf, ...]
    effects: tuple[EffectAsOf, ...]
    # The draft under review then, None where none was known (``approvals.as_of``).
    draft: Any = None
    approvals: tuple[ApprovalAsOf, ...] = ()


@dataclass(frozen=True)
class TaskRecord:
    """What a task's points are worked out from, read once."""

    task: Task
    entries: list[HistoryEntry]
    rows: dict[int, Step]
    leases: list[Lease]
    effects: list[Effect]
    # Each attempt's claim and end, as entry indexes, by (step id, token).
    claims: dict[tuple[int, int], int]
    ends: dict[tuple[int, int], int]
    # The entry at which each step row first succeeded.
    first_success: dict[int, int]
    # The latest time stamped on the entries up to each index: what the clock had reached.
    reached: list[datetime]

    def index_at(self, moment: datetime) -> int | None:
        """The first point by which ``moment`` had passed, or None if it came after them
        all."""
        found = bisect_left(self.reached, moment)
        return found if found < len(self.reached) else None


def read(task: Task) -> TaskRecord:
    """``task``'s history and the rows its points are read from, in a fixed number of
    queries: the history's own, the step rows, the attempts, the ledger."""
    entries = history(task.pk)
    rows = {step.pk: step for step in Step.objects.filter(task_id=task.pk)}
    leases = [lease for held in leases_of(rows.values()).values() for lease in held]
    effects = list(Effect.objects.filter(step_id__in=list(rows)).order_by("created_at", "pk"))
    claims, ends, first_success = _marks(entries)
    return TaskRecord(
        task=task,
        entries=entries,
        rows=rows,
        leases=leases,
        effects=effects,
        claims=claims,
        ends=ends,
        first_success=first_success,
        reached=list(accumulate((entry.created_at for entry in entries), max)),
    )


def _marks(
    entries: Sequence[HistoryEntry],
) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int], int], dict[int, int]]:
    """Where each attempt began (its step running with a new token) and ended (its step,
    with that token, no longer running), and where each row first succeeded."""
    claims: dict[tuple[int, int], int] = {}
    ends: dict[tuple[int, int], int] = {}
    first_success: dict[int, int] = {}
    for index, entry in enumerate(entries):
        for step_id, (status, _, token) in changed_steps(entry):
            attempt = (step_id, token)
            if status == StepStatus.RUNNING:
                claims.setdefault(attempt, index)
            elif attempt in claims:
                ends.setdefault(attempt, index)
            if status == StepStatus.SUCCEEDED:
                first_success.setdefault(step_id, index)
    return claims, ends, first_success


def changed_steps(entry: HistoryEntry) -> list[tuple[int, tuple[str, int, int]]]:
    """The ``(step id, (status, attempts, token))`` an entry records."""
    steps = (entry.data or {}).get("steps") or {}
    return [(int(pk), (state[0], int(state[1]), int(state[2]))) for pk, state in steps.items()]


def state_after(record: TaskRecord, index: int) -> Snapshot:
    """The task as it stood after entry ``index`` of its history (0 is the enqueue);
    IndexError outside the history."""
    if not 0 <= index < len(record.entries):
        raise IndexError(f"task #{record.task.pk} has no history entry {index}")
    entry = record.entries[index]
    folded = fold_events((each.kind, each.data) for each in record.entries[: index + 1])
    steps = sorted(
        (
            _step(record, pk, state.status, state.attempts, state.fencing_token)
            for pk, state in folded.steps.items()
        ),
        key=lambda step: (step.position, step.revision, step.item, step.pk),
    )
    return Snapshot(
        point=Point(index, entry.kind, entry.created_at, entry.actor, entry.reason or ""),
        status=str(folded.status),
        steps=tuple(steps),
        payload=payload_after(record, index),
        attempts=tuple(sorted(_attempts(record, index), key=lambda a: a.acquired_at)),
        effects=tuple(_effects(record, index)),
    )


def _step(record: TaskRecord, pk: int, status: str, attempts: int, token: int) -> StepAsOf:
    """The row ``pk`` with the state a point gives it."""
    row = record.rows.get(pk)
    return StepAsOf(
        pk=pk,
        kind=row.kind if row is not None else f"step {pk}",
        position=row.position if row is not None else 0,
        revision=row.revision if row is not None else 0,
        item=row.item if row is not None else 0,
        status=str(status),
        attempts=attempts,
        token=token,
    )


def payload_after(record: TaskRecord, index: int) -> Any:
    """The payload after entry ``index``: the newest edit made by then, else the payload
    before the first edit (the task's own where none was made)."""
    edits = [
        (at, entry.data)
        for at, entry in enumerate(record.entries)
        if "new_payload" in (entry.data or {})
    ]
    made = [data["new_payload"] for at, data in edits if at <= index]
    if made:
        return made[-1]
    return edits[0][1].get("old_payload") if edits else record.task.payload


def _labels(record: TaskRecord) -> dict[int, str]:
    return {pk: _step(record, pk, "", 0, 0).label for pk in record.rows}


def _attempts(record: TaskRecord, index: int) -> Iterable[AttemptAsOf]:
    labels = _labels(record)
    for lease in record.leases:
        attempt = (lease.step_id, lease.token)
        began = record.claims.get(attempt, record.index_at(lease.acquired_at))
        if began is None or began > index:
            continue
        ended = record.ends.get(attempt)
        if ended is None and lease.released_at is not None:
            ended = record.index_at(lease.released_at)
        yield AttemptAsOf(
            step_id=lease.step_id,
            step=labels.get(lease.step_id, f"step {lease.step_id}"),
            token=lease.token,
            worker=lease.worker_id,
            acquired_at=lease.acquired_at,
            outcome=lease.outcome if ended is not None and ended <= index else "",
        )


def effect_span(
    record: TaskRecord, effect: Effect, outcomes: dict[tuple[int, int], str]
) -> tuple[int | None, int | None]:
    """The points from which ``effect`` was started and done (None: not by any point).

    By its own times, but never before the claim that started it, and started by the end
    of that attempt; done by that end when the attempt succeeded, since a handler returns
    only once each of its calls has its result. ``outcomes``: how each attempt ended, by
    (step id, token)."""
    attempt = (effect.step_id, effect.token)
    claim, end = record.claims.get(attempt), record.ends.get(attempt)
    started = record.index_at(effect.created_at)
    if end is not None:
        started = end if started is None else min(started, end)
    if claim is not None and started is not None:
        started = max(started, claim)
    if started is None or effect.status != Effect.Status.DONE or effect.finished_at is None:
        return started, None
    done = record.index_at(effect.finished_at)
    if outcomes.get(attempt) == Lease.Outcome.SUCCEEDED and end is not None:
        done = end if done is None else min(done, end)
    return started, None if done is None else max(done, started)


def _effects(record: TaskRecord, index: int) -> Iterable[EffectAsOf]:
    labels = _labels(record)
    outcomes = {(lease.step_id, lease.token): lease.outcome for lease in record.leases}
    for effect in record.effects:
        started, done = effect_span(record, effect, outcomes)
        if started is None or started > index:
            continue
        finished = done is not None and done <= index
        yield EffectAsOf(
            key=effect.key,
            step=labels.get(effect.step_id, f"step {effect.step_id}"),
            status=str(Effect.Status.DONE if finished else Effect.Status.STARTED),
        )
