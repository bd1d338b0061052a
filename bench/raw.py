"""RAW: the near-limit baseline, a raw psycopg 3 job loop with the durable core's shape.

One table; a job is claimed in one transaction (``SELECT … FOR UPDATE SKIP LOCKED
LIMIT 1`` and an UPDATE that takes a lease: status, attempt, lease expiry, start time) and
completed in another (one UPDATE). An idle worker waits on LISTEN (a statement trigger
notifies on insert), so it wakes as fast as procrastinate's. No events, no fencing,
no Django: what one PostgreSQL round trip per transition costs and nothing else.

``python -m bench.raw`` runs one worker process until SIGTERM.
"""

from __future__ import annotations

import os
from typing import Any

import psycopg

from bench.common import ENV_DSN, RAW_CHANNEL, mark_ready, wait_for_go

TABLE = "bench_raw_job"

SCHEMA = f"""
CREATE TABLE {TABLE} (
    id bigserial PRIMARY KEY,
    payload jsonb NOT NULL DEFAULT '{{}}',
    status text NOT NULL DEFAULT 'todo',
    attempts integer NOT NULL DEFAULT 0,
    worker text,
    lease_expires_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    finished_at timestamptz
);
CREATE INDEX {TABLE}_todo_idx ON {TABLE} (id) WHERE status = 'todo';
CREATE FUNCTION {TABLE}_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{RAW_CHANNEL}', '');
    RETURN NULL;
END $$;
CREATE TRIGGER {TABLE}_notify AFTER INSERT ON {TABLE}
    FOR EACH STATEMENT EXECUTE FUNCTION {TABLE}_notify();
"""

# The table's name is spelled out (not formatted in) so each statement is a plain literal.
INSERT_ONE = "INSERT INTO bench_raw_job (payload) VALUES (%s) RETURNING id"
INSERT_MANY = "INSERT INTO bench_raw_job (payload) SELECT * FROM unnest(%s::jsonb[]) RETURNING id"

CLAIM = """
SELECT id, payload FROM bench_raw_job WHERE status = 'todo'
ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED
"""
LEASE = """
UPDATE bench_raw_job SET status = 'doing', attempts = attempts + 1, worker = %s,
    lease_expires_at = now() + interval '30 seconds', started_at = now()
WHERE id = %s
"""
COMPLETE = """
UPDATE bench_raw_job SET status = 'done', finished_at = now(), lease_expires_at = NULL
WHERE id = %s AND status = 'doing' AND worker = %s
"""


def run_job(payload: Any) -> None:
    """The trivial task."""


def work(conn: psycopg.Connection[Any], worker: str) -> bool:
    """Claim, run and complete one job; False when none was due."""
    with conn.transaction():
        row = conn.execute(CLAIM).fetchone()
        if row is None:
            return False
        conn.execute(LEASE, (worker, row[0]))
    run_job(row[1])
    conn.execute(COMPLETE, (row[0], worker))
    return True


def main() -> None:
    worker = f"raw-{os.getpid()}"
    with psycopg.connect(os.environ[ENV_DSN], autocommit=True) as conn:
        conn.execute(f"LISTEN {RAW_CHANNEL}")
        mark_ready()
        wait_for_go()
        while True:
            if not work(conn, worker):
                # Pending notifications return at once; otherwise wait for an insert.
                for _ in conn.notifies(timeout=1.0, stop_after=1):
                    pass


if __name__ == "__main__":
    main()
