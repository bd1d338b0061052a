"""The benchmark run: ``python -m bench.run --mode quick|full`` (``make bench-quick`` /
``make bench``).

It finds PostgreSQL and Redis as ``scripts/with-services.sh`` does (``DATABASE_URL`` /
``REDIS_URL``, else 127.0.0.1), creates a database of its own (``task_console_bench``,
dropped at the end) and uses Redis keys under a prefix of its own (deleted at the end),
runs every cell for every system in a shuffled order per run, then the console cells
(``bench/pages.py``: two pages timed over two data sets, ``bench/dataset.py``, each in a
database of its own, ``bench_console_<tasks>``, built in the first run, dropped at the
end), and writes
``bench/results/<timestamp>[-quick].{json,md}`` (and, in full mode, the table into
``docs/performance.md``). Every process it starts is stopped, also on error; every wait
has a deadline, and the whole run has a time budget after which cells are skipped.

Exit status: 0 when the harness ran (cells that failed are reported in the table),
2 when the services cannot be reached or another bench run holds the lock, 1 on a crash.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import hashlib
import importlib.metadata
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import redis

from . import dataset, report
from .common import BENCH_DIR, ROOT, wait_for
from .pages import PAGES, BadAnswer, PageProcess
from .procs import stop_all
from .raw import SCHEMA as RAW_SCHEMA
from .systems import ORDER, SYSTEMS, Ctx, Progress, System

BENCH_DB = "task_console_bench"
# The console cells' data sets: one database per size, "bench_console_<tasks>".
CONSOLE_DB = "bench_console_{}"
CONSOLE_DB_PATTERN = r"^bench_console_[0-9]+$"
CONSOLE_PAGES = tuple(PAGES)
ALL_CELLS = ("enqueue", "drain", "latency", "console")
LOCK_KEY = 7_311_003  # pg advisory lock: one bench run per server at a time
RESULTS_DIR = BENCH_DIR / "results"
DOCS = ROOT / "docs" / "performance.md"


@dataclass(frozen=True)
class Mode:
    name: str
    runs: int
    single_n: int
    bulk_n: int
    batch: int
    drain_n: int
    workers: tuple[int, ...]
    rates: tuple[int, ...]
    latency_seconds: float
    senders: int
    drain_timeout: float  # a drain cell stops here and reports what finished
    budget: float  # seconds for all cells; later cells are skipped past it
    console_sizes: tuple[int, int]  # tasks in the console cells' small and large data sets
    console_gets: int  # timed GETs per page and size (after console_warmup untimed ones)
    console_warmup: int


MODES = {
    "quick": Mode(
        "quick", 1, 500, 5_000, 1_000, 1_000, (1, 2, 4), (50, 200, 500), 3.0, 4, 45, 240,
        console_sizes=(2_000, 20_000), console_gets=20, console_warmup=5,
    ),
    "full": Mode(
        "full", 3, 5_000, 50_000, 1_000, 10_000, (1, 2, 4), (50, 200, 500), 6.0, 4, 100, 27 * 60,
        console_sizes=(10_000, 1_000_000), console_gets=20, console_warmup=5,
    ),
}  # fmt: skip


class Interrupted(BaseException):
    """SIGTERM: unwind through every ``finally`` so processes and data are cleaned up."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(f"signal {signum}")


# --- services ---------------------------------------------------------------------------


def discover() -> tuple[str, str]:
    """``DATABASE_URL`` and ``REDIS_URL``, or the loopback defaults of with-services.sh."""
    user = os.environ.get("PGUSER") or getpass.getuser()
    database_url = (
        os.environ.get("DATABASE_URL") or f"postgres://{user}@127.0.0.1:5432/task_console"
    )
    redis_url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    return database_url, redis_url


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


