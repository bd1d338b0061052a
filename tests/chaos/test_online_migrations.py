"""Drill 26: migrating a database of 1,000,000 tasks while workers run.

The migrations that build or drop indexes on the big tables are taken out of the
database while it is small (each unapplied as Django's executor unapplies it), 1,000,000
finished tasks with their steps, leases and events are loaded with bulk SQL, a cluster
starts, a producer enqueues steadily, and the migrations are put back (each applied as
``migrate`` applies it, with the release line's settings: no statement timeout) while the
workers claim and complete. The migrations between them stay: the code running now needs
the column 0004 adds and the table 0009 adds.

Measured while migrating: the longest gap between two completions, the slowest enqueue,
the longest any other session waited for a lock, lock timeouts in the workers' and the
producer's output. Every task of the workload must succeed, once.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.db import connection
from django.db.migrations.recorder import MigrationRecorder

from tasks_app.db.clock import db_now
from tasks_app.history import TaskState, fold
from tasks_app.models import Step, StepStatus, Task, TaskStatus
from tasks_app.observability import invariants
from tests.chaos.harness import Cluster, Record, wait_for_drain
from tests.e2e_support import PYTHON, ROOT, database_url, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(600), pytest.mark.no_fold_check]

TASKS = 1_000_000
# Those of the migrations of the big tables that build or drop indexes, in order.
INDEX_MIGRATIONS = [
    "0003_lighter_indexes",
    "0005_console_indexes",
    "0006_partial_task_indexes",
    "0007_heap_only_lease_updates",
    "0008_cancelled_finished_index",
    "0010_metrics_indexes_and_longer_counter_names",
    # Also copies every task's payload, in batches, and moves the payload's GIN index.
    "0014_payload_search",
]
# Work must keep flowing: no completion waits longer than this for the one before it
# (the migration's DDL waits at most TASKS_MIGRATION_LOCK_TIMEOUT_MS, 2 s, for a lock).
LONGEST_GAP_S = 3.0
LOCK_TIMEOUT = re.compile(r"lock timeout|LockNotAvailable", re.I)

EXECUTOR = """
import time
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

with connection.cursor() as cursor:
    cursor.execute("SELECT pg_backend_pid()")
    print("pid", cursor.fetchone()[0], flush=True)
executor = MigrationExecutor(connection)
for name in {names!r}:
    key = ("tasks_app", name)
    migration = executor.loader.graph.nodes[key]
    state = executor.loader.project_state(key, at_end=False)
    started = time.monotonic()
    executor.{method}(state, migration)
    print("done", name, round(time.monotonic() - started, 2), flush=True)
"""

PRODUCER = """
import os, time
from tasks_app import services
n = 0
while not os.path.exists(os.environ["ROW26_STOP"]):
    started = time.time()
    try:
        services.enqueue("demo.noop", {"n": n}, idempotency_key=f"row26-{n}")
        print("ok", n, started, round(time.time() - started, 3), flush=True)
    except Exception as exc:
        print("failed", n, started, round(time.time() - started, 3), repr(exc), flush=True)
    n += 1
    time.sleep(0.02)
