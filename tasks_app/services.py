"""Every state change of the task system.

Each function changes state in one transaction and writes the Event of each transition
beside it. Lock order is always task row, then step rows, so a cancel racing a claim or
a completion waits instead of deadlocking; the only writes that lock a step without its
task (a heartbeat, the effects ledger's start) take no other lock. Worker writes
(complete, fail, heartbeat) carry the fencing token of their claim; a stale token changes
nothing and is recorded as ``stale_write_rejected``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import DateTimeField, ExpressionWrapper, F, Q
from django.db.models.functions import Now
from django.utils import timezone

from . import validation
from .dispatch import MAX_COUNTDOWN, Doorbell, ring_on_commit
from .effects import Effects
from .exceptions import (
    IdempotencyConflict,
    InvalidInput,
    InvalidTransition,
    NotPermitted,
    error_class,
    error_text,
)
from .history import derive_task_status
from .models import (
    TERMINAL_TASK_STATUSES,
    Counter,
    Effect,
    Event,
    EventKind,
    Lease,
    QueueState,
    Step,
    StepStatus,
    Task,
    TaskStatus,
)
from .signals import announce_on_commit, steps_cancelled
from .workflows import AwaitDecision, StepContext, Workflow, registry

logger = logging.getLogger(__name__)

Actor = Any  # a user, or a string such as "cli:alice" / "system:sweeper", or None

SYSTEM = "system"
SWEEPER = "system:sweeper"


# --- small helpers -----------------------------------------------------------------------


def db_now() -> datetime:
    """The database's clock on PostgreSQL (rule 3); the process clock on SQLite."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT STATEMENT_TIMESTAMP()")
            value: datetime = cursor.fetchone()[0]
            return value
    return timezone.now()


def _now_plus(seconds: float) -> ExpressionWrapper:
    return ExpressionWrapper(Now() + timedelta(seconds=seconds), output_field=DateTimeField())


def actor_fields(actor: Actor) -> tuple[str, int | None]:
    if actor is None:
        return SYSTEM, None
    if isinstance(actor, str):
        return actor.strip() or SYSTEM, None
    return actor.get_username(), actor.pk


def _check_permission(actor: Actor, permission: str) -> None:
    """Users need the permission; string actors are trusted callers (commands, sweeper)."""
    if actor is None or isinstance(actor, str):
        return
    if not actor.is_authenticated or not actor.has_perm(f"tasks_app.{permission}"):
        raise NotPermitted(f"{permission} is required")


def _state(step: Step) -> list[Any]:
    return [step.status, step.attempts, step.fencing_token]


def _event(
    kind: str,
    *,
    task_id: int | None,
    step_id: int | None = None,
    actor: Actor = None,
    reason: str = "",
    steps: Iterable[Step] = (),
    **data: Any,
) -> Event:
    name, user_id = actor_fields(actor)
    changes = {str(step.pk): _state(step) for step in steps}
    if changes:
        data["steps"] = changes
    return Event.objects.create(
        task_id=task_id,
        step_id=step_id,
        kind=kind,
        actor=name,
        actor_user_id=user_id,
        reason=reason,
        data=data,
    )


def event_error(text: str) -> str:
    """An error as its event keeps it: the end of a long traceback, where the exception
    and its message are."""
    return text if len(text) <= 2000 else "…" + text[-1999:]


def bump_counter(name: str, by: int = 1) -> None:
    """Add to a metrics counter in its own transaction."""
    if by <= 0:
        return
    with transaction.atomic():
        if Counter.objects.filter(name=name).update(value=F("value") + by):
            return
        try:
            with transaction.atomic():
                Counter.objects.create(name=name, value=by)
        except IntegrityError:
            Counter.objects.filter(name=name).update(value=F("value") + by)


def _current_steps(task: Task) -> list[Step]:
    return list(task.steps.exclude(status=StepStatus.SUPERSEDED).order_by("position", "revision"))


def _settle_task(task: Task, steps: Sequence[Step] | None = None) -> str:
    """Store the task status derived from its (non-superseded) steps."""
    current = _current_steps(task) if steps is None else steps
    status = derive_task_status(
        (step.status for step in current), cancel_requested=task.cancel_requested_at is not None
    )
    finished = timezone.now() if status in TERMINAL_TASK_STATUSES | {TaskStatus.DEAD} else None
    if status != task.status or (finished is None and task.finished_at is not None):
        if status != task.status:
            announce_on_commit([(task.pk, status)])
        task.status = status
        task.finished_at = finished
        task.save(update_fields=["status", "finished_at", "updated_at"])
    return status


def lock_task(task_id: int) -> Task:
    """Lock a task row: every transition of a task takes this lock first."""
    return Task.objects.select_for_update().get(pk=task_id)


# --- enqueue -----------------------------------------------------------------------------


@dataclass(frozen=True)
class EnqueueResult:
    task: Task
    created: bool


@dataclass(frozen=True)
class PreparedItem:
    workflow: Workflow
    payload: dict[str, Any]
    payload_hash: str
    idempotency_key: str | None
    queue: str
    priority: int
    run_after: datetime | None


_ENQUEUE_FIELDS = frozenset(
    {"workflow", "payload", "idempotency_key", "queue", "priority", "run_after"}
)


