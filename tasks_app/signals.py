"""Signals the core sends for apps that build on it (the core imports none of them), and
for producers that want to hear how their tasks end."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from django.db import transaction
from django.dispatch import Signal

from tasks_app.models import Task, TaskStatus

logger = logging.getLogger(__name__)

# Sent inside the cancelling transaction with ``task``, ``steps`` (the rows just
# cancelled), ``actor`` and ``reason``: an app that keeps its own records for waiting steps
# (approval requests) closes them in the same commit.
steps_cancelled = Signal()

# Sent with ``task`` (sender ``Task``, the row as it is once the commit is done) once per
# outcome, after the transaction that reached it committed: never for a transition that
# rolled back. A task redriven after it died and
# dying again is a second outcome, and a second signal.
task_succeeded = Signal()
task_dead_lettered = Signal()
task_cancelled = Signal()

OUTCOMES: dict[str, Signal] = {
    TaskStatus.SUCCEEDED: task_succeeded,
    TaskStatus.DEAD: task_dead_lettered,
    TaskStatus.CANCELLED: task_cancelled,
}


def announce_on_commit(
    changes: Iterable[tuple[int, str]], *, rows: Mapping[int, Task] | None = None
) -> None:
    """Send the outcome signal of each ``(task id, new status)`` after the current
    transaction commits. Callers pass only statuses that just changed, and the tasks as
    this transaction leaves them in ``rows`` when they have them (the others are read
    after the commit)."""
    outcomes = [(pk, status) for pk, status in changes if status in OUTCOMES]
    # The hot path pays nothing when nobody listens.
    if outcomes and any(OUTCOMES[status].has_listeners(Task) for _, status in outcomes):
        transaction.on_commit(lambda: _announce(outcomes, rows or {}), robust=True)


def _announce(outcomes: list[tuple[int, str]], rows: Mapping[int, Task]) -> None:
    missing = [pk for pk, _ in outcomes if pk not in rows]
    tasks = {**rows, **(Task.objects.in_bulk(missing) if missing else {})}
    for pk, status in outcomes:
        task = tasks.get(pk)
        if task is None:
            continue
        for receiver, answer in OUTCOMES[status].send_robust(sender=Task, task=task):
            if isinstance(answer, Exception):
                logger.error(
                    "receiver %r of the %s signal failed for task #%s",
                    receiver,
                    status,
                    pk,
                    exc_info=answer,
                )
