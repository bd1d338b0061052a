"""The PostgreSQL-backed peers added beside procrastinate: PgQueuer (two batch sizes), DBOS
Transact and django-tasks-db, as the harness drives and observes them (``bench/systems.py``
has the base classes and the rest). Nothing here imports a peer's package: each one's
worker, schema tool and producer run in subprocesses, so a package that fails to import
skips that system's cells instead of stopping the harness.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path
from typing import Any, ClassVar

import psycopg

from bench.common import ROOT, scalar
from bench.procs import ProcessGroup
from bench.systems import Progress, _GoFileBased


def run_tool(argv: list[str], env: dict[str, str], what: str) -> None:
    """A peer's own schema tool; the last line it printed (a traceback's exception) in
    the error when it fails."""
    done = subprocess.run(  # noqa: S603 (the harness's own commands)
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    if done.returncode != 0:
        lines = [line for line in (done.stdout + "\n" + done.stderr).splitlines() if line.strip()]
        last = lines[-1].strip() if lines else "no output"
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {last}")


class Pgq(_GoFileBased):
    """PgQueuer 1.x: N processes of its CLI, ``pgq run bench.pgq_app:create`` with its
    default ``--batch-size 10``; the factory waits for the go file."""

    key = "pgq"
    label = "PGQ b10"
    install_key = "pgq"
    batch_size: ClassVar[int] = 10
    tables = ("pgqueuer", "pgqueuer_log", "pgqueuer_statistics")
    poll_interval = 0.05

    def pgq(self) -> str:
        return str(Path(self.ctx.python).with_name("pgq"))

    def install(self) -> None:
        # ``pgq install`` with its defaults: durability "durable" (all tables logged).
        run_tool([self.pgq(), "install"], {**self.ctx.env, "PGDSN": self.ctx.dsn}, "pgq install")

    def argv(self) -> list[str]:
        return [self.pgq(), "run", "bench.pgq_app:create", "--batch-size", str(self.batch_size)]

    def staged_count(self) -> int:
        return self._row_count("pgqueuer")

    def progress(self, conn: psycopg.Connection[Any], total: int) -> Progress:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'successful'),"
            " count(*) FILTER (WHERE status IN ('exception', 'failed', 'canceled'))"
            " FROM pgqueuer_log WHERE status NOT IN ('queued', 'picked')"
        ).fetchone()
        assert row is not None
        return Progress(int(row[0]), int(row[1]))

    def last_completion(self, conn: psycopg.Connection[Any]) -> float | None:
        # A completion is logged when the worker's status buffer is flushed (every 0.1 s
        # or batch-size completions): the time it became durable.
        return self._epoch(
            conn,
            "SELECT extract(epoch FROM max(created)) FROM pgqueuer_log WHERE status = 'successful'",
        )

    def first_start(self, conn: psycopg.Connection[Any]) -> float | None:
        return self._epoch(
            conn,
            "SELECT extract(epoch FROM min(created)) FROM pgqueuer_log WHERE status = 'picked'",
        )

    def start_times(self, conn: psycopg.Connection[Any], ids: list[int]) -> dict[int, float]:
        return self._times(
            conn,
            "SELECT job_id, extract(epoch FROM min(created)) FROM pgqueuer_log"
            " WHERE status = 'picked' AND job_id = ANY(%s) GROUP BY job_id",
            ids,
        )

    def busy(self, conn: psycopg.Connection[Any]) -> bool:
        return bool(scalar(conn, "SELECT EXISTS (SELECT 1 FROM pgqueuer)"))

    def verify_once(self, conn: psycopg.Connection[Any], total: int) -> str | None:
        # The log keeps a row per transition: every job enqueued ('queued') was picked
        # once and completed once, no other job completed, and the queue table is empty.
        return self._expect(
            conn,
            """
            WITH per_job AS (
                SELECT job_id,
                    count(*) FILTER (WHERE status = 'queued') AS queued,
                    count(*) FILTER (WHERE status = 'picked') AS picked,
                    count(*) FILTER (WHERE status = 'successful') AS done
                FROM pgqueuer_log GROUP BY job_id
            )
            SELECT count(*) FILTER (WHERE queued = 1),
                count(*) FILTER (WHERE queued = 1 AND picked = 1 AND done = 1),
                count(*) FILTER (WHERE queued <> 1 OR picked <> 1 OR done <> 1),
                (SELECT count(*) FROM pgqueuer)
            FROM per_job
            """,
            {
                "jobs enqueued": total,
                "picked and completed once": total,
                "other log histories": 0,
                "left in the queue": 0,
            },
        )


class Pgq100(Pgq):
    """PgQueuer with ``--batch-size 100``; the report compares with the better of this and
    PGQ b10, metric by metric."""

    key = "pgq100"
    label = "PGQ b100"
    batch_size = 100
    cells = ("drain", "latency")  # the same producer as PGQ b10


class Dbos(_GoFileBased):
    """DBOS Transact: N processes of ``bench/dbos_app.py``, each a DBOS application with an
    executor id of its own. Held by a worker concurrency of 0 and released by setting the
    queue's row to the real one (``bench.dbos_app``)."""

    key = "dbos"
    label = "DBOS"
    install_key = "dbos"
    module = "bench.dbos_app"
    no_bulk = "no batch enqueue: `DBOSClient.enqueue` takes one workflow"
    tables = (
        "dbos.workflow_status",
        "dbos.workflow_input",
        "dbos.workflow_output",
        "dbos.operation_outputs",
        "dbos.notifications",
        "dbos.workflow_events",
        "dbos.workflow_events_history",
        "dbos.streams",
    )
    queue = "bench"  # bench.dbos_app.QUEUE (not imported: the harness stays free of DBOS)
    worker_concurrency = 100  # bench.dbos_app.WORKER_CONCURRENCY

    def install(self) -> None:
        run_tool(
            [self.ctx.python, "-m", "bench.dbos_app", "migrate"],
            {**self.ctx.env, "BENCH_DSN": self.ctx.dsn},
            "DBOS's migrations",
        )

    def worker_env(self, *, barrier: bool) -> dict[str, str]:
        return {"BENCH_DBOS_HELD": "1"} if barrier else {}

    def reset(self) -> None:
        super().reset()
        # Held until released: workers that start now find the queue at 0 from their
        # first poll on (the row of the last cell may say otherwise).
        with self.ctx.connect() as conn:
            conn.execute(
                "UPDATE dbos.queues SET worker_concurrency = 0 WHERE name = %s", (self.queue,)
            )

    def release(self, group: ProcessGroup) -> float:
        with self.ctx.connect() as conn:
            released = time.time()
            conn.execute(
                "UPDATE dbos.queues SET worker_concurrency = %s WHERE name = %s",
                (self.worker_concurrency, self.queue),
            )
        return released

    def staged_count(self) -> int:
        return self._row_count("dbos.workflow_status")

    def progress(self, conn: psycopg.Connection[Any], total: int) -> Progress:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'SUCCESS'),"
            " count(*) FILTER (WHERE status IN"
            "  ('ERROR', 'CANCELLED', 'MAX_RECOVERY_ATTEMPTS_EXCEEDED'))"
            " FROM dbos.workflow_status WHERE queue_name = %s",
            (self.queue,),
        ).fetchone()
        assert row is not None
        return Progress(int(row[0]), int(row[1]))

    def last_completion(self, conn: psycopg.Connection[Any]) -> float | None:
        return self._epoch(
            conn,
            "SELECT max(completed_at) / 1000.0 FROM dbos.workflow_status WHERE status = 'SUCCESS'",
        )

    def first_start(self, conn: psycopg.Connection[Any]) -> float | None:
        return self._epoch(
            conn, "SELECT min(started_at_epoch_ms) / 1000.0 FROM dbos.workflow_status"
        )

    def start_times(self, conn: psycopg.Connection[Any], ids: list[int]) -> dict[int, float]:
        # The producer names each workflow by a number (bench.producer.DbosClient).
        rows = conn.execute(
            "SELECT workflow_uuid, started_at_epoch_ms / 1000.0 FROM dbos.workflow_status"
            " WHERE workflow_uuid = ANY(%s::text[])",
            ([str(i) for i in ids],),
        ).fetchall()
        return {int(row[0]): float(row[1]) for row in rows if row[1] is not None}

    def busy(self, conn: psycopg.Connection[Any]) -> bool:
        return bool(
            scalar(
                conn,
                "SELECT EXISTS (SELECT 1 FROM dbos.workflow_status"
                " WHERE status IN ('ENQUEUED', 'PENDING'))",
            )
        )

    def verify_once(self, conn: psycopg.Connection[Any], total: int) -> str | None:
        # Each workflow succeeded on its first attempt (a recovery would count a second)
        # and recorded its one step once.
        return self._expect(
            conn,
            "SELECT count(*), count(*) FILTER (WHERE status = 'SUCCESS'),"
            " count(*) FILTER (WHERE recovery_attempts IS DISTINCT FROM 1),"
            " (SELECT count(*) FROM dbos.operation_outputs)"
            " FROM dbos.workflow_status",
            {
                "workflows": total,
                "succeeded": total,
                "started other than once": 0,
                "step outputs": total,
            },
        )