def _prepare(
    *,
    workflow: Any,
    payload: Any,
    idempotency_key: Any = None,
    queue: Any = "default",
    priority: Any = 0,
    run_after: Any = None,
    prefix: str = "",
) -> PreparedItem:
    def named(exc: InvalidInput) -> InvalidInput:
        if prefix:
            exc.field = prefix + exc.field
            exc.args = (prefix + str(exc),)
        return exc

    try:
        if not isinstance(workflow, str):
            raise InvalidInput("workflow", "registered", "workflow: must be a workflow name")
        flow = registry.latest(workflow)
        canonical = validation.validate_payload(payload)
        if flow.validate_payload is not None:
            flow.validate_payload(payload)
        return PreparedItem(
            workflow=flow,
            # The stored payload is exactly what the canonical form says.
            payload=json.loads(canonical),
            payload_hash=validation.payload_hash(flow.name, canonical),
            idempotency_key=validation.validate_idempotency_key(idempotency_key),
            queue=validation.validate_queue(queue),
            priority=validation.validate_priority(priority),
            run_after=validation.validate_run_after(run_after),
        )
    except InvalidInput as exc:
        raise named(exc) from None


def enqueue(
    workflow: str,
    payload: dict[str, Any],
    *,
    idempotency_key: str | None = None,
    queue: str = "default",
    priority: int = 0,
    run_after: datetime | None = None,
    actor: Actor = None,
) -> EnqueueResult:
    """Create a task, or return the one its idempotency key already names."""
    item = _prepare(
        workflow=workflow,
        payload=payload,
        idempotency_key=idempotency_key,
        queue=queue,
        priority=priority,
        run_after=run_after,
    )
    return _enqueue_prepared([item], actor)[0]


def enqueue_many(items: Sequence[dict[str, Any]], *, actor: Actor = None) -> list[EnqueueResult]:
    """Enqueue several tasks, all or nothing; results in input order."""
    prepared = []
    for index, item in enumerate(items):
        prefix = f"items[{index}]."
        if not isinstance(item, dict):
            raise InvalidInput(f"items[{index}]", "object", f"items[{index}]: must be a dict")
        unknown = set(item) - _ENQUEUE_FIELDS
        if unknown:
            raise InvalidInput(
                prefix + sorted(unknown)[0], "known_field", f"{prefix}{sorted(unknown)[0]}: unknown"
            )
        for required in ("workflow", "payload"):
            if required not in item:
                raise InvalidInput(prefix + required, "required", f"{prefix}{required}: required")
        prepared.append(_prepare(prefix=prefix, **item))
    return _enqueue_prepared(prepared, actor)


def _enqueue_prepared(items: list[PreparedItem], actor: Actor) -> list[EnqueueResult]:
    # On PostgreSQL one item outside a transaction is one statement in autocommit: it
    # either inserts the task with its steps and event, or finds the key taken and writes
    # nothing, so there is nothing to make atomic.
    alone = len(items) == 1 and connection.vendor == "postgresql"
    for round_ in range(3):
        try:
            if alone and not connection.in_atomic_block:
                results, duplicates = _insert(items, actor)
            else:
                with transaction.atomic():
                    results, duplicates = _insert(items, actor)
            break
        except IdempotencyConflict:
            # Counted once the enqueue's transaction is gone: the only write it makes.
            bump_counter("idempotency_conflict")
            raise
        except IntegrityError:
            # A concurrent enqueue of the same key won the unique constraint (SQLite), or the
            # holder of a key vanished before we read it: roll back and look again.
            if round_ == 2:
                raise
    bump_counter("enqueue_duplicate", duplicates)
    return results


def _insert(items: list[PreparedItem], actor: Actor) -> tuple[list[EnqueueResult], int]:
    """Create the tasks of ``items`` whose keys are free; the others return the task that
    holds their key, or raise :class:`IdempotencyConflict` if it differs.

    1. Within the batch, the first item with a key is the one created; later items with
       that key must match it.
    2. Create: on PostgreSQL one statement that skips keys already taken (``ON CONFLICT DO
       NOTHING``, so a concurrent enqueue of the same key waits and then skips); on SQLite
       the ORM after looking the keys up.
    3. Compare the items whose key was taken with the task that holds it.
    """
    author, user_id = actor_fields(actor)
    firsts: dict[str, int] = {}
    unique: list[tuple[int, PreparedItem]] = []
    for index, item in enumerate(items):
        key = item.idempotency_key
        if key and key in firsts:
            earlier = items[firsts[key]]
            if (earlier.workflow.name, earlier.payload_hash) != (
                item.workflow.name,
                item.payload_hash,
            ):
                raise IdempotencyConflict(key, None)
            continue
        if key:
            firsts[key] = index
        unique.append((index, item))

    if connection.vendor == "postgresql":
        from .batch import insert_tasks

        created = insert_tasks(unique, author=author, user_id=user_id)
    else:
        created = _insert_with_orm(unique, author=author, user_id=user_id)

    taken = [item.idempotency_key for index, item in unique if index not in created]
    holders = (
        {t.idempotency_key: t for t in Task.objects.filter(idempotency_key__in=taken)}
        if taken
        else {}
    )
    results: list[EnqueueResult] = []
    duplicates = 0
    for index, item in enumerate(items):
        if index in created:
            results.append(EnqueueResult(created[index], created=True))
            continue
        key = item.idempotency_key or ""
        known = created.get(firsts[key]) if key in firsts else None
        if known is None:
            known = holders.get(key)
            if known is None:
                # The holder vanished between the insert and this read: start again.
                raise IntegrityError(f"idempotency key {key!r} changed hands; retrying")
            if known.workflow != item.workflow.name or known.payload_hash != item.payload_hash:
                raise IdempotencyConflict(key, known.pk)
        results.append(EnqueueResult(known, created=False))
        duplicates += 1
    return results, duplicates


