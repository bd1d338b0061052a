"""A task's history: its append-only events, how they are recorded, chained for the audit
and logged, the counters they feed, and the replay that folds them back into the task."""

from __future__ import annotations

from tasks_app.history.replay import StepState, TaskState, fold, fold_events
from tasks_app.models import derive_task_status

__all__ = ["StepState", "TaskState", "derive_task_status", "fold", "fold_events"]