class Dtdb(_GoFileBased):
    """django-tasks-db: N processes of ``manage.py db_worker`` behind the go file
    (``bench/dtdb_worker.py``), with the settings of ``bench/dtdb_settings.py``."""

    key = "dtdb"
    label = "DTDB"
    install_key = "dtdb"
    module = "bench.dtdb_worker"
    no_bulk = "no batch enqueue: Django's tasks framework has `Task.enqueue` only"
    tables = ("django_tasks_database_dbtaskresult",)

    def install(self) -> None:
        run_tool(
            [self.ctx.python, "manage.py", "migrate", "--noinput", "django_tasks_database"],
            {**self.ctx.env, "DJANGO_SETTINGS_MODULE": "bench.dtdb_settings"},
            "migrate (bench.dtdb_settings)",
        )

    def staged_count(self) -> int:
        return self._row_count("django_tasks_database_dbtaskresult")

    def progress(self, conn: psycopg.Connection[Any], total: int) -> Progress:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'SUCCESSFUL'),"
            " count(*) FILTER (WHERE status = 'FAILED')"
            " FROM django_tasks_database_dbtaskresult"
        ).fetchone()
        assert row is not None
        return Progress(int(row[0]), int(row[1]))

    def last_completion(self, conn: psycopg.Connection[Any]) -> float | None:
        return self._epoch(
            conn,
            "SELECT extract(epoch FROM max(finished_at)) FROM django_tasks_database_dbtaskresult"
            " WHERE status = 'SUCCESSFUL'",
        )

    def first_start(self, conn: psycopg.Connection[Any]) -> float | None:
        return self._epoch(
            conn,
            "SELECT extract(epoch FROM min(started_at)) FROM django_tasks_database_dbtaskresult",
        )

    def start_times(self, conn: psycopg.Connection[Any], ids: list[int]) -> dict[int, float]:
        # The producer returns each task's UUID as a number (bench.producer.DtdbClient).
        rows = conn.execute(
            "SELECT id, extract(epoch FROM started_at) FROM django_tasks_database_dbtaskresult"
            " WHERE id = ANY(%s::uuid[])",
            ([str(uuid.UUID(int=i)) for i in ids],),
        ).fetchall()
        return {int(row[0].int): float(row[1]) for row in rows if row[1] is not None}

    def busy(self, conn: psycopg.Connection[Any]) -> bool:
        return bool(
            scalar(
                conn,
                "SELECT EXISTS (SELECT 1 FROM django_tasks_database_dbtaskresult"
                " WHERE status IN ('READY', 'RUNNING'))",
            )
        )

    def verify_once(self, conn: psycopg.Connection[Any], total: int) -> str | None:
        # A claim appends the worker's id to the row: one id means one run.
        return self._expect(
            conn,
            "SELECT count(*), count(*) FILTER (WHERE status = 'SUCCESSFUL'),"
            " count(*) FILTER (WHERE jsonb_array_length(worker_ids) <> 1)"
            " FROM django_tasks_database_dbtaskresult",
            {"tasks": total, "succeeded": total, "claimed other than once": 0},
        )
