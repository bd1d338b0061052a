"""The project's systems and the first peers as the harness sees them: how to install
their schemas, start their workers, release a pre-filled queue, see progress, read start
and completion times, check that every task ran once, and clean up. The other peers are in
``bench/peers.py``.

Times are seconds since the epoch on this machine's clock: PostgreSQL's ``now()``, the
workers' and the harness's ``time.time()`` all read the same clock.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import psycopg
import redis
from honcho.environ import parse_procfile

from bench.common import (
    ENV_DSN,
    ENV_GO_FILE,
    ENV_PROC_CONCURRENCY,
    ENV_READY_DIR,
    PLAIN_QUEUE,
    PLAIN_STARTS_KEY,
    ROOT,
    scalar,
)
from bench.procs import ProcessGroup, children, memory_kib
from bench.raw import SCHEMA as RAW_SCHEMA
from bench.raw import TABLE as RAW_TABLE

CELERY_FLAGS = [
    "--pool=prefork",
    "--loglevel=WARNING",
    # No gossip, mingle or event heartbeats: less start-up time and background traffic,
    # the same for both Celery-based systems.
    "--without-gossip",
    "--without-mingle",
    "--without-heartbeat",
]


@dataclass
class Ctx:
    """What every cell needs: the bench database, Redis and its two key prefixes, the
    environment for subprocesses and a scratch folder."""

    dsn: str  # libpq URI of the bench database
    admin_dsn: str  # the same server's maintenance database (stats are read there)
    db_name: str
    redis_url: str
    live_prefix: str  # the workers' broker keys
    stage_prefix: str  # where pre-filled messages wait until released
    work_dir: Path
    env: dict[str, str]
    python: str = sys.executable
    celery: str = str(Path(sys.executable).with_name("celery"))
    rds: redis.Redis = field(init=False)
    _groups: int = 0

    def __post_init__(self) -> None:
        self.rds = redis.Redis.from_url(self.redis_url, socket_timeout=10)

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)

    def producer_env(self, *, staged: bool) -> dict[str, str]:
        env = dict(self.env)
        if staged:
            env["TASKS_BROKER_PREFIX"] = self.stage_prefix
        return env

    def new_group(self, name: str) -> ProcessGroup:
        self._groups += 1
        folder = self.work_dir / f"{self._groups:03d}-{name}"
        return ProcessGroup(name, folder)

    def purge_keys(self, prefix: str, *, lists_only: bool = False) -> None:
        for key in self.rds.scan_iter(match=prefix + "*", count=1000):
            if lists_only and self.rds.type(key) not in {b"list", "list"}:
                continue
            self.rds.delete(key)


@dataclass(frozen=True)
class Progress:
    done: int
    failed: int


class System:
    key: ClassVar[str]
    label: ClassVar[str]
    tables: ClassVar[tuple[str, ...]] = ()
    # Tables written on a clock, not by each execution (counters kept in memory and
    # written once a second, workers' heartbeats): their rows are counted apart.
    clock_tables: ClassVar[tuple[str, ...]] = ()
    # Whether the pre-fill goes through the staged broker prefix (released by renaming
    # the queue lists) rather than a go file the worker processes wait for.
    staged: ClassVar[bool] = False
    poll_interval: ClassVar[float] = 0.1
    # The cells it runs; a variant that differs only in its workers leaves out the enqueue
    # cell, which would repeat another system's.
    cells: ClassVar[tuple[str, ...]] = ("enqueue", "drain", "latency")
    # Why the enqueue cell has no bulk figure (no batch API), or None when it has one; the
    # pre-fill of a drain then goes through the producer's loop of single calls.
    no_bulk: ClassVar[str | None] = None
    # Systems sharing a schema (a variant and its base) install it once, under this key.
    install_key: ClassVar[str] = ""
    # The worker counts its drain cells run at, of the mode's (None: every one).
    drain_workers: ClassVar[tuple[int, ...] | None] = None

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx

    def install(self) -> None:
        """Create the system's schema in the bench database (once per harness run, before
        any cell); an exception makes every cell of the system "skipped" with its message."""

    # --- workers ---------------------------------------------------------------------

    def start_workers(self, n: int, *, barrier: bool) -> ProcessGroup:
        raise NotImplementedError

    def expected_ready(self, n: int) -> int:
        return n

    def worker_env(self, *, barrier: bool) -> dict[str, str]:
        """What a worker process's environment adds to the harness's."""
        return {}

    def executing_pids(self, group: ProcessGroup) -> list[int]:
        """The processes that run the tasks (prefork children, or the worker processes)."""
        return group.pids

    def memory(self, group: ProcessGroup) -> dict[str, Any]:
        per_process = [memory_kib(pid) for pid in self.executing_pids(group)]
        per_process = [m for m in per_process if m]
        leaders = [memory_kib(pid) for pid in group.pids]
        return {"executing": per_process, "leaders": leaders}

    # --- the queue -------------------------------------------------------------------

    def reset(self) -> None:
        """Empty the system's tables and its Redis keys (no worker may be running)."""
        if self.tables:
            with self.ctx.connect() as conn:
                conn.execute("SET lock_timeout = '15s'")
                # The history refuses TRUNCATE unless the database allows it, as a bench
                # database does (Server._create, in bench/databases.py).
                conn.execute(f"TRUNCATE {', '.join(self.tables)} RESTART IDENTITY CASCADE")
        self.ctx.purge_keys(self.ctx.stage_prefix)
        self.ctx.purge_keys(self.ctx.live_prefix)

    def clear_queues(self) -> None:
        """Between latency rates, with the workers running: only the Redis lists go (the
        CELERY start times among them), not the workers' bindings and not the tables (a
        TRUNCATE would fight the workers' locks); ids keep growing, so earlier rows never
        match a later rate's tasks."""
        self.ctx.purge_keys(self.ctx.live_prefix, lists_only=True)

    def release(self, group: ProcessGroup) -> float:
        """Let the workers at the pre-filled tasks; returns the release time."""
        raise NotImplementedError

    def staged_count(self) -> int:
        """How many pre-filled tasks wait (checked before the release)."""
        raise NotImplementedError

    def progress(self, conn: psycopg.Connection[Any], total: int) -> Progress:
        raise NotImplementedError

    def last_completion(self, conn: psycopg.Connection[Any]) -> float | None:
        return None

    def first_start(self, conn: psycopg.Connection[Any]) -> float | None:
        return None

    def start_times(self, conn: psycopg.Connection[Any], ids: list[int]) -> dict[int, float]:
        raise NotImplementedError

    def busy(self, conn: psycopg.Connection[Any]) -> bool:
        """Whether anything is still queued or running (between latency rates)."""
        raise NotImplementedError

    def verify_once(self, conn: psycopg.Connection[Any], total: int) -> str | None:
        """After a drain: check in the database that each of the ``total`` pre-filled tasks
        ran exactly once, raising ``NotExactlyOnce`` when not; returns what was checked,
        or None when the system keeps no record to check."""
        return None

    # --- helpers ---------------------------------------------------------------------

    def _row_count(self, table: str) -> int:
        with self.ctx.connect() as conn:
            return int(scalar(conn, f"SELECT count(*) FROM {table}") or 0)  # noqa: S608

    def _epoch(self, conn: psycopg.Connection[Any], sql: str) -> float | None:
        """A time as seconds since the epoch, or None when there is none yet."""
        value = scalar(conn, sql)
        return float(value) if value is not None else None

    def _times(self, conn: psycopg.Connection[Any], sql: str, ids: list[int]) -> dict[int, float]:
        rows = conn.execute(sql, (ids,)).fetchall()
        return {int(row[0]): float(row[1]) for row in rows if row[1] is not None}

    def _expect(self, conn: psycopg.Connection[Any], sql: str, checks: dict[str, int]) -> str:
        """Run ``sql`` (one row) and compare its columns, in order, with ``checks``
        (what each counts -> the value it must have); raise ``NotExactlyOnce`` naming every
        mismatch, else return the checks as text."""
        row = conn.execute(sql).fetchone()
        assert row is not None
        wrong = [
            f"{what}: {int(value or 0)}, expected {expected}"
            for (what, expected), value in zip(checks.items(), row, strict=True)
            if int(value or 0) != expected
        ]
        if wrong:
            raise NotExactlyOnce(f"{self.label}: " + "; ".join(wrong))
        return "; ".join(f"{what} = {expected}" for what, expected in checks.items())