def _insert_with_orm(
    unique: list[tuple[int, PreparedItem]], *, author: str, user_id: int | None
) -> dict[int, Task]:
    keys = [item.idempotency_key for _, item in unique if item.idempotency_key]
    taken = set(
        Task.objects.filter(idempotency_key__in=keys).values_list("idempotency_key", flat=True)
    )
    fresh = [(index, item) for index, item in unique if item.idempotency_key not in taken]
    now = db_now()
    created: dict[int, Task] = {}
    for index, item in fresh:
        created[index] = Task(
            workflow=item.workflow.name,
            workflow_version=item.workflow.version,
            payload=item.payload,
            payload_hash=item.payload_hash,
            idempotency_key=item.idempotency_key,
            queue=item.queue,
            priority=item.priority,
            status=TaskStatus.PENDING,
            created_by=author,
            created_by_user_id=user_id,
        )
    Task.objects.bulk_create(list(created.values()))

    steps: list[Step] = []
    for index, item in fresh:
        task = created[index]
        for position, spec in enumerate(item.workflow.steps):
            first = position == 0
            steps.append(
                Step(
                    task=task,
                    position=position,
                    revision=0,
                    kind=spec.kind,
                    status=StepStatus.PENDING if first else StepStatus.BLOCKED,
                    queue=task.queue,
                    priority=task.priority,
                    max_attempts=spec.max_attempts,
                    available_at=(item.run_after or now) if first else None,
                    dispatched_at=(item.run_after or now) if first else None,
                    idempotency_key=f"{task.key}:{position}:{spec.kind}",
                )
            )
    Step.objects.bulk_create(steps)

    by_task: dict[int, list[Step]] = {}
    for step in steps:
        by_task.setdefault(step.task_id, []).append(step)
    Event.objects.bulk_create(
        [
            Event(
                task_id=task.pk,
                kind=EventKind.ENQUEUED,
                actor=author,
                actor_user_id=user_id,
                data={
                    "workflow": task.workflow,
                    "version": task.workflow_version,
                    "queue": task.queue,
                    "payload_hash": task.payload_hash,
                    "steps": {str(s.pk): _state(s) for s in by_task[task.pk]},
                },
            )
            for task in created.values()
        ]
    )
    ring_on_commit(
        [
            Doorbell(s.pk, s.queue, max((s.available_at - now).total_seconds(), 0.0))
            for s in steps
            if s.status == StepStatus.PENDING and s.available_at is not None
        ]
    )
    return created


def get_task(*, idempotency_key: str) -> Task | None:
    return Task.objects.filter(idempotency_key=idempotency_key).first()


# --- the worker's side: claim, heartbeat, complete, fail -------------------------------


@dataclass(frozen=True)
class Claim:
    step_id: int
    task_id: int
    token: int
    attempt: int
    worker_id: str
    lease_seconds: int
    queue: str = "default"


def _paused_queues() -> Q:
    return Q(queue__in=QueueState.objects.filter(paused=True).values("name"))


def claim_step(step_id: int, *, worker_id: str, lease_seconds: int | None = None) -> Claim | None:
    """Claim one step if it is pending, due by the database's clock, and its queue runs.

    Returns ``None`` when there is nothing to claim: the step ran already, is not due,
    was cancelled, or its queue is paused. That is how a duplicate or late doorbell
    does nothing.
    """
    lease = lease_seconds or settings.TASKS_LEASE_SECONDS
    task_id = Step.objects.filter(pk=step_id).values_list("task_id", flat=True).first()
    if task_id is None:
        return None
    with transaction.atomic():
        # Pruned or deleted meanwhile: a late doorbell for it does nothing.
        task = Task.objects.select_for_update().filter(pk=task_id).first()
        if task is None:
            return None
        step = (
            Step.objects.select_for_update()
            .filter(pk=step_id, status=StepStatus.PENDING, available_at__lte=Now())
            .exclude(_paused_queues())
            .first()
        )
        if step is None:
            return None
        step.status = StepStatus.RUNNING
        step.attempts += 1
        step.fencing_token += 1
        Step.objects.filter(pk=step.pk).update(
            status=step.status,
            attempts=step.attempts,
            fencing_token=step.fencing_token,
            lease_expires_at=_now_plus(lease),
            started_at=Now(),
        )
        Lease.objects.create(
            step=step,
            token=step.fencing_token,
            worker_id=worker_id,
            acquired_at=Now(),
            expires_at=_now_plus(lease),
        )
        if task.status != TaskStatus.RUNNING:
            task.status = TaskStatus.RUNNING
            task.save(update_fields=["status", "updated_at"])
        _event(
            EventKind.CLAIMED,
            task_id=task.pk,
            step_id=step.pk,
            actor=f"worker:{worker_id}",
            steps=[step],
            token=step.fencing_token,
            attempt=step.attempts,
            lease_seconds=lease,
        )
    return Claim(
        step_id=step.pk,
        task_id=task.pk,
        token=step.fencing_token,
        attempt=step.attempts,
        worker_id=worker_id,
        lease_seconds=lease,
        queue=step.queue,
    )


def _held_step(claim: Claim) -> Step | None:
    """The claimed step, locked, if this claim still holds it."""
    return (
        Step.objects.select_for_update()
        .filter(pk=claim.step_id, status=StepStatus.RUNNING, fencing_token=claim.token)
        .first()
    )


def reject_stale(claim: Claim, operation: str) -> None:
    """Record a worker write refused because its claim no longer holds the step."""
    current = Step.objects.filter(pk=claim.step_id).values("status", "fencing_token").first()
    with transaction.atomic():
        _event(
            EventKind.STALE_WRITE_REJECTED,
            task_id=claim.task_id,
            step_id=claim.step_id,
            actor=f"worker:{claim.worker_id}",
            operation=operation,
            token=claim.token,
            current_token=current["fencing_token"] if current else None,
            current_status=current["status"] if current else None,
        )
    logger.warning("stale %s refused for step %s token %s", operation, claim.step_id, claim.token)


