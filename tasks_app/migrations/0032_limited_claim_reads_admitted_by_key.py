# The claim under limits (migration 0031's function) locks the steps it admitted by their
# primary key alone. Its one plan a session (plan_cache_mode) is made from the statistics of
# the moment: made while the steps' table was nearly empty, it joined the admitted steps to
# a scan of every pending step (the index their status names), so a burst after a quiet
# hour cost each claim the backlog. The rest is as 0031 installed it.
#
# Installing a function takes no lock on the tables; going back reinstalls 0031's.

from importlib import import_module

from django.db import migrations

FUNCTION = r"""
CREATE OR REPLACE FUNCTION tasks_app_claim_limited(
    p_queue text, p_step bigint, p_only_named boolean, p_limit integer, p_size integer,
    p_lease integer, p_worker text, p_numbers jsonb
) RETURNS TABLE (
    claimed_step tasks_app_step, claimed_task tasks_app_task, decided boolean,
    lone_named boolean
)
LANGUAGE plpgsql
-- The running steps are read through step_lease_idx by plain index scans: its entries of
-- steps that ran and ended stay until a vacuum, and only a plain scan marks them dead.
SET enable_bitmapscan TO off
-- One plan for every call: planning the statement anew would cost more than running it.
SET plan_cache_mode TO force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    now_ timestamptz;
BEGIN
    -- Nothing to weigh: no lock taken (limited_claims.has_due, by the index the candidates
    -- are read through).
    PERFORM 1 FROM tasks_app_step s
    WHERE s.id = p_step AND s.status = 'pending' AND s.limit_turn IS NOT NULL
      AND s.available_at <= clock_timestamp();
    IF NOT FOUND THEN
        IF NOT p_only_named AND p_queue IS NOT NULL THEN
            PERFORM 1 FROM tasks_app_step s
            WHERE s.queue = p_queue AND s.status = 'pending' AND s.limit_turn IS NOT NULL
              AND s.available_at <= clock_timestamp()
            ORDER BY s.priority DESC, s.limit_turn, s.available_at
            LIMIT 1;
        END IF;
        IF NOT FOUND THEN
            RETURN QUERY SELECT NULL::tasks_app_step, NULL::tasks_app_task, true, false;
            RETURN;
        END IF;
    END IF;
    -- The lock every claim under limits takes first (limited_claims.LOCK), then the clock.
    PERFORM pg_advisory_xact_lock(1610840196);
    now_ := clock_timestamp();
    RETURN QUERY
    WITH named AS (
        SELECT s.id, s.task_id, s.queue, s.limits, s.limit_turn, s.error_class
        FROM tasks_app_step s
        WHERE s.id = p_step AND s.status = 'pending' AND s.available_at <= now_
          AND s.limit_turn IS NOT NULL
          AND s.queue NOT IN (SELECT q.name FROM tasks_app_queuestate q WHERE q.paused)
    ), mode AS (
        -- The named step alone: a run of that step, or one whose last lease ran out
        -- (then a batch of one).
        SELECT x.lone, p_only_named OR x.lone AS named_only,
            CASE WHEN x.lone THEN 1 ELSE p_limit END AS batch
        FROM (
            SELECT EXISTS (
                SELECT 1 FROM named n WHERE n.error_class = 'lease_expired'
            ) AS lone
        ) x
    ), rest AS (
        SELECT s.id, s.task_id, s.queue, s.limits, s.limit_turn, s.error_class
        FROM tasks_app_step s
        WHERE NOT (SELECT m.named_only FROM mode m)
          AND s.queue = COALESCE(p_queue, (SELECT n.queue FROM named n))
          AND s.status = 'pending' AND s.available_at <= now_ AND s.limit_turn IS NOT NULL
          AND s.queue NOT IN (SELECT q.name FROM tasks_app_queuestate q WHERE q.paused)
          AND (p_limit = 1 OR s.error_class <> 'lease_expired')
        ORDER BY s.priority DESC, s.limit_turn, s.available_at
        LIMIT p_size
    ), candidates AS MATERIALIZED (
        SELECT row_number() OVER () AS rn, c.* FROM (
            SELECT * FROM named WHERE (SELECT m.named_only FROM mode m)
            UNION ALL
            SELECT * FROM rest
        ) c
    ), entries AS MATERIALIZED (
        SELECT c.rn, e.ord, e.v->>0 AS name, e.v->>1 AS key, (e.v->>2)::bigint AS weight
        FROM candidates c
        CROSS JOIN LATERAL jsonb_array_elements(c.limits) WITH ORDINALITY AS e(v, ord)
    ), numbers AS (
        -- Each limit's numbers in effect (limit_standing.numbers): an operator's live
        -- change, else the declaration with TASKS_LIMITS as this worker knows it
        -- (p_numbers: {name: [concurrency, rate count, rate seconds]}, nulls where none).
        SELECT n.name,
            CASE WHEN st.overridden THEN true ELSE d.v IS NOT NULL END AS known,
            CASE WHEN st.overridden THEN st.concurrency ELSE (d.v->>0)::integer END
                AS concurrency,
            CASE WHEN st.overridden THEN r.m[1]::bigint ELSE (d.v->>1)::bigint END
                AS rate_count,
            CASE WHEN st.overridden
                THEN COALESCE(NULLIF(r.m[2], ''), '1')::double precision
                    * CASE r.m[3] WHEN 's' THEN 1 WHEN 'm' THEN 60 ELSE 3600 END
                ELSE (d.v->>2)::double precision END AS rate_seconds
        FROM (SELECT DISTINCT x.name FROM entries x) n
        LEFT JOIN tasks_app_limitstate st ON st.name = n.name
        CROSS JOIN LATERAL (SELECT p_numbers->n.name AS v) d
        CROSS JOIN LATERAL (
            SELECT regexp_match(
                st.rate, '^\s*(\d+)\s*/\s*(\d*(?:\.\d+)?)\s*([smh])\s*$'
            ) AS m
        ) r
    ), running AS (
        SELECT e->>0 AS name, e->>1 AS key, count(*) AS n
        FROM tasks_app_step s, jsonb_array_elements(s.limits) e
        WHERE s.status = 'running' AND s.limit_turn IS NOT NULL
        GROUP BY 1, 2
    ), standing AS MATERIALIZED (
        -- Each key as it stands: its running steps, pause, hold and rate window moved on to
        -- now (limit_standing.Window.at: 21 slices, oldest first).
        SELECT p.name, p.key, nb.known, nb.concurrency, nb.rate_count,
            COALESCE(r.n, 0) AS running, k.paused_at IS NOT NULL AS paused, k.held_until,
            g.width, g.slice, w.spent, (SELECT sum(v) FROM unnest(w.spent) v) AS used
        FROM (SELECT DISTINCT x.name, x.key FROM entries x) p
        JOIN numbers nb ON nb.name = p.name
        LEFT JOIN tasks_app_limitkey k ON k."limit" = p.name AND k.key = p.key
        LEFT JOIN running r ON r.name = p.name AND r.key = p.key
        CROSS JOIN LATERAL (
            SELECT nb.rate_seconds / 20 AS width,
                floor(extract(epoch FROM now_)::double precision / (nb.rate_seconds / 20)
                )::bigint AS slice
        ) g
        CROSS JOIN LATERAL (SELECT
            CASE WHEN nb.rate_count IS NOT NULL THEN ARRAY(
                SELECT CASE
                    WHEN k."window" IS NULL OR k."window" = '{}'::jsonb THEN 0
                    WHEN (k."window"->>'width')::double precision = g.width THEN COALESCE(
                        (k."window"->'spent'->>(j + LEAST(GREATEST(
                            g.slice - (k."window"->>'slice')::bigint, 0), 21))::integer
                        )::bigint, 0)
                    WHEN j = 20 THEN (
                        SELECT COALESCE(sum(u::bigint), 0)
                        FROM jsonb_array_elements_text(k."window"->'spent') u
                    )
                    ELSE 0 END
                FROM generate_series(0, 20) j ORDER BY j
            ) END AS spent
        ) w
    ), all_fit AS (
        -- Every candidate fits when each key has room for all of them at once (so, while
        -- the limits have room, nothing is weighed one by one).
        SELECT NOT EXISTS (
            SELECT 1 FROM (
                SELECT x.name, x.key, count(*) AS slots, sum(x.weight) AS units
                FROM entries x GROUP BY 1, 2
            ) t
            JOIN standing s ON s.name = t.name AND s.key = t.key
            WHERE NOT s.known OR s.paused OR s.held_until > now_
               OR s.running + t.slots > s.concurrency OR s.used + t.units > s.rate_count
        ) AS yes
    ), refused AS (
        -- Else each candidate weighed as if every one before it started (their running
        -- slots and spends counted in order): the first that does not fit is where this
        -- stops.
        SELECT min(w.rn) AS rn FROM (
            SELECT x.rn, s.known, s.paused, s.held_until, s.concurrency, s.running,
                s.rate_count, s.used,
                count(*) OVER pair AS slots, sum(x.weight) OVER pair AS units
            FROM entries x JOIN standing s ON s.name = x.name AND s.key = x.key
            WHERE NOT (SELECT f.yes FROM all_fit f)
            WINDOW pair AS (PARTITION BY x.name, x.key ORDER BY x.rn)
        ) w
        WHERE NOT w.known OR w.paused OR w.held_until > now_
           OR w.running + w.slots > w.concurrency OR w.used + w.units > w.rate_count
    ), admitted AS (
        SELECT c.id, c.rn FROM candidates c
        WHERE c.rn <= (SELECT m.batch FROM mode m)
          AND c.rn < COALESCE((SELECT f.rn FROM refused f), c.rn + 1)
    ), locked AS MATERIALIZED (
        -- (Arrays, not joins, for the few rows these hold: the planner cannot count the
        -- rows of a WITH and would scan the table for them.) The steps by their key and no
        -- status, so that no plan reads them through an index of every pending step; the
        -- status is the one of the row as locked, which a change committed since this
        -- statement began has moved on.
        SELECT s.id, s.status FROM tasks_app_step s JOIN tasks_app_task t ON t.id = s.task_id
        WHERE s.id = ANY (ARRAY(SELECT a.id FROM admitted a))
        FOR UPDATE OF s, t SKIP LOCKED
    ), picked AS (
        SELECT l.id FROM locked l WHERE l.status = 'pending'
    ), claimed AS (
        -- As sql.CLAIM_IDS_SQL marks them: leases start at the time the limits were
        -- judged at.
        UPDATE tasks_app_step s
        SET status = 'running', attempts = s.attempts + 1,
            fencing_token = s.fencing_token + 1,
            lease_expires_at = now_ + p_lease * interval '1 second',
            lease_worker = p_worker, started_at = now_
        WHERE s.id = ANY (ARRAY(SELECT p.id FROM picked p))
        RETURNING s.*
    ), taken AS (
        SELECT c.rn, c.limits, c.limit_turn FROM candidates c
        WHERE c.id = ANY (ARRAY(SELECT cl.id FROM claimed cl))
    ), spends AS (
        SELECT x.name, x.key, sum(x.weight) AS units FROM entries x
        WHERE x.rn = ANY (ARRAY(SELECT tk.rn FROM taken tk))
        GROUP BY 1, 2
    ), booked AS MATERIALIZED (
        -- The rate windows as the claimed steps spent them, rows locked in key order
        -- (Python's, as enqueue locks them: limit_keys.assign_turns).
        SELECT k.id, jsonb_build_object(
            'width', s.width, 'slice', s.slice,
            'spent', to_jsonb(s.spent[1:20] || (s.spent[21] + sp.units))
        ) AS w
        FROM spends sp JOIN standing s ON s.name = sp.name AND s.key = sp.key
        JOIN tasks_app_limitkey k ON k."limit" = sp.name AND k.key = sp.key
        WHERE s.rate_count IS NOT NULL
        ORDER BY k."limit" COLLATE "C", k.key COLLATE "C"
        FOR UPDATE OF k
    ), windows AS (
        UPDATE tasks_app_limitkey k SET "window" = b.w FROM booked b WHERE k.id = b.id
        RETURNING k.id
    ), owners AS (
        -- The limit a step's turn is counted in (limited_claims.turn_owner): its first
        -- partitioned limit, else its first.
        SELECT DISTINCT ON (x.rn) x.name, tk.limit_turn AS turn
        FROM entries x JOIN taken tk ON tk.rn = x.rn
        ORDER BY x.rn, COALESCE(x.key, '') = '', x.ord
    ), moved AS MATERIALIZED (
        SELECT st.name, o.turn FROM tasks_app_limitstate st
        JOIN (SELECT name, max(turn) AS turn FROM owners GROUP BY name) o
          ON o.name = st.name
        WHERE st.turn < o.turn
        ORDER BY st.name COLLATE "C"
        FOR UPDATE OF st
    ), turns AS (
        UPDATE tasks_app_limitstate st SET turn = mv.turn FROM moved mv
        WHERE st.name = mv.name
        RETURNING st.name
    ), verdict AS (
        -- (The windows and turns are written though nothing reads them: PostgreSQL runs
        -- every data-modifying WITH to completion.)
        SELECT m.lone,
            (SELECT count(*) FROM admitted) = m.batch
                OR NOT EXISTS (SELECT 1 FROM refused f WHERE f.rn IS NOT NULL) AS decided
        FROM mode m
    )
    SELECT o.step_row, o.task_row, o.decided, o.lone FROM (
        SELECT ROW(cl.*)::tasks_app_step AS step_row, t AS task_row,
            NULL::boolean AS decided, NULL::boolean AS lone,
            array_position((SELECT array_agg(a.id ORDER BY a.rn) FROM admitted a), cl.id)
                AS rn
        FROM claimed cl JOIN tasks_app_task t ON t.id = cl.task_id
        UNION ALL
        SELECT NULL, NULL, v.decided, v.lone, NULL FROM verdict v
    ) o
    ORDER BY o.rn NULLS LAST;
END;
$$;
"""


def install(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FUNCTION)


def reinstall_0031(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        earlier = import_module("tasks_app.migrations.0031_limited_claim_function")
        schema_editor.execute(earlier.FUNCTION)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tasks_app", "0031_limited_claim_function"),
    ]

    operations = [
        migrations.RunPython(install, reinstall_0031),
    ]