class Server:
    """The maintenance connection: holds the bench lock, creates and drops the bench
    database, and reads its statistics from outside it (so reading adds no commit)."""

    def __init__(self, admin_dsn: str, db_name: str) -> None:
        self.db_name = db_name
        self.others: list[str] = []  # the console data sets' databases
        self.conn = psycopg.connect(admin_dsn, autocommit=True, connect_timeout=5)
        self.can_checkpoint = True
        self.walinspect = False
        self.wal_error = ""
        self.oid = 0

    def lock(self) -> bool:
        return bool(self.scalar("SELECT pg_try_advisory_lock(%s)", LOCK_KEY))

    def scalar(self, sql: str, *args: Any) -> Any:
        row = self.conn.execute(sql, args or None).fetchone()
        return row[0] if row else None

    def create(self) -> None:
        self.drop()
        self.conn.execute(f'CREATE DATABASE "{self.db_name}"')
        self.oid = int(self.scalar("SELECT oid FROM pg_database WHERE datname = %s", self.db_name))

    def drop(self) -> None:
        self.conn.execute(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')

    def create_other(self, name: str) -> None:
        """Another database of this run (a console data set), dropped by ``drop_others``."""
        self.conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.others.append(name)
        self.conn.execute(f'CREATE DATABASE "{name}"')

    def drop_others(self) -> None:
        """This run's other databases, and any a killed run left behind (we hold the
        lock: no other run is using them)."""
        rows = self.conn.execute(
            "SELECT datname FROM pg_database WHERE datname ~ %s", (CONSOLE_DB_PATTERN,)
        ).fetchall()
        for name in {*self.others, *(str(row[0]) for row in rows)}:
            self.conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.others = []

    def backends(self) -> int:
        return int(
            self.scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
                " AND backend_type = 'client backend'",
                self.db_name,
            )
        )

    def quiesce(self, timeout: float = 30) -> None:
        """Wait until no client is connected to the bench database, then a moment more:
        a backend writes its statistics as it exits, just after it leaves the list."""
        wait_for(lambda: self.backends() == 0, timeout=timeout, what="bench database clients")
        time.sleep(0.3)

    def checkpoint(self) -> None:
        """A checkpoint before each measured drain, so every system starts from the same
        full-page-write state (WAL per step is otherwise a matter of luck)."""
        if not self.can_checkpoint:
            return
        try:
            self.conn.execute("CHECKPOINT")
        except psycopg.Error:
            self.can_checkpoint = False

    def stats(self) -> dict[str, Any]:
        row = self.conn.execute(
            "SELECT xact_commit, xact_rollback, pg_current_wal_lsn()::text"
            " FROM pg_stat_database WHERE datname = %s",
            (self.db_name,),
        ).fetchone()
        assert row is not None
        return {"commits": int(row[0]), "rollbacks": int(row[1]), "lsn": row[2]}

    def wal_bytes(self, before: str, after: str) -> int:
        return int(self.scalar("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", after, before))

    def own_wal_bytes(self, dsn: str, before: str, after: str) -> int | None:
        """The WAL written for the bench database alone: records touching its relations
        and the commit records of their transactions (pg_walinspect, when it could be
        installed). The LSN difference counts the whole cluster, other databases too."""
        if not self.walinspect:
            return None
        # pg_walinspect reads only flushed WAL; the wal writer gets there within moments.
        with contextlib.suppress(TimeoutError):
            wait_for(
                lambda: self.scalar("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", after),
                timeout=5,
                what="the WAL flush",
            )
        sql = """
            WITH r AS (
                SELECT xid, record_length, block_ref
                FROM pg_get_wal_records_info(%(before)s::pg_lsn, %(after)s::pg_lsn)
            ),
            mine AS (SELECT DISTINCT xid FROM r WHERE block_ref LIKE %(rel)s AND xid <> 0)
            SELECT coalesce(sum(record_length), 0) FROM r
            WHERE block_ref LIKE %(rel)s OR (xid <> 0 AND xid IN (SELECT xid FROM mine))
        """
        try:
            with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
                conn.execute("SET statement_timeout = '60s'")
                row = conn.execute(
                    sql, {"before": before, "after": after, "rel": f"%rel %/{self.oid}/%"}
                ).fetchone()
        except psycopg.Error as exc:
            self.wal_error = str(exc).strip()[:300]
            return None
        self.wal_error = ""
        return int(row[0]) if row else None

    def settings(self) -> dict[str, str]:
        names = [
            "server_version",
            "shared_buffers",
            "synchronous_commit",
            "fsync",
            "wal_level",
            "max_connections",
            "full_page_writes",
            "checkpoint_timeout",
            "max_wal_size",
        ]
        rows = self.conn.execute(
            "SELECT name, current_setting(name) FROM unnest(%s::text[]) AS name", (names,)
        ).fetchall()
        out = {str(name): str(value) for name, value in rows}
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()


