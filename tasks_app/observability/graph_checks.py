"""The invariant checker's check of a task's steps against its graph (``order``): no step
was made due, ran or ended before every step it waits for had succeeded.

A step that left ``blocked`` (due, running, waiting for a person, succeeded or dead) stands
on the steps it waits for (``tasks_app.models.graphs.waits_for``, read from its row as its
task was enqueued): each of their current rows has succeeded, and finished no later than
the step's last attempt started. In a line that is the step before; in a graph, each of
its branches, so a join that ran before one of its branches finished is found here.
Superseded rows are history and are not checked; cancelled ones never ran.
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
