"""The step's state machine, in one place: every status a step takes, the fields that go
with it, and what the task becomes.

- :func:`start_attempt`: a claim takes a pending step (``running``, one more attempt, a
  raised fencing token, a lease).
- :func:`make_due`: the one way a step becomes ``pending`` (a new step reached, a retry,
  a hand-back, a redrive, a new revision), with its doorbell.
- :func:`end_attempt`: an attempt ends (a worker's result or failure, a hand-back, a lease
  run out, a person's decision on an approval step), as its ``Ending`` says
  (``tasks_app.engine.endings``); it decides the step's next status, makes what follows a
  success due, settles the task and records the events.
- :func:`settle_task`: the task's status derived from its current steps.
- And the statuses a person's action or a revision gives: :func:`succeed`,
  :func:`wait_for_approval`, :func:`cancel_steps`, :func:`supersede`, and a new row's
  (:func:`new_step`).

Nothing else assigns a step's status (``tests/engine/test_one_state_machine.py`` reads the
code for it). The fast path's SQL (``tasks_app.engine.sql``: the batch claim and
``COMPLETE_SQL``) restates :func:`start_attempt` and a success's :func:`end_attempt` for
speed, and ``tests/engine/test_parity.py`` compares the two.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import F
from django.db.models.functions import Now

from tasks_app.access import Actor
from tasks_app.db.clock import db_now, now_plus
from tasks_app.engine import fan_outs
from tasks_app.engine.announcements import announce_on_commit
from tasks_app.engine.attempt_records import close_lease
from tasks_app.engine.dispatch import MAX_COUNTDOWN, Doorbell
from tasks_app.engine.endings import ENDING_EVENTS, FAILED_ATTEMPT_EVENTS, Ending, next_status
from tasks_app.engine.transitions import is_approval, step_inputs
from tasks_app.history import counting, derive_task_status
from tasks_app.history.events import event_error, record_event
from tasks_app.models import (
    TERMINAL_TASK_STATUSES,
    EventKind,
    Step,
    StepStatus,
    Task,
    TaskStatus,
    graphs,
    stored_task_status,
)

logger = logging.getLogger(__name__)


def new_step(**fields: Any) -> Step:
    """A new step row (unsaved: a new task's, a revision's), ``blocked`` until the one
    before it succeeds; the caller makes the first one due (:func:`make_due`) or succeeded
    (:func:`succeed`)."""
    return Step(status=StepStatus.BLOCKED, **fields)


def start_attempt(step: Step, *, worker_id: str, lease_seconds: int) -> None:
    """A claim takes ``step`` (locked, pending and due): ``running`` under a raised fencing
    token, with one more attempt and ``worker_id``'s lease of ``lease_seconds`` by the
    database's clock, on the step itself (its Lease row is written when the attempt ends:
    :func:`close_lease`). The task's row is not rewritten: it reads as running from its
    step (DESIGN rule 11). The claim's SQL (``sql.claim_sql``) is the batch twin."""
    step.status = StepStatus.RUNNING
    step.attempts += 1
    step.fencing_token += 1
    step.lease_worker = worker_id
    start_attempts([step.pk], worker_id=worker_id, lease_seconds=lease_seconds)


def start_attempts(
    step_ids: Sequence[int], *, worker_id: str, lease_seconds: int, at: datetime | None = None
) -> None:
    """:func:`start_attempt`'s writes for many steps; a claim under limits
    (``limited_claims``) starts their leases ``at`` the time it judged the limits at, so
    the attempts' records show what the rates counted."""
    Step.objects.filter(pk__in=step_ids).update(
        status=StepStatus.RUNNING,
        attempts=F("attempts") + 1,
        fencing_token=F("fencing_token") + 1,
        lease_expires_at=now_plus(lease_seconds)
        if at is None
        else at + timedelta(seconds=lease_seconds),
        lease_worker=worker_id,
        started_at=Now() if at is None else at,
    )


