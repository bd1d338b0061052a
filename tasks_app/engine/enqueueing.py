"""Creating tasks: ``enqueue`` and ``enqueue_many``, the only ways in (DESIGN rule 4)."""

from __future__ import annotations

import collections
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from django.db import IntegrityError, InterfaceError, OperationalError, connection, transaction

from tasks_app import validation
from tasks_app.access import Actor, actor_fields
from tasks_app.db.clock import db_now
from tasks_app.engine import tracing_hooks
from tasks_app.engine.dispatch import Doorbell, ring_on_commit
from tasks_app.engine.fast_inserts import insert_tasks
from tasks_app.engine.limit_keys import assign_turns
from tasks_app.engine.limits import Placement, place
from tasks_app.engine.states import make_due, new_step
from tasks_app.engine.transitions import bump_counter, fast_path_enabled
from tasks_app.engine.workflows import Workflow, registry
from tasks_app.exceptions import IdempotencyConflict, InvalidInput, all_of
from tasks_app.history import counting
from tasks_app.models import Step, StepStatus, Task, TaskStatus, step_key
from tasks_app.models.graphs import is_root

T = TypeVar("T")


@dataclass(frozen=True)
class EnqueueResult:
    task: Task
    created: bool


@dataclass(frozen=True)
class PreparedItem:
    workflow: Workflow
    payload: dict[str, Any]
    # The payload's canonical JSON text, which the insert sends as it is.
    canonical: str
    payload_hash: str
    idempotency_key: str | None
    queue: str
    priority: int
    run_after: datetime | None
    # The limits each step runs under (tasks_app.engine.limits).
    placement: Placement
    # The W3C traceparent of the enqueue's span, stored on the task; set by the enqueue
    # only with tracing on (tracing_hooks.EnqueueTrace.stamped).
    traceparent: str | None = None


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
    """Check every input rule and return the item; refuse it with all the rules it
    breaks at once (``InvalidInput.errors``), each field named with ``prefix``. The
    workflow's own payload rules are checked once the workflow is known and the payload
    passed the general ones."""
    errors: list[InvalidInput] = []

    def check(rule: Callable[..., T], *args: Any) -> T | None:
        try:
            return rule(*args)
        except InvalidInput as exc:
            errors.append(exc)
            return None

    flow: Workflow | None = None
    if isinstance(workflow, str):
        flow = check(registry.latest, workflow)
    else:
        errors.append(InvalidInput("workflow", "registered", "workflow: must be a workflow name"))
    canonical = check(validation.validate_payload, payload)
    placement = None
    if flow is not None and canonical is not None:
        check(flow.check_payload, payload)
        placement = check(place, flow, payload)
    key = check(validation.validate_idempotency_key, idempotency_key)
    checked_queue = check(validation.validate_queue, queue)
    checked_priority = check(validation.validate_priority, priority)
    checked_run_after = check(validation.validate_run_after, run_after)
    if errors:
        raise all_of([_prefixed(error, prefix) for error in errors]) from None
    assert flow is not None and canonical is not None and placement is not None
    assert checked_queue is not None and checked_priority is not None
    return PreparedItem(
        workflow=flow,
        # The stored payload is exactly what the canonical form says.
        payload=json.loads(canonical),
        canonical=canonical,
        payload_hash=validation.payload_hash(flow.name, canonical),
        idempotency_key=key,
        queue=checked_queue,
        priority=checked_priority,
        run_after=checked_run_after,
        placement=placement,
    )


def _prefixed(error: InvalidInput, prefix: str) -> InvalidInput:
    """The error with its fields named as in a batch (``items[2].payload``)."""
    if not prefix:
        return error
    for each in error.errors:
        each.field = prefix + each.field
        each.args = (prefix + str(each),)
    if len(error.errors) > 1:
        return all_of(error.errors)
    return error


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
    return _enqueue_traced([item], actor)[0]


def check_enqueue(workflow: Any, payload: Any, *, prefix: str = "", **options: Any) -> None:
    """Refuse what ``enqueue`` would refuse, writing nothing (a schedule's declaration is
    checked this way when it is stored)."""
    _prepare(workflow=workflow, payload=payload, prefix=prefix, **options)


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
    return _enqueue_traced(prepared, actor)


