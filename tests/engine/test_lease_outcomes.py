"""What comes of running a claimed step: a success records its events and makes the next
step due; a failed attempt is retried after its backoff and not claimed before it; a step
that keeps failing is dead-lettered after its attempts, and a redrive restarts its budget
but not its fencing token; a handler error is retried or dead-lettered by its class; and
a step of a workflow version this worker lacks waits uncharged for a worker that has it
(DESIGN rules 3 and 6).

Time moves by back-dating rows (``backdate``), never by sleeping.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from tasks_app import services
from tasks_app.demo.workflows import flaky, validate_flaky
from tasks_app.engine import runner
from tasks_app.models import EventKind, Lease, StepStatus, TaskStatus
from tasks_app.tasks import run_step
from tasks_app.workflows import StepSpec, Workflow, register, registry
from tests.conftest import backdate, event_kinds, only_step
from tests.e2e_support import wait_for
from tests.lease_support import WORKER, Recorder, claim, events, fresh, step_at
from tests.lease_support import pair as pair  # a fixture, for pytest to find
from tests.lease_support import recorder as recorder  # a fixture, for pytest to find

VERSIONED = "test.worker.versioned"
SLOW_RETRY = "test.worker.slow_retry"


# --- test workflows -----------------------------------------------------------------------


@pytest.fixture
def versioned(recorder: Recorder) -> Iterator[str]:
    for version in (1, 2):
        register(Workflow(VERSIONED, version, steps=(StepSpec("only", recorder.handler),)))
    yield VERSIONED
    for version in (1, 2):
        registry.unregister(VERSIONED, version)


@pytest.fixture
def slow_retry() -> Iterator[str]:
    """demo.flaky's handler with a backoff long enough that "not yet due" is certain."""
    register(
        Workflow(
            SLOW_RETRY,
            1,
            steps=(StepSpec("flaky", flaky, backoff_base=3600, backoff_cap=3600),),
            validate_payload=validate_flaky,
        )
    )
    yield SLOW_RETRY
    registry.unregister(SLOW_RETRY, 1)


# --- the success path ---------------------------------------------------------------------


@pytest.mark.django_db
def test_a_step_that_succeeds_records_enqueued_claimed_and_succeeded() -> None:
    task = services.enqueue("demo.noop", {"hello": "world"}).task
    step = only_step(task)

    assert runner.run_claimed(step.pk) is True

    step = fresh(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.SUCCEEDED, 1, 1)
    assert step.result == {}
    assert step.lease_expires_at is None
    assert step.finished_at is not None
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    assert task.finished_at is not None
    assert event_kinds(task) == ["enqueued", "claimed", "succeeded"]
    claimed = events(task, EventKind.CLAIMED)[0]
    assert claimed.step_id == step.pk
    assert claimed.actor == f"worker:{runner.worker_id()}"
    assert (claimed.data["token"], claimed.data["attempt"]) == (1, 1)
    lease = Lease.objects.get(step=step)
    assert (lease.token, lease.worker_id) == (1, runner.worker_id())
    assert lease.outcome == Lease.Outcome.SUCCEEDED
    assert lease.released_at is not None


@pytest.mark.django_db
def test_the_second_step_becomes_pending_only_after_the_first_succeeds(
    pair: str, recorder: Recorder
) -> None:
    task = services.enqueue(pair, {"draft": "fail_once"}, idempotency_key="post-7").task
    draft, publish = step_at(task, 0), step_at(task, 1)
    assert (draft.status, publish.status) == (StepStatus.PENDING, StepStatus.BLOCKED)
    assert publish.available_at is None
    assert services.claim_step(publish.pk, worker_id=WORKER) is None

    # The first attempt fails: the draft waits for its retry, the publish stays blocked.
    assert runner.run_claimed(draft.pk) is True
    assert fresh(draft).status == StepStatus.PENDING
    assert fresh(publish).status == StepStatus.BLOCKED
    assert services.claim_step(publish.pk, worker_id=WORKER) is None

    backdate(draft)
    assert runner.run_claimed(draft.pk) is True
    assert fresh(draft).status == StepStatus.SUCCEEDED
    publish = fresh(publish)
    assert publish.status == StepStatus.PENDING
    assert publish.available_at is not None
    assert publish.attempts == publish.fencing_token == 0

    assert runner.run_claimed(publish.pk) is True
    assert fresh(publish).status == StepStatus.SUCCEEDED
    assert fresh(publish).result == {"done": "publish", "attempt": 1}
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    assert event_kinds(task) == [
        "enqueued",
        "claimed",
        "retry_scheduled",
        "claimed",
        "succeeded",
        "claimed",
        "succeeded",
    ]
    # The draft's success is the event that made the publish due.
    made_due = events(task, EventKind.SUCCEEDED)[0]
    assert made_due.data["steps"][str(publish.pk)] == [StepStatus.PENDING, 0, 0]
    # The handler saw its place in the retry story and the earlier result.
    assert recorder.calls == [
        {
            "kind": "draft",
            "attempt": 1,
            "token": 1,
            "step_key": "post-7:0:draft",
            "results": {},
        },
        {
            "kind": "draft",
            "attempt": 2,
            "token": 2,
            "step_key": "post-7:0:draft",
            "results": {},
        },
        {
            "kind": "publish",
            "attempt": 1,
            "token": 1,
            "step_key": "post-7:1:publish",
            "results": {"draft": {"done": "draft", "attempt": 2}},
        },
    ]


