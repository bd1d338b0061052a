"""The systems the horizon and faults cells run (US, PROC c10, PGQ b10), as those cells see
them beyond the ``System`` interface: which rows are a job enqueued and not finished, and,
for the faults cell, each one's way back from a dead worker and its job with an external
effect.

Each system gets the same time before a dead worker's jobs run again (``lease``): US's
lease (``TASKS_LEASE_SECONDS``, its sweeper every ``every`` seconds, beat and a maintenance
worker beside the workers as the ``Procfile`` runs them), PgQueuer's ``--heartbeat-timeout``
(a job whose heartbeat is older is picked again), procrastinate's stalled-jobs recipe
(``bench/proc_worker.py``, every ``every`` seconds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import psycopg
from psycopg import sql

from bench.common import ENV_PGQ_EFFECT, ENV_PROC_RETRY_EVERY, ENV_PROC_STALLED
from bench.peers import Pgq
from bench.procs import ProcessGroup
from bench.systems import CELERY_FLAGS, Ctx, Proc10, System, Us

SYSTEMS = ("us", "proc10", "pgq")


@dataclass(frozen=True)
class Queue:
    """A system's jobs enqueued and not finished: the rows of ``table`` where
    ``unfinished``; and ``failures``, the jobs that ended failed by kind (a query of two
    columns: the kind, how many)."""

    table: str
    unfinished: str
    failures: str

    def depth(self) -> sql.Composed:
        return sql.SQL("SELECT count(*) FROM {} WHERE {}").format(
            sql.Identifier(self.table), sql.SQL(self.unfinished)
        )

    def ids(self, conn: psycopg.Connection[Any]) -> list[int]:
        query = sql.SQL("SELECT id FROM {} WHERE {}").format(
            sql.Identifier(self.table), sql.SQL(self.unfinished)
        )
        return [int(row[0]) for row in conn.execute(query).fetchall()]

    def still_unfinished(self, conn: psycopg.Connection[Any], ids: list[int]) -> int:
        query = sql.SQL("SELECT count(*) FROM {} WHERE id = ANY(%s) AND {}").format(
            sql.Identifier(self.table), sql.SQL(self.unfinished)
        )
        row = conn.execute(query, (ids,)).fetchone()
        return int(row[0]) if row else 0

    def failed_by_kind(self, conn: psycopg.Connection[Any]) -> dict[str, int]:
        rows = conn.execute(sql.SQL(self.failures)).fetchall()
        return {str(row[0] or "?"): int(row[1]) for row in rows}


QUEUES = {
    "us": Queue(
        "tasks_app_task",
        "status IN ('pending', 'running')",
        # A dead step's error class: OutcomeUnknown is an effect a person must decide on.
        "SELECT error_class, count(*) FROM tasks_app_step WHERE status = 'dead' GROUP BY 1",
    ),
    "proc10": Queue(
        "procrastinate_jobs",
        "status IN ('todo', 'doing')",
        "SELECT status, count(*) FROM procrastinate_jobs"
        " WHERE status IN ('failed', 'aborted', 'cancelled') GROUP BY 1",
    ),
    # A job's row leaves the queue table when it finishes (its history is in the log).
    "pgq": Queue(
        "pgqueuer",
        "TRUE",
        "SELECT status::text, count(*) FROM pgqueuer_log"
        " WHERE status IN ('exception', 'failed', 'canceled') GROUP BY 1",
    ),
}


@dataclass(frozen=True)
class Lease:
    lease: float  # seconds before a dead worker's jobs may run again
    every: float  # seconds between the looks for them (US's sweeps, PROC's retry loop)


def _seconds(value: float) -> str:
    return f"{value:g}"


class UsFaults(Us):
    """US running ``bench.effect``, with the sweeper that reaps a dead worker's leases."""

    extra_args: ClassVar[list[str]] = ["-I", "bench.worker_hooks,bench.effect_workflow"]

    def __init__(self, ctx: Ctx, recovery: Lease) -> None:
        super().__init__(ctx)
        self.recovery = recovery

    def worker_env(self, *, barrier: bool) -> dict[str, str]:
        return {
            "TASKS_LEASE_SECONDS": _seconds(self.recovery.lease),
            "TASKS_SWEEP_SECONDS": _seconds(self.recovery.every),
        }

    def start_helpers(self) -> list[ProcessGroup]:
        """Beat and a maintenance worker, as the ``Procfile``'s lines run them."""
        env = {**self.ctx.env, **self.worker_env(barrier=False)}
        env["TASKS_BEAT_SCHEDULE_FILE"] = str(self.ctx.work_dir / "beat" / "schedule")
        beat = self.ctx.new_group("us-beat")
        beat.spawn([self.ctx.celery, "-A", "config", "beat", "--loglevel", "WARNING"], env)
        maintenance = self.ctx.new_group("us-maintenance")
        node = f"bench-maintenance-{maintenance.folder.name}@%h"
        argv = [self.ctx.celery, "-A", "config", "worker", "-Q", "maintenance", "-c", "1"]
        maintenance.spawn([*argv, "-n", node, *CELERY_FLAGS], env)
        return [beat, maintenance]


class ProcFaults(Proc10):
    """procrastinate running ``bench.effect``, its workers retrying stalled jobs."""

    def __init__(self, ctx: Ctx, recovery: Lease) -> None:
        super().__init__(ctx)
        self.recovery = recovery

    def worker_env(self, *, barrier: bool) -> dict[str, str]:
        return {
            **super().worker_env(barrier=barrier),
            ENV_PROC_STALLED: _seconds(self.recovery.lease),
            ENV_PROC_RETRY_EVERY: _seconds(self.recovery.every),
        }

    def start_helpers(self) -> list[ProcessGroup]:
        return []


class PgqFaults(Pgq):
    """PgQueuer running ``bench_effect``, a job picked again once its heartbeat is older
    than the lease."""

    def __init__(self, ctx: Ctx, recovery: Lease) -> None:
        super().__init__(ctx)
        self.recovery = recovery

    def argv(self) -> list[str]:
        return [*super().argv(), "--heartbeat-timeout", _seconds(self.recovery.lease)]

    def worker_env(self, *, barrier: bool) -> dict[str, str]:
        return {ENV_PGQ_EFFECT: "1"}

    def start_helpers(self) -> list[ProcessGroup]:
        return []


FaultSystem = UsFaults | ProcFaults | PgqFaults
FAULT_SYSTEMS: dict[str, type[FaultSystem]] = {
    "us": UsFaults,
    "proc10": ProcFaults,
    "pgq": PgqFaults,
}


def horizon_system(ctx: Ctx, key: str) -> System:
    """The system as every other cell runs it (the no-op job)."""
    return {"us": Us, "proc10": Proc10, "pgq": Pgq}[key](ctx)