def make_due(
    step: Step, now: datetime, *, delay: float = 0, fresh_budget: bool = False, save: bool = True
) -> Doorbell | None:
    """Make ``step`` pending, due ``delay`` seconds after ``now``; with ``fresh_budget`` its
    attempts start again (a redrive). Returns its doorbell, to ring once the transaction
    commits, or None when it is due further out than a doorbell waits (the sweeper rings
    for it once due: ``dispatched_at`` stays empty). Saves a stored row unless the caller
    saves it with more (``save``); a new one (a revision's) is saved by its caller."""
    step.status = StepStatus.PENDING
    step.available_at = now + timedelta(seconds=delay)
    step.finished_at = None
    if fresh_budget:
        step.attempts = 0
    bell = None
    step.dispatched_at = None
    if delay <= MAX_COUNTDOWN:
        step.dispatched_at = step.available_at
        bell = Doorbell(step.pk, step.queue, delay) if step.pk is not None else None
    if step.pk is not None and save:
        fields = ["status", "available_at", "dispatched_at", "finished_at", "attempts"]
        step.save(update_fields=fields)
    return bell


def succeed(step: Step, result: Any, now: datetime) -> None:
    """``step`` succeeded with ``result``, without a worker (an answer, a draft)."""
    step.status = StepStatus.SUCCEEDED
    step.result = result
    step.finished_at = now
    if step.pk is not None:
        step.save(update_fields=["status", "result", "finished_at"])


def wait_for_approval(step: Step) -> None:
    """An approval step the task reached waits for a person."""
    step.status = StepStatus.WAITING_APPROVAL
    step.save(update_fields=["status"])


def cancel_steps(task: Task, statuses: Iterable[str], now: datetime) -> list[Step]:
    """Cancel the task's steps in ``statuses`` (the task is locked); returns them."""
    steps = list(task.steps.select_for_update().filter(status__in=statuses).order_by("position"))
    for step in steps:
        step.status = StepStatus.CANCELLED
        step.finished_at = now
    Step.objects.bulk_update(steps, ["status", "finished_at"])
    return steps


def supersede(steps: Sequence[Step], now: datetime) -> None:
    """A new revision replaces ``steps``: they stay as history."""
    for step in steps:
        step.status = StepStatus.SUPERSEDED
        step.finished_at = step.finished_at or now
    Step.objects.bulk_update(steps, ["status", "finished_at"])