def _release(step: Step, token: int, outcome: str) -> None:
    Lease.objects.filter(step=step, token=token, released_at=None).update(
        released_at=Now(), outcome=outcome
    )


def _unblock_next(task: Task, after: Step, now: datetime) -> tuple[list[Step], Step | None]:
    """Once ``after`` succeeded: the next step made due, or the approval step reached.

    An approval step is not made due (no worker runs it): it is returned as the gate to
    open, which the caller does with :func:`_open_gate` once its own event is written.
    """
    following = (
        task.steps.filter(status=StepStatus.BLOCKED, position__gt=after.position)
        .order_by("position", "-revision")
        .first()
    )
    if following is None:
        return [], None
    if is_approval(task, following.position):
        return [], following
    following.status = StepStatus.PENDING
    following.available_at = now
    following.dispatched_at = now
    following.save(update_fields=["status", "available_at", "dispatched_at"])
    return [following], None


def step_inputs(task: Task, position: int) -> dict[str, Any]:
    """The results of the task's earlier steps by kind (current rows): a handler's
    ``ctx.results``."""
    if position == 0:
        return {}
    return dict(
        task.steps.filter(status=StepStatus.SUCCEEDED, position__lt=position)
        .order_by("position", "revision")
        .values_list("kind", "result")
    )


def step_context(
    task: Task, step: Step, *, attempt: int, token: int, timeout: float | None = None
) -> StepContext:
    """What a handler gets: the payload, earlier results, its place in the retry story, the
    effects ledger fenced by ``token``, and the request for changes it answers, if any."""
    return StepContext(
        task_id=task.pk,
        step_id=step.pk,
        payload=task.payload,
        results=step_inputs(task, step.position),
        attempt=attempt,
        fencing_token=token,
        step_key=step.idempotency_key,
        effects=Effects(step_id=step.pk, step_key=step.idempotency_key, fencing_token=token),
        timeout=timeout,
        revision=step.revision,
        change_request=step.change_request,
    )


def _open_gate(task: Task, step: Step, *, actor: Actor, reason: str = "") -> None:
    """Open the approval step the task has reached, in the caller's transaction (the task
    row locked): it goes to ``waiting_approval`` and its request is recorded, with an
    ``approval_requested`` event, in the same commit as the change that reached it.

    1. Call the step's handler with the task's payload and earlier results; it reads the
       draft and returns :class:`AwaitDecision`.
    2. In a savepoint, mark the step waiting and let ``open_request`` record the request.
    3. A handler that fails, or returns anything else, leaves nothing of step 2 behind: the
       step is dead-lettered (``permanent_error``) for on-call, and the change that
       reached it stands.
    """
    flow = registry.get(task.workflow, task.workflow_version)
    spec = flow.step(step.position) if flow is not None else None
    ctx = step_context(task, step, attempt=step.attempts, token=step.fencing_token)
    failure: tuple[str, str] = ("invalid_result", "an approval step must return AwaitDecision")
    data: dict[str, Any] | None = None
    try:
        with transaction.atomic():
            wait = spec.handler(ctx) if spec is not None else None
            if isinstance(wait, AwaitDecision):
                step.status = StepStatus.WAITING_APPROVAL
                step.save(update_fields=["status"])
                data = wait.open_request(task, step)
    except Exception as exc:
        logger.exception("approval step %s of task %s could not open", step.pk, task.pk)
        failure = (error_class(exc), error_text(exc))
    if data is None:
        step.status = StepStatus.DEAD
        step.error_class, step.last_error = failure
        step.finished_at = db_now()
        step.save(update_fields=["status", "error_class", "last_error", "finished_at"])
        status = _settle_task(task)
        _event(
            EventKind.DEAD_LETTERED,
            task_id=task.pk,
            step_id=step.pk,
            actor=actor,
            reason="permanent_error",
            steps=[step],
            error_class=step.error_class,
            error=event_error(step.last_error),
            task_status=status,
        )
        return
    status = _settle_task(task)
    _event(
        EventKind.APPROVAL_REQUESTED,
        task_id=task.pk,
        step_id=step.pk,
        actor=actor,
        reason=reason,
        steps=[step],
        task_status=status,
        **data,
    )


@dataclass(frozen=True)
class HeartbeatResult:
    alive: bool
    cancel_requested: bool


def heartbeat(claim: Claim, *, lease_seconds: int | None = None) -> HeartbeatResult:
    """Extend the lease of a running step; tell the worker whether to stop."""
    lease = lease_seconds or claim.lease_seconds
    with transaction.atomic():
        renewed = Step.objects.filter(
            pk=claim.step_id, status=StepStatus.RUNNING, fencing_token=claim.token
        ).update(lease_expires_at=_now_plus(lease))
        if renewed:
            Lease.objects.filter(step_id=claim.step_id, token=claim.token).update(
                expires_at=_now_plus(lease)
            )
            cancel = Task.objects.filter(
                pk=claim.task_id, cancel_requested_at__isnull=False
            ).exists()
            return HeartbeatResult(alive=True, cancel_requested=cancel)
    reject_stale(claim, "heartbeat")
    return HeartbeatResult(alive=False, cancel_requested=False)


