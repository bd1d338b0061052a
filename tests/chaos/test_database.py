"""Drill 10: PostgreSQL restarted (as after a crash: every session cut) and the workers'
sessions killed with ``pg_terminate_backend``, while steps run. Workers, the sweeper and
beat reconnect; a step whose outcome could not be written runs again once its lease runs
out."""

from __future__ import annotations

import pytest
from django.db import connection

from tasks_app.db.clock import db_now
from tasks_app.models import StepStatus, Task, TaskStatus
from tests.chaos.harness import (
    Cluster,
    Record,
    Remotes,
    assert_nothing_lost_or_done_twice,
    enqueue_workload,
    resumed_after,
    wait_for_drain,
)
from tests.chaos.services import OwnPostgres
from tests.e2e_support import wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]


def _started(cluster: Cluster, label: str) -> list[int]:
    cluster.start(workers=1, concurrency=2)
    ids = enqueue_workload(90, label=label)
    wait_for(
        lambda: Task.objects.filter(pk__in=ids, status=TaskStatus.SUCCEEDED).count() >= 10,
        timeout=60,
        what="10 tasks to finish first",
    )
    wait_for(
        lambda: Task.objects.filter(pk__in=ids, steps__status=StepStatus.RUNNING).exists(),
        timeout=30,
        what="a step to run",
    )
    return ids


def test_row_10_postgresql_restarted(
    cluster: Cluster, counting_remotes: Remotes, own_postgres: OwnPostgres, record_property: Record
) -> None:
    ids = _started(cluster, "row10-restart")

    own_postgres.restart(mode="immediate")
    connection.close()  # this process's session was cut too
    back_at = db_now()

    wait_for_drain(ids, cluster, timeout=150)
    assert_nothing_lost_or_done_twice(ids, counting_remotes)
    record_property("resumed_s", resumed_after(back_at))


def test_row_10_worker_sessions_terminated(
    cluster: Cluster, counting_remotes: Remotes, own_postgres: OwnPostgres, record_property: Record
) -> None:
    ids = _started(cluster, "row10-terminate")

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        [mine] = cursor.fetchone() or [None]
    killed = own_postgres.terminate_backends(connection.settings_dict["NAME"], keep=mine)
    assert killed, "no worker session was terminated"
    at = db_now()

    wait_for_drain(ids, cluster, timeout=150)
    assert_nothing_lost_or_done_twice(ids, counting_remotes)
    record_property("sessions_terminated", killed)
    record_property("resumed_s", resumed_after(at))
