"""Fan-outs: a step that runs once per item of a list known only at run time.

A workflow declares one as a step with ``fan_out`` (``StepSpec``): a function of the results
of the steps it waits for that gives the items, at most ``max_items``. The enqueue makes its
row as every step's (item 0, ``blocked``). When the steps it waits for have succeeded, the
transaction that saw the last of them succeed asks for the items and, for N of them, makes
item 0 due and adds items 1 to N-1 at the same position, each its own step: its own lease,
attempts, step key (its first row's and ``:i<n>``: ``models.work.item_key``) and ledger
entries. N is recorded with them (the event's ``fanned_out``). A step that waits for a
fan-out waits for every one of its rows, and gets their results as one list in item order
(:func:`results_of`).

A fan-out of no items succeeds at once without running: its one row holds ``[]`` and was
never claimed, and the steps after it get ``[]``. A fan-out whose function fails, or gives
something other than a list, or too many items, is refused: its row is dead with
``fan_out_refused`` and the reason, for on-call; a redrive asks for the items again.

Each row's item is not stored: a run asks the same function again, of the same stored
results, and takes its own (:func:`item_of`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tasks_app.access import Actor
from tasks_app.engine.workflows import registry
from tasks_app.history.events import event_error, record_event
from tasks_app.models import EventKind, Step
from tasks_app.models.work import item_key

if TYPE_CHECKING:
    from tasks_app.engine.workflows import StepSpec
    from tasks_app.models import Task

FAN_OUT_REFUSED = "fan_out_refused"


@dataclass(frozen=True)
class Items:
    """What a fan-out's function gave: its items, or (``items`` None) why it is refused."""

    items: list[Any] | None
    error: str = ""


def spec_of(task: Task, step: Step) -> StepSpec | None:
    """The fan-out ``step`` is a row of, under its task's workflow version; None when it
    is not one (or the version is not known here)."""
    flow = registry.get(task.workflow, task.workflow_version)
    spec = flow.step(step.position) if flow is not None else None
    if spec is None or spec.kind != step.kind or spec.fan_out is None:
        return None
    return spec


def items_for(spec: StepSpec, results: Mapping[str, Any]) -> Items:
    """The items of the fan-out ``spec`` given ``results`` (of the steps it waits for)."""
    assert spec.fan_out is not None
    try:
        given = spec.fan_out(results)
    except Exception as exc:
        return Items(None, f"{spec.kind}: fan_out raised {type(exc).__name__}: {exc}")
    if isinstance(given, (str, bytes, Mapping)) or not isinstance(given, Sequence):
        return Items(None, f"{spec.kind}: fan_out must give a list, not {type(given).__name__}")
    if len(given) > spec.max_items:
        return Items(
            None, f"{spec.kind}: fan_out gave {len(given)} items, more than max_items "
            f"{spec.max_items}",
        )  # fmt: skip
    return Items(list(given))


def item_of(spec: StepSpec, results: Mapping[str, Any], index: int) -> Any:
    """Item ``index`` of the fan-out ``spec``, asked again of the same ``results``."""
    made = items_for(spec, results)
    if made.items is None:
        raise ValueError(made.error)
    if index >= len(made.items):
        raise ValueError(
            f"{spec.kind}: fan_out now gives {len(made.items)} items, and this is item {index}"
        )
    return made.items[index]


def results_of(rows: Sequence[Step]) -> list[Any]:
    """The results of a fan-out's succeeded rows, in item order: ``[]`` for a fan-out of
    no items (its one row succeeded without a claim)."""
    ordered = sorted(rows, key=lambda row: row.item)
    if len(ordered) == 1 and ordered[0].attempts == 0 and ordered[0].result == []:
        return []
    return [row.result for row in ordered]


def refused_at_start(step: Step) -> bool:
    """Whether ``step`` is a fan-out refused before it started (dead, never claimed),
    whose items a redrive asks for again; a row refused later only runs again."""
    return step.error_class == FAN_OUT_REFUSED and step.attempts == 0


def item_row(task: Task, first: Step, item: int) -> Step:
    """Item ``item`` of the fan-out whose first row is ``first``: a new row (unsaved,
    ``blocked`` as every new row; the state machine makes it due)."""
    return Step(
        task=task, position=first.position, revision=first.revision, item=item,
        kind=first.kind, queue=first.queue, priority=first.priority,
        max_attempts=first.max_attempts, limits=first.limits, limit_turn=first.limit_turn,
        after=first.after,
        idempotency_key=item_key(first.idempotency_key, item),
    )  # fmt: skip


def letter_refused(task: Task, refused: Sequence[Step], status: str, actor: Actor) -> None:
    """The ``dead_lettered`` event of each fan-out ``refused`` (dead), written after the
    event that recorded the change, with the task's ``status`` as it left it."""
    for step in refused:
        record_event(
            EventKind.DEAD_LETTERED,
            task_id=task.pk,
            step_id=step.pk,
            actor=actor,
            reason=FAN_OUT_REFUSED,
            steps=[step],
            task=task,
            task_status=status,
            error_class=step.error_class,
            error=event_error(step.last_error),
        )