# --- a retry waits for its backoff --------------------------------------------------------


@pytest.mark.django_db
def test_a_failed_attempt_is_retried_after_its_backoff() -> None:
    task = services.enqueue("demo.flaky", {"fail_first": 1}).task
    step = only_step(task)

    assert runner.run_claimed(step.pk) is True

    step = fresh(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.PENDING, 1, 1)
    assert step.error_class == "tasks_app.exceptions.RetryableError"
    assert "failing on claim 1" in step.last_error
    task.refresh_from_db()
    assert task.status == TaskStatus.PENDING
    assert task.finished_at is None
    retry = events(task, EventKind.RETRY_SCHEDULED)[0]
    # demo.flaky: base 0.1 s, so the first retry waits between 0 and 0.1 s (full jitter).
    assert 0 <= retry.data["retry_in"] <= 0.1
    assert retry.data["error_class"] == "tasks_app.exceptions.RetryableError"
    released = Lease.objects.get(step=step, token=1)
    assert released.outcome == Lease.Outcome.FAILED
    assert released.released_at is not None
    assert step.available_at is not None
    assert step.available_at > released.acquired_at
    assert step.available_at <= released.released_at + timedelta(seconds=0.1)
    assert step.dispatched_at == step.available_at

    backdate(step)
    assert runner.run_claimed(step.pk) is True

    step = fresh(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.SUCCEEDED, 2, 2)
    assert step.result == {"token": 2, "attempt": 2}
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    assert event_kinds(task) == ["enqueued", "claimed", "retry_scheduled", "claimed", "succeeded"]


@pytest.mark.django_db
def test_a_retry_is_not_claimed_before_its_backoff_has_passed(slow_retry: str) -> None:
    task = services.enqueue(slow_retry, {"fail_first": 1}).task
    step = only_step(task)
    # Full jitter may pick any delay down to zero; this seed picks a long one.
    random.seed(20260601)
    assert runner.run_claimed(step.pk) is True
    retry_in = events(task, EventKind.RETRY_SCHEDULED)[0].data["retry_in"]
    assert 60 < retry_in <= 3600

    assert services.claim_step(step.pk, worker_id=WORKER) is None
    run_step(step.pk)
    assert runner.run_claimed(step.pk) is False
    # Looking did not count as an attempt.
    step = fresh(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.PENDING, 1, 1)
    assert Lease.objects.filter(step=step).count() == 1

    backdate(step, seconds=retry_in - 30)
    assert services.claim_step(step.pk, worker_id=WORKER) is None

    backdate(step, seconds=60)
    again = claim(step)
    assert (again.attempt, again.token) == (2, 2)


# --- max attempts dead-letters ------------------------------------------------------------


@pytest.mark.django_db
def test_a_step_that_keeps_failing_is_dead_lettered_after_max_attempts() -> None:
    task = services.enqueue("demo.flaky", {"fail_first": 5}).task
    step = only_step(task)
    assert step.max_attempts == 3

    for _ in range(3):
        backdate(step)
        assert runner.run_claimed(step.pk) is True

    step = fresh(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.DEAD, 3, 3)
    assert step.error_class == "tasks_app.exceptions.RetryableError"
    assert "failing on claim 3" in step.last_error
    assert step.finished_at is not None
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD
    assert task.finished_at is not None
    assert event_kinds(task) == [
        "enqueued",
        "claimed",
        "retry_scheduled",
        "claimed",
        "retry_scheduled",
        "claimed",
        "dead_lettered",
    ]
    dead = events(task, EventKind.DEAD_LETTERED)[0]
    assert dead.reason == "max_attempts"
    assert dead.data["error_class"] == "tasks_app.exceptions.RetryableError"
    # A dead step waits for a person: no message runs it.
    backdate(step)
    run_step(step.pk)
    assert fresh(step).status == StepStatus.DEAD
    assert Lease.objects.filter(step=step).count() == 3


