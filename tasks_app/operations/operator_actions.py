"""What people do to tasks: redrive, resolve, cancel, rewind from a step (one task or
many), pause and resume a queue. Each checks the actor's permission and records who did it
and why."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction

from tasks_app import validation
from tasks_app.access import Actor, actor_fields, check_permission
from tasks_app.db.clock import db_now
from tasks_app.engine import fan_outs
from tasks_app.engine.dispatch import Doorbell, ring_on_commit
from tasks_app.engine.states import (
    Following,
    after_success,
    cancel_steps,
    make_due,
    settle_and_record,
    start,
    succeed,
)
from tasks_app.engine.transitions import is_approval, lock_task
from tasks_app.engine.waiting import open_approval_step
from tasks_app.engine.workflows import registry
from tasks_app.exceptions import InvalidInput, InvalidTransition
from tasks_app.history.events import record_event
from tasks_app.models import Effect, EventKind, QueueState, Step, StepStatus, Task
from tasks_app.models.json_columns import described

# The rewind row's service lives with the rewind; imported so that run_action finds it here.
from tasks_app.operations.rewinds import rewind_from as rewind_from
from tasks_app.operations.task_actions import ACTIONS, Action, refusal
from tasks_app.signals import steps_cancelled


def _run_again(step: Step, now: datetime, delay: timedelta | None = None) -> None:
    """A dead step becomes due now (or after ``delay``) with a fresh attempt budget; its
    token keeps rising. One due later than a doorbell's countdown reaches is left unrung:
    the sweeper rings it once it is due (``states.make_due``)."""
    make_due(step, now, delay=delay.total_seconds() if delay else 0, fresh_budget=True)


def _ring_or_open(
    task: Task, steps: Sequence[Step], *, actor: Actor, delay: timedelta | None = None
) -> None:
    """After a redrive or a resolve: ring for the steps made due (with the delay as the
    countdown, when a doorbell reaches that far), and open the request of an approval step
    among them (no worker runs one)."""
    countdown = delay.total_seconds() if delay is not None else 0.0
    bells = []
    for step in steps:
        if is_approval(task, step.position):
            open_approval_step(task, step, actor=actor)
        elif step.dispatched_at is not None:
            bells.append(Doorbell(step.pk, step.queue, countdown))
    ring_on_commit(bells)


CANCELLABLE = (
    StepStatus.BLOCKED,
    StepStatus.PENDING,
    StepStatus.WAITING_APPROVAL,
    StepStatus.DEAD,
)


def _dead_steps(task: Task, action: Action) -> list[Step]:
    """The task's dead steps, locked, once the action is known to apply (else
    :class:`InvalidTransition` saying why)."""
    dead = list(task.steps.select_for_update().filter(status=StepStatus.DEAD).order_by("position"))
    why = refusal(action, task, dead[0] if dead else None)
    if why is not None:
        raise InvalidTransition(why)
    return dead


def _plan_data(plan: str | None) -> dict[str, Any]:
    """What an event of a bulk action records of it: the plan's id, which groups its events."""
    return {} if plan is None else {"plan": plan}


def redrive(
    task: Task,
    *,
    actor: Actor,
    reason: str,
    payload: dict[str, Any] | None = None,
    delay: timedelta | int | str | None = None,
    plan: str | None = None,
) -> Task:
    """Make a dead task runnable again: fresh attempt budget, same step key, rising token.
    With ``delay`` (a timedelta, seconds, or text such as ``15m``; more than 0, at most 7
    days) the dead steps become due that long after now by the database's clock, and the
    event records it as ``delay_seconds`` (``redrive_later``)."""
    check_permission(actor, "redrive_task")
    reason = validation.require_text(reason, "reason")
    wait = validation.validate_delay(delay) if delay is not None else None
    canonical = validation.validate_payload(payload) if payload is not None else None
    flow = registry.get(task.workflow, task.workflow_version)
    if payload is not None and flow is not None:
        # An edited payload must pass the same rules as one given to enqueue.
        flow.check_payload(payload)
    with transaction.atomic():
        locked = lock_task(task.pk)
        dead = _dead_steps(locked, Action.REDRIVE if wait is None else Action.REDRIVE_LATER)
        now = db_now()
        following = Following()
        for step in dead:
            if fan_outs.refused_at_start(step):
                # A fan-out that never started: its items are asked for again.
                start(locked, step, now, following)
                if following.refused:
                    raise InvalidTransition(f"the fan-out is still refused: {step.last_error}")
            else:
                _run_again(step, now, wait)
        data: dict[str, Any] = _plan_data(plan)
        if wait is not None:
            data["delay_seconds"] = int(wait.total_seconds())
        if canonical is not None:
            # An undecodable old payload is kept as a note saying so: the event stays
            # decodable (an edit is how a person mends such a task).
            old = described(locked.payload)
            data.update(old_payload=old, new_payload=json.loads(canonical))
            locked.payload = data["new_payload"]
            locked.save(update_fields=["payload", "updated_at"])
        if following.fanned_out:
            data["fanned_out"] = following.fanned_out
        settle_and_record(
            EventKind.REDRIVEN,
            locked,
            actor=actor,
            reason=reason,
            steps=[*dead, *following.changed],
            **data,
        )
        ringing = {step.pk: step for step in [*dead, *following.due]}
        _ring_or_open(locked, list(ringing.values()), actor=actor, delay=wait)
    return locked


