"""A task's history as everything reads it: its Event rows, and the transitions recorded by the
rows that already hold them (DESIGN rules 8 and 11).

The task row and its first steps (revision 0) record its enqueue (``enqueued``, at the
task's ``created_at``, by its ``created_by``): the workflow, version, queue and payload hash
are the task's, and its steps start as the enqueue made them (the first ``pending``, the
rest ``blocked``, no attempt, token 0). It goes first.

An attempt's Lease row records its claim (``claimed``, at ``acquired_at``) and, when the
attempt succeeded, its success (``succeeded``, at ``released_at``); the live lease of a
step still running, which sits on the step row, records its claim. Those transitions write
no Event of their own. Where an Event records one (history written before, or a success
that also made the next step due, which no attempt record holds), the Event is read and the
record it repeats is not.

Events keep their order (``id``). A transition read from an attempt record goes after the
events of its step's earlier attempts and before those of its own attempt or later ones,
whatever the clocks say (rows are back-dated, a process's clock may be off); between those
bounds it goes by time. Events and attempt records are stamped by the database's clock
(rule 3) and a task's transitions are serialized by its row lock, so the times order them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from tasks_app.models import (
    Event,
    EventKind,
    Lease,
    Step,
    StepStatus,
    Task,
    derive_task_status,
    leases_of,
)
from tasks_app.models.graphs import is_root

# Transitions an attempt's Lease row records, in the order they happen within an attempt.
RECORDED_BY_ATTEMPTS = (EventKind.CLAIMED, EventKind.SUCCEEDED)
# Every transition read from the rows that record it, in the order they happen.
DERIVED_KINDS = (EventKind.ENQUEUED, *RECORDED_BY_ATTEMPTS)


@dataclass(frozen=True)
class DerivedEvent:
    """A transition read from the row that records it (the task's, an attempt's), shaped as
    the Event it stands for (no ``id``: it is not an Event row, and is not in the audit
    chain)."""

    task_id: int
    step_id: int | None
    kind: str
    actor: str
    created_at: datetime
    data: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    actor_user_id: int | None = None
    chain_hash: None = None
    chain_previous: None = None
    id: None = None

    @property
    def pk(self) -> None:
        return None

    def get_kind_display(self) -> str:
        return str(EventKind(self.kind).label)


HistoryEntry = Event | DerivedEvent


def enqueued(task: Task, first_steps: Iterable[Step]) -> DerivedEvent:
    """The enqueue ``task``'s row records, with its steps of revision 0 as it made them.

    How the enqueue makes them is written twice, and read here: ``sql.INSERT_SQL`` (the
    roots ``pending``: a line's first step, a graph's steps that wait for none; the rest
    ``blocked``) and its ORM twin ``enqueueing._insert_with_orm``
    (``states.new_step``, the first made due by ``states.make_due``). The fold check after
    every test compares what this reads with the rows either writer stored."""
    return DerivedEvent(
        task_id=task.pk,
        step_id=None,
        kind=EventKind.ENQUEUED,
        actor=task.created_by,
        actor_user_id=task.created_by_user_id,
        created_at=task.created_at,
        data={
            "workflow": task.workflow,
            "version": task.workflow_version,
            "queue": task.queue,
            "payload_hash": task.payload_hash,
            "steps": {
                str(step.pk): [
                    StepStatus.PENDING
                    if is_root(step.position, step.after)
                    else StepStatus.BLOCKED,
                    0,
                    0,
                ]
                for step in sorted(first_steps, key=lambda step: step.position)
            },
        },
    )


def attempt_events(task_id: int, lease: Lease) -> list[DerivedEvent]:
    """What ``lease`` records of its step's history that no event does: its claim, and its
    success if it ended so. Nothing for a row written before it kept its attempt
    (``attempt`` 0): events record those."""
    return lease_transitions(task_id, lease) if lease.attempt >= 1 else []


def lease_transitions(task_id: int, lease: Lease) -> list[DerivedEvent]:
    """The claim ``lease`` holds, and its success if it ended so, whenever it was written
    (the attempt is left out where the row did not keep it)."""

    def transition(kind: str, status: str, at: datetime, **data: Any) -> DerivedEvent:
        return DerivedEvent(
            task_id=task_id,
            step_id=lease.step_id,
            kind=kind,
            actor=f"worker:{lease.worker_id}",
            created_at=at,
            data={
                "steps": {str(lease.step_id): [status, lease.attempt, lease.token]},
                "token": lease.token,
                **data,
            },
        )

    attempt = {"attempt": lease.attempt} if lease.attempt else {}
    claimed = transition(EventKind.CLAIMED, StepStatus.RUNNING, lease.acquired_at, **attempt)
    if lease.outcome != Lease.Outcome.SUCCEEDED or lease.released_at is None:
        return [claimed]
    return [claimed, transition(EventKind.SUCCEEDED, StepStatus.SUCCEEDED, lease.released_at)]


def _key(entry: HistoryEntry) -> tuple[str, int | None, Any, Any]:
    """What makes a derived transition the same one: kind, step, token, and for a claim the
    attempt it began (an enqueue: its kind alone)."""
    data = entry.data or {}
    attempt = data.get("attempt") if entry.kind == EventKind.CLAIMED else None
    return (entry.kind, entry.step_id, data.get("token"), attempt)


def step_token(event: Event, step_id: int) -> int | None:
    """The fencing token ``event`` leaves step ``step_id`` with (its ``[status, attempts,
    token]`` in ``data["steps"]``), or names for it (``data["token"]`` of an event of that
    step, but for a refused write, whose token is the stale worker's); None if neither."""
    data = event.data or {}
    state = (data.get("steps") or {}).get(str(step_id))
    if state is not None:
        return int(state[2])
    token = data.get("token")
    if event.step_id == step_id and event.kind != EventKind.STALE_WRITE_REJECTED:
        return token if isinstance(token, int) and not isinstance(token, bool) else None
    return None


def _place(events: Sequence[Event], entry: DerivedEvent) -> int:
    """Where ``entry`` (of attempt ``n`` of its step) goes among ``events``: after every event
    of its step from before attempt ``n`` (a token below ``n``), before every event of that
    attempt or a later one (``n`` or above), which the fold's order needs whatever the
    clocks say (rows back-dated, a process's clock off); within those bounds, by time, before
    an event of the same instant (the task's ``cancelled`` written as the attempt ended).
    An enqueue goes first."""
    if entry.step_id is None:  # the enqueue
        return 0
    token = entry.data["token"]
    low, high = 0, len(events)
    for index, event in enumerate(events):
        named = step_token(event, entry.step_id)
        if named is None:
            continue
        if named < token:
            low = index + 1
        elif high == len(events):
            high = index
    by_time = next(
        (i for i, event in enumerate(events) if event.created_at >= entry.created_at),
        len(events),
    )
    return min(max(by_time, low), max(high, low))


def interleave(events: Sequence[Event], derived: Iterable[DerivedEvent]) -> list[HistoryEntry]:
    """``events`` (in id order) with the transitions ``derived`` from the rows that record
    them that no event repeats, each where :func:`_place` puts it."""
    repeated = {_key(event) for event in events if event.kind in DERIVED_KINDS}
    extra = [entry for entry in derived if _key(entry) not in repeated]
    if not extra:
        return list(events)
    slots: dict[int, list[DerivedEvent]] = {}
    for entry in extra:
        slots.setdefault(_place(events, entry), []).append(entry)
    merged: list[HistoryEntry] = []
    for index in range(len(events) + 1):
        merged += sorted(
            slots.get(index, []),
            key=lambda entry: (
                entry.kind != EventKind.ENQUEUED,
                entry.created_at,
                DERIVED_KINDS.index(entry.kind),
            ),
        )
        if index < len(events):
            merged.append(events[index])
    return _with_task_status(merged)


def _with_task_status(history: list[HistoryEntry]) -> list[HistoryEntry]:
    """``history`` with each success read from an attempt record saying the status it left
    its task in (``task_status``, as the success's event said it): the status of the
    task's steps at that point, as the fold reads them (``settle_task`` derived the same
    from the rows when the success was written)."""
    steps: dict[str, str] = {}
    cancel_requested = False
    shown: list[HistoryEntry] = []
    for entry in history:
        data = entry.data or {}
        cancel_requested = cancel_requested or entry.kind == EventKind.CANCEL_REQUESTED
        for step_id, state in (data.get("steps") or {}).items():
            steps[step_id] = state[0]
        if isinstance(entry, DerivedEvent) and entry.kind == EventKind.SUCCEEDED:
            status = derive_task_status(steps.values(), cancel_requested=cancel_requested)
            entry = replace(entry, data={**entry.data, "task_status": str(status)})
        shown.append(entry)
    return shown


def histories(task_ids: Iterable[int]) -> dict[int, list[HistoryEntry]]:
    """The histories of the tasks ``task_ids``, oldest first, by task id (an id with no
    stored task, pruned, maps to what is left of it: its events kept for the audit)."""
    ids = list(task_ids)
    events: dict[int, list[Event]] = {pk: [] for pk in ids}
    for event in Event.objects.filter(task_id__in=ids).order_by("task_id", "id"):
        events[event.task_id or 0].append(event)
    steps = list(
        Step.objects.filter(task_id__in=ids).only(
            "id", "task_id", "position", "revision", "status", "attempts", "fencing_token",
            "started_at", "lease_worker", "lease_expires_at", "after", "item",
        )
    )  # fmt: skip
    owner = {step.pk: step.task_id for step in steps}
    derived: dict[int, list[DerivedEvent]] = {pk: [] for pk in ids}
    tasks = Task.objects.filter(pk__in=ids).only(
        "id", "workflow", "workflow_version", "queue", "payload_hash", "created_by",
        "created_by_user_id", "created_at",
    )  # fmt: skip
    first: dict[int, list[Step]] = {}
    for step in steps:
        if step.revision == 0 and step.item == 0:  # (a fan-out's later items came later)
            first.setdefault(step.task_id, []).append(step)
    for task in tasks:
        derived[task.pk].append(enqueued(task, first.get(task.pk, [])))
    for step_id, leases in leases_of(steps).items():
        for lease in leases:
            derived[owner[step_id]] += attempt_events(owner[step_id], lease)
    return {pk: interleave(events[pk], derived[pk]) for pk in ids}


def history(task_id: int) -> list[HistoryEntry]:
    """One task's history, oldest first (:func:`histories`)."""
    return histories([task_id])[task_id]
