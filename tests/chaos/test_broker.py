"""Drills 4, 5, 7, 8 and 9: the broker redelivers, duplicates, forgets and stops answering
messages, and a producer dies before it could publish. A message is only a doorbell: the
database says what is due, the lease says who runs it, and the sweeper rings again for a
due step whose doorbell was lost."""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from datetime import datetime

import pytest
from django.conf import settings
from django.db import connection
from django.db.models import Max

from tasks_app import services
from tasks_app.db.clock import db_now
from tasks_app.engine.dispatch import Doorbell, publish
from tasks_app.history import timeline
from tasks_app.models import Event, EventKind, Lease, Step, StepStatus, Task, TaskStatus
from tests.chaos.harness import (
    RECEIVED,
    Cluster,
    Record,
    Remotes,
    assert_nothing_lost_or_done_twice,
    enqueue_workload,
    resumed_after,
    wait_for_drain,
)
from tests.chaos.services import OwnRedis
from tests.e2e_support import PYTHON, ROOT, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

RUN_STEP_DONE = r"Task tasks_app\.tasks\.run_step\[[^\]]+\] succeeded in"
# What an enqueue may take while the broker is down or hung: the publish wait, plus the
# database work of the enqueue itself.
ENQUEUE_BOUND = settings.TASKS_PUBLISH_WAIT_MS / 1000 + 0.5


def test_row_4_a_step_outliving_the_visibility_timeout_runs_once(
    cluster: Cluster, counting_remotes: Remotes, record_property: Record
) -> None:
    # Redis hands the unacknowledged message to another process after 3 s, while the
    # step runs for 10 s under a 2 s lease that its heartbeat keeps renewing.
    cluster.env.update(TASKS_LEASE_SECONDS="2", TASKS_BROKER_VISIBILITY_SECONDS="3")
    cluster.start(workers=1, concurrency=2)
    [worker] = cluster.workers
    task = services.enqueue("demo.flaky", {"sleep": 10}, idempotency_key="row4").task

    def redelivered() -> bool:
        return any(count > 1 for count in Counter(RECEIVED.findall(worker.output())).values())

    wait_for(redelivered, timeout=30, what=lambda: "a redelivery\n" + worker.tail())
    wait_for_drain([task.pk], cluster)

    assert_nothing_lost_or_done_twice([task.pk], counting_remotes)
    step = Step.objects.get(task=task)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.SUCCEEDED, 1, 1)
    assert list(step.leases.values_list("token", "outcome")) == [(1, Lease.Outcome.SUCCEEDED)]
    kinds = [entry.kind for entry in timeline.history(task.pk)]
    assert kinds == ["enqueued", "claimed", "succeeded"]
    assert step.finished_at and step.started_at
    ran = (step.finished_at - step.started_at).total_seconds()
    assert ran > 3 * 2, "the step should outlive several leases, renewed by its heartbeat"
    deliveries = max(Counter(RECEIVED.findall(worker.output())).values())
    record_property("deliveries_of_the_message", deliveries)


def test_row_5_every_message_delivered_three_times(
    cluster: Cluster, counting_remotes: Remotes, record_property: Record
) -> None:
    cluster.start(workers=1, concurrency=2)
    [worker] = cluster.workers
    mark = worker.mark()
    ids = enqueue_workload(60, label="row5", sleep=0.05)
    steps = list(Step.objects.filter(task__in=ids).values_list("pk", "queue"))
    # Three doorbells for every step, besides the enqueue's own and the sweeper's.
    for _ in range(3):
        publish([Doorbell(pk, queue) for pk, queue in steps])

    wait_for_drain(ids, cluster)
    wait_for(
        lambda: worker.count(RUN_STEP_DONE, since=mark) >= 3 * len(steps),
        timeout=60,
        what=lambda: "every doorbell to be handled\n" + worker.tail(),
    )
    statuses = assert_nothing_lost_or_done_twice(ids, counting_remotes)
    assert statuses == {TaskStatus.SUCCEEDED: len(ids)}
    claims = Counter(
        entry.step_id
        for history in timeline.histories(ids).values()
        for entry in history
        if entry.kind == EventKind.CLAIMED
    )
    assert claims == {pk: 1 for pk, _ in steps}
    stale = Event.objects.filter(task_id__in=ids, kind=EventKind.STALE_WRITE_REJECTED)
    assert not stale.exists()
    record_property("messages_handled", worker.count(RUN_STEP_DONE, since=mark))


def _progress(ids: list[int], at_least: int) -> None:
    wait_for(
        lambda: Task.objects.filter(pk__in=ids, status=TaskStatus.SUCCEEDED).count() >= at_least,
        timeout=60,
        what=f"{at_least} tasks to finish first",
    )


