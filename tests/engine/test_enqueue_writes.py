"""What an enqueue writes and when it rings: the task, its steps (only the first due) and
its ``enqueued`` event; step keys; a step to run later is not claimed before its time and
is rung by the sweeper once due; the doorbell rings only after commit, and a broker that
is down fails nothing; and a producer recovers from a connection the database dropped
(DESIGN §2 rules 1, 3 and 5).

Tests that need a real commit (doorbells published after commit, a dropped connection)
are transactional.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import InterfaceError, OperationalError, connection, transaction
from kombu import pools

from config.celery import app as celery_app
from tasks_app import services
from tasks_app.demo.workflows import noop
from tasks_app.engine.dispatch import publisher
from tasks_app.history import timeline
from tasks_app.models import Event, EventKind, StepStatus, Task, TaskStatus
from tasks_app.workflows import StepSpec, Workflow, registry
from tests.conftest import BrokerView, backdate, only_step
from tests.enqueue_support import NOTHING, stored

DOWN_BROKER_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1: connection refused


# --- helpers ---------------------------------------------------------------------------------


def point_broker_at(url: str) -> None:
    """Make the Celery app publish to ``url``, dropping every pooled broker connection.

    kombu caches connection and producer pools per URL (globally) and Celery caches them on
    the app, so all three are reset for the new URL to take effect.
    """
    celery_app.conf.update(broker_url=url)
    pools.reset()
    # What Celery itself does after a fork; it has no public call for it.
    celery_app._pool = None  # type: ignore[attr-defined]
    celery_app.amqp._producer_pool = None  # type: ignore[attr-defined]


@pytest.fixture
def three_steps() -> Iterator[Workflow]:
    """A registered workflow with three steps, to see positions and blocked steps."""
    flow = Workflow(
        "test.enqueue.three",
        1,
        steps=(StepSpec("fetch", noop), StepSpec("draft", noop), StepSpec("send", noop)),
    )
    registry.register(flow)
    yield flow
    registry.unregister(flow.name, flow.version)


# --- what an enqueue writes --------------------------------------------------------------------


@pytest.mark.django_db
def test_it_writes_the_task_and_its_steps_which_record_the_enqueue_and_makes_only_the_first_due(
    three_steps: Workflow,
) -> None:
    result = services.enqueue(
        three_steps.name,
        {"article_id": "a-1"},
        idempotency_key="publish:article-001:v3",
        priority=7,
        actor="cli:alice",
    )

    assert result.created is True
    task = Task.objects.get()
    assert task == result.task
    assert (task.workflow, task.workflow_version, task.payload) == (
        three_steps.name,
        1,
        {"article_id": "a-1"},
    )
    assert (task.status, task.queue, task.priority) == (TaskStatus.PENDING, "default", 7)
    assert (task.created_by, task.created_by_user, task.finished_at) == ("cli:alice", None, None)
    steps = list(task.steps.order_by("position"))
    assert [(s.position, s.revision, s.kind, s.status) for s in steps] == [
        (0, 0, "fetch", StepStatus.PENDING),
        (1, 0, "draft", StepStatus.BLOCKED),
        (2, 0, "send", StepStatus.BLOCKED),
    ]
    assert [s.idempotency_key for s in steps] == [
        "publish:article-001:v3:0:fetch",
        "publish:article-001:v3:1:draft",
        "publish:article-001:v3:2:send",
    ]
    assert all(
        (s.attempts, s.fencing_token, s.queue, s.priority) == (0, 0, "default", 7) for s in steps
    )
    assert steps[0].available_at is not None
    assert steps[0].available_at <= services.db_now()
    assert [s.available_at for s in steps[1:]] == [None, None]
    # No Event row: the task row and its first steps record the enqueue, read as one.
    assert not Event.objects.exists()
    [event] = timeline.history(task.pk)
    assert (event.kind, event.task_id, event.step_id) == (EventKind.ENQUEUED, task.pk, None)
    assert (event.actor, event.actor_user_id, event.created_at) == (
        "cli:alice",
        None,
        task.created_at,
    )
    assert event.data == {
        "workflow": three_steps.name,
        "version": 1,
        "queue": "default",
        "payload_hash": task.payload_hash,
        "steps": {
            str(steps[0].pk): ["pending", 0, 0],
            str(steps[1].pk): ["blocked", 0, 0],
            str(steps[2].pk): ["blocked", 0, 0],
        },
    }


@pytest.mark.django_db
def test_a_task_without_a_key_derives_its_step_keys_from_its_id() -> None:
    task = services.enqueue("demo.noop", {}).task

    assert task.idempotency_key is None
    assert only_step(task).idempotency_key == f"task-{task.pk}:0:noop"


@pytest.mark.django_db
def test_it_records_a_user_who_enqueues(oncall: Any) -> None:
    task = services.enqueue("demo.noop", {}, actor=oncall).task

    task.refresh_from_db()
    assert (task.created_by, task.created_by_user) == ("olivia-oncall", oncall)
    [event] = timeline.history(task.pk)
    assert (event.kind, event.actor, event.actor_user_id) == (
        "enqueued",
        "olivia-oncall",
        oncall.pk,
    )


@pytest.mark.django_db
def test_get_task_finds_a_task_by_its_key_or_returns_none() -> None:
    task = services.enqueue("demo.noop", {}, idempotency_key="find:me").task
    services.enqueue("demo.noop", {})

    assert services.get_task(idempotency_key="find:me") == task
    assert services.get_task(idempotency_key="find:nobody") is None
    assert services.get_task(idempotency_key=f"task-{task.pk}") is None


# --- run_after --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_step_to_run_later_cannot_be_claimed_before_its_time() -> None:
    run_after = services.db_now() + timedelta(hours=1)
    task = services.enqueue("demo.noop", {}, run_after=run_after).task
    step = only_step(task)
    assert (step.status, step.available_at) == (StepStatus.PENDING, run_after)

    assert services.claim_step(step.pk, worker_id="w") is None
    backdate(step, 3600 - 60)  # a minute to go
    assert services.claim_step(step.pk, worker_id="w") is None
    step.refresh_from_db()
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.PENDING, 0, 0)

    backdate(step, 120)  # a minute past
    claim = services.claim_step(step.pk, worker_id="w")

    assert claim is not None
    step.refresh_from_db()
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.RUNNING, 1, 1)


@pytest.mark.django_db
def test_a_step_due_in_an_hour_is_rung_by_the_sweeper_once_it_is_due(
    broker: BrokerView, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        task = services.enqueue(
            "demo.noop", {}, run_after=services.db_now() + timedelta(hours=1)
        ).task
    step = only_step(task)
    assert broker.step_ids() == []  # too far out for a countdown; the sweeper will ring

    with django_capture_on_commit_callbacks(execute=True):
        assert services.sweep().redispatched == 0
    assert broker.step_ids() == []

    backdate(step, 3600 + 60)
    with django_capture_on_commit_callbacks(execute=True):
        assert services.sweep().redispatched == 1
    assert broker.step_ids() == [step.pk]


# --- the doorbell ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_first_step_is_rung_once_the_enqueue_commits(
    broker: BrokerView, django_capture_on_commit_callbacks: Any, three_steps: Workflow
) -> None:
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        task = services.enqueue(three_steps.name, {}).task
        assert broker.step_ids() == []  # not before commit

    assert callbacks  # the doorbell's (and the counts') ran at the commit
    first = task.steps.get(position=0)
    assert broker.step_ids() == [first.pk]


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_enqueue_leaves_no_task_and_rings_nothing(broker: BrokerView) -> None:
    with pytest.raises(RuntimeError, match="caller changed its mind"), transaction.atomic():
        services.enqueue("demo.noop", {}, idempotency_key="rollback:1")
        assert Task.objects.count() == 1
        raise RuntimeError("caller changed its mind")

    assert stored() == NOTHING
    assert broker.step_ids() == []
    # The key was never taken.
    assert services.enqueue("demo.noop", {"other": 1}, idempotency_key="rollback:1").created


@pytest.mark.django_db(transaction=True)
def test_a_committed_enqueue_rings_the_first_step_after_commit(broker: BrokerView) -> None:
    with transaction.atomic():
        task = services.enqueue("demo.noop", {}).task
        assert broker.step_ids() == []

    assert broker.step_ids() == [only_step(task).pk]


@pytest.mark.django_db(transaction=True)
def test_a_broker_that_is_down_does_not_fail_the_enqueue_and_the_sweeper_rings_later(
    broker: BrokerView, caplog: pytest.LogCaptureFixture
) -> None:
    original = celery_app.conf.broker_url
    try:
        point_broker_at(DOWN_BROKER_URL)
        started = time.monotonic()
        result = services.enqueue("demo.noop", {}, idempotency_key="down:1")
        took = time.monotonic() - started
        # Doorbells go out from a background thread: let it try while the broker is down.
        assert publisher.flush(timeout=10)
    finally:
        point_broker_at(original)

    # The publish was tried and failed, and neither failed nor held up the enqueue
    # (DESIGN rule 1: short broker timeouts, no blocking retries).
    assert any("could not ring" in record.getMessage() for record in caplog.records)
    assert took < 1.0, f"enqueue with the broker down took {took:.1f}s"
    assert result.created is True
    task = Task.objects.get()
    step = only_step(task)
    assert (task.status, step.status) == (TaskStatus.PENDING, StepStatus.PENDING)
    assert broker.step_ids() == []

    assert services.sweep().redispatched == 0  # rung a moment ago, as far as it knows
    assert broker.step_ids() == []
    backdate(step, 60)
    assert services.sweep().redispatched == 1
    assert broker.step_ids() == [step.pk]


# --- a connection the database dropped --------------------------------------------------------


def _drop_django_connection() -> None:
    """Terminate this process's database session from another one, as a restart does."""
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    params = connection.get_connection_params()
    other = connection.get_new_connection(params)
    try:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()


