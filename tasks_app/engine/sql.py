"""The statements of the hot path (``tasks_app.engine.fastpath`` and ``limited_claims`` run
them on PostgreSQL).

Each restates rules whose home is Python code, named beside it; ``tests/engine/test_parity.py``
(and ``test_limit_parity.py`` for the claim under limits) runs the same scenarios through
both and compares the rows and events they leave, and ``tests/engine/test_orm_path.py``
runs the Python side with this one switched off.
"""

from __future__ import annotations

from functools import cache

from tasks_app.exceptions import LEASE_EXPIRED

# "A step is due", as models.StepQuerySet.due says it, for the statements below.
DUE = "s.status = 'pending' AND s.available_at <= statement_timestamp()"
# Steps under limits are claimed by limited_claims, which enforces them; never here.
UNLIMITED = "s.limit_turn IS NULL"


# The columns of a step and of a task in the order of the models' concrete fields
# (tests/engine/test_batch_claims.py checks they match): a claim returns the rows it claimed, so the
# worker runs them without reading them again.
STEP_COLUMNS = (
    "id", "task_id", "position", "revision", "kind", "status", "queue", "priority", "attempts",
    "max_attempts", "available_at", "idempotency_key", "fencing_token", "lease_expires_at",
    "lease_worker", "dispatched_at", "result", "last_error", "error_class", "error_fingerprint",
    "dead_workflow", "change_request", "started_at", "finished_at", "limits", "limit_turn",
    "after", "item",
)  # fmt: skip
TASK_COLUMNS = (
    "id", "workflow", "workflow_version", "payload", "payload_hash", "idempotency_key", "queue",
    "priority", "status", "created_by", "created_by_user_id", "created_at", "updated_at",
    "finished_at", "cancel_requested_at", "traceparent",
)  # fmt: skip
_CLAIM_ROWS = ", ".join(
    [f"c.{name}" for name in STEP_COLUMNS] + [f"t.{name}" for name in TASK_COLUMNS]
)

# ORM twin: leases.claim_step with states.start_attempt (one step),
# fastpath._claim_batch_one_by_one (many); steps under limits are limited_claims'. "Due" is
# models.StepQuerySet.due, "not paused" is transitions.paused_filter, the event's steps
# triple is history.events.step_state.
# The batch size is written into the statement ({limit}, see claim_sql), not passed as a
# parameter: with an unknown LIMIT PostgreSQL's generic plan expects a large batch and
# hash-joins whole tables, so every call was planned anew (0.7-1.5 ms a claim). With the
# size in the text there is one prepared statement per size the runner asks for, each
# planned once.
# One statement: pick due steps (the named one first) with their task rows, skipping rows
# another transaction holds; mark them running with a raised token and their lease (holder
# and expiry: the attempt's Lease row is written when it ends, and records the claim, so no
# event is written: history.timeline). The task rows are locked, not written (they read as
# running from their steps: models.Task.live_status).
_CLAIM_SQL = f"""
WITH target AS (
    SELECT COALESCE(%(queue)s, (SELECT queue FROM tasks_app_step WHERE id = %(step)s)) AS queue
), open_queue AS (
    SELECT queue FROM target
    WHERE NOT EXISTS (
        SELECT 1 FROM tasks_app_queuestate q WHERE q.name = target.queue AND q.paused
    )
), named AS (
    SELECT s.id FROM tasks_app_step s JOIN tasks_app_task t ON t.id = s.task_id
    WHERE s.id = %(step)s AND {DUE} AND {UNLIMITED}
      AND s.queue = (SELECT queue FROM open_queue)
    FOR UPDATE OF s, t SKIP LOCKED
), more AS (
    -- A step whose last lease ran out is claimed only in a batch of one
    -- (exceptions.LEASE_EXPIRED).
    SELECT s.id FROM tasks_app_step s JOIN tasks_app_task t ON t.id = s.task_id
    WHERE s.queue = (SELECT queue FROM open_queue) AND {DUE} AND {UNLIMITED}
      AND s.id IS DISTINCT FROM %(step)s
      AND ({{limit}} = 1 OR s.error_class <> '{LEASE_EXPIRED}')
    ORDER BY s.priority DESC, s.available_at
    LIMIT {{limit}}
    FOR UPDATE OF s, t SKIP LOCKED
), picked AS (
    -- The named step first; when it cannot be claimed, its place goes to another. A named
    -- step whose last lease ran out is the whole batch.
    SELECT id FROM (SELECT id, 0 AS rank FROM named UNION ALL SELECT id, 1 FROM more) AS c
    ORDER BY rank
    LIMIT CASE WHEN EXISTS (
        SELECT 1 FROM named JOIN tasks_app_step x ON x.id = named.id
        WHERE x.error_class = '{LEASE_EXPIRED}'
    ) THEN 1 ELSE {{limit}} END
), claimed AS (
    UPDATE tasks_app_step s
    SET status = 'running', attempts = s.attempts + 1, fencing_token = s.fencing_token + 1,
        lease_expires_at = statement_timestamp() + %(lease)s * interval '1 second',
        lease_worker = %(worker)s, started_at = statement_timestamp()
    WHERE s.id IN (SELECT id FROM picked)
    RETURNING {", ".join(f"s.{name}" for name in STEP_COLUMNS)}
)
SELECT {_CLAIM_ROWS}
FROM claimed c JOIN tasks_app_task t ON t.id = c.task_id
ORDER BY c.id = %(step)s DESC, c.priority DESC, c.available_at, c.id
"""  # noqa: S608 (DUE, LEASE_EXPIRED and the column names are constants, not input)