class NotExactlyOnce(RuntimeError):
    """A drain ran a task twice, or left one unrun: the cell fails."""


class _CeleryBased(System):
    staged = True
    extra_args: ClassVar[list[str]] = []
    queue_lists: ClassVar[tuple[str, ...]] = ()

    def start_workers(self, n: int, *, barrier: bool) -> ProcessGroup:
        group = self.ctx.new_group(f"{self.key}-c{n}")
        env = dict(self.ctx.env)
        env[ENV_READY_DIR] = str(group.ready_dir)
        env.update(self.worker_env(barrier=barrier))
        node = f"bench-{self.key}-{os.getpid()}-{group.folder.name}@%h"
        argv = [self.ctx.celery, "-A", "config", "worker", "-c", str(n), "-n", node]
        group.spawn([*argv, *CELERY_FLAGS, *self.extra_args], env)
        return group

    def expected_ready(self, n: int) -> int:
        return 1  # the main process signals once its pool is up and it consumes

    def executing_pids(self, group: ProcessGroup) -> list[int]:
        return [child for pid in group.pids for child in children(pid)]

    def release(self, group: ProcessGroup) -> float:
        rds = self.ctx.rds
        stage, live = self.ctx.stage_prefix, self.ctx.live_prefix
        keys = [
            key.decode()
            for key in rds.scan_iter(match=stage + "*", count=1000)
            if rds.type(key) in {b"list", "list"}
        ]
        if not keys:
            raise RuntimeError("nothing staged to release")
        for key in keys:
            if rds.exists(live + key[len(stage) :]):
                raise RuntimeError(f"the live queue {key[len(stage) :]} is not empty")
        pipe = rds.pipeline(transaction=True)
        for key in keys:
            pipe.rename(key, live + key[len(stage) :])
        released = time.time()
        pipe.execute()
        return released


