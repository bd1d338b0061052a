"""Tasks, their steps, every lease and an append-only event history.

The database is the source of truth: nothing but ``tasks_app.services`` writes a status
field, and every transition is written beside its :class:`Event` in one transaction.

The tables live in modules of one concern each: ``work`` (tasks and steps), ``attempts``
(each attempt's Lease row), ``effect_ledger`` (the external writes), ``events`` (the
history and the audit chain's checkpoints), ``system_state`` (queue switches, counters,
heartbeats, workflow samples) and ``schedules`` (periodic work and the slots it decided).
Their public names are re-exported here, so ``from tasks_app.models import Task`` is the
one way in.
"""

from __future__ import annotations

from tasks_app.models.attempts import Lease, leases_of
from tasks_app.models.effect_ledger import Effect
from tasks_app.models.events import (
    OPERATOR_EVENT_KINDS,
    RARE_EVENT_KINDS,
    AppendOnlyError,
    AuditCheckpoint,
    AuditCheckpointQuerySet,
    Event,
    EventKind,
    EventQuerySet,
)
from tasks_app.models.limits import LimitKey, LimitState
from tasks_app.models.programs import ApiToken, AutoApply, PlanStatus, ProposedPlan
from tasks_app.models.schedules import RunOutcome, ScheduleRun, StoredSchedule
from tasks_app.models.statuses import (
    ACTIVE_TASK_STATUSES,
    FINAL_STEP_STATUSES,
    TERMINAL_TASK_STATUSES,
    StepStatus,
    TaskStatus,
    derive_task_status,
    live_task_status,
    stored_task_status,
)
from tasks_app.models.system_state import Counter, Heartbeat, QueueState, WorkflowSample
from tasks_app.models.work import (
    AWAITING_VERSION_Q,
    PayloadSearch,
    Step,
    StepQuerySet,
    Task,
    TaskQuerySet,
    live_status_fields,
    step_key,
)

__all__ = [
    "ACTIVE_TASK_STATUSES",
    "AWAITING_VERSION_Q",
    "FINAL_STEP_STATUSES",
    "OPERATOR_EVENT_KINDS",
    "RARE_EVENT_KINDS",
    "TERMINAL_TASK_STATUSES",
    "ApiToken",
    "AppendOnlyError",
    "AuditCheckpoint",
    "AuditCheckpointQuerySet",
    "AutoApply",
    "Counter",
    "Effect",
    "Event",
    "EventKind",
    "EventQuerySet",
    "Heartbeat",
    "Lease",
    "LimitKey",
    "LimitState",
    "PayloadSearch",
    "PlanStatus",
    "ProposedPlan",
    "QueueState",
    "RunOutcome",
    "ScheduleRun",
    "Step",
    "StepQuerySet",
    "StepStatus",
    "StoredSchedule",
    "Task",
    "TaskQuerySet",
    "TaskStatus",
    "WorkflowSample",
    "derive_task_status",
    "leases_of",
    "live_status_fields",
    "live_task_status",
    "step_key",
    "stored_task_status",
]
