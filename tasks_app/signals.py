"""Signals the core sends for apps that build on it (the core imports none of them), and
for producers that want to hear how their tasks end (sent by
``tasks_app.engine.announcements.announce_on_commit``)."""

from __future__ import annotations

from django.dispatch import Signal

from tasks_app.models import TaskStatus

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

ENDING_SIGNALS: dict[str, Signal] = {
    TaskStatus.SUCCEEDED: task_succeeded,
    TaskStatus.DEAD: task_dead_lettered,
    TaskStatus.CANCELLED: task_cancelled,
}