# ORM twin: limited_claims._take. The steps a claim under limits admitted (``ids``, in
# its order) that are still pending, whose task and step rows no other transaction holds,
# marked running as _CLAIM_SQL marks them, their leases started ``at`` the time the claim
# judged the limits at (states.start_attempts), and returned with their task rows.
CLAIM_IDS_SQL = f"""
WITH locked AS MATERIALIZED (
    -- By primary key alone, the status checked on the row as locked, so that no plan
    -- reads the steps through an index of every pending one (twin: the function's
    -- "locked", migration 0032, which says why).
    SELECT s.id, s.status FROM tasks_app_step s JOIN tasks_app_task t ON t.id = s.task_id
    WHERE s.id = ANY(%(ids)s::bigint[])
    FOR UPDATE OF s, t SKIP LOCKED
), claimed AS (
    UPDATE tasks_app_step s
    SET status = 'running', attempts = s.attempts + 1, fencing_token = s.fencing_token + 1,
        lease_expires_at = %(at)s + %(lease)s * interval '1 second',
        lease_worker = %(worker)s, started_at = %(at)s
    WHERE s.id = ANY(ARRAY(SELECT id FROM locked WHERE status = 'pending'))
    RETURNING {", ".join(f"s.{name}" for name in STEP_COLUMNS)}
)
SELECT {_CLAIM_ROWS}
FROM claimed c JOIN tasks_app_task t ON t.id = c.task_id
ORDER BY array_position(%(ids)s::bigint[], c.id)
"""  # noqa: S608 (the column names are constants, not input)


@cache
def claim_sql(limit: int) -> str:
    """The claim statement for batches of ``limit`` steps."""
    return _CLAIM_SQL.replace("{limit}", str(int(limit)))