@pytest.mark.django_db
def test_the_attempt_budget_restarts_on_redrive_but_the_fencing_token_does_not() -> None:
    task = services.enqueue("demo.flaky", {"fail_first": 3}).task
    step = only_step(task)
    for _ in range(3):
        backdate(step)
        runner.run_claimed(step.pk)
    assert fresh(step).status == StepStatus.DEAD

    services.redrive(task, actor="cli:test", reason="the remote is back")
    step = fresh(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.PENDING, 0, 3)

    after = claim(step)
    assert (after.attempt, after.token) == (1, 4)
    runner.execute(after)
    step = fresh(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.SUCCEEDED, 1, 4)
    assert step.result == {"token": 4, "attempt": 1}
    assert list(Lease.objects.filter(step=step).values_list("token", flat=True)) == [1, 2, 3, 4]


# --- how handler errors are classified ----------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("mode", "error_class", "reason"),
    [
        ("permanent", "tasks_app.exceptions.PermanentError", "permanent_error"),
        ("invalid_input", "tasks_app.exceptions.InvalidInput", "permanent_error"),
        ("outcome_unknown", "tasks_app.exceptions.OutcomeUnknown", "outcome_unknown"),
        ("set", "invalid_result", "permanent_error"),
        ("nan", "invalid_result", "permanent_error"),
    ],
)
def test_a_handler_error_that_retrying_cannot_fix_dead_letters_at_once(
    pair: str, recorder: Recorder, mode: str, error_class: str, reason: str
) -> None:
    task = services.enqueue(pair, {"draft": mode}).task
    draft, publish = step_at(task, 0), step_at(task, 1)

    runner.execute(claim(draft))

    draft = fresh(draft)
    assert (draft.status, draft.attempts, draft.max_attempts) == (StepStatus.DEAD, 1, 3)
    assert draft.error_class == error_class
    assert draft.last_error
    assert draft.result is None
    assert fresh(publish).status == StepStatus.BLOCKED
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD
    assert task.finished_at is not None
    assert event_kinds(task) == ["enqueued", "claimed", "dead_lettered"]
    assert events(task, EventKind.DEAD_LETTERED)[0].reason == reason
    assert len(recorder.calls) == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("mode", "error_class"),
    [("value_error", "builtins.ValueError"), ("runtime_error", "builtins.RuntimeError")],
)
def test_an_unexpected_handler_error_is_retried(pair: str, mode: str, error_class: str) -> None:
    task = services.enqueue(pair, {"draft": mode}).task
    draft = step_at(task, 0)
    start = services.db_now()

    runner.execute(claim(draft))

    draft = fresh(draft)
    assert (draft.status, draft.attempts) == (StepStatus.PENDING, 1)
    assert draft.error_class == error_class
    assert draft.available_at is not None
    assert draft.available_at > start
    retry = events(task, EventKind.RETRY_SCHEDULED)[0]
    assert 0 <= retry.data["retry_in"] <= 3600
    task.refresh_from_db()
    assert task.status == TaskStatus.PENDING


@pytest.mark.django_db
def test_a_handler_sees_earlier_results_its_attempt_and_its_step_key(
    pair: str, recorder: Recorder
) -> None:
    task = services.enqueue(pair, {"publish": "fail_once"}).task
    draft, publish = step_at(task, 0), step_at(task, 1)
    runner.execute(claim(draft))
    runner.execute(claim(publish))
    backdate(publish)
    runner.execute(claim(publish))

    assert fresh(publish).status == StepStatus.SUCCEEDED
    key = f"task-{task.pk}"
    assert [(c["kind"], c["attempt"], c["step_key"], c["results"]) for c in recorder.calls] == [
        ("draft", 1, f"{key}:0:draft", {}),
        ("publish", 1, f"{key}:1:publish", {"draft": {"done": "draft", "attempt": 1}}),
        ("publish", 2, f"{key}:1:publish", {"draft": {"done": "draft", "attempt": 1}}),
    ]
    assert fresh(publish).idempotency_key == f"{key}:1:publish"


# --- an unregistered workflow version -----------------------------------------------------


