"""Drill 20: a step that kills its process, claimed in one batch with healthy steps: the
crash costs only the step that crashed. The worker's main process hands back the rest of
the batch at once, uncharged, and ends the crashing step's lease without waiting for it
to run out (``tasks_app.engine.crashes``)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from tasks_app import services
from tasks_app.exceptions import LEASE_EXPIRED
from tasks_app.models import Event, EventKind, Lease, Step, StepStatus, TaskStatus
from tests.chaos.harness import (
    Cluster,
    Record,
    Remotes,
    assert_nothing_lost_or_done_twice,
    wait_for_drain,
)

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

# Long beside the recovery asserted: a step charged for the crash would wait all of it.
LEASE_SECONDS = 30
RECOVERED_WITHIN = timedelta(seconds=5)
# Quick steps claimed first, so the drain's batches have grown by the time it reaches the
# poison step; the rest come after it, half of them failing twice before they succeed.
WARM_UP = 40
AFTER = 40


def _items() -> list[dict[str, Any]]:
    def flaky(n: int, payload: dict[str, Any], priority: int) -> dict[str, Any]:
        return {
            "workflow": "demo.flaky",
            "payload": payload,
            "priority": priority,
            "idempotency_key": f"crash-batch-{n}",
        }

    warm_up = [flaky(n, {}, 10) for n in range(WARM_UP)]
    poison = flaky(WARM_UP, {"error": "crash", "fail_first": 99}, 5)
    after = [flaky(WARM_UP + 1 + n, {"fail_first": 2} if n % 2 else {}, 0) for n in range(AFTER)]
    return [*warm_up, poison, *after]


def test_row_20_a_crash_costs_only_the_crashing_step(
    cluster: Cluster, counting_remotes: Remotes, record_property: Record
) -> None:
    cluster.env["TASKS_LEASE_SECONDS"] = str(LEASE_SECONDS)
    # Enqueued before the worker starts: its first drain claims them in priority order, in
    # batches that double while the steps are quick.
    results = services.enqueue_many(_items(), actor="test:chaos")
    ids = [result.task.pk for result in results]
    poison_task = ids[WARM_UP]
    healthy = [pk for pk in ids if pk != poison_task]
    # Two pool processes: the one left runs what the other's death handed back (Celery
    # replaces a dead pool process only at its next check, up to five seconds later).
    cluster.start(workers=1, concurrency=2)

    wait_for_drain(ids, cluster, timeout=150)

    # The batch the poison step crashed: the leases its claim statement took with it.
    poison = Step.objects.get(task_id=poison_task)
    poison_leases = list(poison.leases.order_by("token"))
    crash = poison_leases[0]
    mates = {
        lease.step_id: lease
        for lease in Lease.objects.filter(
            worker_id=crash.worker_id, acquired_at=crash.acquired_at
        ).exclude(step=poison)
    }
    released = {
        event.step_id: event
        for event in Event.objects.filter(kind=EventKind.CLAIM_RELEASED, step_id__in=mates)
    }
    charged = Lease.objects.filter(step__task_id__in=healthy, outcome=Lease.Outcome.EXPIRED)
    finished = max(
        (step.finished_at for step in Step.objects.filter(pk__in=mates) if step.finished_at),
        default=crash.acquired_at,
    )
    ran = sum(1 for event in released.values() if event.data["ran"])

    def since_crash(moment: datetime | None) -> float | None:
        return round((moment - crash.acquired_at).total_seconds(), 2) if moment else None

    record_property("batch", len(mates) + 1)
    record_property("released_finished", ran)
    record_property("released_unstarted", len(released) - ran)
    record_property("charged", charged.count())
    record_property(
        "healthy_dead", Step.objects.filter(task_id__in=healthy, status=StepStatus.DEAD).count()
    )
    record_property(
        "released_s", since_crash(max((e.created_at for e in released.values()), default=None))
    )
    record_property("mates_done_s", since_crash(finished))
    record_property("poison_lease_ended_s", since_crash(crash.released_at))
    record_property("poison_dead_s", since_crash(poison.finished_at))

    assert len(mates) >= 2, f"the poison step shared its batch with {len(mates)} step(s)"
    # Every step of its batch was handed back at once, uncharged, and done within seconds.
    assert {lease.outcome for lease in mates.values()} == {Lease.Outcome.RELEASED}
    assert set(released) == set(mates)
    assert all(event.data["running_step"] == poison.pk for event in released.values())
    assert finished - crash.acquired_at < RECOVERED_WITHIN, finished - crash.acquired_at
    # No healthy step was dead-lettered or charged for the crash: every claim counts as an
    # attempt but the released ones, and none of their leases expired.
    statuses = assert_nothing_lost_or_done_twice(healthy, counting_remotes)
    assert statuses == {TaskStatus.SUCCEEDED: len(healthy)}
    assert not charged.exists()
    for step in Step.objects.filter(task_id__in=healthy):
        uncharged = step.leases.filter(outcome=Lease.Outcome.RELEASED).count()
        assert step.attempts == step.fencing_token - uncharged, step

    # The poison step kept the treatment of an expired lease: three attempts, each charged,
    # the first ended long before its lease would have run out.
    assert (poison.status, poison.error_class) == (StepStatus.DEAD, LEASE_EXPIRED)
    assert poison.attempts == poison.max_attempts == 3
    assert [lease.outcome for lease in poison_leases] == [Lease.Outcome.EXPIRED] * 3
    assert crash.released_at is not None
    assert crash.released_at - crash.acquired_at < timedelta(seconds=LEASE_SECONDS / 2)