class Us(_CeleryBased):
    """Our durable core: demo.noop through enqueue / enqueue_many, our Celery worker."""

    key = "us"
    label = "US"
    clock_tables = ("tasks_app_counter", "tasks_app_heartbeat")
    tables: ClassVar[tuple[str, ...]] = (
        "tasks_app_task",
        "tasks_app_step",
        "tasks_app_lease",
        "tasks_app_event",
        "tasks_app_effect",
        "tasks_app_counter",
        "tasks_app_payloadsearch",
    )
    extra_args = ["-I", "bench.worker_hooks"]

    def staged_count(self) -> int:
        return self._row_count("tasks_app_task")

    def progress(self, conn: psycopg.Connection[Any], total: int) -> Progress:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'succeeded'),"
            " count(*) FILTER (WHERE status IN ('dead', 'cancelled')) FROM tasks_app_task"
        ).fetchone()
        assert row is not None
        return Progress(int(row[0]), int(row[1]))

    def last_completion(self, conn: psycopg.Connection[Any]) -> float | None:
        return self._epoch(
            conn,
            "SELECT extract(epoch FROM max(finished_at)) FROM tasks_app_task"
            " WHERE status = 'succeeded'",
        )

    def first_start(self, conn: psycopg.Connection[Any]) -> float | None:
        return self._epoch(conn, "SELECT extract(epoch FROM min(acquired_at)) FROM tasks_app_lease")

    def start_times(self, conn: psycopg.Connection[Any], ids: list[int]) -> dict[int, float]:
        return self._times(
            conn,
            "SELECT s.task_id, extract(epoch FROM min(l.acquired_at))"
            " FROM tasks_app_lease l JOIN tasks_app_step s ON s.id = l.step_id"
            " WHERE s.task_id = ANY(%s) GROUP BY s.task_id",
            ids,
        )

    def busy(self, conn: psycopg.Connection[Any]) -> bool:
        return bool(
            scalar(
                conn,
                "SELECT EXISTS (SELECT 1 FROM tasks_app_task"
                " WHERE status IN ('pending', 'running'))",
            )
        )

    def verify_once(self, conn: psycopg.Connection[Any], total: int) -> str | None:
        # Every task succeeded, and no step was claimed twice (a second claim is a second
        # run: a lease row per claim).
        return self._expect(
            conn,
            "SELECT (SELECT count(*) FROM tasks_app_task),"
            " (SELECT count(*) FROM tasks_app_task WHERE status = 'succeeded'),"
            " (SELECT count(*) FROM (SELECT step_id FROM tasks_app_lease"
            "  GROUP BY step_id HAVING count(*) > 1) AS twice)",
            {"tasks": total, "succeeded": total, "steps claimed more than once": 0},
        )