def _enqueue_traced(items: list[PreparedItem], actor: Actor) -> list[EnqueueResult]:
    """:func:`_enqueue_prepared` inside the enqueue's spans, each item stamped with its
    span's traceparent for its task row (tracing_hooks: nothing at all with tracing off)."""
    with tracing_hooks.enqueue(items) as trace:
        results = _enqueue_prepared(trace.stamped(items), actor)
        trace.created(results)
    return results


def _enqueue_prepared(items: list[PreparedItem], actor: Actor) -> list[EnqueueResult]:
    # With the SQL path, one item outside a transaction is one statement in autocommit: it
    # either inserts the task with its steps and event, or finds the key taken and writes
    # nothing, so there is nothing to make atomic.
    alone = len(items) == 1 and fast_path_enabled() and items[0].placement.turn_key is None
    outside = not connection.in_atomic_block
    if outside:
        _replace_lost_connection()
    for round_ in range(3):
        try:
            if alone and outside:
                results, duplicates = _insert(items, actor)
            else:
                with transaction.atomic():
                    results, duplicates = _insert(items, actor)
            break
        except (OperationalError, InterfaceError):
            # The database dropped the connection (a restart, a failover). Outside a
            # caller's transaction a new one is opened; the enqueue is tried again only
            # when every item has a key, since a lost answer may hide a commit and the key
            # is what makes a second try return that task instead of a copy.
            if (
                not outside
                or round_
                or (connection.connection is not None and connection.is_usable())
            ):
                raise
            connection.close()
            if any(item.idempotency_key is None for item in items):
                raise
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


def _replace_lost_connection() -> None:
    """Before an enqueue outside any transaction, replace a connection an earlier error
    left unusable (or older than ``CONN_MAX_AGE``), as Django does at each request: a
    producer that runs outside requests recovers from a database restart by itself."""
    connection.close_if_unusable_or_obsolete()


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

    turns = _turns(unique)
    if fast_path_enabled():
        created = insert_tasks(unique, turns, author=author, user_id=user_id)
    else:
        created = _insert_with_orm(unique, turns, author=author, user_id=user_id)
    counting.add(collections.Counter(f"{counting.ENQUEUED}:{t.workflow}" for t in created.values()))

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


def _turns(unique: list[tuple[int, PreparedItem]]) -> dict[int, int | None]:
    """Each limited item's turn (limit_keys.assign_turns), by item index."""
    limited = [(index, item) for index, item in unique if item.placement.turn_key is not None]
    if not limited:
        return {}
    pairs = {
        (entry[0], entry[1])
        for _, item in limited
        for entries in item.placement.steps
        for entry in entries or ()
    }
    turns = assign_turns([item.placement.turn_key for _, item in limited], pairs)
    return {index: turn for (index, _), turn in zip(limited, turns, strict=True)}


def _insert_with_orm(
    unique: list[tuple[int, PreparedItem]],
    turns: dict[int, int | None],
    *,
    author: str,
    user_id: int | None,
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
            traceparent=item.traceparent,
        )
    Task.objects.bulk_create(list(created.values()))

    steps: list[Step] = []
    for index, item in fresh:
        task = created[index]
        for position, spec in enumerate(item.workflow.steps):
            step = new_step(
                task=task,
                position=position,
                revision=0,
                kind=spec.kind,
                queue=task.queue,
                priority=task.priority,
                max_attempts=spec.max_attempts,
                idempotency_key=step_key(task.key, position, spec.kind),
                limits=item.placement.steps[position],
                limit_turn=turns.get(index) if item.placement.steps[position] else None,
                after=item.workflow.stored_after(position),
            )
            if is_root(position, step.after):
                # Rung after the commit with the others (enqueue's doorbells).
                make_due(step, item.run_after or now)
            steps.append(step)
    Step.objects.bulk_create(steps)

    # No `enqueued` event: the task row and its first steps record the enqueue
    # (tasks_app.history.timeline).
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