def resolve(
    task: Task, *, actor: Actor, reason: str, outcome: str, plan: str | None = None
) -> Task:
    """A person answers for a dead step: ``done`` (it happened) or ``retry`` (it did not)."""
    check_permission(actor, "resolve_task")
    reason = validation.require_text(reason, "reason")
    if outcome not in ("done", "retry"):
        raise InvalidInput("outcome", "choice", "outcome: must be 'done' or 'retry'")
    name, _ = actor_fields(actor)
    with transaction.atomic():
        locked = lock_task(task.pk)
        step = _dead_steps(locked, Action(f"resolve_{outcome}"))[0]
        now = db_now()
        started = Effect.objects.filter(step=step, status=Effect.Status.STARTED)
        changed = [step]
        if outcome == "done":
            started.update(
                status=Effect.Status.DONE,
                result={"resolved_by": name, "note": reason},
                finished_at=now,
            )
            succeed(step, {"resolved": "done", "by": name, "note": reason}, now)
            following = after_success(locked, step, now)
            changed += following.changed
        else:
            # "It did not happen": forget the unfinished effects so the next attempt calls.
            started.delete()
            _run_again(step, now)
            following = Following(due=[step])
        status = settle_and_record(
            EventKind.RESOLVED,
            locked,
            step_id=step.pk,
            actor=actor,
            reason=reason,
            steps=changed,
            outcome=outcome,
            **_plan_data(plan),
        )
        fan_outs.letter_refused(locked, following.refused, status, actor)
        _ring_or_open(locked, [*following.due, *following.approvals], actor=actor)
    return locked


def cancel(task: Task, *, actor: Actor, reason: str, plan: str | None = None) -> Task:
    """Cancel what has not run; ask a running step to stop. Its late result does not
    revive the task, and completed side effects are not undone."""
    check_permission(actor, "cancel_task")
    reason = validation.require_text(reason, "reason")
    with transaction.atomic():
        locked = lock_task(task.pk)
        why = refusal(Action.CANCEL, locked, None)
        if why is not None:
            raise InvalidTransition(why)
        now = db_now()
        steps = cancel_steps(locked, CANCELLABLE, now)
        steps_cancelled.send(sender=Task, task=locked, steps=steps, actor=actor, reason=reason)
        running = locked.steps.filter(status=StepStatus.RUNNING).exists()
        if running:
            locked.cancel_requested_at = now
            locked.save(update_fields=["cancel_requested_at", "updated_at"])
        settle_and_record(
            EventKind.CANCEL_REQUESTED if running else EventKind.CANCELLED,
            locked,
            actor=actor,
            reason=reason,
            steps=steps,
            **_plan_data(plan),
        )
    return locked


def _check_queue(name: Any) -> str:
    return validation.validate_queue(name, field="name")


def pause_queue(name: str, *, actor: Actor, reason: str) -> None:
    """Stop claims in a queue; running steps finish, nothing new starts."""
    _set_queue(name, paused=True, actor=actor, reason=reason)


def resume_queue(name: str, *, actor: Actor, reason: str) -> None:
    _set_queue(name, paused=False, actor=actor, reason=reason)


def _set_queue(name: str, *, paused: bool, actor: Actor, reason: str) -> None:
    check_permission(actor, "pause_queue")
    queue = _check_queue(name)
    reason = validation.require_text(reason, "reason")
    who, _ = actor_fields(actor)
    with transaction.atomic():
        state, _ = QueueState.objects.select_for_update().get_or_create(name=queue)
        if state.paused == paused:
            return
        state.paused = paused
        state.changed_by = who
        state.reason = reason
        state.save()
        if not paused:
            now = db_now()
            due = list(
                Step.objects.due(now)
                .filter(queue=queue)
                .order_by("-priority", "available_at")
                .values_list("pk", flat=True)[:1000]
            )
            Step.objects.filter(pk__in=due).update(dispatched_at=now)
            ring_on_commit([Doorbell(pk, queue) for pk in due])
        # Last: the audit chain's lock is the last one a transaction takes, so nothing
        # holding it waits for a step row (audit_chain).
        record_event(
            EventKind.QUEUE_PAUSED if paused else EventKind.QUEUE_RESUMED,
            task_id=None,
            actor=actor,
            reason=reason,
            queue=queue,
        )


