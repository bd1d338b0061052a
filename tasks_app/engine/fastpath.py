"""Batched claims and completions: the workers' hot path.

Same guarantees as :func:`leases.claim_step` and :func:`leases.complete_step`, for many
steps per transaction. A claim is still a conditional, fenced write; a completion still
checks the token and records the attempt with the change. On PostgreSQL each is one
statement (``tasks_app.engine.sql``), run in autocommit: atomic on its own, without the
round trips of BEGIN and COMMIT. Only a completion whose task's cancel was requested while
its step ran takes a transaction, for the task's ``cancelled`` event. On SQLite (the
embedded mode), or with the fast path switched off (``transitions.fast_path_enabled``),
they run the one-step services in a loop.

Lock order stays task row, then step row: a batch claim locks both with SKIP LOCKED, so it
never waits on a cancel or a completion that holds the task, and a batch completion locks
its tasks in id order before touching their steps.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from tasks_app.access import SYSTEM
from tasks_app.db import rows
from tasks_app.db.hot_cursor import hot_cursor
from tasks_app.db.lock_conflicts import retry_lock_conflicts
from tasks_app.engine import leases, limited_claims
from tasks_app.engine.announcements import announce_on_commit
from tasks_app.engine.dispatch import Doorbell, ring_on_commit
from tasks_app.engine.leases import Claim
from tasks_app.engine.sql import (
    COMPLETE_SQL,
    TASK_COLUMNS,
    claim_sql,
)
from tasks_app.engine.states import record_ending
from tasks_app.engine.transitions import fast_path_enabled, paused_filter
from tasks_app.engine.workflows import registry
from tasks_app.exceptions import LEASE_EXPIRED
from tasks_app.history import counting
from tasks_app.models import EventKind, Step, Task
from tasks_app.models.json_columns import strict_json


def claim_batch(
    *,
    worker_id: str,
    limit: int,
    step_id: int | None = None,
    queue: str | None = None,
    lease_seconds: int | None = None,
) -> list[Claim]:
    """Claim up to ``limit`` due steps of one queue, ``step_id`` first if it can be.

    The queue is ``queue``, or else the named step's. Nothing is claimed in a paused queue.
    A step whose last lease ran out is claimed only in a batch of its own (named, or with
    ``limit`` 1), so a step that kills its process takes no other step's attempt along.
    Steps under limits are claimed first, as their limits let them
    (``limited_claims``), then the rest.
    """
    lease = lease_seconds or settings.TASKS_LEASE_SECONDS
    limited = _claim_limited(worker_id, limit, step_id, queue, lease)
    if limited.alone or len(limited.claims) == limit:
        return limited.claims
    if limited.claims:
        queue = queue or limited.claims[0].queue
        if step_id in {claim.step_id for claim in limited.claims}:
            step_id = None
        limit -= len(limited.claims)
    if not fast_path_enabled():
        return limited.claims + _claim_batch_one_by_one(worker_id, limit, step_id, queue, lease)
    return limited.claims + _claim_unlimited(worker_id, limit, step_id, queue, lease)


def _claim_limited(
    worker_id: str, limit: int, step_id: int | None, queue: str | None, lease: int
) -> limited_claims.Claimed:
    """The claim of steps under limits, when this worker knows of any and they may be due
    (one indexed look first, so queues without them pay nothing more)."""
    if not registry.limits():
        return limited_claims.Claimed()
    if queue is None:
        # A doorbell's first claim: the queue is the named step's, whether that step is
        # still due or not (a drain that stops, or recruits help, rings naming a step it
        # has run already), so the steps under limits waiting there are claimed too.
        if step_id is None:
            return limited_claims.Claimed()
        named = Step.objects.filter(pk=step_id).values_list("queue", "limit_turn").first()
        if named is None:
            return limited_claims.Claimed()
        queue = named[0]
        if named[1] is None and not limited_claims.has_due(queue):
            return limited_claims.Claimed()
    elif not fast_path_enabled() and not limited_claims.has_due(queue):
        # (The fast path's claim looks first itself, in the same round trip.)
        return limited_claims.Claimed()
    return limited_claims.claim(
        queue=queue, worker_id=worker_id, limit=limit, lease_seconds=lease, step_id=step_id
    )


def _claim_unlimited(
    worker_id: str, limit: int, step_id: int | None, queue: str | None, lease: int
) -> list[Claim]:
    # One statement is atomic on its own: outside a transaction it runs in autocommit,
    # without the round trips of BEGIN and COMMIT (the one before it delays every start).
    atomic = transaction.atomic() if connection.in_atomic_block else nullcontext()
    with atomic, hot_cursor() as cursor:
        cursor.execute(
            claim_sql(limit),
            {
                "queue": queue,
                "step": step_id,
                "lease": lease,
                "worker": worker_id,
            },
            prepare=True,
        )
        claimed = cursor.fetchall()
    claims = [
        Claim.of(step, worker_id=worker_id, lease_seconds=lease, keep=True)
        for step in leases.claimed_steps(claimed)
    ]
    counting.add(collections.Counter(f"{counting.CLAIMED}:{claim.queue}" for claim in claims))
    return claims


def _claim_batch_one_by_one(
    worker_id: str, limit: int, step_id: int | None, queue: str | None, lease: int
) -> list[Claim]:
    if queue is None and step_id is not None:
        queue = Step.objects.filter(pk=step_id).values_list("queue", flat=True).first()
    if queue is None:
        return []
    # A step whose last lease ran out is claimed only in a batch of one
    # (exceptions.LEASE_EXPIRED).
    due = Step.objects.due().filter(queue=queue, limit_turn__isnull=True)
    if limit > 1:
        due = due.exclude(error_class=LEASE_EXPIRED)
    if step_id is not None:
        due = due.exclude(pk=step_id)
    candidates = list(
        due.order_by("-priority", "available_at").values_list("pk", flat=True)[:limit]
    )
    # A named step whose last lease ran out is the whole batch.
    alone = step_id is not None and _alone(step_id)
    if step_id is not None:
        candidates.insert(0, step_id)
    claims = []
    for pk in candidates:
        claim = leases.claim_step(pk, worker_id=worker_id, lease_seconds=lease)
        if claim is not None:
            claims.append(claim)
            if pk == step_id and alone:
                break
        if len(claims) == limit:
            break
    return claims


def _alone(step_id: int) -> bool:
    """Whether the step must be claimed in a batch of its own (exceptions.LEASE_EXPIRED)."""
    return Step.objects.filter(pk=step_id, error_class=LEASE_EXPIRED).exists()


def complete_many(done: Sequence[tuple[Claim, Any]]) -> set[int]:
    """Record the results of many claimed steps; returns the ids accepted.

    The statement makes each task's next step ``pending``, so it is for successes whose
    next step is not an approval step: those go through :func:`leases.complete_step`,
    which opens the request in the same transaction (``runner.run_batch`` splits them).

    A claim that no longer holds its step is refused and recorded as
    ``stale_write_rejected``, exactly as :func:`leases.complete_step` does.
    """
    if not done:
        return set()
    if not fast_path_enabled():
        return {claim.step_id for claim, result in done if leases.complete_step(claim, result)}
    # A claim given twice is one completion and one stale write, as one by one.
    first: dict[tuple[int, int], tuple[Claim, Any]] = {}
    repeated: list[Claim] = []
    for claim, result in done:
        if (claim.step_id, claim.token) in first:
            repeated.append(claim)
        else:
            first[(claim.step_id, claim.token)] = (claim, result)
    unique = list(first.values())
    # The sweeper never waits on a step row, but people and other paths may: a deadlock
    # lost here is tried again rather than leaving the whole batch to expire. Each of the
    # two calls commits on its own, so each is tried again on its own.
    held, deferred = retry_lock_conflicts(
        lambda: _complete(unique, cancelled=False), what="a batch completion"
    )
    if deferred:
        # Tasks whose cancel was requested while their steps ran: rare, and recorded in a
        # transaction with their `cancelled` events.
        rest = [(claim, result) for claim, result in unique if claim.step_id in deferred]
        more, _ = retry_lock_conflicts(
            lambda: _complete(rest, cancelled=True), what="a batch completion"
        )
        held |= more
    for claim, _ in unique:
        if (claim.step_id, claim.token) not in held:
            leases.reject_stale(claim, "complete")
    for claim in repeated:
        leases.reject_stale(claim, "complete")
    return {step_id for step_id, _ in held}


def _complete(
    unique: Sequence[tuple[Claim, Any]], *, cancelled: bool
) -> tuple[set[tuple[int, int]], set[int]]:
    """Record ``unique`` (one claim per step and token) in one statement; returns the
    (step, token) pairs accepted and the steps deferred: those whose task's cancel was
    requested, unless ``cancelled``, which records them with their tasks' ``cancelled``
    events, in one transaction.

    The statement alone is atomic: outside a transaction it runs in autocommit, without the
    round trips of BEGIN and COMMIT."""
    atomic = transaction.atomic() if cancelled or connection.in_atomic_block else nullcontext()
    with atomic, hot_cursor() as cursor:
        cursor.execute(COMPLETE_SQL, completion_params(unique, cancelled=cancelled), prepare=True)
        answer = cursor.fetchall()
        # A completion counts for the claim whose token holds the step, not for a stale
        # claim of the same step in the same call.
        held = {(pk, int(token)) for what, pk, token, *_ in answer if what == "done"}
        _count_run_times(
            unique, {pk: float(seconds) for what, pk, seconds, *_ in answer if what == "ran"}
        )
        ring_on_commit([Doorbell(pk, queue) for what, pk, queue, *_ in answer if what == "next"])
        settled = {
            row[1]: rows.from_row(Task, TASK_COLUMNS, row[3:])
            for row in answer
            if row[0] == "settled"
        }
        announce_on_commit(((pk, task.status) for pk, task in settled.items()), rows=settled)
        # A task whose cancel was requested while its step ran ends with `cancelled`, after
        # its `succeeded`, as complete_step writes it: an operator event, so it joins the
        # audit chain (record_event also logs and counts it).
        for _, task in sorted(settled.items()):
            record_ending(
                task,
                task.status,
                after=EventKind.SUCCEEDED,
                step=None,
                actor=SYSTEM,
                reason=leases.CANCELLED_WHILE_RUNNING,
            )
    return held, {pk for what, pk, *_ in answer if what == "deferred"}


def completion_params(done: Sequence[tuple[Claim, Any]], *, cancelled: bool) -> dict[str, Any]:
    """``COMPLETE_SQL``'s parameters for ``done``, each claim with its result."""
    return {
        "tasks": sorted({claim.task_id for claim, _ in done}),
        "cancelled": cancelled,
        "ids": [claim.step_id for claim, _ in done],
        "tokens": [claim.token for claim, _ in done],
        # None is stored as SQL NULL, as the ORM stores it, not as JSON null.
        "results": [None if result is None else strict_json(result) for _, result in done],
        "actors": [f"worker:{claim.worker_id}" for claim, _ in done],
    }


def _count_run_times(unique: Sequence[tuple[Claim, Any]], seconds: dict[int, float]) -> None:
    """Each accepted success's run time into its workflow's histogram."""
    workflows = {
        claim.step_id: claim.step.task.workflow
        for claim, _ in unique
        if claim.step is not None and claim.step_id in seconds
    }
    if missing := seconds.keys() - workflows.keys():
        workflows |= dict(Step.objects.filter(pk__in=missing).values_list("pk", "task__workflow"))
    by_workflow: dict[str, list[float]] = collections.defaultdict(list)
    for pk, run in seconds.items():
        by_workflow[workflows[pk]].append(run)
    for workflow, runs in by_workflow.items():
        counting.add(counting.step_seconds(runs, workflow))


def queue_has_due_steps(queue: str) -> bool:
    return Step.objects.due().filter(queue=queue).exclude(paused_filter()).exists()
