"""Batched claims and completions: the workers' hot path.

Same guarantees as :func:`leases.claim_step` and :func:`leases.complete_step`, for many
steps per transaction. A claim is still a conditional, fenced write with its Lease and
Event; a completion still checks the token and writes its Event with the change. On
PostgreSQL each is one transaction of one or two statements; on SQLite (the embedded mode)
they fall back to the one-step services in a loop.

Lock order stays task row, then step row: a batch claim locks both with SKIP LOCKED, so it
never waits on a cancel or a completion that holds the task, and a batch completion locks
its tasks in id order before touching their steps.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import psycopg
from django.conf import settings
from django.db import connection, transaction

from . import leases
from .dispatch import Doorbell, ring_on_commit
from .leases import Claim
from .models import Step, Task, TaskStatus
from .signals import announce_on_commit
from .transitions import paused_filter, uses_sql

if TYPE_CHECKING:
    from .enqueueing import PreparedItem


@contextmanager
def _cursor() -> Iterator[psycopg.Cursor[Any]]:
    """A psycopg cursor with server-side parameter binding on Django's connection.

    Arrays of thousands of values are sent as parameters instead of being quoted into the
    statement text, and statements run often are prepared by psycopg.
    """
    connection.ensure_connection()
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        yield cursor


# One statement: pick due steps (the named one first) with their task rows, skipping rows
# another transaction holds; mark them running with a raised token; write their leases,
# their `claimed` events and the tasks' status.
CLAIM_SQL = """
WITH target AS (
    SELECT COALESCE(%(queue)s, (SELECT queue FROM tasks_app_step WHERE id = %(step)s)) AS queue
), open_queue AS (
    SELECT queue FROM target
    WHERE NOT EXISTS (
        SELECT 1 FROM tasks_app_queuestate q WHERE q.name = target.queue AND q.paused
    )
), named AS (
    SELECT s.id FROM tasks_app_step s JOIN tasks_app_task t ON t.id = s.task_id
    WHERE s.id = %(step)s AND s.status = 'pending' AND s.available_at <= statement_timestamp()
      AND s.queue = (SELECT queue FROM open_queue)
    FOR UPDATE OF s, t SKIP LOCKED
), more AS (
    SELECT s.id FROM tasks_app_step s JOIN tasks_app_task t ON t.id = s.task_id
    WHERE s.queue = (SELECT queue FROM open_queue) AND s.status = 'pending'
      AND s.available_at <= statement_timestamp() AND s.id IS DISTINCT FROM %(step)s
    ORDER BY s.priority DESC, s.available_at
    LIMIT %(limit)s
    FOR UPDATE OF s, t SKIP LOCKED
), picked AS (
    -- The named step first; when it cannot be claimed, its place goes to another.
    SELECT id FROM (SELECT id, 0 AS rank FROM named UNION ALL SELECT id, 1 FROM more) AS c
    ORDER BY rank LIMIT %(limit)s
), claimed AS (
    UPDATE tasks_app_step s
    SET status = 'running', attempts = s.attempts + 1, fencing_token = s.fencing_token + 1,
        lease_expires_at = statement_timestamp() + %(lease)s * interval '1 second',
        started_at = statement_timestamp()
    WHERE s.id IN (SELECT id FROM picked)
    RETURNING s.id, s.task_id, s.queue, s.attempts, s.fencing_token, s.lease_expires_at,
              s.priority, s.available_at
), leases AS (
    INSERT INTO tasks_app_lease (step_id, token, worker_id, acquired_at, expires_at, released_at, outcome)
    SELECT id, fencing_token, %(worker)s, statement_timestamp(), lease_expires_at, NULL, ''
    FROM claimed
), events AS (
    INSERT INTO tasks_app_event (task_id, step_id, kind, actor, actor_user_id, reason, data, created_at)
    SELECT task_id, id, 'claimed', %(actor)s, NULL, '',
           jsonb_build_object(
               'steps', jsonb_build_object(id::text, jsonb_build_array('running', attempts, fencing_token)),
               'token', fencing_token, 'attempt', attempts, 'lease_seconds', %(lease)s
           ),
           statement_timestamp()
    FROM claimed
), tasks AS (
    UPDATE tasks_app_task t SET status = 'running', updated_at = statement_timestamp()
    FROM claimed WHERE t.id = claimed.task_id AND t.status <> 'running'
)
SELECT id, task_id, queue, attempts, fencing_token FROM claimed
ORDER BY id = %(step)s DESC, priority DESC, available_at, id
"""

LOCK_TASKS_SQL = "SELECT id FROM tasks_app_task WHERE id = ANY(%s) ORDER BY id FOR UPDATE"

# One statement after the tasks are locked: fenced success for every step still held by
# its token, leases released, the next step of each task made due (unless a cancel was
# requested), task status settled, and one `succeeded` event per step (plus `cancelled`).
COMPLETE_SQL = """
WITH input AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(results)s::jsonb[], %(actors)s::text[])
        AS i(id, token, result, actor)
), done AS (
    UPDATE tasks_app_step s
    SET status = 'succeeded', result = i.result, finished_at = statement_timestamp(),
        lease_expires_at = NULL
    FROM input i
    WHERE s.id = i.id AND s.fencing_token = i.token AND s.status = 'running'
    RETURNING s.id, s.task_id, s.position, s.attempts, s.fencing_token
), released AS (
    UPDATE tasks_app_lease l SET released_at = statement_timestamp(), outcome = 'succeeded'
    FROM done WHERE l.step_id = done.id AND l.token = done.fencing_token AND l.released_at IS NULL
), nxt AS (
    UPDATE tasks_app_step n
    SET status = 'pending', available_at = statement_timestamp(),
        dispatched_at = statement_timestamp()
    FROM done JOIN tasks_app_task t ON t.id = done.task_id
    WHERE n.task_id = done.task_id AND n.position = done.position + 1 AND n.status = 'blocked'
      AND t.cancel_requested_at IS NULL
    RETURNING n.id, n.task_id, n.queue, n.attempts, n.fencing_token
), settled AS (
    UPDATE tasks_app_task t
    SET status = CASE WHEN t.cancel_requested_at IS NOT NULL THEN 'cancelled'
                      WHEN nxt.id IS NULL THEN 'succeeded' ELSE 'pending' END,
        finished_at = CASE WHEN nxt.id IS NULL THEN statement_timestamp() END,
        updated_at = statement_timestamp()
    FROM done LEFT JOIN nxt ON nxt.task_id = done.task_id
    WHERE t.id = done.task_id
    RETURNING t.id, t.status
), events AS (
    -- A task's `succeeded` comes before its `cancelled`: ids follow the ORDER BY.
    INSERT INTO tasks_app_event (task_id, step_id, kind, actor, actor_user_id, reason, data, created_at)
    SELECT task_id, step_id, kind, actor, NULL, reason, data, statement_timestamp()
    FROM (
        SELECT done.task_id, done.id AS step_id, 'succeeded' AS kind, i.actor,
               '' AS reason, 0 AS ord,
               jsonb_build_object(
                   'steps',
                   jsonb_build_object(
                       done.id::text, jsonb_build_array('succeeded', done.attempts, done.fencing_token)
                   ) || CASE WHEN nxt.id IS NULL THEN '{}'::jsonb ELSE jsonb_build_object(
                       nxt.id::text, jsonb_build_array('pending', nxt.attempts, nxt.fencing_token)
                   ) END,
                   'token', done.fencing_token, 'task_status', settled.status
               ) AS data
        FROM done JOIN input i ON i.id = done.id AND i.token = done.fencing_token
             JOIN settled ON settled.id = done.task_id
             LEFT JOIN nxt ON nxt.task_id = done.task_id
        UNION ALL
        SELECT settled.id, NULL, 'cancelled', 'system', 'cancel requested while the step ran', 1,
               '{}'::jsonb
        FROM settled WHERE settled.status = 'cancelled'
    ) AS e
    ORDER BY task_id, ord
)
SELECT 'done', id, fencing_token::text FROM done
UNION ALL
SELECT 'next', id, queue FROM nxt
UNION ALL
SELECT 'settled', id, status FROM settled WHERE status IN ('succeeded', 'cancelled')
"""


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
    """
    lease = lease_seconds or settings.TASKS_LEASE_SECONDS
    if not uses_sql():
        return _claim_batch_one_by_one(worker_id, limit, step_id, queue, lease)
    with transaction.atomic(), _cursor() as cursor:
        cursor.execute(
            CLAIM_SQL,
            {
                "queue": queue,
                "step": step_id,
                "limit": limit,
                "lease": lease,
                "worker": worker_id,
                "actor": f"worker:{worker_id}",
            },
            prepare=True,
        )
        rows = cursor.fetchall()
    return [
        Claim(
            step_id=pk,
            task_id=task_id,
            token=token,
            attempt=attempts,
            worker_id=worker_id,
            lease_seconds=lease,
            queue=step_queue,
        )
        for pk, task_id, step_queue, attempts, token in rows
    ]