class CountingConnection(psycopg.Connection[Any]):
    """The harness's observer connection, counting its statements (each one a commit in
    autocommit mode) so they can be taken out of the bench database's commit count."""

    statements = 0

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        self.statements += 1
        return super().execute(*args, **kwargs)


# --- setup ------------------------------------------------------------------------------


def prepare_database(ctx: Ctx, server: Server) -> None:
    migrate = subprocess.run(  # noqa: S603
        [ctx.python, "manage.py", "migrate", "--noinput"],
        cwd=ROOT,
        env=ctx.env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if migrate.returncode != 0:
        raise RuntimeError(f"migrate failed:\n{migrate.stdout}\n{migrate.stderr}")
    from .proc_app import apply_schema

    apply_schema(ctx.dsn)
    with ctx.connect() as conn:
        conn.execute(RAW_SCHEMA)
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            server.walinspect = True
        except psycopg.Error:
            server.walinspect = False  # not a superuser, or the contrib module is missing


def environment(server: Server, rds: redis.Redis) -> dict[str, Any]:
    versions = {"python": platform.python_version()}
    for dist in ("Django", "celery", "kombu", "procrastinate", "psycopg", "redis"):
        try:
            versions[dist if dist != "redis" else "redis-py"] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "missing"
    pg = server.settings()
    versions["PostgreSQL"] = pg.pop("server_version", "?")
    info: dict[str, Any] = {}
    with contextlib.suppress(redis.RedisError):
        info = rds.info("server")  # type: ignore[assignment]
    versions["Redis"] = str(info.get("redis_version", "?"))
    redis_settings: dict[str, str] = {}
    for name in (
        "maxmemory",
        "maxmemory-policy",
        "appendonly",
        "appendfsync",
        "save",
        "io-threads",
        "hz",
    ):
        try:
            value = rds.config_get(name)
            redis_settings[name] = str(value.get(name, "?"))  # type: ignore[union-attr]
        except redis.RedisError:
            redis_settings[name] = "(CONFIG GET refused)"
    cpu_model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    memory_gib = 0.0
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gib = int(line.split()[1]) / 1024 / 1024
    return {
        "versions": versions,
        "postgresql_settings": pg,
        "redis_settings": redis_settings,
        "cpu_model": cpu_model,
        "cpus": len(os.sched_getaffinity(0)),
        "memory_gib": memory_gib,
        "platform": platform.platform(),
    }


def code_fingerprint() -> str:
    """HEAD and a digest of the uncommitted changes to tracked files: compared at the start
    and the end of a run, it tells whether the measured code changed under the run."""
    try:
        diff = subprocess.run(
            ["git", "diff", "HEAD", "--", ".", ":(exclude)bench", ":(exclude)docs"],  # noqa: S607
            cwd=ROOT,
            capture_output=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{git_state()} {hashlib.sha256(diff).hexdigest()[:12]}"


def git_state() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],  # noqa: S607
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],  # noqa: S607
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}{' with uncommitted changes' if dirty else ''}"


# --- cells --------------------------------------------------------------------------------


