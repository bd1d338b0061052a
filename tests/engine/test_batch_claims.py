"""Claiming in batches (``fastpath.claim_batch``): which due steps a batch takes, in what
order and how many; a step whose lease ran out claimed only alone; what each claim writes
and the rows it hands the worker; and workers claiming at once, against each other and
against cancels of the same tasks. Batches keep every guarantee of the one-step path
(DESIGN rules 1, 2, 3, 8 and 10), on PostgreSQL.

Time moves by back-dating rows (``backdate``), never by sleeping. The racing tests need
other database connections and are transactional.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from tasks_app import services
from tasks_app.engine import fastpath, runner, sql
from tasks_app.exceptions import LEASE_EXPIRED, InvalidTransition
from tasks_app.history import timeline
from tasks_app.models import EventKind, Lease, Step, StepStatus, Task, TaskStatus
from tasks_app.services import Claim
from tests.batch_support import claim_due, claimed_batches, lease_count, noops
from tests.batch_support import patient_drain as patient_drain  # a fixture, for pytest to find
from tests.batch_support import two_queues as two_queues  # a fixture, for pytest to find
from tests.conftest import BrokerView, backdate, event_kinds, only_step
from tests.lease_support import LEASE, WORKER, attempts_of, events, fresh, lease_of, step_at

# --- helpers ------------------------------------------------------------------------------


def field_values(row: Step | Task) -> dict[str, Any]:
    return {field.attname: getattr(row, field.attname) for field in type(row)._meta.concrete_fields}


# --- what a batch claims ------------------------------------------------------------------


@pytest.mark.django_db
def test_a_batch_claims_only_due_pending_steps_of_its_queue(pair: str, two_queues: None) -> None:
    due = noops(3)
    elsewhere = noops(2, queue="other")
    future = noops(1, run_after=timezone.now() + timedelta(hours=1))[0]
    running = noops(1)[0]
    assert services.claim_step(running.pk, worker_id="earlier") is not None
    cancelled = noops(1)[0]
    services.cancel(cancelled.task, actor="cli:t", reason="not wanted")
    blocked = step_at(services.enqueue(pair, {}).task, 1)
    draft = step_at(blocked.task, 0)
    untouched = [*elsewhere, future, running, cancelled, blocked]
    before = {s.pk: (s.status, s.attempts, s.fencing_token) for s in map(fresh, untouched)}

    claims = claim_due(limit=50)

    assert set(claims) == {s.pk for s in due} | {draft.pk}
    after = {s.pk: (s.status, s.attempts, s.fencing_token) for s in map(fresh, untouched)}
    assert after == before
    assert lease_count(future) == lease_count(blocked) == lease_count(elsewhere[0]) == 0

    # The other queue is claimed on its own; the future step once its time has come.
    assert set(claim_due(limit=50, queue="other")) == {s.pk for s in elsewhere}
    assert claim_due(limit=50) == {}
    backdate(future, seconds=2 * 3600)
    assert set(claim_due(limit=50)) == {future.pk}


@pytest.mark.django_db
def test_a_paused_queue_is_not_claimed_by_a_batch_until_it_is_resumed(two_queues: None) -> None:
    steps = noops(3)
    elsewhere = noops(1, queue="other")[0]
    services.pause_queue("default", actor="cli:t", reason="incident")

    assert claim_due(limit=10) == {}
    assert fastpath.claim_batch(worker_id=WORKER, limit=10, step_id=steps[0].pk) == []
    for step in map(fresh, steps):
        assert (step.status, step.attempts, step.fencing_token) == (StepStatus.PENDING, 0, 0)
        assert lease_count(step) == 0
        assert EventKind.CLAIMED not in event_kinds(step.task)
    # Pausing one queue leaves the others running.
    assert set(claim_due(limit=10, queue="other")) == {elsewhere.pk}

    services.resume_queue("default", actor="cli:t", reason="over")

    assert set(claim_due(limit=10)) == {s.pk for s in steps}


@pytest.mark.django_db
def test_a_named_step_of_another_queue_is_not_claimed_with_the_given_queue(
    two_queues: None,
) -> None:
    here = noops(1)[0]
    there = noops(1, queue="other")[0]

    claims = fastpath.claim_batch(worker_id=WORKER, limit=5, step_id=there.pk, queue="default")

    assert [c.step_id for c in claims] == [here.pk]
    assert fresh(there).status == StepStatus.PENDING
    # Without a queue, the named step's own queue is drained.
    claims = fastpath.claim_batch(worker_id=WORKER, limit=5, step_id=there.pk)
    assert [(c.step_id, c.queue) for c in claims] == [(there.pk, "other")]


def _urgency_ladder() -> dict[int, str]:
    """Five due steps; names say their priority and how long they have waited."""
    made = {}
    for name, priority, waited in [
        ("low-oldest", -5, 900),
        ("mid-new", 0, 10),
        ("high-new", 10, 20),
        ("high-old", 10, 300),
        ("mid-old", 0, 200),
    ]:
        step = only_step(services.enqueue("demo.noop", {"name": name}, priority=priority).task)
        backdate(step, seconds=waited)
        made[step.pk] = name
    return made


@pytest.mark.django_db
def test_a_batch_takes_the_highest_priority_first_then_the_longest_waiting() -> None:
    names = _urgency_ladder()

    order: list[str] = []
    while claims := fastpath.claim_batch(worker_id=WORKER, limit=1, queue="default"):
        order.extend(names[c.step_id] for c in claims)

    assert order == ["high-old", "high-new", "mid-old", "mid-new", "low-oldest"]


@pytest.mark.django_db
def test_a_batch_of_n_takes_the_n_most_urgent_steps() -> None:
    names = _urgency_ladder()

    claims = fastpath.claim_batch(worker_id=WORKER, limit=3, queue="default")

    assert sorted(names[c.step_id] for c in claims) == ["high-new", "high-old", "mid-old"]


@pytest.mark.django_db
def test_the_named_step_comes_first_even_when_its_priority_is_lower() -> None:
    names = _urgency_ladder()
    low = next(pk for pk, name in names.items() if name == "low-oldest")

    claims = fastpath.claim_batch(worker_id=WORKER, limit=3, step_id=low)

    assert claims[0].step_id == low
    assert sorted(names[c.step_id] for c in claims[1:]) == ["high-new", "high-old"]


@pytest.mark.django_db
@pytest.mark.parametrize("named", [False, True])
@pytest.mark.parametrize("limit", [1, 4])
def test_a_batch_claims_no_more_than_its_limit(limit: int, named: bool) -> None:
    steps = noops(10)
    step_id = steps[-1].pk if named else None

    claims = fastpath.claim_batch(worker_id=WORKER, limit=limit, step_id=step_id, queue="default")

    assert len(claims) == limit
    if named:
        assert claims[0].step_id == steps[-1].pk
    running = Step.objects.filter(pk__in=[s.pk for s in steps], status=StepStatus.RUNNING)
    assert sorted(running.values_list("pk", flat=True)) == sorted(c.step_id for c in claims)
    assert sum(len(attempts_of(step)) for step in steps) == limit
    # On the steps: an attempt's Lease row is written when it ends.
    assert not Lease.objects.filter(step__in=steps).exists()


@pytest.mark.django_db
@pytest.mark.parametrize("fast_path", [True, False], ids=["sql", "orm"])
def test_a_step_whose_lease_ran_out_is_claimed_only_in_a_batch_of_its_own(
    settings: Any, fast_path: bool
) -> None:
    # It may have killed the process that ran it: in another step's batch it would take
    # that batch's attempts down with it the next time.
    settings.TASKS_SQL_FAST_PATH = fast_path
    [suspect] = noops(1, priority=9)
    others = noops(4)

    def reap() -> None:
        backdate(suspect, seconds=LEASE + 1)
        assert services.reap_expired_leases() == 1

    claim_due(limit=1, step_id=suspect.pk)
    reap()
    after = fresh(suspect)
    assert (after.status, after.error_class) == (StepStatus.PENDING, LEASE_EXPIRED)
    assert after.last_error == "lease of token 1 expired on attempt 1"

    # Passed over by a batch of two, for all its priority; named, it is the whole batch.
    assert sorted(claim_due(limit=2)) == [others[0].pk, others[1].pk]
    assert fresh(suspect).status == StepStatus.PENDING
    assert list(claim_due(limit=4, step_id=suspect.pk)) == [suspect.pk]
    reap()
    # A batch of one takes it first, by its priority.
    assert list(claim_due(limit=1)) == [suspect.pk]
    pending = Step.objects.filter(pk__in=[s.pk for s in others], status=StepStatus.PENDING)
    assert sorted(pending.values_list("pk", flat=True)) == [others[2].pk, others[3].pk]


@pytest.mark.django_db
def test_a_drain_runs_the_steps_whose_lease_ran_out_one_per_batch_after_the_rest(
    patient_drain: None,
) -> None:
    steps = noops(6)
    suspects, ordinary = {s.pk for s in steps[:2]}, steps[2:]
    for pk in suspects:
        claim_due(limit=1, step_id=pk)
    for step in steps[:2]:
        backdate(step, seconds=LEASE + 1)
    assert services.reap_expired_leases() == 2

    assert runner.drain(ordinary[0].pk) == 6

    done = Step.objects.filter(pk__in=[s.pk for s in steps], status=StepStatus.SUCCEEDED)
    assert done.count() == 6
    for claimed_together in claimed_batches(steps):
        assert len(claimed_together) == 1 or not suspects & set(claimed_together)
    last_ordinary = max(
        Lease.objects.filter(step__in=ordinary).values_list("acquired_at", flat=True)
    )
    again = Lease.objects.filter(step__in=suspects, token=2).values_list("acquired_at", flat=True)
    assert len(again) == 2
    assert all(acquired > last_ordinary for acquired in again)


@pytest.mark.django_db
def test_a_named_step_that_cannot_be_claimed_leaves_its_place_to_another_due_step() -> None:
    finished = noops(1)[0]
    assert runner.run_claimed(finished.pk)
    waiting = noops(2)

    claims = fastpath.claim_batch(worker_id=WORKER, limit=1, step_id=finished.pk)

    assert [c.step_id for c in claims] == [waiting[0].pk]
    assert fresh(finished).fencing_token == 1


@pytest.mark.django_db
def test_each_claimed_step_is_running_with_a_raised_token_a_lease_and_its_claim_recorded() -> None:
    first, second = noops(2)
    # The second has a failed attempt behind it: the claim counts on from there.
    earlier = services.claim_step(second.pk, worker_id="w0")
    assert earlier is not None
    services.fail_step(earlier, error_class="Boom", message="boom", retry_in=0, reason="")
    backdate(second, seconds=5)

    start = services.db_now()
    claims = claim_due(limit=10, lease_seconds=45)
    end = services.db_now()

    assert set(claims) == {first.pk, second.pk}
    for step, attempts in ((first, 1), (second, 2)):
        held = claims[step.pk]
        assert (held.task_id, held.token, held.attempt) == (step.task_id, attempts, attempts)
        assert (held.worker_id, held.lease_seconds, held.queue) == (WORKER, 45, "default")
        step = fresh(step)
        assert (step.status, step.attempts, step.fencing_token) == (
            StepStatus.RUNNING,
            attempts,
            attempts,
        )
        assert step.started_at is not None
        lease = lease_of(step, attempts)
        assert lease.worker_id == WORKER
        assert (lease.released_at, lease.outcome) == (None, "")
        # Leases run on the database's clock.
        assert start <= lease.acquired_at <= end
        assert lease.expires_at == lease.acquired_at + timedelta(seconds=45)
        assert step.lease_expires_at == lease.expires_at
        [claimed] = events(step.task, EventKind.CLAIMED)[attempts - 1 :]
        assert (claimed.step_id, claimed.actor) == (step.pk, f"worker:{WORKER}")
        assert claimed.data == {
            "steps": {str(step.pk): [StepStatus.RUNNING, attempts, attempts]},
            "token": attempts,
            "attempt": attempts,
        }
        task = Task.objects.get(pk=step.task_id)
        # Read as running from its step; the claim did not rewrite its row (DESIGN rule 11).
        assert (task.live_status, task.status) == (TaskStatus.RUNNING, TaskStatus.PENDING)
    assert len(events(first.task, EventKind.CLAIMED)) == 1
    assert len(events(second.task, EventKind.CLAIMED)) == 2


@pytest.mark.django_db
def test_a_batch_claim_without_a_lease_length_uses_the_configured_one() -> None:
    step = noops(1)[0]

    [held] = fastpath.claim_batch(worker_id=WORKER, limit=1, queue="default")

    lease = lease_of(step, held.token)
    assert held.lease_seconds == LEASE
    assert lease.expires_at - lease.acquired_at == timedelta(seconds=LEASE)


# --- racing workers -----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_workers_claiming_batches_at_once_take_every_due_step_exactly_once(
    broker: BrokerView,
) -> None:
    steps = noops(200)
    ids = [step.pk for step in steps]
    workers = 8
    barrier = threading.Barrier(workers)
    taken: dict[str, list[Claim]] = {f"w{i}": [] for i in range(workers)}
    errors: list[BaseException] = []

    def work(name: str, seed: int) -> None:
        rng = random.Random(seed)
        try:
            barrier.wait(timeout=30)
            for _ in range(500):
                # Half the rounds answer a doorbell for some step, claimed or not.
                named = rng.choice(ids) if rng.random() < 0.5 else None
                claims = fastpath.claim_batch(
                    worker_id=name,
                    limit=rng.randint(1, 12),
                    step_id=named,
                    queue=None if named else "default",
                )
                if not claims:
                    return
                taken[name].extend(claims)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(name, i)) for i, name in enumerate(taken)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert not errors
    assert not any(thread.is_alive() for thread in threads)
    every = [claim.step_id for claims in taken.values() for claim in claims]
    assert sorted(every) == sorted(ids)  # all 200, none twice
    names = list(taken)
    for i, one in enumerate(names):
        for other in names[i + 1 :]:
            assert not {c.step_id for c in taken[one]} & {c.step_id for c in taken[other]}
    owner = {claim.step_id: name for name, claims in taken.items() for claim in claims}
    leases = list(
        Step.objects.filter(pk__in=ids, status=StepStatus.RUNNING).values_list("pk", "lease_worker")
    )
    assert sorted(leases) == sorted(owner.items())  # exactly one live lease each, its claimer's
    task_ids = Step.objects.filter(pk__in=ids).values_list("task_id", flat=True)
    claimed = Counter(
        entry.step_id
        for entries in timeline.histories(task_ids).values()
        for entry in entries
        if entry.kind == EventKind.CLAIMED
    )
    assert claimed == Counter(ids)
    states = Counter(
        Step.objects.filter(pk__in=ids).values_list("status", "attempts", "fencing_token")
    )
    assert states == {(StepStatus.RUNNING, 1, 1): 200}
    assert claim_due(limit=50) == {}

    # One batch completes them all.
    done = [(claim, {"by": name}) for name, claims in taken.items() for claim in claims]
    assert fastpath.complete_many(done) == set(ids)
    assert Task.objects.filter(status=TaskStatus.SUCCEEDED).count() == 200


@pytest.mark.django_db(transaction=True)
def test_batch_claims_racing_cancels_of_the_same_tasks_neither_deadlock_nor_tear_a_task(
    pair: str, broker: BrokerView
) -> None:
    tasks = [
        r.task
        for r in services.enqueue_many([{"workflow": pair, "payload": {"n": n}} for n in range(80)])
    ]
    claimers, cancellers = 4, 4
    barrier = threading.Barrier(claimers + cancellers)
    errors: list[BaseException] = []
    refused: list[int] = []

    def claim_and_complete(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            for _ in range(1000):
                claims = fastpath.claim_batch(worker_id=f"w{index}", limit=4, queue="default")
                if not claims:
                    return
                fastpath.complete_many([(claim, {"by": index}) for claim in claims])
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    def cancel_some(index: int) -> None:
        mine = tasks[index::cancellers]
        if index % 2:
            mine.reverse()
        try:
            barrier.wait(timeout=30)
            for task in mine:
                try:
                    services.cancel(task, actor="cli:t", reason="race")
                except InvalidTransition:
                    refused.append(task.pk)  # it had already succeeded
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=claim_and_complete, args=(i,)) for i in range(claimers)]
    threads += [threading.Thread(target=cancel_some, args=(i,)) for i in range(cancellers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert not errors  # a deadlock would surface here as psycopg's DeadlockDetected
    assert not any(thread.is_alive() for thread in threads)
    for task in tasks:
        task.refresh_from_db()
        steps = list(task.steps.order_by("position"))
        statuses = [step.status for step in steps]
        history = event_kinds(task)
        assert task.finished_at is not None
        if task.pk in refused:
            assert task.status == TaskStatus.SUCCEEDED
            assert statuses == [StepStatus.SUCCEEDED] * 2
        elif task.cancel_requested_at is None:
            # Cancelled while nothing ran: what had not run never will.
            assert task.status == TaskStatus.CANCELLED
            assert StepStatus.CANCELLED in statuses
            assert set(statuses) <= {StepStatus.SUCCEEDED, StepStatus.CANCELLED}
            assert history[-1] == EventKind.CANCELLED
            assert EventKind.CANCEL_REQUESTED not in history
        else:
            # Cancelled while a step ran: its result is kept, the next step never ran.
            assert task.status == TaskStatus.CANCELLED
            assert history[-3:] == ["cancel_requested", "succeeded", "cancelled"]
            assert StepStatus.SUCCEEDED in statuses
        # A cancelled step was never claimed; every claim left one lease and one event.
        assert all(s.fencing_token == 0 for s in steps if s.status == StepStatus.CANCELLED)
        for step in steps:
            assert lease_count(step) == step.fencing_token
        assert history.count("claimed") == sum(s.fencing_token for s in steps)
    assert not Step.objects.filter(
        status__in=[StepStatus.PENDING, StepStatus.RUNNING, StepStatus.BLOCKED]
    ).exists()


# --- what a claim hands the worker -----------------------------------------------------


def test_the_claim_statement_names_every_column_of_a_step_and_a_task_in_field_order() -> None:
    assert tuple(f.attname for f in Step._meta.concrete_fields) == sql.STEP_COLUMNS
    assert tuple(f.attname for f in Task._meta.concrete_fields) == sql.TASK_COLUMNS


@pytest.mark.django_db
def test_a_claim_returns_its_steps_and_tasks_as_the_database_holds_them_after_it() -> None:
    """The worker runs the rows the claim returned without reading them again, so they
    must be what a read after the claim gives: raised token, running, the task running."""
    results = services.enqueue_many(
        [
            {"workflow": "demo.noop", "payload": {"n": n, "deep": {"x": [n]}}, "priority": n}
            for n in range(3)
        ]
    )
    claims = fastpath.claim_batch(worker_id=WORKER, limit=10, queue="default")
    assert len(claims) == 3
    for claim in claims:
        assert claim.step is not None
        stored = Step.objects.select_related("task").get(pk=claim.step_id)
        assert field_values(claim.step) == field_values(stored)
        assert field_values(claim.step.task) == field_values(stored.task)
        assert claim.step.status == StepStatus.RUNNING
        assert claim.step.task.status == TaskStatus.PENDING  # the row, not rewritten
        assert claim.step.task.live_status == TaskStatus.RUNNING
        assert (claim.token, claim.attempt) == (stored.fencing_token, stored.attempts)
    assert {claim.task_id for claim in claims} == {result.task.pk for result in results}
