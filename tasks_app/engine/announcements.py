"""The ending signals (``tasks_app.signals``) of tasks whose transitions just ended them,
sent once the transaction that ended them commits."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from django.db import transaction

from tasks_app.models import Task
from tasks_app.signals import ENDING_SIGNALS

logger = logging.getLogger(__name__)


def announce_on_commit(
    changes: Iterable[tuple[int, str]], *, rows: Mapping[int, Task] | None = None
) -> None:
    """Send the ending signal of each ``(task id, new status)`` once the transaction
    commits (``tasks_app.signals``). Callers pass only statuses that just changed, and the
    tasks as they leave them in ``rows`` when they have them (the rest are read then)."""
    outcomes = [(pk, status) for pk, status in changes if status in ENDING_SIGNALS]
    # The hot path pays nothing when nobody listens.
    if outcomes and any(ENDING_SIGNALS[status].has_listeners(Task) for _, status in outcomes):
        transaction.on_commit(lambda: _announce(outcomes, rows or {}), robust=True)


def _announce(outcomes: list[tuple[int, str]], rows: Mapping[int, Task]) -> None:
    missing = [pk for pk, _ in outcomes if pk not in rows]
    tasks = {**rows, **(Task.objects.in_bulk(missing) if missing else {})}
    for pk, status in outcomes:
        task = tasks.get(pk)
        if task is None:
            continue
        for receiver, answer in ENDING_SIGNALS[status].send_robust(sender=Task, task=task):
            if isinstance(answer, Exception):
                logger.error(
                    "receiver %r of the %s signal failed for task #%s",
                    receiver,
                    status,
                    pk,
                    exc_info=answer,
                )
