"""Drills 1, 2, 3 and 11: worker processes killed, shut down and crashed by their own
step, while they hold leases. Each step they held runs again once its lease runs out (or
waits for a person, if a write without idempotency keys was cut after sending it)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from datetime import datetime

import pytest

from tasks_app import services
from tasks_app.db.clock import db_now
from tasks_app.exceptions import LEASE_EXPIRED
from tasks_app.models import Lease, Step, StepStatus, TaskStatus
from tests.chaos.harness import (
    Cluster,
    Record,
    Remotes,
    assert_cut_steps_ran_again,
    assert_nothing_lost_or_done_twice,
    enqueue_workload,
    record_cut,
    resumed_after,
    wait_for_drain,
)
from tests.e2e_support import Worker

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]


def test_row_1_a_worker_child_killed_mid_step(
    cluster: Cluster, counting_remotes: Remotes, record_property: Record
) -> None:
    cluster.start(workers=1, concurrency=2)
    ids = enqueue_workload(60, label="row1")

    killed: list[int] = []
    tokens: dict[int, int] = {}
    fault_at = db_now()
    for _ in range(3):
        pid, held = cluster.wait_until_held(besides=killed)
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)
        tokens.update(held)

    wait_for_drain(ids, cluster)
    assert_nothing_lost_or_done_twice(ids, counting_remotes)
    record_cut(record_property, assert_cut_steps_ran_again(tokens, fault_at))


def _hit_a_busy_worker(
    cluster: Cluster,
    remotes: Remotes,
    label: str,
    fault: Callable[[Worker], None],
    *,
    sleep: float = 0.2,
) -> tuple[dict[int, int], datetime]:
    """With two workers draining 60 tasks, ``fault`` hits the first once it holds steps;
    waits for the drain and runs the checker. Returns the tokens the worker held then, and
    when (the database's clock)."""
    cluster.start(workers=2, concurrency=2)
    ids = enqueue_workload(60, label=label, sleep=sleep)
    victim = cluster.workers[0]
    cluster.wait_until_held(by=victim)
    tokens = cluster.held_by(victim)
    fault_at = db_now()
    fault(victim)
    wait_for_drain(ids, cluster)
    assert_nothing_lost_or_done_twice(ids, remotes)
    return tokens, fault_at


def test_row_2_a_whole_worker_killed_and_restarted(
    cluster: Cluster, counting_remotes: Remotes, record_property: Record
) -> None:
    def kill_and_replace(victim: Worker) -> None:
        cluster.kill(victim)
        cluster.add_worker()

    tokens, fault_at = _hit_a_busy_worker(cluster, counting_remotes, "row2", kill_and_replace)
    record_cut(record_property, assert_cut_steps_ran_again(tokens, fault_at))


def test_row_3_a_warm_shutdown_finishes_its_steps(
    cluster: Cluster, counting_remotes: Remotes, record_property: Record
) -> None:
    def warm_shutdown(victim: Worker) -> None:
        cluster.signal(victim, signal.SIGTERM)
        assert victim.process.wait(timeout=60) == 0, victim.tail()

    tokens, fault_at = _hit_a_busy_worker(cluster, counting_remotes, "row3-warm", warm_shutdown)
    # A warm shutdown lets the running steps finish under the lease they hold.
    for step in Step.objects.filter(pk__in=tokens):
        assert (step.status, step.fencing_token) == (StepStatus.SUCCEEDED, tokens[step.pk])
        assert step.leases.get(token=tokens[step.pk]).outcome == Lease.Outcome.SUCCEEDED
    record_property("shutdown_finished_steps", len(tokens))
    record_property("resumed_s", resumed_after(fault_at))


def test_row_3_a_cold_shutdown_leaves_its_steps_to_run_again(
    cluster: Cluster, counting_remotes: Remotes, record_property: Record
) -> None:
    def cold_shutdown(victim: Worker) -> None:
        cluster.signal(victim, signal.SIGQUIT)
        victim.process.wait(timeout=60)

    tokens, fault_at = _hit_a_busy_worker(
        cluster, counting_remotes, "row3-cold", cold_shutdown, sleep=0.6
    )
    record_cut(record_property, assert_cut_steps_ran_again(tokens, fault_at))


def test_row_11_a_poison_step_is_dead_lettered_and_other_work_flows(
    cluster: Cluster, counting_remotes: Remotes, record_property: Record
) -> None:
    cluster.start(workers=1, concurrency=2)
    began = time.monotonic()
    poison = [
        services.enqueue(
            "demo.flaky", {"error": "crash", "fail_first": 99}, idempotency_key=f"poison-{n}"
        ).task.pk
        for n in range(2)
    ]
    ids = enqueue_workload(90, label="row11", sleep=0.05)

    drained = wait_for_drain([*poison, *ids], cluster, timeout=150)
    statuses = assert_nothing_lost_or_done_twice(ids, counting_remotes)
    # Every other task finished: a crash took no other step's attempts along more than
    # once, since a step whose lease ran out is claimed alone.
    assert statuses == {TaskStatus.SUCCEEDED: len(ids)}
    for step in Step.objects.filter(task__in=poison):
        assert (step.status, step.error_class) == (StepStatus.DEAD, LEASE_EXPIRED)
        assert step.attempts == step.max_attempts == 3
        outcomes = list(step.leases.order_by("token").values_list("outcome", flat=True))
        assert outcomes == [Lease.Outcome.EXPIRED] * 3
    record_property("drain_s", round(drained - began, 1))