class UsProcfile(Us):
    """Our worker exactly as the Procfile's ``worker`` line starts it (its log level, its
    Celery defaults, the production logging settings), with the cell's concurrency and a
    node name added; compared with the harness's US worker in the drain cells."""

    key = "procfile"
    label = "US/PF"
    cells = ("drain",)
    extra_args = ["-I", "bench.worker_hooks"]

    def start_workers(self, n: int, *, barrier: bool) -> ProcessGroup:
        group = self.ctx.new_group(f"{self.key}-c{n}")
        env = {k: v for k, v in self.ctx.env.items() if k not in PRODUCTION_LOG_SETTINGS}
        # The line runs in production mode, which needs what a deployment gives it.
        env.update(PRODUCTION_ENV)
        env[ENV_READY_DIR] = str(group.ready_dir)
        # `celery` in the line is the one installed beside this interpreter.
        env["PATH"] = f"{Path(self.ctx.celery).parent}{os.pathsep}{env.get('PATH', '')}"
        node = f"bench-{self.key}-{os.getpid()}-{group.folder.name}@%h"
        command = parse_procfile((ROOT / "Procfile").read_text()).processes["worker"]
        # Through a shell, as a Procfile runner starts it (the shell expands the line's
        # ${VAR:-default}); exec env (the line starts with a variable's assignment) keeps the
        # worker the group's leader, and "$@" appends the cell's concurrency, the node name
        # and the ready hook.
        group.spawn(
            [
                *("sh", "-c", f'exec env {command} "$@"', "sh"),
                *("-c", str(n), "-n", node, *self.extra_args),
            ],
            env,
        )
        return group


class UsLimited(Us):
    """Our durable core with its one step under limits set far above what the machine
    does (``bench/limited_workflow.py``): no step is ever held back, so the drain measures
    what the limits' bookkeeping costs; compared with US in the drain cell of 2 workers."""

    key = "uslimited"
    label = "US/LIM"
    cells = ("drain",)
    drain_workers = (2,)
    install_key = "us"
    # The limits' own rows (turns, rate windows) start empty in every cell too.
    tables = (*Us.tables, "tasks_app_limitkey", "tasks_app_limitstate")
    extra_args = ["-I", "bench.worker_hooks,bench.limited_workflow"]


# Settings the harness sets for quiet workers; the Procfile's worker runs without them.
PRODUCTION_LOG_SETTINGS = {"TASKS_LOG_LEVEL", "TASKS_LOG_MESSAGES"}
# What production mode (on in every Procfile line) needs to start; the bench's steps call
# no remote.
PRODUCTION_ENV = {
    "DJANGO_SECRET_KEY": "bench-" + "x" * 60,
    "DJANGO_ALLOWED_HOSTS": "bench.invalid",
    "PUBLISH_URL": "https://publish.invalid/",
    "MAIL_URL": "https://mail.invalid/",
}