class Bench:
    def __init__(self, ctx: Ctx, server: Server, mode: Mode) -> None:
        self.ctx = ctx
        self.server = server
        self.mode = mode
        self.started = time.monotonic()
        # The console data sets: tasks -> DSN, built by the first console cell.
        self.console_dsns: dict[int, str] = {}
        self.console_data: dict[str, Any] = {}
        self.console_failure: str | None = None

    def over_budget(self) -> bool:
        return time.monotonic() - self.started > self.mode.budget

    def producer(
        self, system: System, mode: str, *, staged: bool, timeout: float, **options: Any
    ) -> dict[str, Any]:
        out = self.ctx.work_dir / f"producer-{time.monotonic_ns()}.json"
        argv = [self.ctx.python, "-m", "bench.producer", system.key, mode, "--out", str(out)]
        for name, value in options.items():
            flag = "--" + name.replace("_", "-")
            if value is True:
                argv.append(flag)
            elif value is not False:
                argv += [flag, str(value)]
        done = subprocess.run(  # noqa: S603
            argv,
            cwd=ROOT,
            env=self.ctx.producer_env(staged=staged),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(
                f"producer {system.key} {mode} exited {done.returncode}\n"
                f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
            )
        result: dict[str, Any] = json.loads(out.read_text())
        out.unlink()
        return result

    # 1. enqueue/s from one producer

    def enqueue(self, system: System) -> dict[str, Any]:
        mode = self.mode
        system.reset()
        single = self.producer(
            system, "single", staged=True, timeout=max(60, mode.single_n / 40), n=mode.single_n
        )
        system.reset()
        bulk = self.producer(
            system,
            "bulk",
            staged=True,
            timeout=max(60, mode.bulk_n / 150),
            n=mode.bulk_n,
            batch=mode.batch,
        )
        system.reset()
        return {"single": single, "bulk": bulk}

    # 2, 4, 5. drain a pre-filled queue; commits, WAL and memory around it

    def drain(self, system: System, workers: int) -> dict[str, Any]:
        mode, ctx, server = self.mode, self.ctx, self.server
        total = mode.drain_n
        system.reset()
        self.producer(
            system,
            "bulk",
            staged=True,
            timeout=max(60, total / 150),
            n=total,
            batch=mode.batch,
            no_warmup=True,
        )
        staged = system.staged_count()
        if staged != total:
            raise RuntimeError(f"pre-filled {staged} tasks, expected {total}")
        with ctx.connect() as conn:
            conn.execute("ANALYZE")
        server.quiesce()
        server.checkpoint()
        before = server.stats()

        booting = time.monotonic()
        group = system.start_workers(workers, barrier=True)
        observer: CountingConnection | None = None
        out: dict[str, Any] = {"total": total}
        try:
            group.wait_ready(system.expected_ready(workers), timeout=90)
            out["worker_boot_s"] = time.monotonic() - booting
            observer = CountingConnection.connect(ctx.dsn, autocommit=True, connect_timeout=10)
            released = system.release(group)
            deadline = released + mode.drain_timeout
            progress = Progress(0, 0)
            while True:
                progress = system.progress(observer, total)
                if progress.done + progress.failed >= total:
                    break
                if time.time() > deadline:
                    out["capped"] = True
                    break
                if group.exited():
                    raise RuntimeError(f"a worker exited during the drain\n{group.tail()}")
                time.sleep(system.poll_interval)
            observed_end = time.time()
            end = system.last_completion(observer) if not out.get("capped") else None
            first = system.first_start(observer)
            memory = system.memory(group)
        finally:
            out["worker_stop_s"] = group.stop()
            if observer is not None:
                observer.close()
        server.quiesce()
        after = server.stats()

        # A worker that found work before the release (it polled the database on its
        # own) is timed from its first start instead.
        began = min(released, first) if first is not None else released
        end = end if end is not None and end >= began else observed_end
        elapsed = max(end - began, 1e-6)
        done = max(progress.done, 0)
        commits = after["commits"] - before["commits"] - (observer.statements if observer else 0)
        wal = server.wal_bytes(before["lsn"], after["lsn"])
        own_wal = server.own_wal_bytes(ctx.dsn, before["lsn"], after["lsn"])
        executing = memory["executing"]
        out.update(
            {
                "done": done,
                "failed": progress.failed,
                "elapsed": elapsed,
                "throughput": done / elapsed,
                "first_start_delay": (first - released) if first is not None else None,
                "started_before_release": first is not None and first < released,
                "commits": commits,
                "rollbacks": after["rollbacks"] - before["rollbacks"],
                "commits_per_step": commits / done if done else None,
                "wal_bytes": wal,
                "wal_bytes_per_step": wal / done if done else None,
                "own_wal_bytes": own_wal,
                "own_wal_error": server.wal_error or None,
                "own_wal_bytes_per_step": own_wal / done if done and own_wal is not None else None,
                "checkpointed": server.can_checkpoint,
                "memory_kib": memory,
                "rss_mib": _median_mib(executing, "rss"),
                "pss_mib": _median_mib(executing, "pss"),
                "uss_mib": _median_mib(executing, "uss"),
            }
        )
        if progress.failed:
            out["note"] = f"{progress.failed} tasks failed"
        if progress.failed or out.get("capped"):
            out["worker_log_tail"] = group.tail(15)[-3000:]
        system.reset()
        return out

    # 3. enqueue -> start latency under an open-loop producer

    def latency(self, system: System) -> dict[str, Any]:
        mode, ctx = self.mode, self.ctx
        system.reset()
        group = system.start_workers(2, barrier=False)
        rates: dict[str, Any] = {}
        try:
            group.wait_ready(system.expected_ready(2), timeout=90)
            with ctx.connect() as conn:
                # Warm-up: connections opened, code paths hot, then nothing left behind.
                self.producer(system, "single", staged=False, timeout=60, n=10)
                wait_for(lambda: not system.busy(conn), timeout=60, what="the warm-up")
            for rate in mode.rates:
                if self.over_budget():
                    rates[str(rate)] = {"error": "skipped: time budget"}
                    continue
                try:
                    rates[str(rate)] = self._latency_at(system, group.exited, rate)
                except Exception as exc:
                    rates[str(rate)] = {"error": f"{exc}"[:2000]}
                    if group.exited():
                        raise
        finally:
            stopped = group.stop()
        system.reset()
        return {"workers": 2, "rates": rates, "worker_stop_s": stopped}

    def _latency_at(self, system: System, exited: Any, rate: int) -> dict[str, Any]:
        mode, ctx = self.mode, self.ctx
        system.clear_queues()
        result = self.producer(
            system,
            "openloop",
            staged=False,
            timeout=mode.latency_seconds * 4 + 60,
            rate=rate,
            duration=mode.latency_seconds,
            senders=mode.senders,
        )
        records = [(int(r[0]), float(r[1]), float(r[2])) for r in result["records"]]
        ids = [record[0] for record in records]
        with ctx.connect() as conn:
            starts: dict[int, float] = {}
            deadline = time.monotonic() + 30
            while True:
                starts = system.start_times(conn, ids)
                if len(starts) >= len(ids) or time.monotonic() > deadline or exited():
                    break
                time.sleep(0.25)
            with contextlib.suppress(TimeoutError):
                wait_for(lambda: not system.busy(conn), timeout=30, what="the queue to empty")
        latencies = [(starts[i] - due) * 1000 for i, due, _ in records if i in starts]
        lags = [(sent - due) * 1000 for _, due, sent in records]
        out: dict[str, Any] = {
            "sent": len(records),
            "scheduled": result["count"],
            "started": len(latencies),
            "missing": len(records) - len(latencies),
            "producer_errors": result["error_count"],
        }
        if result["errors"]:
            out["producer_error_sample"] = result["errors"][:3]
        if latencies:
            out.update(
                {
                    "p50_ms": report.percentile(latencies, 50),
                    "p99_ms": report.percentile(latencies, 99),
                    "max_ms": max(latencies),
                    "producer_lag_p50_ms": report.percentile(lags, 50),
                    "producer_lag_p99_ms": report.percentile(lags, 99),
                }
            )
        else:
            out["error"] = "no task started"
        return out

    # 6. a console page rendered over a small and a large history

    def build_console_data(self) -> None:
        """Each size's database: created, migrated, filled with COPY, analyzed, checked.
        Built once per harness run; a failure is remembered so later cells fail at once."""
        if self.console_failure is not None:
            raise RuntimeError(f"the console data could not be built: {self.console_failure}")
        if self.console_dsns:
            return
        try:
            for tasks in self.mode.console_sizes:
                name = CONSOLE_DB.format(tasks)
                began = time.monotonic()
                self.server.create_other(name)
                dsn = with_database(self.ctx.dsn, name)
                migrated = dataset.migrate(self.ctx.python, self.ctx.env, dsn)
                info = dataset.load(dsn, tasks)
                info.update(
                    {"database": name, "migrate_s": migrated, "build_s": time.monotonic() - began}
                )
                self.console_data[str(tasks)] = info
                self.console_dsns[tasks] = dsn
                print(
                    f"console data: {tasks:,} tasks in {name}, built in {info['build_s']:.1f} s "
                    f"({info['database_mib']:,.0f} MiB)",
                    flush=True,
                )
        except Exception as exc:
            self.console_dsns = {}
            self.console_failure = f"{type(exc).__name__}: {exc}".strip().splitlines()[-1][:500]
            raise

    def console(self, page: str) -> dict[str, Any]:
        """One page timed over both data sets: a ``bench.pages`` process per set, warmed
        up, then the GETs alternate between the two (which goes first alternates too), so
        the machine's moments of load fall on both sizes alike."""
        mode, ctx = self.mode, self.ctx
        self.build_console_data()
        sizes = mode.console_sizes
        procs: dict[int, PageProcess] = {}
        out: dict[str, Any] = {}
        try:
            for tasks in sizes:
                env = {**ctx.env, "DATABASE_URL": self.console_dsns[tasks]}
                env["BENCH_DSN"] = env["DATABASE_URL"]
                procs[tasks] = PageProcess(
                    ctx.python,
                    page,
                    env=env,
                    cwd=ROOT,
                    log=ctx.work_dir / f"page-{page}-{tasks}-{time.monotonic_ns()}.log",
                    warmup=mode.console_warmup,
                )
            for tasks, proc in procs.items():
                self._ask(proc, tasks, None, timeout=120)  # booted and warmed up
            times: dict[int, list[float]] = {tasks: [] for tasks in sizes}
            size_bytes: dict[int, int] = {}
            for round_ in range(mode.console_gets):
                for tasks in sizes if round_ % 2 == 0 else sizes[::-1]:
                    reply = self._ask(procs[tasks], tasks, "get", timeout=60)
                    times[tasks].append(float(reply["ms"]))
                    size_bytes[tasks] = int(reply["bytes"])
            for tasks in sizes:
                queries = self._ask(procs[tasks], tasks, "explain", timeout=120)
                out[str(tasks)] = {
                    "median_ms": statistics.median(times[tasks]),
                    "min_ms": min(times[tasks]),
                    "max_ms": max(times[tasks]),
                    "times_ms": times[tasks],
                    "bytes": size_bytes[tasks],
                    **queries,
                }
        finally:
            for proc in procs.values():
                proc.stop()
        small, large = sizes
        small_ms, large_ms = out[str(small)]["median_ms"], out[str(large)]["median_ms"]
        return {
            "page": page,
            "url": PAGES[page],
            "small": small,
            "large": large,
            "small_ms": small_ms,
            "large_ms": large_ms,
            "ratio": large_ms / small_ms,
            "sizes": out,
        }

    @staticmethod
    def _ask(proc: PageProcess, tasks: int, command: str | None, timeout: float) -> dict[str, Any]:
        try:
            return proc.ask(command, timeout)
        except BadAnswer as exc:
            # The process's log (a 500's traceback) first, the answer on the last line.
            raise RuntimeError(f"{proc.tail(3000)}\nat {tasks:,} tasks: {exc}") from None


def _median_mib(processes: list[dict[str, int]], field: str) -> float | None:
    values = [p[field] for p in processes if field in p]
    return statistics.median(values) / 1024 if values else None


def run_cells(
    bench: Bench, systems: list[str], seed: int, wanted: set[str]
) -> tuple[list[dict[str, Any]], list[list[str]]]:
    mode = bench.mode
    rng = random.Random(seed)
    cells: list[dict[str, Any]] = []
    orders: list[list[str]] = []
    for run in range(1, mode.runs + 1):
        order = list(systems)
        rng.shuffle(order)
        orders.append(order)
        for key in order:
            system = SYSTEMS[key](bench.ctx)
            plan: list[tuple[str, int | None]] = [("enqueue", None)]
            plan += [("drain", n) for n in mode.workers]
            plan.append(("latency", None))
            plan = [step for step in plan if step[0] in wanted]
            for cell_name, workers in plan:
                cell: dict[str, Any] = {"run": run, "system": key, "cell": cell_name}
                if workers is not None:
                    cell["workers"] = workers
                label = f"run {run}/{mode.runs} {system.label:<6} {cell_name}" + (
                    f" c{workers}" if workers else ""
                )
                if bench.over_budget():
                    cell["skipped"] = "time budget"
                    cells.append(cell)
                    print(f"{label}: skipped (time budget)", flush=True)
                    continue
                began = time.monotonic()
                try:
                    if cell_name == "enqueue":
                        cell.update(bench.enqueue(system))
                    elif cell_name == "drain":
                        assert workers is not None
                        cell.update(bench.drain(system, workers))
                    else:
                        cell.update(bench.latency(system))
                except Exception as exc:
                    cell["error"] = "".join(traceback.format_exception(exc))[-6000:]
                    stop_all()
                    with contextlib.suppress(Exception):
                        system.reset()
                cell["seconds"] = time.monotonic() - began
                cells.append(cell)
                print(f"{label}: {_brief(cell)} ({cell['seconds']:.1f} s)", flush=True)
        if "console" in wanted and "us" in systems:
            cells += console_cells(bench, run)
    return cells, orders


def console_cells(bench: Bench, run: int) -> list[dict[str, Any]]:
    """A run's console cells, after its system cells (the large data set's build then
    lands in none of them)."""
    cells: list[dict[str, Any]] = []
    for page in CONSOLE_PAGES:
        cell: dict[str, Any] = {"run": run, "system": "us", "cell": "console", "page": page}
        label = f"run {run}/{bench.mode.runs} US     console {page}"
        if bench.over_budget():
            cell["skipped"] = "time budget"
            cells.append(cell)
            print(f"{label}: skipped (time budget)", flush=True)
            continue
        began = time.monotonic()
        try:
            cell.update(bench.console(page))
        except Exception as exc:
            cell["error"] = "".join(traceback.format_exception(exc))[-6000:]
        cell["seconds"] = time.monotonic() - began
        cells.append(cell)
        print(f"{label}: {_brief(cell)} ({cell['seconds']:.1f} s)", flush=True)
    return cells


def _brief(cell: dict[str, Any]) -> str:
    if cell.get("error"):
        return "ERROR " + cell["error"].strip().splitlines()[-1][:200]
    if cell["cell"] == "console":
        return (
            f"{cell['small']:,} tasks {cell['small_ms']:.1f} ms, {cell['large']:,} tasks "
            f"{cell['large_ms']:.1f} ms, ratio {cell['ratio']:.2f}"
        )
    if cell["cell"] == "enqueue":
        return f"single {cell['single']['rate']:,.0f}/s, bulk {cell['bulk']['rate']:,.0f}/s"
    if cell["cell"] == "drain":
        text = f"{cell['throughput']:,.0f}/s"
        if cell.get("commits_per_step") is not None:
            text += f", {cell['commits_per_step']:.2f} commits/step"
        if cell.get("wal_bytes_per_step") is not None:
            text += f", {cell['wal_bytes_per_step']:,.0f} WAL B/step"
        if cell.get("rss_mib") is not None:
            text += f", RSS {cell['rss_mib']:.1f} MiB"
        if cell.get("capped"):
            text += f" (capped: {cell['done']}/{cell['total']})"
        return text
    parts = []
    for rate, res in cell["rates"].items():
        if "p99_ms" in res:
            parts.append(f"{rate}/s p50 {res['p50_ms']:.1f} p99 {res['p99_ms']:.1f} ms")
        else:
            parts.append(f"{rate}/s {res.get('error', '?')}")
    return "; ".join(parts)


# --- main ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--mode", choices=sorted(MODES), default="quick")
    parser.add_argument("--runs", type=int, help="override the mode's number of runs")
    parser.add_argument("--systems", default=",".join(ORDER), help="comma-separated subset")
    parser.add_argument("--seed", type=int, help="seed of the per-run system order")
    parser.add_argument(
        "--cells",
        default=",".join(ALL_CELLS),
        help="comma-separated subset of the cells (console: only with the system us)",
    )
    parser.add_argument("--senders", type=int, help="override the open loop's sender threads")
    parser.add_argument(
        "--docs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write the table into docs/performance.md (default: in full mode only)",
    )
    args = parser.parse_args(argv)
    mode = MODES[args.mode]
    if args.runs:
        mode = Mode(**{**asdict(mode), "runs": args.runs})
    if args.senders:
        mode = Mode(**{**asdict(mode), "senders": args.senders})
    cells = {c.strip() for c in args.cells.split(",") if c.strip()}
    if not cells or cells - set(ALL_CELLS):
        parser.error(f"--cells takes {', '.join(ALL_CELLS)}")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        parser.error(f"unknown systems: {', '.join(unknown)}")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    partial = systems != ORDER or cells != set(ALL_CELLS) or mode != MODES[args.mode]
    write_docs = args.docs if args.docs is not None else (mode.name == "full" and not partial)

    signal.signal(signal.SIGTERM, _on_sigterm)
    # A last resort past the budget and the longest cell: unwind and clean up.
    signal.signal(signal.SIGALRM, _on_sigterm)
    signal.alarm(int(mode.budget) + 900)
    database_url, redis_url = discover()
    bench_url = with_database(database_url, BENCH_DB)
    admin_url = with_database(database_url, "postgres")
    try:
        server = Server(admin_url, BENCH_DB)
        rds = redis.Redis.from_url(redis_url, socket_connect_timeout=3, socket_timeout=10)
        rds.ping()
    except (psycopg.Error, redis.RedisError) as exc:
        print(
            f"bench: PostgreSQL ({database_url}) or Redis ({redis_url}) is unreachable: {exc}\n"
            "Start them as `make test` says, or point DATABASE_URL / REDIS_URL at them.",
            file=sys.stderr,
        )
        return 2
    if not server.lock():
        print("bench: another benchmark run holds the lock on this server", file=sys.stderr)
        server.close()
        return 2

    # Keys a killed run left behind (we hold the lock: no other run is using them).
    for stale in ("bench-*", "benchstage-*"):
        for key in rds.scan_iter(match=stale, count=1000):
            rds.delete(key)
    token = f"{int(time.time())}-{os.getpid()}"
    work_dir = Path(tempfile.mkdtemp(prefix="task-console-bench-"))
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DJANGO_PRODUCTION", "TASKS_QUEUES", "DJANGO_SETTINGS_MODULE"}
    }
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DATABASE_URL": bench_url,
            "BENCH_DSN": bench_url,
            "REDIS_URL": redis_url,
            "TASKS_BROKER_PREFIX": f"bench-{token}:",
            "TASKS_VAR_DIR": str(work_dir / "var"),
            # Production-like: DEBUG would make Django keep every query in memory.
            "DJANGO_DEBUG": "0",
            "TASKS_LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
    )
    ctx = Ctx(
        dsn=bench_url,
        admin_dsn=admin_url,
        db_name=BENCH_DB,
        redis_url=redis_url,
        live_prefix=f"bench-{token}:",
        stage_prefix=f"benchstage-{token}:",
        work_dir=work_dir,
        env=env,
    )
    started_at = datetime.now(UTC)
    began = time.monotonic()
    print(
        f"bench: {mode.name} mode, {mode.runs} run(s), systems {', '.join(systems)}, "
        f"seed {seed}; database {BENCH_DB}, Redis prefix {ctx.live_prefix}",
        flush=True,
    )
    code_at_start = code_fingerprint()
    try:
        server.drop_others()
        server.create()
        prepare_database(ctx, server)
        env_info = environment(server, rds)
        bench = Bench(ctx, server, mode)
        results, orders = run_cells(bench, systems, seed, cells)
        console_data = bench.console_data
    finally:
        stop_all()
        with contextlib.suppress(Exception):
            server.drop()
        with contextlib.suppress(Exception):
            server.drop_others()
        with contextlib.suppress(Exception):
            ctx.purge_keys(ctx.live_prefix)
            ctx.purge_keys(ctx.stage_prefix)
        server.close()
        shutil.rmtree(work_dir, ignore_errors=True)

    summary = report.summarize(report.collect(results))
    stamp = started_at.strftime("%Y%m%dT%H%M%SZ")
    result: dict[str, Any] = {
        "meta": {
            "started": started_at.isoformat(timespec="seconds"),
            "duration_s": time.monotonic() - began,
            "mode": {
                **asdict(mode),
                "workers": list(mode.workers),
                "rates": list(mode.rates),
                "console_sizes": list(mode.console_sizes),
            },
            "systems": systems,
            "seed": seed,
            "orders": orders,
            "git": git_state(),
            "code_at_start": code_at_start,
            "code_at_end": code_fingerprint(),
            "environment": env_info,
            "console_data": console_data,
        },
        "cells": results,
        "summary": summary,
    }
    result["targets"] = report.evaluate(summary, result["meta"]["mode"])
    table = report.markdown(result)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    suffix = "-partial" if partial else ("" if mode.name == "full" else f"-{mode.name}")
    json_path = RESULTS_DIR / f"{stamp}{suffix}.json"
    md_path = RESULTS_DIR / f"{stamp}{suffix}.md"
    json_path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    md_path.write_text(f"# Benchmark {stamp} ({mode.name})\n\n{table}")
    if write_docs:
        report.update_docs(DOCS, table, f"bench/results/{md_path.name}")
    print("\n" + table)
    print(
        f"bench: wrote {json_path.relative_to(ROOT)} and {md_path.relative_to(ROOT)}"
        + (f" and {DOCS.relative_to(ROOT)}" if write_docs else "")
    )
    print(f"bench: took {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Interrupted as exc:
        print(
            f"bench: interrupted ({exc}); processes, database and keys cleaned up", file=sys.stderr
        )
        sys.exit(143)