def _claim_batch_one_by_one(
    worker_id: str, limit: int, step_id: int | None, queue: str | None, lease: int
) -> list[Claim]:
    if queue is None and step_id is not None:
        queue = Step.objects.filter(pk=step_id).values_list("queue", flat=True).first()
    if queue is None:
        return []
    due = Step.objects.due().filter(queue=queue)
    if step_id is not None:
        due = due.exclude(pk=step_id)
    candidates = list(
        due.order_by("-priority", "available_at").values_list("pk", flat=True)[:limit]
    )
    if step_id is not None:
        candidates.insert(0, step_id)
    claims = []
    for pk in candidates:
        claim = leases.claim_step(pk, worker_id=worker_id, lease_seconds=lease)
        if claim is not None:
            claims.append(claim)
        if len(claims) == limit:
            break
    return claims


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
    if not uses_sql():
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
    with transaction.atomic(), _cursor() as cursor:
        cursor.execute(
            LOCK_TASKS_SQL, [sorted({claim.task_id for claim, _ in unique})], prepare=True
        )
        cursor.execute(
            COMPLETE_SQL,
            {
                "ids": [claim.step_id for claim, _ in unique],
                "tokens": [claim.token for claim, _ in unique],
                # None is stored as SQL NULL, as the ORM stores it, not as JSON null.
                "results": [
                    None if result is None else json.dumps(result, allow_nan=False)
                    for _, result in unique
                ],
                "actors": [f"worker:{claim.worker_id}" for claim, _ in unique],
            },
            prepare=True,
        )
        rows = cursor.fetchall()
        # A completion counts for the claim whose token holds the step, not for a stale
        # claim of the same step in the same call.
        held = {(pk, int(token)) for what, pk, token in rows if what == "done"}
        ring_on_commit([Doorbell(pk, queue) for what, pk, queue in rows if what == "next"])
        announce_on_commit((pk, status) for what, pk, status in rows if what == "settled")
    for claim, _ in unique:
        if (claim.step_id, claim.token) not in held:
            leases.reject_stale(claim, "complete")
    for claim in repeated:
        leases.reject_stale(claim, "complete")
    return {step_id for step_id, _ in held}