class PlainCelery(_CeleryBased):
    """A plain Celery task in this Django project (bench.plain_tasks), its worker with
    Celery's default prefetch multiplier (4), as a plain Celery user keeps it and as
    Celery's guide advises for many short tasks; the durable worker's 1 is this project's
    choice, not theirs."""

    key = "celery"
    label = "CELERY"
    extra_args = ["-I", "bench.plain_tasks", "-Q", PLAIN_QUEUE, "--prefetch-multiplier", "4"]
    poll_interval = 0.005  # a Redis poll costs next to nothing

    def _remaining(self) -> int:
        live = self.ctx.live_prefix
        pipe = self.ctx.rds.pipeline(transaction=False)
        pipe.llen(live + PLAIN_QUEUE)
        pipe.hlen(live + "unacked")
        queued, unacked = pipe.execute()
        return int(queued) + int(unacked)

    def staged_count(self) -> int:
        return int(self.ctx.rds.llen(self.ctx.stage_prefix + PLAIN_QUEUE))  # type: ignore[arg-type]

    def progress(self, conn: psycopg.Connection[Any], total: int) -> Progress:
        # Late acks: a message leaves the unacked hash once its task has returned, so
        # "nothing queued and nothing unacked" means every task ran.
        return Progress(total - self._remaining(), 0)

    def start_times(self, conn: psycopg.Connection[Any], ids: list[int]) -> dict[int, float]:
        wanted = set(ids)
        out: dict[int, float] = {}
        raw = self.ctx.rds.lrange(self.ctx.live_prefix + PLAIN_STARTS_KEY, 0, -1)
        for item in raw:  # type: ignore[union-attr]
            seq, stamp = item.decode().split()
            if int(seq) in wanted:
                out.setdefault(int(seq), float(stamp))
        return out

    def busy(self, conn: psycopg.Connection[Any]) -> bool:
        return self._remaining() > 0


class _GoFileBased(System):
    """N worker processes that wait, booted and connected, for a go file."""

    module: ClassVar[str]

    def start_workers(self, n: int, *, barrier: bool) -> ProcessGroup:
        group = self.ctx.new_group(f"{self.key}-c{n}")
        env = dict(self.ctx.env)
        env[ENV_READY_DIR] = str(group.ready_dir)
        env[ENV_DSN] = self.ctx.dsn
        if barrier:
            env[ENV_GO_FILE] = str(group.folder / "go")
        env.update(self.worker_env(barrier=barrier))
        for _ in range(n):
            group.spawn(self.argv(), env)
        return group

    def argv(self) -> list[str]:
        """One worker process's command line."""
        return [self.ctx.python, "-m", self.module]

    def release(self, group: ProcessGroup) -> float:
        released = time.time()
        (group.folder / "go").touch()
        return released


