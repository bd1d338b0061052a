"""The load drill: 3,000 tasks on 2 workers while a worker is killed again and again, the
database's sessions are killed once and Redis is restarted once. Every task settles and
the checker is clean (asserted); the throughput after the last fault, as a share of a
clean run's, is recorded (the goal is above 90%, not asserted: shared machines are noisy)."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from tasks_app.models import Task
from tests.e2e_support import wait_for

from .harness import (
    SETTLED,
    Cluster,
    Record,
    Remotes,
    assert_nothing_lost_or_done_twice,
    enqueue_workload,
    wait_for_drain,
)
from .services import OwnPostgres, OwnRedis

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(900)]

LOAD = 3000
SLEEP = 0.02


def _settled(ids: list[int]) -> int:
    return Task.objects.filter(pk__in=ids, status__in=SETTLED).count()


def _wait_until_settled(ids: list[int], count: int, cluster: Cluster) -> None:
    wait_for(
        lambda: _settled(ids) >= count,
        timeout=300,
        what=lambda: f"{count} tasks to settle\n" + cluster.tails(),
    )


def _drain_rate(ids: list[int], cluster: Cluster) -> float:
    began = time.monotonic()
    return len(ids) / (wait_for_drain(ids, cluster, timeout=600) - began)


def test_load_3000_tasks_through_worker_kills_a_database_fault_and_a_redis_restart(
    cluster: Cluster,
    counting_remotes: Remotes,
    own_postgres: OwnPostgres,
    own_redis: OwnRedis,
    record_property: Record,
) -> None:
    cluster.start(workers=2, concurrency=2)
    clean = enqueue_workload(LOAD, label="clean", sleep=SLEEP)
    clean_rate = _drain_rate(clean, cluster)

    ids = enqueue_workload(LOAD, label="load", sleep=SLEEP)

    def kill_a_worker() -> None:
        # The fault lasts until its replacement is ready, as a supervisor would start it.
        cluster.kill(cluster.workers[0])
        cluster.add_worker()

    def kill_database_sessions() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            [mine] = cursor.fetchone() or [None]
        own_postgres.terminate_backends(connection.settings_dict["NAME"], keep=mine)

    # Each fault once another tenth of the work has settled: the second half runs clean.
    faults = [kill_a_worker, kill_database_sessions, kill_a_worker, own_redis.restart]
    for tenth, fault in enumerate([*faults, kill_a_worker], start=1):
        _wait_until_settled(ids, LOAD * tenth // 10, cluster)
        fault()
    last_fault = time.monotonic()  # and every worker is up again
    left = LOAD - _settled(ids)

    drained = wait_for_drain(ids, cluster, timeout=600)
    statuses = assert_nothing_lost_or_done_twice([*clean, *ids], counting_remotes)
    after_rate = left / (drained - last_fault)
    record_property("clean_per_s", round(clean_rate))
    record_property("after_last_fault_per_s", round(after_rate))
    record_property("share", f"{after_rate / clean_rate:.0%}")
    record_property("statuses", dict(statuses))