# ORM twin: leases.complete_step, that is states.end_attempt for a success. "What a success
# leads to" is states.after_success (here: the blocked step at the next position, in a
# line; the runner sends a success for which transitions.completes_alone holds, a graph's
# or one reaching an approval step, through complete_step instead), the task's status is states.settle_task's, the steps triple
# history.events.step_state's, and the attempt's events are end_attempt's (its event here;
# the task's ending event, states.record_ending, written by fastpath.complete_many after
# this statement).
# One statement: lock the tasks in id order (transitions.lock_task's order, for many:
# every writer locks a task row before its step rows), then the fenced success for every
# step still held by its token, each attempt's Lease row written, the next step of each
# task made due (unless a cancel was requested), task status settled, and a `succeeded`
# event for each step whose success made the next step due (the Lease row records the
# success itself: history.timeline; the next step's change is the event's).
# A task whose cancel was requested while its step ran ends `cancelled`, whose event is an
# operator event, chained (audit_chain), written in Python in the same transaction: with
# %(cancelled)s false (the statement runs alone, in autocommit) such steps are left as they
# are and returned as `deferred`, for fastpath.complete_many to record in a transaction of
# their own, with %(cancelled)s true.
# The task columns of a row that is not a settled task's (typed by the first branch).
_NO_TASK = ", ".join(["NULL"] * len(TASK_COLUMNS))
COMPLETE_SQL = f"""
WITH locked AS MATERIALIZED (
    -- Each task as it is once locked: a cancel committed while this waited for the lock is
    -- seen here, where the statement's snapshot (taken before) would miss it.
    SELECT id, cancel_requested_at FROM tasks_app_task
    WHERE id = ANY(%(tasks)s::bigint[]) ORDER BY id FOR UPDATE
), input AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(results)s::jsonb[], %(actors)s::text[])
        AS i(id, token, result, actor)
), held AS (
    -- The live leases as the claims left them (the update below clears them).
    SELECT s.id, s.lease_worker, s.lease_expires_at FROM tasks_app_step s
    WHERE s.id IN (SELECT id FROM input)
), done AS (
    UPDATE tasks_app_step s
    SET status = 'succeeded', result = i.result, finished_at = statement_timestamp(),
        lease_expires_at = NULL, lease_worker = ''
    FROM input i
    -- By primary key: `status || ''` keeps the planner off step_lease_idx, whose entries
    -- for the steps finished since the last vacuum it would visit on every completion
    -- (the statistics, taken while few steps run, make that partial index look tiny).
    WHERE s.id = i.id AND s.fencing_token = i.token AND s.status || '' = 'running'
      -- Every task is locked before any step is: checked once, before the first step.
      AND (SELECT count(*) FROM locked) >= 0
      AND (%(cancelled)s OR NOT EXISTS (
          SELECT 1 FROM locked l WHERE l.id = s.task_id AND l.cancel_requested_at IS NOT NULL
      ))
    RETURNING s.id, s.task_id, s.position, s.attempts, s.fencing_token, s.started_at
), released AS (
    -- The attempt's record (attempt_records.close_lease); a lease an earlier release opened
    -- as a row at its claim is closed instead.
    INSERT INTO tasks_app_lease AS l (step_id, token, attempt, worker_id, acquired_at, expires_at, released_at, outcome)
    SELECT done.id, done.fencing_token, done.attempts, held.lease_worker, done.started_at,
           COALESCE(held.lease_expires_at, statement_timestamp()), statement_timestamp(), 'succeeded'
    FROM done JOIN held ON held.id = done.id
    ON CONFLICT (step_id, token) DO UPDATE
    SET released_at = excluded.released_at, outcome = excluded.outcome, attempt = excluded.attempt
    WHERE l.released_at IS NULL
), nxt AS (
    UPDATE tasks_app_step n
    SET status = 'pending', available_at = statement_timestamp(),
        dispatched_at = statement_timestamp()
    FROM done JOIN locked t ON t.id = done.task_id
    WHERE n.task_id = done.task_id AND n.position = done.position + 1 AND n.status = 'blocked'
      AND t.cancel_requested_at IS NULL
    RETURNING n.id, n.task_id, n.queue, n.attempts, n.fencing_token
), outcome AS (
    SELECT done.task_id AS id,
           CASE WHEN t.cancel_requested_at IS NOT NULL THEN 'cancelled'
                WHEN nxt.id IS NULL THEN 'succeeded' ELSE 'pending' END AS status
    FROM done JOIN locked t ON t.id = done.task_id
         LEFT JOIN nxt ON nxt.task_id = done.task_id
), settled AS (
    -- Only a task whose row changes is written: a success that makes the next step due
    -- leaves a pending task's row as it was (settle_task's condition).
    UPDATE tasks_app_task t
    SET status = o.status,
        finished_at = CASE WHEN o.status <> 'pending' THEN statement_timestamp() END,
        updated_at = statement_timestamp()
    FROM outcome o
    WHERE t.id = o.id
      AND (t.status <> o.status OR (o.status = 'pending' AND t.finished_at IS NOT NULL))
    RETURNING {", ".join(f"t.{name}" for name in TASK_COLUMNS)}
), events AS (
    INSERT INTO tasks_app_event (task_id, step_id, kind, actor, actor_user_id, reason, data, created_at)
    SELECT task_id, step_id, kind, actor, NULL, reason, data, statement_timestamp()
    FROM (
        SELECT done.task_id, done.id AS step_id, 'succeeded' AS kind, i.actor,
               '' AS reason,
               jsonb_build_object(
                   'steps',
                   jsonb_build_object(
                       done.id::text, jsonb_build_array('succeeded', done.attempts, done.fencing_token)
                   ) || jsonb_build_object(
                       nxt.id::text, jsonb_build_array('pending', nxt.attempts, nxt.fencing_token)
                   ),
                   'token', done.fencing_token, 'task_status', outcome.status
               ) AS data
        FROM done JOIN input i ON i.id = done.id AND i.token = done.fencing_token
             JOIN outcome ON outcome.id = done.task_id
             JOIN nxt ON nxt.task_id = done.task_id
        -- Checked once, first: a batch that made no next step due (one-step tasks) skips
        -- the joins above, which the planner nests (it guesses one row per CTE).
        WHERE EXISTS (SELECT 1 FROM nxt)
    ) AS e
    ORDER BY task_id
)
SELECT 'settled', id, status, {", ".join(TASK_COLUMNS)}
FROM settled WHERE status IN ('succeeded', 'cancelled')
UNION ALL
SELECT 'done', id, fencing_token::text, {_NO_TASK} FROM done
UNION ALL
SELECT 'next', id, queue, {_NO_TASK} FROM nxt
UNION ALL
SELECT 'ran', id, extract(epoch FROM statement_timestamp() - started_at)::text, {_NO_TASK}
FROM done
UNION ALL
SELECT 'deferred', s.id, i.token::text, {_NO_TASK}
FROM input i JOIN tasks_app_step s ON s.id = i.id JOIN locked l ON l.id = s.task_id
WHERE NOT %(cancelled)s AND l.cancel_requested_at IS NOT NULL
"""  # noqa: S608 (the column names are constants, not input)