def queue_has_due_steps(queue: str) -> bool:
    return Step.objects.due().filter(queue=queue).exclude(paused_filter()).exists()


# Each step's key is models.step_key's (revision 0), restated in SQL.
# One statement: insert the tasks whose keys are free (a key taken meanwhile by a concurrent
# enqueue makes this wait for it, then skip), all their steps, and one `enqueued` event each.
# Ids are drawn first so every row maps back to its item, and rows go in key order so two
# batches sharing keys queue on them in one order instead of deadlocking.
INSERT_SQL = """
WITH input AS (
    SELECT i.*, nextval(pg_get_serial_sequence('tasks_app_task', 'id')) AS id
    FROM jsonb_to_recordset(%(items)s::jsonb) AS i(
        ord int, workflow text, version int, payload jsonb, hash text, key text, queue text,
        priority int, run_after timestamptz
    )
), spec AS (
    SELECT * FROM jsonb_to_recordset(%(steps)s::jsonb)
        AS s(ord int, position int, kind text, max_attempts int)
), tasks AS (
    INSERT INTO tasks_app_task (id, workflow, workflow_version, payload, payload_hash, idempotency_key,
                                queue, priority, status, created_by, created_by_user_id,
                                created_at, updated_at, finished_at, cancel_requested_at)
    SELECT id, workflow, version, payload, hash, key, queue, priority, 'pending', %(author)s, %(user)s,
           statement_timestamp(), statement_timestamp(), NULL, NULL
    FROM input ORDER BY key, ord
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id, created_at
), steps AS (
    INSERT INTO tasks_app_step (task_id, position, revision, kind, status, queue, priority, attempts,
                                max_attempts, available_at, idempotency_key, fencing_token,
                                lease_expires_at, dispatched_at, result, last_error, error_class,
                                started_at, finished_at)
    SELECT t.id, s.position, 0, s.kind, CASE WHEN s.position = 0 THEN 'pending' ELSE 'blocked' END,
           i.queue, i.priority, 0, s.max_attempts,
           CASE WHEN s.position = 0 THEN COALESCE(i.run_after, t.created_at) END,
           COALESCE(i.key, 'task-' || t.id) || ':' || s.position || ':' || s.kind, 0,
           NULL, CASE WHEN s.position = 0 THEN COALESCE(i.run_after, t.created_at) END,
           NULL, '', '', NULL, NULL
    FROM tasks t JOIN input i ON i.id = t.id JOIN spec s ON s.ord = i.ord
    ORDER BY t.id, s.position
    RETURNING id, task_id, position, status, available_at
), states AS (
    SELECT task_id, jsonb_object_agg(id::text, jsonb_build_array(status, 0, 0)) AS steps,
           min(id) FILTER (WHERE position = 0) AS first_step,
           min(available_at) FILTER (WHERE position = 0) AS available_at
    FROM steps GROUP BY task_id
), events AS (
    INSERT INTO tasks_app_event (task_id, step_id, kind, actor, actor_user_id, reason, data, created_at)
    SELECT t.id, NULL, 'enqueued', %(author)s, %(user)s, '',
           jsonb_build_object('workflow', i.workflow, 'version', i.version, 'queue', i.queue,
                              'payload_hash', i.hash, 'steps', st.steps),
           t.created_at
    FROM tasks t JOIN input i ON i.id = t.id JOIN states st ON st.task_id = t.id
    ORDER BY t.id
)
SELECT i.ord, t.id, t.created_at, st.first_step, st.available_at
FROM tasks t JOIN input i ON i.id = t.id JOIN states st ON st.task_id = t.id
"""