def paused_queues() -> list[str]:
    return list(QueueState.objects.filter(paused=True).values_list("name", flat=True))


@dataclass(frozen=True)
class BulkReport:
    action: str
    changed: list[int]
    # Tasks the action no longer applied to (changed by someone else meanwhile), and why.
    skipped: list[tuple[int, str]]
    # More tasks matched than the limit allowed; they were left alone.
    limited: bool
    # The id every event of this bulk action carries (``data.plan``).
    plan: str = ""


def run_action(action: str, task: Task, **kwargs: Any) -> Task:
    """Take ``action`` (a row of ``task_actions.ACTIONS``) on one task through its
    service, with the row's fixed arguments (resolve's outcome) and ``kwargs`` (``actor``,
    ``reason``, ``plan`` and the row's parameters)."""
    spec = ACTIONS[action]
    service: Callable[..., Task] = globals()[spec.service]
    return service(task, **spec.fixed, **kwargs)


# Every action of the table, by name, as the bulk entry runs it (kept for callers of the
# earlier dictionary of bulk actions).
BULK_ACTIONS: dict[str, Callable[..., Task]] = {
    name: (lambda task, _name=name, **kw: run_action(_name, task, **kw)) for name in ACTIONS
}


def new_plan_id() -> str:
    return uuid.uuid4().hex[:16]


def check_bulk(
    action: str,
    *,
    actor: Actor,
    reason: str,
    limit: int,
    params: Mapping[str, Any] | None = None,
) -> str:
    """The checks of a bulk action made before anything is read or changed: the action,
    the permission, the reason, the action's parameters and the limit. Returns the
    reason, stripped."""
    if action not in ACTIONS:
        raise InvalidInput("action", "choice", f"action: one of {', '.join(ACTIONS)}")
    spec = ACTIONS[action]
    check_permission(actor, spec.permission)
    reason = validation.require_text(reason, "reason")
    check_params(action, params or {})
    if not 1 <= limit <= bulk_limit():
        raise InvalidInput("limit", "range", f"limit: from 1 to {bulk_limit()} tasks per action")
    return reason


def check_params(action: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters of a bulk ``action`` (all but the reason), checked by their rules:
    one it does not take for many tasks, or a required one missing, is an
    :class:`InvalidInput` naming it. Returns them as the service takes them."""
    spec = ACTIONS[action]
    taken = {param.name: param for param in spec.bulk_params if param.name != "reason"}
    for name in params:
        if name not in taken:
            raise InvalidInput(name, "unexpected", f"{name}: {spec.label} takes no {name}")
    checked: dict[str, Any] = {}
    for name, param in taken.items():
        value = params.get(name)
        if value is None or value == "":
            if param.required:
                raise InvalidInput(name, "required", f"{name}: is required and may not be empty")
            continue
        if param.kind == "delay":
            value = validation.validate_delay(value, field=name)
        checked[name] = value
    return checked


def bulk_limit() -> int:
    """The most tasks one bulk action may change (``TASKS_BULK_LIMIT``): the cap and the
    default of every way to ask for one."""
    return int(settings.TASKS_BULK_LIMIT)


def act_on_tasks(
    tasks: Iterable[Task],
    *,
    action: str,
    actor: Actor,
    reason: str,
    limit: int,
    plan: str | None = None,
    params: Mapping[str, Any] | None = None,
) -> BulkReport:
    """Apply one operator action (a row of ``task_actions.ACTIONS``, with its ``params``
    such as a delay) to each of ``tasks`` (at most ``limit``), each in its own transaction
    with its own Event, as if done one by one: the console's bulk form on dead letters,
    the admin's actions and the management commands all come here.

    The action, the permission, the reason and the limit are checked before anything
    changes (given no tasks, that check is all it does); a task the action does not apply
    to (not dead, already finished, or changed by someone else meanwhile) is skipped and
    reported, not an error for the rest. Every event carries the plan's id (a new one
    unless given), so the audit log can show the action as one.
    """
    reason = check_bulk(action, actor=actor, reason=reason, limit=limit, params=params)
    given = check_params(action, params or {})
    plan = plan or new_plan_id()
    changed: list[int] = []
    skipped: list[tuple[int, str]] = []
    limited = False
    for task in tasks:
        if len(changed) + len(skipped) == limit:
            limited = True
            break
        try:
            run_action(action, task, actor=actor, reason=reason, plan=plan, **given)
        except InvalidTransition as exc:
            skipped.append((task.pk, str(exc)))
        else:
            changed.append(task.pk)
    return BulkReport(action, changed, skipped, limited, plan)