def test_row_7_redis_restarted_without_persistence(
    cluster: Cluster, counting_remotes: Remotes, own_redis: OwnRedis, record_property: Record
) -> None:
    cluster.start(workers=1, concurrency=2)
    ids = enqueue_workload(90, label="row7")
    _progress(ids, 10)
    # The fault lands while steps run and others wait: a single look can fall between one
    # step's end and the next claim (one process holds the batch), so wait for a moment
    # with both.
    at_restart: dict[str, int] = {}

    def running_and_queued() -> bool:
        at_restart["running"] = Step.objects.filter(task__in=ids, status=StepStatus.RUNNING).count()
        at_restart["queued"] = Step.objects.filter(task__in=ids, status=StepStatus.PENDING).count()
        return bool(at_restart["running"] and at_restart["queued"])

    wait_for(running_and_queued, timeout=30, what="steps running while others wait")
    running, queued = at_restart["running"], at_restart["queued"]

    own_redis.restart()  # every queued doorbell is gone
    back_at = db_now()

    wait_for_drain(ids, cluster, timeout=150)
    assert_nothing_lost_or_done_twice(ids, counting_remotes)
    record_property("running_and_queued_at_restart", f"{running}+{queued}")
    record_property("resumed_s", resumed_after(back_at))
    record_property("drained_s", _drained_since(ids, back_at))


def _drained_since(ids: list[int], moment: datetime) -> float:
    """Seconds from ``moment`` until the last of the tasks finished."""
    last = Task.objects.filter(pk__in=ids).aggregate(last=Max("finished_at"))["last"]
    assert isinstance(last, datetime)
    return round((last - moment).total_seconds(), 1)


def _timed_enqueues(label: str, count: int) -> tuple[list[int], float]:
    """Enqueue ``count`` tasks one by one; their ids, and the longest one took."""
    ids, longest = [], 0.0
    for n in range(count):
        began = time.monotonic()
        result = services.enqueue("demo.noop", {"n": n}, idempotency_key=f"{label}-{n}")
        longest = max(longest, time.monotonic() - began)
        ids.append(result.task.pk)
    return ids, longest


@pytest.mark.parametrize("fault", ["refusing", "hung"])
def test_row_8_producers_do_not_wait_on_a_broker_that_is_down(
    cluster: Cluster,
    counting_remotes: Remotes,
    own_redis: OwnRedis,
    record_property: Record,
    fault: str,
) -> None:
    cluster.start(workers=1, concurrency=2)
    if fault == "refusing":
        own_redis.stop()
    else:
        own_redis.pause()  # accepts connections, answers nothing

    ids, longest = _timed_enqueues(f"row8-{fault}", 20)
    assert longest < ENQUEUE_BOUND, f"an enqueue took {longest:.2f} s"
    assert Task.objects.filter(pk__in=ids, status=TaskStatus.PENDING).count() == len(ids)

    if fault == "refusing":
        own_redis.start()
    else:
        own_redis.resume()
    back_at = db_now()
    wait_for_drain(ids, cluster, timeout=150)
    statuses = assert_nothing_lost_or_done_twice(ids, counting_remotes)
    assert statuses == {TaskStatus.SUCCEEDED: len(ids)}
    record_property("longest_enqueue_s", round(longest, 3))
    record_property("drained_s", _drained_since(ids, back_at))


CRASH_AFTER_COMMIT = """
import os
from django.db import transaction
from tasks_app import services
with transaction.atomic():
    # Runs first after the commit, before the doorbell the enqueue registers.
    transaction.on_commit(lambda: os._exit(9))
    services.enqueue("demo.noop", {}, idempotency_key="row9-crashed")
"""


def test_row_9_a_producer_crashing_between_commit_and_publish(
    cluster: Cluster, counting_remotes: Remotes, own_redis: OwnRedis, record_property: Record
) -> None:
    producer = subprocess.run(
        [PYTHON, "manage.py", "shell", "-c", CRASH_AFTER_COMMIT],
        cwd=ROOT,
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert producer.returncode == 9, producer.stderr
    task = Task.objects.get(idempotency_key="row9-crashed")
    assert task.status == TaskStatus.PENDING
    prefix = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("global_keyprefix", "")
    assert own_redis.client().llen(f"{prefix}default") == 0, "a doorbell was published"

    cluster.start(workers=1, concurrency=2)  # its sweeper rings for the due step
    wait_for_drain([task.pk], cluster)
    assert_nothing_lost_or_done_twice([task.pk], counting_remotes)
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    assert task.finished_at
    record_property("recovery_s", round((task.finished_at - task.created_at).total_seconds(), 1))
    connection.close()