# The traceparent is the item's own (NULL with tracing off: enqueueing._enqueue_traced).
_TASK_INSERT_COLUMNS = """id, workflow, workflow_version, payload, payload_hash, idempotency_key,
    queue, priority, status, created_by, created_by_user_id, created_at, updated_at, finished_at,
    cancel_requested_at, traceparent"""
_TASK_INSERT_VALUES = """id, workflow, version, payload, hash, key, queue, priority, 'pending',
    %(author)s, %(user)s, statement_timestamp(), statement_timestamp(), NULL, NULL, traceparent"""

# ORM twin: enqueueing._insert_with_orm (states.new_step, the roots made due by
# states.make_due: a line's first step, a graph's steps that wait for none, which the
# items say as `root`; graphs.is_root). Each step's key is models.step_key's (revision 0),
# restated in SQL.
# One statement: insert the tasks whose keys are free (a key taken meanwhile by a concurrent
# enqueue makes this wait for it, then skip) and all their steps. No `enqueued` event: the
# task row and its first steps record the enqueue (history.timeline.enqueued reads the
# steps' first states, pending then blocked, as written here).
# Ids are drawn first so every row maps back to its item, and rows go in key order so two
# batches sharing keys queue on them in one order instead of deadlocking.
INSERT_SQL = f"""
WITH input AS (
    SELECT i.*, nextval(pg_get_serial_sequence('tasks_app_task', 'id')) AS id
    FROM jsonb_to_recordset(%(items)s::jsonb) AS i(
        ord int, workflow text, version int, payload jsonb, hash text, key text, queue text,
        priority int, run_after timestamptz, traceparent text
    )
), spec AS (
    SELECT * FROM jsonb_to_recordset(%(steps)s::jsonb)
        AS s(ord int, position int, kind text, max_attempts int, limits jsonb, turn bigint,
             root bool, after jsonb)
), keyed AS (
    INSERT INTO tasks_app_task ({_TASK_INSERT_COLUMNS})
    SELECT {_TASK_INSERT_VALUES}
    FROM input WHERE key IS NOT NULL ORDER BY key, ord
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, created_at
), keyless AS (
    -- No key, no conflict to look for: a plain insert, without the speculative insertion
    -- (and its extra WAL record) that ON CONFLICT costs every row.
    INSERT INTO tasks_app_task ({_TASK_INSERT_COLUMNS})
    SELECT {_TASK_INSERT_VALUES}
    FROM input WHERE key IS NULL ORDER BY ord
    RETURNING id, created_at
), tasks AS (
    SELECT id, created_at FROM keyed UNION ALL SELECT id, created_at FROM keyless
), steps AS (
    INSERT INTO tasks_app_step (task_id, position, revision, kind, status, queue, priority, attempts,
                                max_attempts, available_at, idempotency_key, fencing_token,
                                lease_expires_at, dispatched_at, result, last_error, error_class,
                                started_at, finished_at, limits, limit_turn, after)
    SELECT t.id, s.position, 0, s.kind, CASE WHEN s.root THEN 'pending' ELSE 'blocked' END,
           i.queue, i.priority, 0, s.max_attempts,
           CASE WHEN s.root THEN COALESCE(i.run_after, t.created_at) END,
           COALESCE(i.key, 'task-' || t.id) || ':' || s.position || ':' || s.kind, 0,
           NULL, CASE WHEN s.root THEN COALESCE(i.run_after, t.created_at) END,
           NULL, '', '', NULL, NULL, s.limits, s.turn, s.after
    FROM tasks t JOIN input i ON i.id = t.id JOIN spec s ON s.ord = i.ord
    ORDER BY t.id, s.position
    RETURNING id, task_id, position, status, available_at
), states AS (
    SELECT task_id, array_agg(id ORDER BY position) FILTER (WHERE status = 'pending') AS roots,
           min(available_at) AS available_at
    FROM steps GROUP BY task_id
)
SELECT i.ord, t.id, t.created_at, st.roots, st.available_at
FROM tasks t JOIN input i ON i.id = t.id JOIN states st ON st.task_id = t.id
"""  # noqa: S608 (the names are constants, not input)