def end_attempt(task: Task, step: Step, ending: Ending) -> tuple[str, list[Step], list[Doorbell]]:
    """End the attempt ``step`` (locked, with its task) is in, as ``ending`` says.

    1. Close the worker's lease, if any, with its outcome.
    2. Decide the step's status: the caller's (a success, a decision); ``pending`` again
       for a hand-back (its attempt uncharged) unless a cancel was requested; for a
       failure, :func:`next_status`.
    3. Store it with its fields: a success its result, a retry its due time
       (:func:`make_due`), an end its finish time; the error.
    4. A success makes the steps that wait for it due, or reaches approval steps (returned,
       for the caller to open once the events are written); a rejection cancels the rest.
    5. Settle the task, record the attempt's event and, when the attempt ended the task,
       the task's own (``cancelled``, ``dead_lettered``).

    Returns the task's status, the approval steps reached, and the doorbells to ring.
    """
    bells: list[Doorbell] = []
    was = task.status
    now = db_now()  # the attempt's end: a retry is never due before its failure ended
    if ending.lease is not None and ending.token is not None:
        close_lease(step, ending.token, ending.lease, now)
        step.lease_expires_at, step.lease_worker = None, ""
    if ending.status is not None:
        status = ending.status
    elif ending.handed_back:
        step.attempts = max(step.attempts - 1, 0)
        cancelled = task.cancel_requested_at is not None
        status = StepStatus.CANCELLED if cancelled else StepStatus.PENDING
    else:
        status = next_status(task, step, may_retry=ending.retry_in is not None)
    if ending.error is not None and (status != StepStatus.CANCELLED or ending.error_when_cancelled):
        step.error_class, step.last_error = ending.error[0][:200], ending.error[1][:10_000]
    if status == StepStatus.PENDING:
        bell = make_due(step, now, delay=ending.retry_in or 0, save=False)
        bells += [bell] if bell is not None else []
    else:
        step.status = status
        step.finished_at = now
        if status == StepStatus.SUCCEEDED:
            step.result = ending.result
    step.save()
    also: list[Step] = []
    following = Following()
    if status == StepStatus.SUCCEEDED:
        if ending.lease is not None and step.started_at is not None:
            seconds = (now - step.started_at).total_seconds()
            counting.add(counting.step_seconds([seconds], task.workflow))
        if task.cancel_requested_at is None:
            following = after_success(task, step, now)
            also = following.changed
            bells += [Doorbell(s.pk, s.queue) for s in following.due]
    elif status == StepStatus.CANCELLED and ending.status is not None:
        also = cancel_steps(task, (StepStatus.BLOCKED, StepStatus.PENDING), now)
    if ending.event is None:
        # A failure: its event says what became of the step; a reason only when it died.
        kind = FAILED_ATTEMPT_EVENTS[status]
        why = ending.reason
        if status == StepStatus.DEAD and ending.retry_in is not None:
            why = "max_attempts"
        event_reason, ending_reason = (why if kind == EventKind.DEAD_LETTERED else ""), why
    else:
        kind, event_reason, ending_reason = ending.event, ending.reason, ending.ending_reason
    data = dict(ending.data)
    if ending.token is not None:
        data["token"] = ending.token
    if ending.event is None:
        data.update(error_class=step.error_class, error=event_error(step.last_error))
        data["retry_in"] = ending.retry_in if kind == EventKind.RETRY_SCHEDULED else None
    if ending.handed_back or ending.event == EventKind.LEASE_EXPIRED:
        data["step_status"] = str(status)
    if following.fanned_out:
        data["fanned_out"] = following.fanned_out
    if kind == EventKind.SUCCEEDED and ending.lease is not None and not also:
        # The attempt's Lease row records a worker's success (history.timeline); an event
        # is written only for the next step it made due.
        task_status = settle_task(task, now=now)
    else:
        task_status = settle_and_record(
            kind,
            task,
            now=now,
            step_id=step.pk,
            actor=ending.actor,
            reason=event_reason,
            steps=[step, *also],
            **data,
        )
    if task_status == TaskStatus.CANCELLED and ending.cancelled_reason is not None:
        ending_reason = ending.cancelled_reason
    fan_outs.letter_refused(task, following.refused, task_status, ending.ended_by)
    if stored_task_status(task_status) != was and not following.refused:
        # (A branch of a graph may end while the task already ended: dead by another.)
        record_ending(
            task, task_status, after=kind, step=step, actor=ending.ended_by, reason=ending_reason
        )
    return task_status, following.approvals, bells


@dataclass
class Following:
    """What a success started (:func:`after_success`): the rows made due (to ring for), the
    approval steps reached (to open once the event is written), every row it changed (for
    the event), the fan-outs refused (dead: each gets its ``dead_lettered`` event, by
    ``fan_outs.letter_refused``) and how many rows each fan-out made, by kind."""

    due: list[Step] = field(default_factory=list)
    approvals: list[Step] = field(default_factory=list)
    changed: list[Step] = field(default_factory=list)
    refused: list[Step] = field(default_factory=list)
    fanned_out: dict[str, int] = field(default_factory=dict)


def after_success(task: Task, done: Step, now: datetime) -> Following:
    """Once ``done`` succeeded, start each step that waited for it alone (:func:`start`).

    A step follows once every row of every step it waits for has succeeded
    (``graphs.ready``, read from the task's current rows). In a line that is the current row
    at the next position (the steps of a revision are contiguous; the batch completion's SQL
    picks it the same way), if it waits (``blocked``). A fan-out of no items succeeds at
    once, and what waited for it follows in turn.
    """
    following = Following()
    todo = [done]
    while todo:
        done = todo.pop()
        if done.after is None:
            nxt = Step.objects.current_one(task=task, position=done.position + 1)
            ready = [nxt] if nxt is not None and nxt.status == StepStatus.BLOCKED else []
        else:
            current = list(Step.objects.filter(task=task).current())
            ready = [
                step
                for step in graphs.ready(current, StepStatus.SUCCEEDED, StepStatus.BLOCKED)
                if done.position in graphs.waits_for(step)
            ]
        for step in ready:
            todo += start(task, step, now, following)
    return following


