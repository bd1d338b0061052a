"""The invariant checker's checks of a task's steps against its graph (``order``): no step
was made due, ran or ended before every step it waits for had succeeded; and of its
external writes against its step keys (``effect_key``): no write can be made twice.

A step that left ``blocked`` (due, running, waiting for a person, succeeded or dead) stands
on the steps it waits for (``tasks_app.models.graphs.waits_for``, read from its row as its
task was enqueued): each of their current rows has succeeded, and finished no later than
the step's last attempt started. In a line that is the step before; in a graph, each of
its branches, so a join that ran before one of its branches finished is found here.
Superseded rows are history and are not checked; cancelled ones never ran.

The ledger applies each effect key once (its key is unique), so a write is made twice only
under two keys: one outside the key of the step that made it (``<step key>:<name>``), or
a step key two current rows hold (a rewind's rows keep their key, and supersede the rows
they replace; a fan-out's items each have their own). Either is an ``effect_key`` finding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tasks_app.models import StepStatus, graphs
from tasks_app.observability.history_checks import Finding

# The statuses of a step that has left ``blocked``: its dependencies stand behind it.
STARTED = frozenset(
    {
        StepStatus.PENDING,
        StepStatus.RUNNING,
        StepStatus.WAITING_APPROVAL,
        StepStatus.SUCCEEDED,
        StepStatus.DEAD,
    }
)


@dataclass(frozen=True)
class StepRow:
    pk: int
    position: int
    status: str
    after: Any
    started_at: datetime | None
    finished_at: datetime | None
    key: str = ""


def order_findings(task_id: int, rows: Sequence[StepRow]) -> list[Finding]:
    """The ``order`` check of one task's current step rows."""
    current = [row for row in rows if row.status != StepStatus.SUPERSEDED]
    by_position: dict[int, list[StepRow]] = {}
    for row in current:
        by_position.setdefault(row.position, []).append(row)
    findings = []
    for row in current:
        if row.status not in STARTED:
            continue
        for position in graphs.waits_for(row):
            found = by_position.get(position, [])
            unfinished = [other for other in found if other.status != StepStatus.SUCCEEDED]
            if not found or unfinished:
                shown = (
                    f"step {unfinished[0].pk} {unfinished[0].status}"
                    if unfinished
                    else "no current row"
                )
                findings.append(
                    Finding(
                        "order",
                        task_id,
                        f"step {row.pk} is {row.status} but the step it waits for at "
                        f"position {position} has not succeeded ({shown})",
                    )
                )
                continue
            ended = [(other.finished_at, other) for other in found if other.finished_at]
            last = max(ended, key=lambda pair: pair[0], default=None)
            if last is not None and row.started_at is not None and last[0] > row.started_at:
                before = last[1]
                findings.append(
                    Finding(
                        "order",
                        task_id,
                        f"step {row.pk} started at {row.started_at.isoformat()}, before the "
                        f"step it waits for (step {before.pk}) finished at "
                        f"{last[0].isoformat()}",
                    )
                )
    return findings


def effect_key_findings(
    task_id: int, rows: Sequence[StepRow], effects: Sequence[tuple[str, int]]
) -> list[Finding]:
    """The ``effect_key`` check of one task's step rows and its effects ``(key, step id)``."""
    findings = []
    keys = {row.pk: row.key for row in rows}
    for key, step_id in effects:
        if not key.startswith(f"{keys.get(step_id)}:"):
            findings.append(
                Finding(
                    "effect_key",
                    task_id,
                    f"effect {key} of step {step_id} is not under its step key "
                    f"{keys.get(step_id)!r}: a rerun would make the write again",
                )
            )
    holders: dict[str, list[int]] = {}
    for row in rows:
        if row.status != StepStatus.SUPERSEDED:
            holders.setdefault(row.key, []).append(row.pk)
    findings += [
        Finding(
            "effect_key",
            task_id,
            f"steps {', '.join(map(str, pks))} both stand with the step key {key!r}: each "
            "would make its writes",
        )
        for key, pks in holders.items()
        if len(pks) > 1
    ]
    return findings
