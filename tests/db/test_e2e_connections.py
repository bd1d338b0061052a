"""End to end: a real prefork worker gives its database connections back once idle for
``CONN_MAX_AGE`` (here 2 s), and opens them again for the next task.

The worker runs without beat, so nothing but the test's own tasks reaches its pool
processes. Its sessions are told apart by name (``application_name``, ``celery:<pid>``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from tasks_app import services
from tasks_app.models import Task, TaskStatus
from tests.e2e_support import Worker, database_url, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(120),
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def idle_worker(tmp_path: Path) -> Iterator[Worker]:
    process = Worker(
        ["-c", "2", "--loglevel=INFO", "--without-gossip", "--without-mingle"],
        env={
            **os.environ,
            "DATABASE_URL": database_url(connection.settings_dict),
            "REDIS_URL": settings.REDIS_URL or "",
            "TASKS_BROKER_PREFIX": os.environ.get("TASKS_BROKER_PREFIX", ""),
            "TASKS_VAR_DIR": str(tmp_path / "var"),
            "TASKS_DB_CONN_MAX_AGE_SECONDS": "2",
        },
        log_path=tmp_path / "worker.log",
    )
    try:
        process.wait_ready(timeout=60)
        yield process
    finally:
        process.stop()


def pool_sessions(worker: Worker) -> list[str]:
    """The names of the sessions the worker's pool processes hold open now."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT application_name FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name LIKE 'celery:%%'"
        )
        names = [row[0] for row in cursor.fetchall()]
    return [name for name in names if worker.is_pool_child(int(name.split(":")[1]))]


def run_one(worker: Worker, label: str) -> None:
    task = services.enqueue("demo.noop", {"label": label}).task
    wait_for(
        lambda: Task.objects.filter(pk=task.pk, status=TaskStatus.SUCCEEDED).exists(),
        timeout=60,
        what=lambda: f"task {label} to succeed\n{worker.tail()}",
    )


def test_an_idle_worker_gives_its_connections_back_and_reconnects_for_the_next_task(
    idle_worker: Worker,
) -> None:
    run_one(idle_worker, "first")
    assert pool_sessions(idle_worker), "the pool process that ran the task holds no session"

    wait_for(
        lambda: not pool_sessions(idle_worker),
        timeout=30,
        what=lambda: (
            f"the idle pool processes to close their sessions: {pool_sessions(idle_worker)}"
        ),
    )

    run_one(idle_worker, "second")
    idle_worker.assert_quiet()
