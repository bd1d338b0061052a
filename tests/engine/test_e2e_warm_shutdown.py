"""A warm shutdown with SIGTERM to the worker's main process alone, as systemd's
``KillMode=mixed`` sends it (``deploy/systemd``): its pool process claims nothing more,
finishes the step it is running, and hands back, uncharged, the steps of its batch it has
not started (``tasks_app.engine.stopping``); another worker then runs them, each charged
one attempt in all. A real prefork worker on the test database and this run's Redis keys.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from tasks_app import services
from tasks_app.engine.runner import WORKER_STOPPING
from tasks_app.models import Event, EventKind, Lease, Step, StepStatus, Task, TaskStatus
from tests.e2e_support import Worker, database_url, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(180),
    pytest.mark.django_db(transaction=True),
]

# Quick steps first, so the drain's batches have grown (1, 2, 4, 8, 16: 31 steps) when it
# reaches the slow ones, which it then claims in one batch.
QUICK, SLOW, SLOW_SECONDS = 31, 24, 0.5


def step_worker(folder: Path, name: str) -> Worker:
    env = {
        **os.environ,
        "DATABASE_URL": database_url(connection.settings_dict),
        "REDIS_URL": settings.REDIS_URL or "",
        "TASKS_BROKER_PREFIX": os.environ.get("TASKS_BROKER_PREFIX", ""),
        "TASKS_VAR_DIR": str(folder / "var"),
    }
    worker = Worker(
        [
            *("--queues", "default", "--concurrency", "1", "--loglevel", "INFO"),
            *("-n", f"{name}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat"),
        ],
        env=env,
        log_path=folder / f"{name}.log",
    )
    worker.wait_ready(timeout=60)
    return worker


def items() -> list[dict[str, Any]]:
    quick = [
        {"workflow": "demo.noop", "payload": {}, "priority": 10, "idempotency_key": f"q-{n}"}
        for n in range(QUICK)
    ]
    slow = [
        {
            "workflow": "demo.flaky",
            "payload": {"sleep": SLOW_SECONDS},
            "idempotency_key": f"s-{n}",
        }
        for n in range(SLOW)
    ]
    return [*quick, *slow]


def held_by(worker: Worker) -> dict[int, int]:
    """The token of each step a pool process of ``worker`` holds a lease on now."""
    held = {}
    running = Step.objects.filter(status=StepStatus.RUNNING)  # each holds its live lease
    for step_id, token, worker_id in running.values_list("pk", "fencing_token", "lease_worker"):
        if worker.is_pool_child(int(worker_id.rsplit(":", 1)[1])):
            held[step_id] = token
    return held


def test_a_stopping_worker_claims_nothing_more_finishes_its_step_and_hands_back_the_rest(
    tmp_path: Path,
) -> None:
    first = step_worker(tmp_path, "first")
    try:
        ids = [r.task.pk for r in services.enqueue_many(items(), actor="test:e2e")]
        slow = set(Step.objects.filter(task__in=ids, kind="flaky").values_list("pk", flat=True))

        def holding_a_slow_batch() -> dict[int, int] | None:
            held = held_by(first)
            return held if len(set(held) & slow) >= 3 else None

        held = wait_for(
            holding_a_slow_batch,
            timeout=60,
            what=lambda: "the worker to hold a batch of slow steps\n" + first.tail(),
        )
        os.kill(first.pid, signal.SIGTERM)
        signalled_at = services.db_now()
        assert first.process.wait(timeout=60) == 0, first.tail()
    finally:
        first.stop()
    child = next(iter(Lease.objects.filter(step_id__in=held).values_list("worker_id", flat=True)))

    # Nothing claimed after the signal.
    assert not Lease.objects.filter(worker_id=child, acquired_at__gt=signalled_at).exists()
    # Each step held was either run to its end under the lease it held (it had started),
    # or handed back uncharged: due again with no attempt counted, its token kept.
    finished, handed_back = [], []
    for step in Step.objects.filter(pk__in=held):
        lease = step.leases.get(token=held[step.pk])
        if lease.outcome == Lease.Outcome.SUCCEEDED:
            assert (step.status, step.attempts) == (StepStatus.SUCCEEDED, 1)
            finished.append(step.pk)
        else:
            assert lease.outcome == Lease.Outcome.RELEASED, (step.pk, lease.outcome)
            assert (step.status, step.attempts, step.fencing_token) == (
                StepStatus.PENDING,
                0,
                held[step.pk],
            )
            handed_back.append(step.pk)
    assert finished, "the step running at the signal was not finished"
    assert len(handed_back) >= 2, f"nothing handed back of {len(held)} held"
    released = Event.objects.filter(kind=EventKind.CLAIM_RELEASED, step_id__in=handed_back)
    assert sorted(pk or 0 for pk in released.values_list("step_id", flat=True)) == sorted(
        handed_back
    )
    assert set(released.values_list("reason", flat=True)) == {WORKER_STOPPING}

    # Another worker runs the rest: every step charged one attempt in all, none expired.
    second = step_worker(tmp_path, "second")
    try:
        wait_for(
            lambda: (
                Task.objects.filter(pk__in=ids, status=TaskStatus.SUCCEEDED).count() == len(ids)
            ),
            timeout=90,
            what=lambda: "every task to succeed\n" + second.tail(),
        )
    finally:
        second.stop()
    assert set(Step.objects.filter(task__in=ids).values_list("attempts", flat=True)) == {1}
    assert not Lease.objects.filter(step__task__in=ids, outcome=Lease.Outcome.EXPIRED).exists()