def complete_step(claim: Claim, result: Any) -> bool:
    """Record a step's result and make the next step due. False if the claim is stale."""
    with transaction.atomic():
        task = lock_task(claim.task_id)
        step = _held_step(claim)
        if step is not None:
            now = db_now()
            step.status = StepStatus.SUCCEEDED
            step.result = result
            step.finished_at = now
            step.lease_expires_at = None
            step.save(update_fields=["status", "result", "finished_at", "lease_expires_at"])
            _release(step, claim.token, Lease.Outcome.SUCCEEDED)
            due: list[Step] = []
            gate = None
            if task.cancel_requested_at is None:
                due, gate = _unblock_next(task, step, now)
            changed = [step, *due]
            status = _settle_task(task)
            actor = f"worker:{claim.worker_id}"
            _event(
                EventKind.SUCCEEDED,
                task_id=task.pk,
                step_id=step.pk,
                actor=actor,
                steps=changed,
                token=claim.token,
                task_status=status,
            )
            if gate is not None:
                _open_gate(task, gate, actor=actor)
            if status == TaskStatus.CANCELLED:
                _event(
                    EventKind.CANCELLED,
                    task_id=task.pk,
                    actor=SYSTEM,
                    reason="cancel requested while the step ran",
                )
            ring_on_commit([Doorbell(s.pk, s.queue) for s in changed[1:]])
            return True
    reject_stale(claim, "complete")
    return False


def fail_step(
    claim: Claim,
    *,
    error_class: str,
    message: str,
    retry_in: float | None,
    reason: str,
) -> bool:
    """Record a failed attempt: retry after ``retry_in`` seconds while attempts remain,
    else dead-letter with ``reason``. ``retry_in=None`` dead-letters at once.
    """
    with transaction.atomic():
        task = lock_task(claim.task_id)
        step = _held_step(claim)
        if step is not None:
            step.last_error = message[:10_000]
            step.error_class = error_class[:200]
            step.lease_expires_at = None
            _release(step, claim.token, Lease.Outcome.FAILED)
            bells: list[Doorbell] = []
            if task.cancel_requested_at is not None:
                kind, step.status = EventKind.CANCELLED, StepStatus.CANCELLED
                step.finished_at = db_now()
            elif retry_in is not None and step.attempts < step.max_attempts:
                kind, step.status = EventKind.RETRY_SCHEDULED, StepStatus.PENDING
                step.available_at = db_now() + timedelta(seconds=retry_in)
                if retry_in <= MAX_COUNTDOWN:
                    step.dispatched_at = step.available_at
                    bells.append(Doorbell(step.pk, step.queue, retry_in))
                else:
                    # No doorbell that far out: the sweeper rings as soon as it is due.
                    step.dispatched_at = None
            else:
                kind, step.status = EventKind.DEAD_LETTERED, StepStatus.DEAD
                step.finished_at = db_now()
                if retry_in is not None:
                    reason = "max_attempts"
            step.save()
            status = _settle_task(task)
            _event(
                kind,
                task_id=task.pk,
                step_id=step.pk,
                actor=f"worker:{claim.worker_id}",
                reason=reason if kind == EventKind.DEAD_LETTERED else "",
                steps=[step],
                token=claim.token,
                error_class=step.error_class,
                error=event_error(step.last_error),
                retry_in=retry_in if kind == EventKind.RETRY_SCHEDULED else None,
                task_status=status,
            )
            ring_on_commit(bells)
            return True
    reject_stale(claim, "fail")
    return False


# --- steps a person decides -------------------------------------------------------------


def _waiting_step(task: Task, step_id: int) -> Step:
    step = Step.objects.select_for_update().get(pk=step_id, task=task)
    if step.status != StepStatus.WAITING_APPROVAL:
        raise InvalidTransition(f"step {step.kind} of task #{task.pk} is {step.status}")
    return step


def close_gate(
    task: Task,
    step_id: int,
    *,
    outcome: str,
    kind: str,
    actor: Actor,
    reason: str = "",
    result: Any = None,
    error: str = "",
    **data: Any,
) -> str:
    """Settle a waiting approval step; the caller holds the task's lock (:func:`lock_task`)
    and has recorded the decision. Returns the task's new status.

    ``outcome`` is ``succeeded`` (approved: ``result`` is stored and the next step made
    due), ``cancelled`` (rejected, or expired under the cancel policy: the task's
    remaining steps are cancelled with it) or ``dead`` (expired under the dead-letter
    policy: ``error`` says why, and on-call redrives or cancels). One event of ``kind``
    with ``actor`` and ``reason`` records the change; a task that dies or is cancelled
    by it also gets its ``dead_lettered`` or ``cancelled`` event (actor ``system``).
    """
    step = _waiting_step(task, step_id)
    now = db_now()
    changed = [step]
    bells: list[Doorbell] = []
    step.finished_at = now
    gate = None
    if outcome == StepStatus.SUCCEEDED:
        step.status = StepStatus.SUCCEEDED
        step.result = result
        step.save(update_fields=["status", "result", "finished_at"])
        due, gate = _unblock_next(task, step, now)
        changed += due
        bells = [Doorbell(s.pk, s.queue) for s in due]
    elif outcome == StepStatus.CANCELLED:
        step.status = StepStatus.CANCELLED
        step.save(update_fields=["status", "finished_at"])
        changed += _cancel_steps(task, (StepStatus.BLOCKED, StepStatus.PENDING), now)
    elif outcome == StepStatus.DEAD:
        step.status = StepStatus.DEAD
        step.error_class = kind
        step.last_error = error
        step.save(update_fields=["status", "finished_at", "error_class", "last_error"])
    else:
        raise ValueError(f"close_gate: unknown outcome {outcome!r}")
    status = _settle_task(task)
    _event(
        kind,
        task_id=task.pk,
        step_id=step.pk,
        actor=actor,
        reason=reason,
        steps=changed,
        task_status=status,
        **data,
    )
    if gate is not None:
        _open_gate(task, gate, actor=actor)
    # A task that ends here ends with its status event too, as every other path does, so
    # timelines and dead-letter and cancel counts read one kind of event for each.
    who, _ = actor_fields(actor)
    if outcome == StepStatus.DEAD:
        _event(
            EventKind.DEAD_LETTERED,
            task_id=task.pk,
            step_id=step.pk,
            actor=SYSTEM,
            reason=kind,
            task_status=status,
        )
    elif status == TaskStatus.CANCELLED:
        _event(
            EventKind.CANCELLED,
            task_id=task.pk,
            actor=SYSTEM,
            reason=f"{kind} by {who}",
            task_status=status,
        )
    ring_on_commit(bells)
    return status