"""

LOAD = [
    # Finished 20 days ago: inside the retention window, outside the checker's.
    """
    INSERT INTO tasks_app_task (workflow, workflow_version, payload, payload_hash,
        idempotency_key, queue, priority, status, created_by, created_at, updated_at,
        finished_at)
    SELECT 'demo.noop', 1, jsonb_build_object('n', g, 'customer', 'c' || g % 10000),
        md5(g::text) || md5(g::text), 'old-' || g, 'default', 0, 'succeeded', 'loader',
        at, at, at + interval '1 s'
    FROM generate_series(1, {tasks}) AS g,
        LATERAL (SELECT now() - interval '20 days' + g * interval '1 ms' AS at) AS t
    """,
    # Each table's statistics before the next insert checks its foreign keys against it:
    # planned on the statistics of the small table an earlier drill left, each row's check
    # would scan the whole table.
    "ANALYZE tasks_app_task",
    """
    INSERT INTO tasks_app_step (task_id, position, revision, kind, status, queue, priority,
        attempts, max_attempts, available_at, idempotency_key, fencing_token,
        dispatched_at, result, last_error, error_class, started_at, finished_at)
    SELECT id, 0, 0, 'noop', 'succeeded', 'default', 0, 1, 3, created_at,
        idempotency_key || ':0:noop', 1, created_at, '{}', '', '', created_at, finished_at
    FROM tasks_app_task WHERE created_by = 'loader'
    """,
    "ANALYZE tasks_app_step",
    """
    INSERT INTO tasks_app_lease (step_id, token, worker_id, acquired_at, expires_at,
        released_at, outcome)
    SELECT id, 1, 'loader@host:1', started_at, started_at + interval '30 s', finished_at,
        'succeeded'
    FROM tasks_app_step WHERE idempotency_key LIKE 'old-%'
    """,
    """
    INSERT INTO tasks_app_event (task_id, step_id, kind, actor, reason, data, created_at)
    SELECT s.task_id, e.step_id, e.kind, e.actor, '', e.data, e.at
    FROM tasks_app_step AS s, LATERAL (VALUES
        (NULL::bigint, 'enqueued', 'loader', '{}'::jsonb, s.available_at),
        (s.id, 'succeeded', 'worker:loader@host:1', '{"token": 1}'::jsonb, s.finished_at)
    ) AS e (step_id, kind, actor, data, at)
    WHERE s.idempotency_key LIKE 'old-%'
    """,
    "ANALYZE",
]


def _executor(names: list[str], method: str) -> list[str]:
    """A ``manage.py`` command running ``method`` of Django's migration executor on each
    of ``names``, in that order."""
    script = EXECUTOR.format(names=names, method=method)
    return [PYTHON, "manage.py", "shell", "-v", "0", "-c", script]


def _applied() -> set[str]:
    recorder = MigrationRecorder(connection)
    return {name for app, name in recorder.applied_migrations() if app == "tasks_app"}


@pytest.fixture
def index_migrations_out(cluster: Cluster) -> Iterator[None]:
    """The index migrations unapplied (the tables still small); put back after the drill
    if it did not put them back itself."""
    out = subprocess.run(
        _executor(INDEX_MIGRATIONS[::-1], "unapply_migration"),
        cwd=ROOT,
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    yield
    missing = [name for name in INDEX_MIGRATIONS if name not in _applied()]
    if missing:
        subprocess.run(
            _executor(missing, "apply_migration"),
            cwd=ROOT,
            env={**cluster.env, "TASKS_DB_STATEMENT_TIMEOUT_MS": "0"},
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        )


class LockWaits(threading.Thread):
    """Samples ``pg_stat_activity`` and keeps the longest wait for a lock of any session
    but those in ``exclude`` (the migration's own waits make nobody wait)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.exclude: list[int] = []
        self.longest = 0.0
        self.what = ""
        self.stop = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.is_set():
                row = conn.execute(
                    "SELECT extract(epoch FROM now() - query_start)::float, application_name,"
                    " left(query, 80) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND datname = current_database() AND pid <> ALL(%s)"
                    " ORDER BY 1 DESC LIMIT 1",
                    [self.exclude],
                ).fetchone()
                if row and row[0] > self.longest:
                    self.longest, self.what = row[0], f"{row[1]}: {row[2]}"
                self.stop.wait(0.05)


def _load(url: str) -> float:
    started = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET statement_timeout = 0")
        for statement in LOAD:
            conn.execute(statement.replace("{tasks}", str(TASKS)).encode())
    return round(time.monotonic() - started, 1)


def _longest_gap(moments: list[float], start: float, end: float) -> float:
    """The longest stretch of [start, end] without a completion."""
    points = [start, *sorted(m for m in moments if start < m < end), end]
    return round(max(b - a for a, b in itertools.pairwise(points)), 2)


def test_row_26_migrating_a_million_tasks_while_workers_run(
    cluster: Cluster, index_migrations_out: None, tmp_path: Path, record_property: Record
) -> None:
    assert not set(INDEX_MIGRATIONS) & _applied()
    url = database_url(connection.settings_dict)
    record_property("load_s", _load(url))
    assert Task.objects.filter(created_by="loader").count() == TASKS
    since = db_now()

    cluster.start(workers=2, concurrency=2)
    stop = tmp_path / "stop-producer"
    producer_log = tmp_path / "producer.log"
    with producer_log.open("w") as out:
        producer = subprocess.Popen(
            [PYTHON, "manage.py", "shell", "-v", "0", "-c", PRODUCER],
            cwd=ROOT,
            env={**cluster.env, "ROW26_STOP": str(stop)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    workload = Task.objects.filter(idempotency_key__startswith="row26-")
    wait_for(
        lambda: workload.filter(status=TaskStatus.SUCCEEDED).count() >= 50,
        timeout=120,
        what=lambda: "work to flow before migrating\n" + cluster.tails(),
    )

    waits = LockWaits(url)
    waits.start()
    migrate_log = tmp_path / "migrate.log"
    with migrate_log.open("w") as out:
        migrating = subprocess.Popen(
            _executor(INDEX_MIGRATIONS, "apply_migration"),
            cwd=ROOT,
            env={**cluster.env, "TASKS_DB_STATEMENT_TIMEOUT_MS": "0"},
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    began = time.time()
    pid = wait_for(
        lambda: re.search(r"^pid (\d+)", migrate_log.read_text(), re.M),
        timeout=60,
        what="the migration to start",
    )
    waits.exclude.append(int(pid.group(1)))
    migrating.wait(timeout=400)
    ended = time.time()
    migrated = migrating.returncode == 0
    # A little more work after, then the producer stops and the workload drains.
    wait_for(lambda: time.time() - ended > 2, timeout=5, interval=0.2)
    stop.touch()
    producer.wait(timeout=60)
    waits.stop.set()
    waits.join(timeout=10)
    ids = list(workload.values_list("pk", flat=True))
    wait_for_drain(ids, cluster, timeout=180)

    finished = [
        at.timestamp()
        for at in Step.objects.filter(task__in=ids).values_list("finished_at", flat=True)
        if at is not None
    ]
    calls = [line.split() for line in producer_log.read_text().splitlines()]
    enqueues = [(float(c[2]), float(c[3])) for c in calls if c[0] in ("ok", "failed")]
    failed = [c for c in calls if c[0] == "failed"]
    lock_timeouts = sum(len(LOCK_TIMEOUT.findall(w.output())) for w in cluster.workers) + len(
        LOCK_TIMEOUT.findall(producer_log.read_text())
    )
    durations = dict(re.findall(r"^done (\S+) ([\d.]+)", migrate_log.read_text(), re.M))
    gap = _longest_gap(finished, began, ended)
    slowest_enqueue = max((latency for at, latency in enqueues if began <= at <= ended), default=0)
    during = sum(1 for m in finished if began < m < ended)
    record_property("migrate_s", round(ended - began, 1))
    record_property("per_migration_s", durations)
    record_property("completions_while_migrating", during)
    record_property("longest_completion_gap_s", gap)
    record_property("slowest_enqueue_s", slowest_enqueue)
    record_property("longest_lock_wait_s", round(waits.longest, 2))
    record_property("lock_timeouts", lock_timeouts)
    record_property("enqueues_failed", len(failed))

    assert migrated, migrate_log.read_text()[-3000:]
    assert set(INDEX_MIGRATIONS) <= _applied()
    assert not failed, failed[:5]
    assert lock_timeouts == 0, cluster.tails()
    assert gap < LONGEST_GAP_S, (gap, durations)
    assert waits.longest < LONGEST_GAP_S, (waits.longest, waits.what)
    assert during > 0
    # Every task of the workload ran once and its history folds to its state.
    statuses = set(workload.values_list("status", flat=True))
    assert statuses == {TaskStatus.SUCCEEDED}, statuses
    assert not Step.objects.filter(task__in=ids).exclude(status=StepStatus.SUCCEEDED).exists()
    assert all(fold(task) == TaskState.from_db(task) for task in workload)
    report = invariants.check(since=since)
    assert report.ok, report.findings[:10]
