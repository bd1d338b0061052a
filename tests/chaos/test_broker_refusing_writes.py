"""Drill 19: Redis refusing writes for ten seconds while work runs: out of memory under
``noeviction``; read-only as a replica (what a failover does to the old primary); and
restarted empty as a replica (a failover that also lost the data), where a reconnecting
consumer cannot even declare its queues.

Every worker (one as the drills run them, one as the Procfile does, with gossip, mingle
and event heartbeats), the maintenance worker and beat outlive it; while it lasts
``/readyz`` says the broker refuses writes, and where Redis serves no read of the queues
the worker nodes stop reporting themselves live; once Redis accepts writes, due work is
claimed again within seconds (the workers' own backstop rings for it: the sweeper's
re-ring is left at its deployed 30 s) and everything drains, once."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db.models import Max
from django.test import Client

from tasks_app.db.clock import db_now
from tasks_app.engine import presence
from tasks_app.models import Task, TaskStatus
from tests.chaos.harness import (
    Cluster,
    Record,
    Remotes,
    assert_nothing_lost_or_done_twice,
    enqueue_workload,
    resumed_after,
    wait_for_drain,
)
from tests.chaos.services import OwnRedis
from tests.e2e_support import Worker, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

FAULT_SECONDS = 10
# How soon after Redis accepts writes again a worker must claim due work.
RESUME_BOUND = 8.0


def _dead_processes(cluster: Cluster) -> list[str]:
    return [
        f"{process.log_path.stem} exited with {process.process.returncode}"
        for process in cluster.processes
        if process.process.poll() is not None
    ]


@pytest.mark.parametrize("fault", ["out_of_memory", "read_only", "failed_over"])
def test_row_19_workers_outlive_redis_refusing_writes(
    cluster: Cluster,
    counting_remotes: Remotes,
    own_redis: OwnRedis,
    record_property: Record,
    settings: Any,
    fault: str,
) -> None:
    # Nodes report every second and count as silent after three without a report; the
    # sweeper rings again for a step no sooner than as deployed.
    settings.TASKS_WORKER_SILENT_SECONDS = 3
    cluster.env.update(
        TASKS_HEARTBEAT_SECONDS="1", TASKS_WORKER_SILENT_SECONDS="3", TASKS_REDISPATCH_SECONDS="30"
    )
    cluster.start(workers=1, concurrency=2)
    # Another step worker as the Procfile starts it: gossip, mingle and the event
    # heartbeat on (the cluster's own run without them).
    procfile = Worker(
        ["--queues", "default", "--concurrency", "2", "--loglevel", "INFO", "-n", "procfile@%h"],
        env=cluster.env,
        log_path=cluster.folder / "procfile.log",
    )
    cluster.processes.append(procfile)
    procfile.wait_ready(timeout=90)
    ids = enqueue_workload(90, label=f"refused-{fault}")
    wait_for(
        lambda: Task.objects.filter(pk__in=ids, status=TaskStatus.SUCCEEDED).count() >= 10,
        timeout=60,
        what="10 tasks to finish first",
    )

    with own_redis.refusing_writes(fault):
        # Work keeps arriving: the enqueues stand, their doorbells are refused.
        ids += enqueue_workload(30, label=f"refused-{fault}-during", sleep=0.05)
        refused_at = time.monotonic()
        readiness = Client().get("/readyz")
        assert readiness.status_code == 503
        assert readiness.json()["checks"]["broker_writes"]["ok"] is False
        if fault != "out_of_memory":
            # Redis answers no read of a queue: the nodes stop saying they are live.
            wait_for(
                lambda: not any(row.state == "live" for row in presence.workers()),
                timeout=FAULT_SECONDS,
                what=lambda: "the nodes to stop reporting live\n" + cluster.tails(),
            )
            record_property("not_live_after_s", round(time.monotonic() - refused_at, 1))
        time.sleep(max(0.0, FAULT_SECONDS - (time.monotonic() - refused_at)))  # the fault
        assert not _dead_processes(cluster), cluster.tails()
    back_at = db_now()

    wait_for_drain(ids, cluster, timeout=120)
    assert not _dead_processes(cluster), "\n".join(_dead_processes(cluster)) + cluster.tails()
    assert_nothing_lost_or_done_twice(ids, counting_remotes)
    resumed = resumed_after(back_at)
    assert resumed < RESUME_BOUND, f"work resumed {resumed} s after Redis accepted writes"
    wait_for(
        lambda: sum(row.state == "live" for row in presence.workers()) == 3,
        timeout=10,
        what=lambda: "every node to report live again\n" + cluster.tails(),
    )
    record_property("resumed_s", resumed)
    last = Task.objects.filter(pk__in=ids).aggregate(last=Max("finished_at"))["last"]
    assert last is not None
    record_property("drained_s", round((last - back_at).total_seconds(), 1))