# ORM twin: limited_claims._candidates (models.StepQuerySet.due at the claim's time, not
# paused: transitions.paused_filter). The due steps under limits a claim weighs: the named
# one (rank 0), and the queue's (the given one, else the named step's) in claim order
# (step_limited_due_idx), a step whose last lease ran out only when the batch is one.
LIMITED_CANDIDATES_SQL = f"""
WITH named AS (
    SELECT s.id, s.task_id, s.queue, s.limits::text, s.limit_turn, s.error_class,
        0 AS rank, s.priority, s.available_at
    FROM tasks_app_step s
    WHERE s.id = %(step)s AND s.status = 'pending' AND s.available_at <= %(now)s
      AND s.limit_turn IS NOT NULL
      AND s.queue NOT IN (SELECT name FROM tasks_app_queuestate WHERE paused)
), rest AS (
    SELECT s.id, s.task_id, s.queue, s.limits::text, s.limit_turn, s.error_class,
        1 AS rank, s.priority, s.available_at
    FROM tasks_app_step s
    WHERE s.queue = COALESCE(%(queue)s, (SELECT queue FROM named))
      AND s.status = 'pending' AND s.available_at <= %(now)s AND s.limit_turn IS NOT NULL
      AND s.queue NOT IN (SELECT name FROM tasks_app_queuestate WHERE paused)
      AND (%(limit)s = 1 OR s.error_class <> '{LEASE_EXPIRED}')
    ORDER BY s.priority DESC, s.limit_turn, s.available_at
    LIMIT {{size}}
)
SELECT id, task_id, queue, limits, limit_turn, error_class, rank FROM (
    SELECT * FROM named UNION ALL SELECT * FROM rest
) AS c
ORDER BY rank, priority DESC, limit_turn, available_at
"""  # noqa: S608 (a constant, not input)


@cache
def limited_candidates_sql(size: int) -> str:
    """The candidates statement reading ``size`` of the queue's steps (in its text, as
    claim_sql writes the batch size, so each size is planned once)."""
    return LIMITED_CANDIDATES_SQL.replace("{size}", str(int(size)))


# ORM twin: limited_claims._Decision.book. The rate windows as the claim spent them and the
# limits' turn clocks moved on, each row locked in key order first (as enqueue locks them:
# limit_keys.assign_turns), so neither waits on the other in a circle. Python's order is
# the code points' ("C"), whatever collation the database sorts text by.
LIMITED_BOOK_SQL = """
WITH spent AS MATERIALIZED (
    SELECT k.id, v.spent FROM tasks_app_limitkey k
    JOIN unnest(%(names)s::text[], %(keys)s::text[], %(windows)s::jsonb[]) AS v(name, key, spent)
      ON k."limit" = v.name AND k.key = v.key
    ORDER BY k."limit" COLLATE "C", k.key COLLATE "C"
    FOR UPDATE OF k
), windows AS (
    UPDATE tasks_app_limitkey k SET "window" = spent.spent FROM spent WHERE k.id = spent.id
    RETURNING k.id
), moved AS MATERIALIZED (
    SELECT st.name, v.turn FROM tasks_app_limitstate st
    JOIN unnest(%(limits)s::text[], %(turns)s::bigint[]) AS v(name, turn) ON st.name = v.name
    WHERE st.turn < v.turn
    ORDER BY st.name COLLATE "C"
    FOR UPDATE OF st
), turns AS (
    UPDATE tasks_app_limitstate st SET turn = moved.turn FROM moved WHERE st.name = moved.name
    RETURNING st.name
)
SELECT (SELECT count(*) FROM windows), (SELECT count(*) FROM turns)
"""

# ORM twin: limited_claims.has_due. A row when there is one, read in the index's order
# (step_limited_due_idx): as an EXISTS (which drops an ORDER BY), its plan could scan the
# table from the start, past every step a drain had run.
LIMITED_DUE_SQL = """
SELECT 1 FROM tasks_app_step s
WHERE s.queue = %s AND s.status = 'pending' AND s.limit_turn IS NOT NULL
  AND s.available_at <= statement_timestamp()
ORDER BY s.priority DESC, s.limit_turn, s.available_at
LIMIT 1
"""