class Proc(_GoFileBased):
    """procrastinate 3.x: N worker processes, concurrency 1 each (procrastinate's
    default); a variant of PROC c10, run only when ``--systems`` names it."""

    key = "proc"
    label = "PROC c1"
    module = "bench.proc_worker"
    install_key = "proc"
    cells: ClassVar[tuple[str, ...]] = ("drain", "latency")  # PROC c10's producer
    concurrency: ClassVar[int] = 1

    def worker_env(self, *, barrier: bool) -> dict[str, str]:
        return {ENV_PROC_CONCURRENCY: str(self.concurrency)}

    tables = ("procrastinate_jobs", "procrastinate_events", "procrastinate_periodic_defers")

    def install(self) -> None:
        from bench.proc_app import apply_schema

        apply_schema(self.ctx.dsn)

    def staged_count(self) -> int:
        return self._row_count("procrastinate_jobs")

    def progress(self, conn: psycopg.Connection[Any], total: int) -> Progress:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'succeeded'),"
            " count(*) FILTER (WHERE status IN ('failed', 'aborted', 'cancelled'))"
            " FROM procrastinate_jobs"
        ).fetchone()
        assert row is not None
        return Progress(int(row[0]), int(row[1]))

    def last_completion(self, conn: psycopg.Connection[Any]) -> float | None:
        return self._epoch(
            conn,
            "SELECT extract(epoch FROM max(at)) FROM procrastinate_events WHERE type = 'succeeded'",
        )

    def first_start(self, conn: psycopg.Connection[Any]) -> float | None:
        return self._epoch(
            conn,
            "SELECT extract(epoch FROM min(at)) FROM procrastinate_events WHERE type = 'started'",
        )

    def start_times(self, conn: psycopg.Connection[Any], ids: list[int]) -> dict[int, float]:
        return self._times(
            conn,
            "SELECT job_id, extract(epoch FROM min(at)) FROM procrastinate_events"
            " WHERE type = 'started' AND job_id = ANY(%s) GROUP BY job_id",
            ids,
        )

    def busy(self, conn: psycopg.Connection[Any]) -> bool:
        return bool(
            scalar(
                conn,
                "SELECT EXISTS (SELECT 1 FROM procrastinate_jobs"
                " WHERE status IN ('todo', 'doing'))",
            )
        )

    def verify_once(self, conn: psycopg.Connection[Any], total: int) -> str | None:
        return self._expect(
            conn,
            "SELECT (SELECT count(*) FROM procrastinate_jobs),"
            " (SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'),"
            " (SELECT count(*) FROM (SELECT job_id FROM procrastinate_events"
            "  WHERE type = 'started' GROUP BY job_id HAVING count(*) > 1) AS twice)",
            {"jobs": total, "succeeded": total, "jobs started more than once": 0},
        )


class Proc10(Proc):
    """procrastinate with concurrency 10 per worker process, as its users run I/O-bound
    work; it runs the enqueue cell, and the report compares with the better of this and
    PROC c1 (when that ran too), cell by cell."""

    key = "proc10"
    label = "PROC c10"
    concurrency = 10
    cells = ("enqueue", "drain", "latency")


class Raw(_GoFileBased):
    """The raw psycopg loop (bench.raw): N processes; run only when ``--systems`` names
    it (no target is measured against it any more)."""

    key = "raw"
    label = "RAW"
    module = "bench.raw"
    tables = (RAW_TABLE,)

    def install(self) -> None:
        with self.ctx.connect() as conn:
            conn.execute(RAW_SCHEMA)

    def staged_count(self) -> int:
        return self._row_count(RAW_TABLE)

    def progress(self, conn: psycopg.Connection[Any], total: int) -> Progress:
        done = scalar(
            conn,
            f"SELECT count(*) FROM {RAW_TABLE} WHERE status = 'done'",  # noqa: S608
        )
        return Progress(int(done or 0), 0)

    def last_completion(self, conn: psycopg.Connection[Any]) -> float | None:
        return self._epoch(
            conn,
            f"SELECT extract(epoch FROM max(finished_at)) FROM {RAW_TABLE}",  # noqa: S608
        )

    def first_start(self, conn: psycopg.Connection[Any]) -> float | None:
        return self._epoch(
            conn,
            f"SELECT extract(epoch FROM min(started_at)) FROM {RAW_TABLE}",  # noqa: S608
        )

    def start_times(self, conn: psycopg.Connection[Any], ids: list[int]) -> dict[int, float]:
        return self._times(
            conn,
            f"SELECT id, extract(epoch FROM started_at) FROM {RAW_TABLE}"  # noqa: S608
            " WHERE id = ANY(%s)",
            ids,
        )

    def busy(self, conn: psycopg.Connection[Any]) -> bool:
        return bool(
            scalar(
                conn,
                f"SELECT EXISTS (SELECT 1 FROM {RAW_TABLE}"  # noqa: S608
                " WHERE status IN ('todo', 'doing'))",
            )
        )

    def verify_once(self, conn: psycopg.Connection[Any], total: int) -> str | None:
        return self._expect(
            conn,
            f"SELECT count(*), count(*) FILTER (WHERE status = 'done'),"  # noqa: S608
            f" count(*) FILTER (WHERE attempts <> 1) FROM {RAW_TABLE}",
            {"jobs": total, "done": total, "jobs claimed other than once": 0},
        )