def revise(
    task: Task,
    step_id: int,
    *,
    back_to: str,
    actor: Actor,
    reason: str,
    change_request: dict[str, Any],
    **data: Any,
) -> list[Step]:
    """Send a task back from a waiting approval step to the step of kind ``back_to``.

    The caller holds the task's lock. The current rows from ``back_to`` up to the approval
    step become ``superseded`` (they stay as history); new rows for the same positions are
    appended with the task's next revision number and step keys ending ``:r<n>``. The
    first new row is due now and carries ``change_request`` for its handler. Returns the
    new rows.
    """
    gate = _waiting_step(task, step_id)
    current = {s.position: s for s in _current_steps(task)}
    start = next(
        (s.position for s in current.values() if s.kind == back_to and s.position < gate.position),
        None,
    )
    if start is None:
        raise InvalidTransition(f"task #{task.pk} has no step {back_to!r} before {gate.kind}")
    replaced = [current[p] for p in range(start, gate.position + 1)]
    revision = max(task.steps.values_list("revision", flat=True)) + 1
    now = db_now()
    for old in replaced:
        old.status = StepStatus.SUPERSEDED
        old.finished_at = old.finished_at or now
    Step.objects.bulk_update(replaced, ["status", "finished_at"])
    fresh = [
        Step(
            task=task,
            position=old.position,
            revision=revision,
            kind=old.kind,
            status=StepStatus.PENDING if old.position == start else StepStatus.BLOCKED,
            queue=task.queue,
            priority=task.priority,
            max_attempts=old.max_attempts,
            available_at=now if old.position == start else None,
            dispatched_at=now if old.position == start else None,
            idempotency_key=f"{task.key}:{old.position}:{old.kind}:r{revision}",
            change_request={**change_request, "revision": revision}
            if old.position == start
            else None,
        )
        for old in replaced
    ]
    Step.objects.bulk_create(fresh)
    status = _settle_task(task)
    _event(
        EventKind.CHANGES_REQUESTED,
        task_id=task.pk,
        step_id=gate.pk,
        actor=actor,
        reason=reason,
        steps=[*replaced, *fresh],
        revision=revision,
        back_to=back_to,
        task_status=status,
        **data,
    )
    ring_on_commit([Doorbell(fresh[0].pk, fresh[0].queue)])
    return fresh


# --- the sweeper -------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepReport:
    reaped: int
    redispatched: int
    # What the jobs other apps registered did (name -> count), e.g. expired approvals.
    jobs: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, int]:
        return {"reaped": self.reaped, "redispatched": self.redispatched, **self.jobs}


SweepJob = Callable[[int], int]
_sweep_jobs: dict[str, SweepJob] = {}


def register_sweep_job(name: str, job: SweepJob) -> None:
    """Have the sweeper also run ``job(limit)`` (returning how many rows it handled); an
    app building on the core registers its periodic work here, as approvals does for
    expiry."""
    _sweep_jobs[name] = job


def sweep(*, limit: int = 500) -> SweepReport:
    jobs = {name: job(limit) for name, job in list(_sweep_jobs.items())}
    return SweepReport(
        reaped=reap_expired_leases(limit=limit),
        redispatched=redispatch_due(limit=limit),
        jobs=jobs,
    )


def reap_expired_leases(*, limit: int = 500) -> int:
    """Return steps whose lease ran out (by the database's clock) to pending, or dead-letter
    them when their attempts are spent."""
    expired = list(
        Step.objects.filter(status=StepStatus.RUNNING, lease_expires_at__lt=Now())
        .order_by("lease_expires_at")
        .values_list("pk", "task_id", "fencing_token")[:limit]
    )
    reaped = 0
    for step_id, task_id, token in expired:
        with transaction.atomic():
            task = lock_task(task_id)
            # Re-checked under the lock: the worker may have finished or renewed meanwhile.
            step = (
                Step.objects.select_for_update()
                .filter(
                    pk=step_id,
                    status=StepStatus.RUNNING,
                    fencing_token=token,
                    lease_expires_at__lt=Now(),
                )
                .first()
            )
            if step is None:
                continue
            _release(step, token, Lease.Outcome.EXPIRED)
            step.lease_expires_at = None
            now = db_now()
            if task.cancel_requested_at is not None:
                step.status, outcome = StepStatus.CANCELLED, "cancelled"
                step.finished_at = now
            elif step.attempts >= step.max_attempts:
                step.status, outcome = StepStatus.DEAD, "dead"
                step.finished_at = now
                step.error_class = "lease_expired"
                step.last_error = f"lease of token {token} expired on attempt {step.attempts}"
            else:
                step.status, outcome = StepStatus.PENDING, "pending"
                step.available_at = step.dispatched_at = now
            step.save()
            status = _settle_task(task)
            _event(
                EventKind.LEASE_EXPIRED,
                task_id=task_id,
                step_id=step_id,
                actor=SWEEPER,
                steps=[step],
                token=token,
                outcome=outcome,
                task_status=status,
            )
            if step.status == StepStatus.CANCELLED:
                _event(
                    EventKind.CANCELLED,
                    task_id=task_id,
                    actor=SWEEPER,
                    reason="cancel requested while the step ran; its lease expired",
                    task_status=status,
                )
            if step.status == StepStatus.DEAD:
                _event(
                    EventKind.DEAD_LETTERED,
                    task_id=task_id,
                    step_id=step_id,
                    actor=SWEEPER,
                    reason="lease_expired",
                    steps=[step],
                    task_status=status,
                )
            if step.status == StepStatus.PENDING:
                ring_on_commit([Doorbell(step.pk, step.queue)])
            reaped += 1
    return reaped