def start(task: Task, step: Step, now: datetime, following: Following) -> list[Step]:
    """Start ``step``, whose steps it waits for have succeeded (or a dead fan-out a redrive
    asks for the items of again), adding to ``following``: an approval step is reached (no
    worker runs it); a fan-out asks for its items (``fan_outs``) and makes a due row of
    each, succeeds at once for none, or is refused (dead); any other step is made due.
    Returns the rows that succeeded at once, whose followers start next."""
    if is_approval(task, step.position):
        following.approvals.append(step)
        return []
    spec = fan_outs.spec_of(task, step)
    made = fan_outs.items_for(spec, step_inputs(task, step)) if spec is not None else None
    following.changed.append(step)
    if made is not None and made.items is None:
        step.status, step.finished_at = StepStatus.DEAD, now
        step.error_class, step.last_error = fan_outs.FAN_OUT_REFUSED, made.error
        step.save(update_fields=["status", "finished_at", "error_class", "last_error"])
        following.refused.append(step)
        return []
    if made is not None:
        following.fanned_out[step.kind] = len(made.items or ())
        if not made.items:
            succeed(step, [], now)
            return [step]
    make_due(step, now, fresh_budget=True)
    following.due.append(step)
    items = len(made.items or ()) if made is not None else 1
    more = [fan_outs.item_row(task, step, item) for item in range(1, items)]
    for row in more:
        make_due(row, now, save=False)
    Step.objects.bulk_create(more)
    following.due += more
    following.changed += more
    return []


def settle_task(task: Task, *, now: datetime | None = None) -> str:
    """Store the task status derived from its current (non-superseded) steps, in its
    stored form (``models.stored_task_status``), finished at ``now`` (the database's clock)
    when it ends; returns the derived status (``running`` while a step runs)."""
    current = Step.objects.filter(task=task).current().values_list("status", flat=True)
    live = derive_task_status(current, cancel_requested=task.cancel_requested_at is not None)
    status = stored_task_status(live)
    ended = status in TERMINAL_TASK_STATUSES | {TaskStatus.DEAD}
    if status != task.status or (not ended and task.finished_at is not None):
        if status != task.status:
            announce_on_commit([(task.pk, status)])
        task.status = status
        task.finished_at = (now or db_now()) if ended else None
        task.save(update_fields=["status", "finished_at", "updated_at"])
    return live


def settle_and_record(
    kind: str,
    task: Task,
    *,
    now: datetime | None = None,
    step_id: int | None = None,
    actor: Actor = None,
    reason: str = "",
    steps: Iterable[Step] = (),
    **data: Any,
) -> str:
    """Settle the task's status from its steps, then record the transition's event with
    the status it reached (``task_status``); returns that status."""
    status = settle_task(task, now=now)
    record_event(
        kind,
        at=now,
        task_id=task.pk,
        step_id=step_id,
        actor=actor,
        reason=reason,
        steps=steps,
        task=task,
        task_status=status,
        **data,
    )
    return status


def record_ending(
    task: Task, status: str, *, after: str, step: Step | None, actor: Actor, reason: str
) -> None:
    """The status event of a task an attempt ended in ``status``, written after the
    attempt's event ``after`` unless that is the same event. A ``dead_lettered`` event names
    its dead step."""
    kind = ENDING_EVENTS.get(status)
    if kind is None or kind == after:
        return
    dead = step if kind == EventKind.DEAD_LETTERED else None
    record_event(
        kind,
        task_id=task.pk,
        step_id=dead.pk if dead is not None else None,
        actor=actor,
        reason=reason,
        steps=[dead] if dead is not None else (),
        task=task,
        task_status=status,
    )