# Model.from_db takes values in the order of the concrete fields.
TASK_FIELDS = [field.attname for field in Task._meta.concrete_fields]


def insert_tasks(
    items: Sequence[tuple[int, PreparedItem]], *, author: str, user_id: int | None
) -> dict[int, Task]:
    """Create tasks for the items whose keys are free; returns them by item index."""
    if not items:
        return {}
    by_index = dict(items)
    # Rows travel as one JSON document each for tasks and steps: encoding and decoding JSON
    # is far cheaper on both sides than a dozen parameter arrays.
    rows = [
        {
            "ord": index,
            "workflow": item.workflow.name,
            "version": item.workflow.version,
            "payload": item.payload,
            "hash": item.payload_hash,
            "key": item.idempotency_key,
            "queue": item.queue,
            "priority": item.priority,
            "run_after": item.run_after.isoformat() if item.run_after else None,
        }
        for index, item in items
    ]
    steps = [
        {"ord": index, "position": position, "kind": spec.kind, "max_attempts": spec.max_attempts}
        for index, item in items
        for position, spec in enumerate(item.workflow.steps)
    ]
    params = {
        "items": json.dumps(rows, ensure_ascii=False),
        "steps": json.dumps(steps),
        "author": author,
        "user": user_id,
    }
    with _cursor() as cursor:
        cursor.execute(INSERT_SQL, params, prepare=True)
        inserted = cursor.fetchall()
    created: dict[int, Task] = {}
    bells: list[Doorbell] = []
    for index, pk, created_at, first_step, available_at in inserted:
        item = by_index[index]
        # from_db: the row as the database holds it, without Model.__init__'s cost.
        row = {
            "id": pk,
            "workflow": item.workflow.name,
            "workflow_version": item.workflow.version,
            "payload": item.payload,
            "payload_hash": item.payload_hash,
            "idempotency_key": item.idempotency_key,
            "queue": item.queue,
            "priority": item.priority,
            "status": TaskStatus.PENDING,
            "created_by": author,
            "created_by_user_id": user_id,
            "created_at": created_at,
            "updated_at": created_at,
            "finished_at": None,
            "cancel_requested_at": None,
        }
        task = Task.from_db(connection.alias, TASK_FIELDS, [row[name] for name in TASK_FIELDS])
        created[index] = task
        countdown = max((available_at - created_at).total_seconds(), 0.0)
        bells.append(Doorbell(first_step, item.queue, countdown))
    ring_on_commit(bells)
    return created