def redispatch_due(*, limit: int = 500) -> int:
    """Ring again for due steps whose doorbell may have been lost.

    A step is rung at most once per ``TASKS_REDISPATCH_SECONDS`` (``dispatched_at``), and
    at most ``limit`` per sweep, so a broker outage does not turn into a flood.
    """
    interval = timedelta(seconds=settings.TASKS_REDISPATCH_SECONDS)
    with transaction.atomic():
        now = db_now()
        due = list(
            Step.objects.filter(status=StepStatus.PENDING, available_at__lte=now)
            .filter(Q(dispatched_at=None) | Q(dispatched_at__lte=now - interval))
            .exclude(_paused_queues())
            .order_by("-priority", "available_at")
            .values_list("pk", "queue")[:limit]
        )
        if not due:
            return 0
        Step.objects.filter(pk__in=[pk for pk, _ in due]).update(dispatched_at=now)
        ring_on_commit([Doorbell(pk, queue) for pk, queue in due])
    return len(due)


# --- operator actions --------------------------------------------------------------------


def _dead_steps(task: Task) -> list[Step]:
    return list(task.steps.select_for_update().filter(status=StepStatus.DEAD).order_by("position"))


def _run_again(step: Step, now: datetime) -> None:
    """A dead step becomes due now with a fresh attempt budget; its token keeps rising."""
    step.status = StepStatus.PENDING
    step.attempts = 0
    step.available_at = step.dispatched_at = now
    step.finished_at = None
    step.save(update_fields=["status", "attempts", "available_at", "dispatched_at", "finished_at"])


def redrive(
    task: Task, *, actor: Actor, reason: str, payload: dict[str, Any] | None = None
) -> Task:
    """Make a dead task runnable again: fresh attempt budget, same step key, rising token."""
    _check_permission(actor, "redrive_task")
    reason = validation.require_text(reason, "reason")
    canonical = validation.validate_payload(payload) if payload is not None else None
    flow = registry.get(task.workflow, task.workflow_version)
    if payload is not None and flow is not None and flow.validate_payload is not None:
        # An edited payload must pass the same rules as one given to enqueue.
        flow.validate_payload(payload)
    with transaction.atomic():
        locked = lock_task(task.pk)
        dead = _dead_steps(locked)
        if not dead:
            raise InvalidTransition(f"task #{task.pk} has no dead step to redrive")
        now = db_now()
        for step in dead:
            _run_again(step, now)
        data: dict[str, Any] = {}
        if canonical is not None:
            data = {"old_payload": locked.payload, "new_payload": json.loads(canonical)}
            locked.payload = data["new_payload"]
            locked.save(update_fields=["payload", "updated_at"])
        status = _settle_task(locked)
        _event(
            EventKind.REDRIVEN,
            task_id=locked.pk,
            actor=actor,
            reason=reason,
            steps=dead,
            task_status=status,
            **data,
        )
        _run_or_open(locked, dead, actor=actor)
    return locked


def _run_or_open(task: Task, steps: Sequence[Step], *, actor: Actor) -> None:
    """After a redrive or a resolve: ring for the steps made due, and open the request of
    an approval step among them (no worker runs one)."""
    bells = []
    for step in steps:
        if is_approval(task, step.position):
            _open_gate(task, step, actor=actor)
        else:
            bells.append(Doorbell(step.pk, step.queue))
    ring_on_commit(bells)


def is_approval(task: Task, position: int) -> bool:
    """Whether the step at ``position`` of the task's workflow version is one a person
    decides (never claimed: opened when the task reaches it)."""
    flow = registry.get(task.workflow, task.workflow_version)
    spec = flow.step(position) if flow is not None else None
    return spec is not None and spec.approval


def resolve(task: Task, *, actor: Actor, reason: str, outcome: str) -> Task:
    """A person settles a dead step: ``done`` (it happened) or ``retry`` (it did not)."""
    _check_permission(actor, "resolve_task")
    reason = validation.require_text(reason, "reason")
    if outcome not in ("done", "retry"):
        raise InvalidInput("outcome", "choice", "outcome: must be 'done' or 'retry'")
    name, _ = actor_fields(actor)
    with transaction.atomic():
        locked = lock_task(task.pk)
        dead = _dead_steps(locked)
        if not dead:
            raise InvalidTransition(f"task #{task.pk} has no dead step to resolve")
        step = dead[0]
        if outcome == "done" and is_approval(locked, step.position):
            raise InvalidTransition(
                f"step {step.kind} of task #{task.pk} is an approval: only a person's "
                "decision lets the task past it (redrive it for a new request, or cancel)"
            )
        now = db_now()
        started = Effect.objects.filter(step=step, status=Effect.Status.STARTED)
        changed = [step]
        if outcome == "done":
            started.update(
                status=Effect.Status.DONE,
                result={"resolved_by": name, "note": reason},
                finished_at=now,
            )
            step.status = StepStatus.SUCCEEDED
            step.result = {"resolved": "done", "by": name, "note": reason}
            step.finished_at = now
            step.save(update_fields=["status", "result", "finished_at"])
            due, gate = _unblock_next(locked, step, now)
            changed += due
        else:
            # "It did not happen": forget the unfinished effects so the next attempt calls.
            started.delete()
            _run_again(step, now)
            due, gate = [step], None
        status = _settle_task(locked)
        _event(
            EventKind.RESOLVED,
            task_id=locked.pk,
            step_id=step.pk,
            actor=actor,
            reason=reason,
            steps=changed,
            outcome=outcome,
            task_status=status,
        )
        _run_or_open(locked, [*due, *([gate] if gate else [])], actor=actor)
    return locked