@pytest.mark.django_db(transaction=True)
def test_a_producer_outside_a_transaction_recovers_from_a_dropped_connection() -> None:
    services.enqueue("demo.noop", {"n": 0}, idempotency_key="drop:0")

    # With a key, the enqueue tries again on a new connection and succeeds at once.
    _drop_django_connection()
    keyed = services.enqueue("demo.noop", {"n": 1}, idempotency_key="drop:1")
    assert keyed.created and Task.objects.filter(idempotency_key="drop:1").count() == 1

    # Without one, a second try could copy a task whose commit went unanswered: the call
    # fails, and the producer's next call runs on a new connection.
    _drop_django_connection()
    with pytest.raises(OperationalError):
        services.enqueue("demo.noop", {"n": 2})
    assert services.enqueue("demo.noop", {"n": 3}).created
    assert Task.objects.filter(workflow="demo.noop").count() == 3


@pytest.mark.django_db(transaction=True)
def test_inside_a_callers_transaction_a_dropped_connection_is_an_error() -> None:
    with pytest.raises((OperationalError, InterfaceError)), transaction.atomic():
        Task.objects.count()
        _drop_django_connection()
        services.enqueue("demo.noop", {"n": 1}, idempotency_key="drop:in")
    connection.close()
    assert not Task.objects.filter(idempotency_key="drop:in").exists()
