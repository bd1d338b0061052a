"""Every state change of the task system: the names of DESIGN §3, gathered from the
modules that hold them (one concern each).

| module | holds |
|---|---|
| ``access`` | the ``Actor`` type, actor names, permission checks |
| ``engine.states`` | the step's state machine: a step made due, an attempt ended, a task settled |
| ``engine.transitions`` | task locks, a step's place in its workflow, what a handler is given |
| ``history.events`` | recording an event beside its change |
| ``engine.enqueueing`` | ``enqueue``, ``enqueue_many``, ``get_task`` |
| ``engine.leases`` | claim, heartbeat, complete, fail, stale writes |
| ``engine.waiting`` | opening, closing, revising approval steps; a person's own draft |
| ``operations.operator_actions`` | redrive, resolve, cancel, pause and resume, bulk actions |
| ``operations.limits`` | a limit changed live (previewed first), a limit's key paused and resumed |
| ``engine.sweeper`` | reaping expired leases, ringing again for due steps, registered jobs |

Each function changes state in one transaction and writes the Event of each transition
beside it. Lock order is always task row, then step rows, so a cancel racing a claim or
a completion waits instead of deadlocking; the only writes that lock a step without its
task (a heartbeat, the effects ledger's start) take no other lock.
"""

from __future__ import annotations

from tasks_app.access import SWEEPER, SYSTEM, Actor, actor_fields, check_permission
from tasks_app.db.clock import db_now
from tasks_app.engine.enqueueing import EnqueueResult, PreparedItem, enqueue, enqueue_many, get_task
from tasks_app.engine.leases import (
    Claim,
    HeartbeatResult,
    awaiting_version_since,
    claim_step,
    complete_step,
    fail_step,
    heartbeat,
    reject_stale,
    release_claim,
)
from tasks_app.engine.sweeper import (
    SweepReport,
    reap_expired_leases,
    redispatch_due,
    register_sweep_job,
    sweep,
)
from tasks_app.engine.transitions import (
    bump_counter,
    is_approval,
    lock_task,
    step_context,
    step_inputs,
    try_lock_task,
)
from tasks_app.engine.waiting import close_approval_step, open_approval_step, replace_draft, revise
from tasks_app.history.events import event_error, record_event
from tasks_app.operations.limits import (
    change_limit,
    pause_key,
    preview_change,
    reset_limit,
    resume_key,
)
from tasks_app.operations.operator_actions import (
    BULK_ACTIONS,
    BulkReport,
    act_on_tasks,
    bulk_limit,
    cancel,
    check_bulk,
    check_params,
    new_plan_id,
    pause_queue,
    paused_queues,
    redrive,
    resolve,
    resume_queue,
    run_action,
)
from tasks_app.operations.rewinds import RewindPlan, plan_rewind, rewind, rewind_from

__all__ = [
    "BULK_ACTIONS",
    "SWEEPER",
    "SYSTEM",
    "Actor",
    "BulkReport",
    "Claim",
    "EnqueueResult",
    "HeartbeatResult",
    "PreparedItem",
    "RewindPlan",
    "SweepReport",
    "act_on_tasks",
    "actor_fields",
    "awaiting_version_since",
    "bulk_limit",
    "bump_counter",
    "cancel",
    "change_limit",
    "check_bulk",
    "check_params",
    "check_permission",
    "claim_step",
    "close_approval_step",
    "complete_step",
    "db_now",
    "enqueue",
    "enqueue_many",
    "event_error",
    "fail_step",
    "get_task",
    "heartbeat",
    "is_approval",
    "lock_task",
    "new_plan_id",
    "open_approval_step",
    "pause_key",
    "pause_queue",
    "paused_queues",
    "plan_rewind",
    "preview_change",
    "reap_expired_leases",
    "record_event",
    "redispatch_due",
    "redrive",
    "register_sweep_job",
    "reject_stale",
    "release_claim",
    "replace_draft",
    "reset_limit",
    "resolve",
    "resume_key",
    "resume_queue",
    "revise",
    "rewind",
    "rewind_from",
    "run_action",
    "step_context",
    "step_inputs",
    "sweep",
    "try_lock_task",
]