CANCELLABLE = (
    StepStatus.BLOCKED,
    StepStatus.PENDING,
    StepStatus.WAITING_APPROVAL,
    StepStatus.DEAD,
)


def _cancel_steps(task: Task, statuses: Iterable[str], now: datetime) -> list[Step]:
    """Cancel the task's steps in ``statuses`` (the task is locked); returns them."""
    steps = list(task.steps.select_for_update().filter(status__in=statuses).order_by("position"))
    for step in steps:
        step.status = StepStatus.CANCELLED
        step.finished_at = now
    Step.objects.bulk_update(steps, ["status", "finished_at"])
    return steps


def cancel(task: Task, *, actor: Actor, reason: str) -> Task:
    """Cancel what has not run; ask a running step to stop. Its late result does not
    revive the task, and completed side effects are not undone."""
    _check_permission(actor, "cancel_task")
    reason = validation.require_text(reason, "reason")
    with transaction.atomic():
        locked = lock_task(task.pk)
        if locked.status in TERMINAL_TASK_STATUSES:
            raise InvalidTransition(f"task #{task.pk} already {locked.status}")
        if locked.cancel_requested_at is not None:
            raise InvalidTransition(f"task #{task.pk} is already being cancelled")
        now = db_now()
        steps = _cancel_steps(locked, CANCELLABLE, now)
        steps_cancelled.send(sender=Task, task=locked, steps=steps, actor=actor, reason=reason)
        running = locked.steps.filter(status=StepStatus.RUNNING).exists()
        if running:
            locked.cancel_requested_at = now
            locked.save(update_fields=["cancel_requested_at", "updated_at"])
        status = _settle_task(locked)
        _event(
            EventKind.CANCEL_REQUESTED if running else EventKind.CANCELLED,
            task_id=locked.pk,
            actor=actor,
            reason=reason,
            steps=steps,
            task_status=status,
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
    _check_permission(actor, "pause_queue")
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
        _event(
            EventKind.QUEUE_PAUSED if paused else EventKind.QUEUE_RESUMED,
            task_id=None,
            actor=actor,
            reason=reason,
            queue=queue,
        )
        if not paused:
            now = db_now()
            due = list(
                Step.objects.filter(queue=queue, status=StepStatus.PENDING, available_at__lte=now)
                .order_by("-priority", "available_at")
                .values_list("pk", flat=True)[:1000]
            )
            Step.objects.filter(pk__in=due).update(dispatched_at=now)
            ring_on_commit([Doorbell(pk, queue) for pk in due])


def paused_queues() -> list[str]:
    return list(QueueState.objects.filter(paused=True).values_list("name", flat=True))


# --- bulk actions on dead letters --------------------------------------------------------------


@dataclass(frozen=True)
class BulkReport:
    action: str
    changed: list[int]
    # Tasks the action no longer applied to (changed by someone else meanwhile), and why.
    skipped: list[tuple[int, str]]
    # More tasks matched than the limit allowed; they were left alone.
    limited: bool


BULK_ACTIONS: dict[str, tuple[str, Callable[..., Task]]] = {
    "redrive": ("redrive_task", lambda task, **kw: redrive(task, **kw)),
    "resolve_done": ("resolve_task", lambda task, **kw: resolve(task, outcome="done", **kw)),
    "resolve_retry": ("resolve_task", lambda task, **kw: resolve(task, outcome="retry", **kw)),
    "cancel": ("cancel_task", lambda task, **kw: cancel(task, **kw)),
}


def act_on_tasks(
    tasks: Iterable[Task], *, action: str, actor: Actor, reason: str, limit: int
) -> BulkReport:
    """Apply one operator action (redrive, resolve, cancel) to each of ``tasks`` (at most
    ``limit``), each in its own transaction with its own Event, as if done one by one: the
    console's bulk form on dead letters and the management commands both come here.

    The action, the permission, the reason and the limit are checked before anything
    changes (given no tasks, that check is all it does); a task the action does not apply
    to (not dead, already finished, or changed by someone else meanwhile) is skipped and
    reported, not an error for the rest.
    """
    if action not in BULK_ACTIONS:
        raise InvalidInput("action", "choice", f"action: one of {', '.join(BULK_ACTIONS)}")
    permission, run = BULK_ACTIONS[action]
    _check_permission(actor, permission)
    reason = validation.require_text(reason, "reason")
    if not 1 <= limit <= settings.CONSOLE_BULK_LIMIT:
        raise InvalidInput(
            "limit", "range", f"limit: from 1 to {settings.CONSOLE_BULK_LIMIT} tasks per action"
        )
    changed: list[int] = []
    skipped: list[tuple[int, str]] = []
    limited = False
    for task in tasks:
        if len(changed) + len(skipped) == limit:
            limited = True
            break
        try:
            run(task, actor=actor, reason=reason)
        except InvalidTransition as exc:
            skipped.append((task.pk, str(exc)))
        else:
            changed.append(task.pk)
    return BulkReport(action, changed, skipped, limited)


# The name the console's dead-letters view calls it by.
act_on_dead = act_on_tasks
