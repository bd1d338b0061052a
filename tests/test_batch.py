"""The batched hot path: ``batch.claim_batch``, ``batch.complete_many`` and the draining
worker (``runner.drain``) keep every guarantee of the one-step path (DESIGN rules 1, 2, 3,
8 and 10), on PostgreSQL.

Time moves by back-dating rows (``backdate``), never by sleeping. Tests that need other
database connections (racing workers, the heartbeat thread) or a real commit (doorbells
published after commit) are transactional.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from itertools import pairwise
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db import connection, transaction
from django.db.models.functions import Now
from django.utils import timezone

from tasks_app import batch, runner, services, sql
from tasks_app.exceptions import LEASE_EXPIRED, InvalidTransition
from tasks_app.models import Event, EventKind, Lease, Step, StepStatus, Task, TaskStatus
from tasks_app.services import Claim
from tasks_app.tasks import run_step
from tasks_app.workflows import StepContext, StepSpec, Workflow, register, registry
from tests.conftest import BrokerView, backdate, only_step, worker_thread
from tests.e2e_support import wait_for

WORKER = "w1"
LEASE = django_settings.TASKS_LEASE_SECONDS
GATE = "test.batch.gate"


# --- helpers ------------------------------------------------------------------------------


def field_values(row: Step | Task) -> dict[str, Any]:
    return {field.attname: getattr(row, field.attname) for field in type(row)._meta.concrete_fields}


def kinds(task: Task) -> list[str]:
    return list(Event.objects.for_task(task.pk).values_list("kind", flat=True))


def events(task: Task, kind: str) -> list[Event]:
    return list(Event.objects.for_task(task.pk).filter(kind=kind))


def fresh(step: Step) -> Step:
    return Step.objects.get(pk=step.pk)


def step_at(task: Task, position: int) -> Step:
    return task.steps.get(position=position, revision=0)


def noops(count: int, *, queue: str = "default", **options: Any) -> list[Step]:
    """Enqueue ``count`` demo.noop tasks; their steps in enqueue order."""
    results = services.enqueue_many(
        [
            {"workflow": "demo.noop", "payload": {"n": n}, "queue": queue, **options}
            for n in range(count)
        ]
    )
    return [only_step(result.task) for result in results]


def claim_due(limit: int = 100, *, worker_id: str = WORKER, **options: Any) -> dict[int, Claim]:
    """Claim due steps of the default queue; the claims by step id."""
    options.setdefault("queue", "default")
    claims = batch.claim_batch(worker_id=worker_id, limit=limit, **options)
    return {claim.step_id: claim for claim in claims}


def claimed_batches(steps: list[Step]) -> list[list[int]]:
    """The steps' claims grouped by the statement that made them, in order.

    Each claim statement stamps its leases with its own ``statement_timestamp()``.
    """
    groups: dict[Any, list[int]] = {}
    for acquired_at, step_id in (
        Lease.objects.filter(step__in=steps).order_by("acquired_at", "step_id")
    ).values_list("acquired_at", "step_id"):
        groups.setdefault(acquired_at, []).append(step_id)
    return list(groups.values())


def lease_count(step: Step) -> int:
    return Lease.objects.filter(step=step).count()


# --- test workflows -----------------------------------------------------------------------


@dataclass
class Gate:
    """A handler that runs until the heartbeat tells it its task was cancelled."""

    started: threading.Event = field(default_factory=threading.Event)

    def handler(self, ctx: StepContext) -> dict[str, Any]:
        self.started.set()
        ctx._cancelled.wait(timeout=20)
        return {"saw_cancel": ctx.cancelled}


@pytest.fixture
def gate() -> Iterator[Gate]:
    opened = Gate()
    register(Workflow(GATE, 1, steps=(StepSpec("wait", opened.handler),)))
    yield opened
    registry.unregister(GATE, 1)


@pytest.fixture
def two_queues(settings: Any) -> None:
    settings.TASKS_QUEUES = ["default", "other"]


@pytest.fixture
def patient_drain(settings: Any) -> None:
    """A drain that never runs out of time while a test is watching it."""
    settings.TASKS_DRAIN_SECONDS = 300


# --- 1. what a batch claims ---------------------------------------------------------------


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
    assert batch.claim_batch(worker_id=WORKER, limit=10, step_id=steps[0].pk) == []
    for step in map(fresh, steps):
        assert (step.status, step.attempts, step.fencing_token) == (StepStatus.PENDING, 0, 0)
        assert lease_count(step) == 0
        assert EventKind.CLAIMED not in kinds(step.task)
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

    claims = batch.claim_batch(worker_id=WORKER, limit=5, step_id=there.pk, queue="default")

    assert [c.step_id for c in claims] == [here.pk]
    assert fresh(there).status == StepStatus.PENDING
    # Without a queue, the named step's own queue is drained.
    claims = batch.claim_batch(worker_id=WORKER, limit=5, step_id=there.pk)
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
    while claims := batch.claim_batch(worker_id=WORKER, limit=1, queue="default"):
        order.extend(names[c.step_id] for c in claims)

    assert order == ["high-old", "high-new", "mid-old", "mid-new", "low-oldest"]


@pytest.mark.django_db
def test_a_batch_of_n_takes_the_n_most_urgent_steps() -> None:
    names = _urgency_ladder()

    claims = batch.claim_batch(worker_id=WORKER, limit=3, queue="default")

    assert sorted(names[c.step_id] for c in claims) == ["high-new", "high-old", "mid-old"]


@pytest.mark.django_db
def test_the_named_step_comes_first_even_when_its_priority_is_lower() -> None:
    names = _urgency_ladder()
    low = next(pk for pk, name in names.items() if name == "low-oldest")

    claims = batch.claim_batch(worker_id=WORKER, limit=3, step_id=low)

    assert claims[0].step_id == low
    assert sorted(names[c.step_id] for c in claims[1:]) == ["high-new", "high-old"]


@pytest.mark.django_db
@pytest.mark.parametrize("named", [False, True])
@pytest.mark.parametrize("limit", [1, 4])
def test_a_batch_claims_no_more_than_its_limit(limit: int, named: bool) -> None:
    steps = noops(10)
    step_id = steps[-1].pk if named else None

    claims = batch.claim_batch(worker_id=WORKER, limit=limit, step_id=step_id, queue="default")

    assert len(claims) == limit
    if named:
        assert claims[0].step_id == steps[-1].pk
    running = Step.objects.filter(pk__in=[s.pk for s in steps], status=StepStatus.RUNNING)
    assert sorted(running.values_list("pk", flat=True)) == sorted(c.step_id for c in claims)
    assert Lease.objects.filter(step__in=steps).count() == limit


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

    claims = batch.claim_batch(worker_id=WORKER, limit=1, step_id=finished.pk)

    assert [c.step_id for c in claims] == [waiting[0].pk]
    assert fresh(finished).fencing_token == 1


@pytest.mark.django_db
def test_each_claimed_step_is_running_with_a_raised_token_a_lease_and_one_claimed_event() -> None:
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
        lease = Lease.objects.get(step=step, token=attempts)
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
            "lease_seconds": 45,
        }
        task = Task.objects.get(pk=step.task_id)
        assert task.status == TaskStatus.RUNNING
    assert len(events(first.task, EventKind.CLAIMED)) == 1
    assert len(events(second.task, EventKind.CLAIMED)) == 2


@pytest.mark.django_db
def test_a_batch_claim_without_a_lease_length_uses_the_configured_one() -> None:
    step = noops(1)[0]

    [held] = batch.claim_batch(worker_id=WORKER, limit=1, queue="default")

    lease = Lease.objects.get(step=step)
    assert held.lease_seconds == LEASE
    assert lease.expires_at - lease.acquired_at == timedelta(seconds=LEASE)


# --- 2. racing workers --------------------------------------------------------------------


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
                claims = batch.claim_batch(
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
    leases = list(Lease.objects.filter(step_id__in=ids).values_list("step_id", "worker_id"))
    assert sorted(leases) == sorted(owner.items())  # exactly one lease each, by its claimer
    claimed = Counter(
        Event.objects.filter(step_id__in=ids, kind=EventKind.CLAIMED).values_list(
            "step_id", flat=True
        )
    )
    assert claimed == Counter(ids)
    states = Counter(
        Step.objects.filter(pk__in=ids).values_list("status", "attempts", "fencing_token")
    )
    assert states == {(StepStatus.RUNNING, 1, 1): 200}
    assert claim_due(limit=50) == {}

    # One batch completes them all.
    done = [(claim, {"by": name}) for name, claims in taken.items() for claim in claims]
    assert batch.complete_many(done) == set(ids)
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
                claims = batch.claim_batch(worker_id=f"w{index}", limit=4, queue="default")
                if not claims:
                    return
                batch.complete_many([(claim, {"by": index}) for claim in claims])
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
        history = kinds(task)
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


# --- 3. completing a batch ----------------------------------------------------------------


@pytest.mark.django_db
def test_a_batch_of_completions_is_accepted_and_each_step_succeeds() -> None:
    steps = noops(5)
    claims = claim_due()

    accepted = batch.complete_many([(claims[s.pk], {"n": i}) for i, s in enumerate(steps)])

    assert accepted == {s.pk for s in steps}
    for i, step in enumerate(map(fresh, steps)):
        assert (step.status, step.attempts, step.fencing_token) == (StepStatus.SUCCEEDED, 1, 1)
        assert step.result == {"n": i}
        assert step.finished_at is not None
        assert step.lease_expires_at is None
        lease = Lease.objects.get(step=step)
        assert lease.outcome == Lease.Outcome.SUCCEEDED
        assert lease.released_at is not None
        task = Task.objects.get(pk=step.task_id)
        assert task.status == TaskStatus.SUCCEEDED
        assert task.finished_at is not None
        assert kinds(task) == ["enqueued", "claimed", "succeeded"]
        [succeeded] = events(task, EventKind.SUCCEEDED)
        assert (succeeded.step_id, succeeded.actor) == (step.pk, f"worker:{WORKER}")
        assert succeeded.data == {
            "steps": {str(step.pk): [StepStatus.SUCCEEDED, 1, 1]},
            "token": 1,
            "task_status": TaskStatus.SUCCEEDED,
        }


RESULTS: list[Any] = [
    {},
    {"nested": {"list": [1, 2.5, None, True, False], "empty": {}, "deep": [[["x"]]]}},
    {"text": 'naïve café ☕ 名前 "quoted" \\ back\nslash', "emoji": "🙂"},
    {"sql": "'); DROP TABLE tasks_app_step; --", "cast": "'{}'::jsonb"},
    {"big": 2**62, "negative": -(2**40), "float": 0.1, "exp": 1e-300},
    [1, "two", {"three": 3}],
    "just a string",
    42,
    None,
]


@pytest.mark.django_db
def test_results_are_stored_exactly_as_the_handlers_returned_them() -> None:
    steps = noops(len(RESULTS))
    claims = claim_due()

    accepted = batch.complete_many([(claims[s.pk], r) for s, r in zip(steps, RESULTS, strict=True)])

    assert accepted == {s.pk for s in steps}
    assert [fresh(s).result for s in steps] == RESULTS


@pytest.mark.django_db
def test_a_completion_whose_lease_was_reaped_and_reclaimed_is_refused_and_the_rest_accepted() -> (
    None
):
    steps = noops(3)
    claims = claim_due(worker_id="slow")
    lost = steps[1]
    backdate(lost, seconds=LEASE + 60)
    assert services.reap_expired_leases() == 1
    # Claimed by name, as the doorbell the sweeper rings for it does.
    [current] = claim_due(worker_id="fast", step_id=lost.pk).values()
    assert (current.step_id, current.token) == (lost.pk, 2)
    lease_before = fresh(lost).lease_expires_at

    accepted = batch.complete_many([(claims[s.pk], {"by": "slow"}) for s in steps])

    assert accepted == {steps[0].pk, steps[2].pk}
    for step in (steps[0], steps[2]):
        assert (fresh(step).status, fresh(step).result) == (StepStatus.SUCCEEDED, {"by": "slow"})
        assert Task.objects.get(pk=step.task_id).status == TaskStatus.SUCCEEDED
    after = fresh(lost)
    assert (after.status, after.attempts, after.fencing_token) == (StepStatus.RUNNING, 2, 2)
    assert after.result is None
    assert after.lease_expires_at == lease_before
    leases = {lease.token: lease for lease in Lease.objects.filter(step=lost)}
    assert leases[1].outcome == Lease.Outcome.EXPIRED
    assert (leases[2].worker_id, leases[2].released_at, leases[2].outcome) == ("fast", None, "")
    task = Task.objects.get(pk=lost.task_id)
    assert task.status == TaskStatus.RUNNING
    assert kinds(task) == [
        "enqueued",
        "claimed",
        "lease_expired",
        "claimed",
        "stale_write_rejected",
    ]
    [rejected] = events(task, EventKind.STALE_WRITE_REJECTED)
    assert (rejected.step_id, rejected.actor) == (lost.pk, "worker:slow")
    assert rejected.data == {
        "operation": "complete",
        "token": 1,
        "current_token": 2,
        "current_status": StepStatus.RUNNING,
    }

    # The current holder finishes; the stale claim stays refused afterwards too.
    assert batch.complete_many([(current, {"by": "fast"})]) == {lost.pk}
    assert batch.complete_many([(claims[lost.pk], {"by": "slow"})]) == set()
    assert fresh(lost).result == {"by": "fast"}
    assert kinds(task)[-2:] == ["succeeded", "stale_write_rejected"]


@pytest.mark.django_db
def test_a_batch_completion_delivered_twice_or_forged_changes_nothing_the_second_time() -> None:
    steps = noops(2)
    claims = claim_due()
    done = [(claims[s.pk], {"first": True}) for s in steps]
    assert batch.complete_many(done) == {s.pk for s in steps}
    never_claimed = noops(1)[0]
    forged = Claim(
        step_id=never_claimed.pk,
        task_id=never_claimed.task_id,
        token=0,
        attempt=1,
        worker_id="impostor",
        lease_seconds=LEASE,
    )

    again = [(claim, {"second": True}) for claim, _ in done] + [(forged, {"forged": True})]
    assert batch.complete_many(again) == set()

    for step in map(fresh, steps):
        assert (step.status, step.result, step.fencing_token) == (
            StepStatus.SUCCEEDED,
            {"first": True},
            1,
        )
        task = Task.objects.get(pk=step.task_id)
        assert kinds(task) == ["enqueued", "claimed", "succeeded", "stale_write_rejected"]
        [rejected] = events(task, EventKind.STALE_WRITE_REJECTED)
        assert rejected.data["current_status"] == StepStatus.SUCCEEDED
    never_claimed = fresh(never_claimed)
    assert (never_claimed.status, never_claimed.result) == (StepStatus.PENDING, None)
    assert kinds(never_claimed.task) == ["enqueued", "stale_write_rejected"]
    assert events(never_claimed.task, EventKind.STALE_WRITE_REJECTED)[0].actor == "worker:impostor"


@pytest.mark.django_db(transaction=True)
def test_completing_a_draft_makes_the_next_step_due_and_rings_for_it_only_after_commit(
    pair: str, broker: BrokerView
) -> None:
    task = services.enqueue(pair, {}).task
    draft, publish = step_at(task, 0), step_at(task, 1)
    [held] = claim_due().values()
    broker.purge()

    # A completion whose transaction rolls back changes nothing and rings nothing.
    with pytest.raises(RuntimeError), transaction.atomic():
        assert batch.complete_many([(held, {"draft": "v0"})]) == {draft.pk}
        raise RuntimeError("the surrounding work failed")
    assert fresh(draft).status == StepStatus.RUNNING
    assert fresh(publish).status == StepStatus.BLOCKED
    assert broker.step_ids() == []

    with transaction.atomic():
        assert batch.complete_many([(held, {"draft": "v1"})]) == {draft.pk}
        assert broker.step_ids() == []  # not before commit
    assert broker.step_ids() == [publish.pk]

    draft, publish = fresh(draft), fresh(publish)
    assert (draft.status, draft.result) == (StepStatus.SUCCEEDED, {"draft": "v1"})
    assert (publish.status, publish.attempts, publish.fencing_token) == (StepStatus.PENDING, 0, 0)
    assert publish.available_at is not None
    assert publish.dispatched_at is not None
    assert publish.available_at <= services.db_now()
    task.refresh_from_db()
    assert (task.status, task.finished_at) == (TaskStatus.PENDING, None)
    [succeeded] = events(task, EventKind.SUCCEEDED)
    assert succeeded.data["steps"] == {
        str(draft.pk): [StepStatus.SUCCEEDED, 1, 1],
        str(publish.pk): [StepStatus.PENDING, 0, 0],
    }
    assert succeeded.data["task_status"] == TaskStatus.PENDING

    # The last step's success finishes the task.
    [last] = claim_due().values()
    assert last.step_id == publish.pk
    assert batch.complete_many([(last, {"published": True})]) == {publish.pk}
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    assert task.finished_at is not None
    assert fresh(publish).result == {"published": True}
    assert events(task, EventKind.SUCCEEDED)[-1].data == {
        "steps": {str(publish.pk): [StepStatus.SUCCEEDED, 1, 1]},
        "token": 1,
        "task_status": TaskStatus.SUCCEEDED,
    }
    assert kinds(task) == ["enqueued", "claimed", "succeeded", "claimed", "succeeded"]


@pytest.mark.django_db
def test_a_task_cancelled_while_its_step_ran_ends_cancelled_after_a_batch_completion(
    pair: str,
) -> None:
    task = services.enqueue(pair, {}).task
    draft, publish = step_at(task, 0), step_at(task, 1)
    [held] = claim_due().values()
    services.cancel(task, actor="cli:t", reason="withdrawn")
    task.refresh_from_db()
    assert task.status == TaskStatus.RUNNING

    assert batch.complete_many([(held, {"draft": "v1"})]) == {draft.pk}

    draft, publish = fresh(draft), fresh(publish)
    assert (draft.status, draft.result) == (StepStatus.SUCCEEDED, {"draft": "v1"})
    assert (publish.status, publish.fencing_token, publish.available_at) == (
        StepStatus.CANCELLED,
        0,
        None,
    )
    task.refresh_from_db()
    assert task.status == TaskStatus.CANCELLED
    assert task.finished_at is not None
    assert kinds(task) == ["enqueued", "claimed", "cancel_requested", "succeeded", "cancelled"]
    succeeded, cancelled = events(task, EventKind.SUCCEEDED)[0], events(task, "cancelled")[0]
    assert succeeded.data["steps"] == {str(draft.pk): [StepStatus.SUCCEEDED, 1, 1]}
    assert succeeded.data["task_status"] == TaskStatus.CANCELLED
    assert (cancelled.actor, cancelled.step_id) == ("system", None)
    assert claim_due() == {}
    assert batch.claim_batch(worker_id=WORKER, limit=5, step_id=publish.pk) == []


@pytest.mark.django_db
def test_one_batch_completion_settles_each_task_by_its_own_story(pair: str) -> None:
    drafting = services.enqueue(pair, {}).task
    single, withdrawn, overtaken = (step.task for step in noops(3))
    claims = claim_due()
    services.cancel(withdrawn, actor="cli:t", reason="withdrawn")
    lost = only_step(overtaken)
    backdate(lost, seconds=LEASE + 60)
    assert services.reap_expired_leases() == 1
    [current] = claim_due(worker_id="w2", step_id=lost.pk).values()

    accepted = batch.complete_many([(claim, {"step": pk}) for pk, claim in claims.items()])

    assert accepted == set(claims) - {lost.pk}
    drafting.refresh_from_db()
    assert drafting.status == TaskStatus.PENDING
    assert fresh(step_at(drafting, 1)).status == StepStatus.PENDING
    single.refresh_from_db()
    assert single.status == TaskStatus.SUCCEEDED
    withdrawn.refresh_from_db()
    assert withdrawn.status == TaskStatus.CANCELLED
    assert kinds(withdrawn)[-2:] == ["succeeded", "cancelled"]
    overtaken.refresh_from_db()
    assert overtaken.status == TaskStatus.RUNNING
    assert kinds(overtaken)[-1] == "stale_write_rejected"
    assert fresh(lost).fencing_token == current.token == 2
    # Only the drafting task gained a next step; no other task's rows moved.
    assert Step.objects.filter(status=StepStatus.PENDING).count() == 1


# --- 4. the same story told by the one-step path and the batch path -----------------------


@dataclass(frozen=True)
class Path:
    claim: Callable[[list[Step], str], dict[int, Claim]]
    complete: Callable[[list[tuple[Claim, Any]]], set[int]]


def _claim_one_by_one(steps: list[Step], worker_id: str) -> dict[int, Claim]:
    claims = {}
    for step in steps:
        claim = services.claim_step(step.pk, worker_id=worker_id)
        assert claim is not None
        claims[step.pk] = claim
    return claims


def _claim_as_a_batch(steps: list[Step], worker_id: str) -> dict[int, Claim]:
    # The first by name: a step whose lease ran out is claimed only so.
    claims = claim_due(limit=len(steps), worker_id=worker_id, step_id=steps[0].pk)
    assert set(claims) == {step.pk for step in steps}
    return claims


def _complete_one_by_one(done: list[tuple[Claim, Any]]) -> set[int]:
    return {claim.step_id for claim, result in done if services.complete_step(claim, result)}


ONE_STEP = Path(_claim_one_by_one, _complete_one_by_one)
BATCHED = Path(_claim_as_a_batch, batch.complete_many)


def _story(path: Path, workflow: str) -> dict[str, Any]:
    """A draft and publish, a cancel while running, a stale worker and a retry; the
    transcript of what the database holds afterwards, with ids replaced by names."""
    tasks = {
        "pair": services.enqueue(workflow, {}).task,
        "cancelled": services.enqueue("demo.noop", {"c": 1}).task,
        "stale": services.enqueue("demo.noop", {"s": 1}).task,
        "retried": services.enqueue("demo.noop", {"r": 1}).task,
    }
    first = {name: step_at(task, 0) for name, task in tasks.items()}

    held = path.claim(list(first.values()), "w1")
    services.cancel(tasks["cancelled"], actor="cli:t", reason="withdrawn")
    backdate(first["stale"], seconds=LEASE + 60)
    assert services.reap_expired_leases() == 1
    current = path.claim([first["stale"]], "w2")[first["stale"].pk]
    failed = held[first["retried"].pk]
    services.fail_step(failed, error_class="Boom", message="boom", retry_in=0, reason="")
    accepted = path.complete(
        [
            (held[first["pair"].pk], {"draft": "v1"}),
            (held[first["cancelled"].pk], {"c": "kept"}),
            (held[first["stale"].pk], {"s": "late"}),
        ]
    )
    assert accepted == {first["pair"].pk, first["cancelled"].pk}
    assert path.complete([(current, {"s": "fresh"})]) == {first["stale"].pk}
    last = path.claim([step_at(tasks["pair"], 1), first["retried"]], "w1")
    assert path.complete([(claim, {"last": claim.attempt}) for claim in last.values()]) == set(last)

    names = {
        step.pk: f"{name}.{step.position}"
        for name, task in tasks.items()
        for step in task.steps.all()
    }

    def named(data: dict[str, Any]) -> dict[str, Any]:
        if "steps" in data:
            data = {**data, "steps": {names[int(pk)]: v for pk, v in data["steps"].items()}}
        return data

    transcript = {}
    for name, task in tasks.items():
        task.refresh_from_db()
        transcript[name] = {
            "task": (task.status, task.finished_at is None, task.cancel_requested_at is None),
            "steps": [
                (
                    names[s.pk],
                    s.status,
                    s.attempts,
                    s.fencing_token,
                    s.result,
                    s.error_class,
                    s.last_error,
                    s.available_at is None,
                    s.lease_expires_at is None,
                    s.finished_at is None,
                )
                for s in task.steps.order_by("position")
            ],
            "leases": [
                (
                    names[lease.step_id],
                    lease.token,
                    lease.worker_id,
                    lease.outcome,
                    lease.released_at is None,
                )
                for lease in Lease.objects.filter(step__task=task).order_by("step_id", "token")
            ],
            "events": [
                (e.kind, e.actor, e.reason, names.get(e.step_id or 0), named(e.data))
                for e in Event.objects.for_task(task.pk)
            ],
        }
    return transcript


@pytest.mark.django_db
def test_the_batch_path_leaves_the_same_states_and_history_as_the_one_step_path(
    pair: str,
) -> None:
    one_step = _story(ONE_STEP, pair)
    batched = _story(BATCHED, pair)

    assert batched == one_step
    # ... and it is the story the design tells, not two identical mistakes.
    assert {name: [e[0] for e in story["events"]] for name, story in one_step.items()} == {
        "pair": ["enqueued", "claimed", "succeeded", "claimed", "succeeded"],
        "cancelled": ["enqueued", "claimed", "cancel_requested", "succeeded", "cancelled"],
        "stale": [
            "enqueued",
            "claimed",
            "lease_expired",
            "claimed",
            "stale_write_rejected",
            "succeeded",
        ],
        "retried": ["enqueued", "claimed", "retry_scheduled", "claimed", "succeeded"],
    }
    assert {name: story["task"][0] for name, story in one_step.items()} == {
        "pair": TaskStatus.SUCCEEDED,
        "cancelled": TaskStatus.CANCELLED,
        "stale": TaskStatus.SUCCEEDED,
        "retried": TaskStatus.SUCCEEDED,
    }
    succeeded_by = [e[1] for e in one_step["stale"]["events"] if e[0] == "succeeded"]
    assert succeeded_by == ["worker:w2"]


@pytest.mark.django_db
def test_a_batch_completion_names_each_claims_own_worker_as_the_actor() -> None:
    noops(2)
    [first] = claim_due(limit=1, worker_id="wa").values()
    [second] = claim_due(limit=1, worker_id="wb").values()

    assert batch.complete_many([(first, {}), (second, {})]) == {first.step_id, second.step_id}

    actors = dict(Event.objects.filter(kind=EventKind.SUCCEEDED).values_list("step_id", "actor"))
    assert actors == {first.step_id: "worker:wa", second.step_id: "worker:wb"}


# --- 5. the draining worker ---------------------------------------------------------------


@pytest.mark.django_db
def test_a_doorbell_drains_its_step_and_every_other_due_step_of_its_queue(
    patient_drain: None, settings: Any
) -> None:
    settings.TASKS_CLAIM_BATCH = 4
    steps = noops(30)
    named = steps[17]

    assert runner.drain(named.pk) == 30

    for step in map(fresh, steps):
        assert (step.status, step.attempts, step.fencing_token) == (StepStatus.SUCCEEDED, 1, 1)
        assert lease_count(step) == 1
        assert kinds(step.task) == ["enqueued", "claimed", "succeeded"]
    assert Task.objects.filter(status=TaskStatus.SUCCEEDED).count() == 30
    sizes = [len(group) for group in claimed_batches(steps)]
    assert claimed_batches(steps)[0] == [named.pk]  # the named step first, alone
    assert sum(sizes) == 30
    assert max(sizes) <= 4
    assert all(later <= 2 * earlier for earlier, later in pairwise(sizes))


@pytest.mark.django_db
def test_batches_double_while_steps_are_fast_up_to_the_configured_size(
    patient_drain: None, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.TASKS_CLAIM_BATCH = 4
    # Every step counts as fast, so the growth does not depend on this machine's speed.
    monkeypatch.setattr(runner, "FAST_STEP_SECONDS", 3600.0)
    steps = noops(30)

    assert runner.drain(steps[0].pk) == 30

    assert [len(group) for group in claimed_batches(steps)] == [1, 2, 4, 4, 4, 4, 4, 4, 3]


@pytest.mark.django_db
def test_with_a_claim_batch_of_one_a_drain_still_runs_every_step(
    patient_drain: None, settings: Any
) -> None:
    settings.TASKS_CLAIM_BATCH = 1
    steps = noops(5)

    assert runner.drain(steps[2].pk) == 5

    assert all(fresh(step).status == StepStatus.SUCCEEDED for step in steps)
    assert [len(group) for group in claimed_batches(steps)] == [1] * 5


@pytest.mark.django_db
def test_the_celery_entry_point_drains_the_queue_of_the_step_it_names(patient_drain: None) -> None:
    steps = noops(3)

    run_step(steps[1].pk)

    assert [fresh(step).status for step in steps] == [StepStatus.SUCCEEDED] * 3


@pytest.mark.django_db
def test_draining_leaves_other_and_paused_queues_alone(
    patient_drain: None, two_queues: None
) -> None:
    here = noops(5)
    there = noops(3, queue="other")

    assert runner.drain(here[0].pk) == 5

    assert all(fresh(step).status == StepStatus.SUCCEEDED for step in here)
    for step in map(fresh, there):
        assert (step.status, step.fencing_token) == (StepStatus.PENDING, 0)
        assert lease_count(step) == 0

    services.pause_queue("other", actor="cli:t", reason="incident")
    assert runner.drain(there[0].pk) == 0
    assert all(fresh(step).fencing_token == 0 for step in there)
    services.resume_queue("other", actor="cli:t", reason="over")
    assert runner.drain(there[0].pk) == 3


@pytest.mark.django_db
def test_a_doorbell_for_a_step_that_already_finished_still_drains_its_queue(
    patient_drain: None,
) -> None:
    finished = noops(1)[0]
    assert runner.drain(finished.pk) == 1
    later = noops(3)

    assert runner.drain(finished.pk) == 3

    assert all(fresh(step).status == StepStatus.SUCCEEDED for step in later)
    assert fresh(finished).fencing_token == 1
    assert kinds(finished.task) == ["enqueued", "claimed", "succeeded"]


def follow_doorbells(broker: BrokerView, *, limit: int = 50) -> list[int]:
    """Answer every doorbell rung, and those they ring in turn, as a worker would; how
    many steps each drain ran."""
    ran: list[int] = []
    bells = broker.step_ids()
    broker.purge()
    while bells:
        assert len(ran) < limit, "the doorbells never stopped ringing"
        ran.append(runner.drain(bells.pop(0)))
        bells += broker.step_ids()
        broker.purge()
    return ran


@pytest.mark.django_db(transaction=True)
def test_a_drain_out_of_time_runs_one_batch_and_rings_for_the_rest(
    broker: BrokerView, settings: Any
) -> None:
    settings.TASKS_DRAIN_SECONDS = 0
    steps = noops(5)
    broker.purge()

    assert runner.drain(steps[0].pk) == 1

    assert [fresh(step).status for step in steps] == [StepStatus.SUCCEEDED] + [
        StepStatus.PENDING
    ] * 4
    assert broker.step_ids() != []  # rung for the rest, in the same queue
    settings.TASKS_DRAIN_SECONDS = 300
    assert sum(follow_doorbells(broker)) == 4
    assert all(fresh(step).status == StepStatus.SUCCEEDED for step in steps)
    assert all(lease_count(step) == 1 for step in steps)


@pytest.mark.django_db(transaction=True)
def test_a_chain_of_drains_out_of_time_runs_every_step_without_the_sweeper(
    broker: BrokerView, settings: Any
) -> None:
    settings.TASKS_DRAIN_SECONDS = 0
    steps = noops(4)
    broker.purge()

    assert runner.drain(steps[0].pk) == 1
    ran = follow_doorbells(broker)

    # Each drain ran at most one batch of one (batches start at one step).
    assert sorted(set(ran)) in ([0, 1], [1])
    assert sum(ran) == 3
    assert all(fresh(step).status == StepStatus.SUCCEEDED for step in steps)
    assert all(lease_count(step) == 1 for step in steps)


def _flaky_and_noops() -> tuple[list[Step], list[Step]]:
    """noop, flaky, noop, flaky, noop: the flaky ones fail their first claim."""
    failing, passing = [], []
    for n in range(5):
        if n % 2:
            failing.append(only_step(services.enqueue("demo.flaky", {"fail_first": 1}).task))
        else:
            passing.append(only_step(services.enqueue("demo.noop", {"n": n}).task))
    return failing, passing


@pytest.mark.django_db
def test_failures_inside_a_batch_are_retried_with_backoff_while_its_successes_are_recorded(
    patient_drain: None,
) -> None:
    failing, passing = _flaky_and_noops()
    claims = batch.claim_batch(worker_id=WORKER, limit=10, queue="default")
    assert len(claims) == 5

    runner.run_batch(claims)

    for step in map(fresh, passing):
        assert (step.status, step.result) == (StepStatus.SUCCEEDED, {})
        assert Lease.objects.get(step=step).outcome == Lease.Outcome.SUCCEEDED
        assert Task.objects.get(pk=step.task_id).status == TaskStatus.SUCCEEDED
    for step in map(fresh, failing):
        assert (step.status, step.attempts, step.fencing_token) == (StepStatus.PENDING, 1, 1)
        assert step.result is None
        assert step.error_class == "tasks_app.exceptions.RetryableError"
        assert "fail_first" in step.last_error
        lease = Lease.objects.get(step=step)
        assert lease.outcome == Lease.Outcome.FAILED
        assert step.available_at is not None
        assert step.available_at >= lease.acquired_at
        task = Task.objects.get(pk=step.task_id)
        assert task.status == TaskStatus.PENDING
        assert kinds(task) == ["enqueued", "claimed", "retry_scheduled"]
        [retry] = events(task, EventKind.RETRY_SCHEDULED)
        assert 0 <= retry.data["retry_in"] <= 0.1  # demo.flaky: base 0.1 s, first retry

    for step in failing:
        backdate(step)
    assert runner.drain(failing[0].pk) == 2
    for step in map(fresh, failing):
        assert (step.status, step.attempts, step.fencing_token) == (StepStatus.SUCCEEDED, 2, 2)
        assert step.result == {"token": 2, "attempt": 2}
        outcomes = list(Lease.objects.filter(step=step).values_list("outcome", flat=True))
        assert outcomes == [Lease.Outcome.FAILED, Lease.Outcome.SUCCEEDED]


@pytest.mark.django_db
def test_a_drain_retries_the_failures_of_its_batches_and_still_runs_the_rest(
    patient_drain: None,
) -> None:
    failing, passing = _flaky_and_noops()

    ran = runner.drain(passing[0].pk)

    # The retry may come due while the drain still runs (demo.flaky waits at most 0.1 s).
    assert ran in (5, 6, 7)
    assert all(fresh(step).status == StepStatus.SUCCEEDED for step in passing)
    assert all(lease_count(step) == 1 for step in passing)
    for step in failing:
        if fresh(step).status == StepStatus.PENDING:
            backdate(step)
    runner.drain(failing[0].pk)
    for step in map(fresh, failing):
        assert (step.status, step.fencing_token) == (StepStatus.SUCCEEDED, 2)
        assert kinds(step.task) == [
            "enqueued",
            "claimed",
            "retry_scheduled",
            "claimed",
            "succeeded",
        ]


# --- 6. the heartbeat covers the whole batch ----------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_keeps_a_waiting_claim_of_the_batch_alive_while_an_earlier_step_runs(
    gate: Gate, broker: BrokerView
) -> None:
    slow = only_step(services.enqueue(GATE, {}, priority=10).task)
    waiting = noops(1)[0]
    claims = batch.claim_batch(worker_id=WORKER, limit=2, queue="default", lease_seconds=1)
    assert [claim.step_id for claim in claims] == [slow.pk, waiting.pk]
    errors: list[BaseException] = []

    thread = worker_thread(lambda: runner.run_batch(claims), errors)
    thread.start()
    assert gate.started.wait(timeout=20)

    # The waiting step's lease looks long gone; the heartbeat (every third of a second)
    # renews it although its handler has not started.
    backdate(waiting)
    live = Step.objects.filter(pk=waiting.pk, lease_expires_at__gt=Now())
    wait_for(live.exists, timeout=20, interval=0.01, what="the waiting claim's lease renewed")
    assert fresh(waiting).status == StepStatus.RUNNING
    assert fresh(waiting).result is None  # ... and it still has not run
    assert services.reap_expired_leases() == 0

    services.cancel(slow.task, actor="cli:t", reason="let the batch go on")
    thread.join(timeout=30)

    assert not thread.is_alive()
    assert not errors
    assert fresh(slow).result == {"saw_cancel": True}
    waiting = fresh(waiting)
    assert (waiting.status, waiting.fencing_token, waiting.result) == (StepStatus.SUCCEEDED, 1, {})
    assert EventKind.STALE_WRITE_REJECTED not in kinds(waiting.task)
    assert Task.objects.get(pk=slow.task_id).status == TaskStatus.CANCELLED


def _waiting_statements() -> list[str]:
    """Statements of other sessions on this database that wait for a lock."""
    with connection.cursor() as cursor:
        # Activity is snapshotted once per transaction unless the snapshot is cleared.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT query FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        return [query for (query,) in cursor.fetchall()]


@pytest.mark.django_db(transaction=True)
def test_a_renewal_racing_the_batchs_own_completion_is_not_recorded_as_a_stale_write(
    broker: BrokerView,
) -> None:
    step = noops(1)[0]
    claims = batch.claim_batch(worker_id=WORKER, limit=1, queue="default", lease_seconds=1)
    errors: list[BaseException] = []

    thread = worker_thread(lambda: runner.run_batch(claims), errors)
    with transaction.atomic():
        # Hold the step row so the completion queues on it, then let a renewal (due every
        # third of the one-second lease) queue behind it if the claim is still renewed.
        Step.objects.select_for_update().get(pk=step.pk)
        thread.start()
        wait_for(
            lambda: any("WITH input AS" in query for query in _waiting_statements()),
            timeout=20,
            interval=0.01,
            what="the completion to reach the step row",
        )
        # A renewal may or may not come due while the row is held; give it the time to.
        with contextlib.suppress(AssertionError):
            wait_for(lambda: len(_waiting_statements()) >= 2, timeout=2, interval=0.01)
        renewal_queued = len(_waiting_statements()) >= 2
    thread.join(timeout=30)
    if renewal_queued:
        # The queued renewal ends moments after the completion commits, on its own thread.
        stale = Event.objects.filter(task_id=step.task_id, kind=EventKind.STALE_WRITE_REJECTED)
        with contextlib.suppress(AssertionError):
            wait_for(stale.exists, timeout=3, interval=0.01)

    assert not thread.is_alive()
    assert not errors
    assert fresh(step).status == StepStatus.SUCCEEDED
    assert kinds(step.task) == ["enqueued", "claimed", "succeeded"]


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
    claims = batch.claim_batch(worker_id=WORKER, limit=10, queue="default")
    assert len(claims) == 3
    for claim in claims:
        assert claim.step is not None
        stored = Step.objects.select_related("task").get(pk=claim.step_id)
        assert field_values(claim.step) == field_values(stored)
        assert field_values(claim.step.task) == field_values(stored.task)
        assert claim.step.status == StepStatus.RUNNING
        assert claim.step.task.status == TaskStatus.RUNNING
        assert (claim.token, claim.attempt) == (stored.fencing_token, stored.attempts)
    assert {claim.task_id for claim in claims} == {result.task.pk for result in results}