@pytest.mark.django_db
def test_a_step_of_a_version_this_worker_lacks_waits_uncharged_for_a_worker_that_has_it(
    versioned: str, recorder: Recorder, settings: Any
) -> None:
    """A rolling deploy: a producer on the new code enqueued v2; an old worker (v1 only)
    claims it, hands it back marked, due again later, attempt not charged; a worker that
    has v2 then runs it."""
    settings.TASKS_VERSION_RETRY_SECONDS = 30
    task = services.enqueue(versioned, {}).task
    assert task.workflow_version == 2
    step = only_step(task)
    registry.unregister(versioned, 2)  # this worker runs the old release

    assert runner.run_claimed(step.pk) is True

    assert recorder.calls == []
    step = fresh(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.PENDING, 0, 1)
    assert step.error_class == "awaiting_version"
    assert "v2 is not registered on worker" in step.last_error
    assert "it has v1" in step.last_error
    assert step.available_at is not None and step.available_at > services.db_now()
    assert runner.run_claimed(step.pk) is False  # not due before the retry interval
    released = events(task, EventKind.CLAIM_RELEASED)
    assert [(e.reason, e.data["version"]) for e in released] == [("awaiting_version", 2)]
    task.refresh_from_db()
    assert task.status == TaskStatus.PENDING

    # A worker of the new release takes it once it is due.
    register(Workflow(versioned, 2, steps=(StepSpec("only", recorder.handler),)))
    backdate(step, seconds=60)
    assert runner.run_claimed(step.pk) is True
    step = fresh(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.SUCCEEDED, 1, 2)
    assert event_kinds(task) == ["enqueued", "claimed", "claim_released", "claimed", "succeeded"]


@pytest.mark.django_db
def test_a_step_that_waited_its_whole_time_for_its_version_is_dead_lettered_as_incompatible(
    versioned: str, recorder: Recorder, settings: Any
) -> None:
    settings.TASKS_VERSION_WAIT_SECONDS = 1
    task = services.enqueue(versioned, {}).task
    step = only_step(task)
    registry.unregister(versioned, 2)
    assert runner.run_claimed(step.pk) is True
    assert fresh(step).status == StepStatus.PENDING
    since = services.awaiting_version_since(task.pk, step.pk)
    assert since is not None
    wait_for(
        lambda: (services.db_now() - since).total_seconds() >= 1,
        timeout=10,
        what="the wait to pass by the database's clock",
    )

    backdate(step, seconds=60)
    assert runner.run_claimed(step.pk) is True

    assert recorder.calls == []
    step = fresh(step)
    assert (step.status, step.attempts) == (StepStatus.DEAD, 1)
    assert step.error_class == "incompatible_version"
    assert "v2 is not registered on any worker that claimed it" in step.last_error
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD
    assert [e.reason for e in events(task, EventKind.DEAD_LETTERED)] == ["incompatible_version"]


@pytest.mark.django_db
def test_with_no_wait_a_step_of_a_missing_version_is_dead_lettered_at_once(
    versioned: str, recorder: Recorder, settings: Any
) -> None:
    settings.TASKS_VERSION_WAIT_SECONDS = 0
    task = services.enqueue(versioned, {}).task
    step = only_step(task)
    registry.unregister(versioned, 2)  # a deploy rolled the worker back to v1

    assert runner.run_claimed(step.pk) is True

    assert recorder.calls == []
    step = fresh(step)
    assert (step.status, step.attempts) == (StepStatus.DEAD, 1)
    assert step.error_class == "incompatible_version"
    assert "v2" in step.last_error
    assert [e.reason for e in events(task, EventKind.DEAD_LETTERED)] == ["incompatible_version"]


@pytest.mark.django_db
def test_with_no_wait_a_step_kind_the_workflow_does_not_have_is_dead_lettered_at_once(
    versioned: str, recorder: Recorder, settings: Any
) -> None:
    # With the default wait it waits first, like a missing version (test_version_waits).
    settings.TASKS_VERSION_WAIT_SECONDS = 0
    task = services.enqueue(versioned, {}).task
    step = only_step(task)
    registry.unregister(versioned, 2)
    register(Workflow(versioned, 2, steps=(StepSpec("renamed", recorder.handler),)))

    assert runner.run_claimed(step.pk) is True

    assert recorder.calls == []
    step = fresh(step)
    assert (step.status, step.error_class) == (StepStatus.DEAD, "unknown_step_kind")
    assert [e.reason for e in events(task, EventKind.DEAD_LETTERED)] == ["unknown_step_kind"]
