"""A step a worker cannot run by its task's rules waits for a worker that can, for a bounded
time (DESIGN rule 6, a rolling deploy): a workflow this worker has never registered (the
first upgrade that adds it), a version it lacks, or a step kind its version lacks. Such a
step is handed back uncharged, due again after ``TASKS_VERSION_RETRY_SECONDS``, runs once a
worker that has it claims it, and is dead-lettered (``incompatible_version``, or
``unknown_step_kind``) by a worker that lacks it only once ``TASKS_VERSION_WAIT_SECONDS``
have passed since it was first handed back, by the database's clock.

A test plays an old worker by unregistering what the new release registered. Time moves
by back-dating rows and through an injected clock (``database_clock``), never by sleeping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from tasks_app import services
from tasks_app.db import clock
from tasks_app.engine import runner
from tasks_app.models import EventKind, Step, StepStatus, Task, TaskStatus
from tasks_app.workflows import StepSpec, Workflow, register, registry
from tests.conftest import backdate, event_kinds, only_step
from tests.e2e_support import Worker, wait_for, worker_on_test_database
from tests.lease_support import Recorder, events, fresh
from tests.lease_support import recorder as recorder  # a fixture, for pytest to find
from tests.remotes import LoopbackRemote

NEW = "test.versions.new"  # a workflow only the new release has
KINDS = "test.versions.kinds"  # v1 whose second step the old release calls otherwise
WAIT, RETRY = 3600, 30

Move = Callable[[float], None]


@pytest.fixture(autouse=True)
def wait_settings(settings: Any) -> None:
    settings.TASKS_VERSION_WAIT_SECONDS = WAIT
    settings.TASKS_VERSION_RETRY_SECONDS = RETRY


@pytest.fixture
def new_workflow(recorder: Recorder) -> Iterator[Callable[[], None]]:
    """Registers ``NEW`` (a producer on the new release enqueues it); yields how to
    register it again after a test unregistered it to play a worker of the old release."""

    def new_release() -> None:
        register(Workflow(NEW, 1, steps=(StepSpec("only", recorder.handler),)))

    new_release()
    yield new_release
    registry.unregister(NEW, 1)


@pytest.fixture
def database_clock(monkeypatch: pytest.MonkeyPatch) -> Move:
    """Moves the database's clock, as the runner reads it, ``seconds`` ahead (the rows keep
    the real one: back-date a step to make it due)."""
    real = clock.db_now

    def move(seconds: float) -> None:
        monkeypatch.setattr(clock, "db_now", lambda: real() + timedelta(seconds=seconds))

    return move


def old_worker_hands_back(step: Step) -> Step:
    """A worker that lacks what the step needs claims it; it must come back uncharged."""
    attempts, token = fresh(step).attempts, fresh(step).fencing_token
    backdate(step, seconds=RETRY + 1)
    assert runner.run_claimed(step.pk) is True
    step = fresh(step)
    assert (step.status, step.attempts, step.fencing_token) == (
        StepStatus.PENDING,
        attempts,
        token + 1,
    )
    assert step.error_class == "awaiting_version"
    return step


def handed_back(task: Task) -> int:
    return len(
        [e for e in events(task, EventKind.CLAIM_RELEASED) if e.reason == "awaiting_version"]
    )


# --- a workflow the worker has never registered ---------------------------------------------


@pytest.mark.django_db
def test_a_workflow_this_worker_never_registered_waits_uncharged_and_runs_on_a_worker_that_has_it(
    new_workflow: Callable[[], None], recorder: Recorder
) -> None:
    task = services.enqueue(NEW, {}).task
    step = only_step(task)
    registry.unregister(NEW, 1)  # the old release never had it

    assert runner.run_claimed(step.pk) is True

    assert recorder.calls == []
    step = fresh(step)
    assert (step.status, step.attempts, step.error_class) == ("pending", 0, "awaiting_version")
    assert f"workflow {NEW} v1 is not registered on worker" in step.last_error
    assert "it has no version" in step.last_error
    assert f"up to {WAIT} s" in step.last_error
    assert runner.run_claimed(step.pk) is False  # due again only after the retry interval
    due = fresh(step).available_at
    assert due is not None and due > services.db_now() + timedelta(seconds=RETRY - 5)
    task.refresh_from_db()
    assert task.status == TaskStatus.PENDING

    new_workflow()  # a worker of the new release
    backdate(step, seconds=RETRY + 1)
    assert runner.run_claimed(step.pk) is True

    step = fresh(step)
    assert (step.status, step.attempts) == (StepStatus.SUCCEEDED, 1)
    assert [call["attempt"] for call in recorder.calls] == [1]
    assert event_kinds(task) == ["enqueued", "claimed", "claim_released", "claimed", "succeeded"]


@pytest.mark.django_db
def test_a_new_workflow_is_dead_lettered_as_incompatible_only_once_the_whole_wait_has_passed(
    new_workflow: Callable[[], None], recorder: Recorder, database_clock: Move
) -> None:
    task = services.enqueue(NEW, {}).task
    step = only_step(task)
    registry.unregister(NEW, 1)
    old_worker_hands_back(step)

    database_clock(WAIT - 5)  # a second old worker, just before the wait is over
    old_worker_hands_back(step)
    assert handed_back(task) == 2

    database_clock(WAIT + 1)
    backdate(step, seconds=RETRY + 1)
    assert runner.run_claimed(step.pk) is True

    assert recorder.calls == []
    step = fresh(step)
    assert (step.status, step.attempts, step.error_class) == ("dead", 1, "incompatible_version")
    assert f"workflow {NEW} v1 is not registered on any worker that claimed it" in step.last_error
    assert f"in {WAIT + 1} s of waiting" in step.last_error
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD
    assert [e.reason for e in events(task, EventKind.DEAD_LETTERED)] == ["incompatible_version"]


@pytest.mark.django_db
def test_a_redrive_starts_the_wait_again(
    new_workflow: Callable[[], None], database_clock: Move
) -> None:
    task = services.enqueue(NEW, {}).task
    step = only_step(task)
    registry.unregister(NEW, 1)
    old_worker_hands_back(step)
    database_clock(WAIT + 1)
    backdate(step, seconds=RETRY + 1)
    assert runner.run_claimed(step.pk) is True
    assert fresh(step).status == StepStatus.DEAD

    services.redrive(Task.objects.get(pk=task.pk), actor="cli:oncall", reason="rollout resumed")

    # Still an old worker: it waits again rather than dying at once.
    step = old_worker_hands_back(step)
    assert step.attempts == 0
    assert handed_back(task) == 2


@pytest.mark.django_db
def test_a_worker_whose_clock_is_slow_does_not_cut_the_wait_short(
    new_workflow: Callable[[], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wait is measured by the database's clock (rule 3), not by the clock of the
    process that wrote the first hand-back's event, which is stamped by the database's."""
    task = services.enqueue(NEW, {}).task
    step = only_step(task)
    registry.unregister(NEW, 1)
    # The first old worker's clock is two hours slow.
    slow_now = timezone.now
    with monkeypatch.context() as slow:
        slow.setattr(timezone, "now", lambda: slow_now() - timedelta(hours=2))
        old_worker_hands_back(step)
    [first] = events(task, EventKind.CLAIM_RELEASED)
    assert services.db_now() - timedelta(minutes=1) < first.created_at <= services.db_now()

    # Thirty seconds later by the database's clock, another old worker claims it.
    old_worker_hands_back(step)

    assert handed_back(task) == 2
    assert fresh(step).status == StepStatus.PENDING


# --- a step kind the worker's version lacks ---------------------------------------------------


@pytest.fixture
def kinds(recorder: Recorder) -> Iterator[Callable[[str], None]]:
    """``KINDS`` v1 as the new release declares it (``draft``, then ``publish``); yields
    how to register a release's v1 by its second step's kind (the old release: ``post``)."""

    def release(second: str) -> None:
        registry.unregister(KINDS, 1)
        steps = (StepSpec("draft", recorder.handler), StepSpec(second, recorder.handler))
        register(Workflow(KINDS, 1, steps=steps))

    release("publish")
    yield release
    registry.unregister(KINDS, 1)


@pytest.mark.django_db
def test_a_step_kind_the_workers_version_lacks_waits_for_a_worker_that_has_it(
    kinds: Callable[[str], None], recorder: Recorder
) -> None:
    task = services.enqueue(KINDS, {}).task
    assert runner.run_claimed(only_draft(task).pk) is True
    publish = task.steps.get(position=1)
    kinds("post")  # the old release

    publish = old_worker_hands_back(publish)

    assert [call["kind"] for call in recorder.calls] == ["draft"]
    assert f"step kind 'publish' (position 1) of workflow {KINDS} v1" in publish.last_error
    assert "it has draft, post in v1" in publish.last_error
    kinds("publish")  # a worker of the new release
    backdate(publish, seconds=RETRY + 1)
    assert runner.run_claimed(publish.pk) is True
    assert fresh(publish).status == StepStatus.SUCCEEDED
    assert [call["kind"] for call in recorder.calls] == ["draft", "publish"]
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED


@pytest.mark.django_db
def test_a_step_kind_no_worker_has_is_dead_lettered_as_unknown_only_after_the_wait(
    kinds: Callable[[str], None], recorder: Recorder, database_clock: Move
) -> None:
    task = services.enqueue(KINDS, {}).task
    assert runner.run_claimed(only_draft(task).pk) is True
    publish = task.steps.get(position=1)
    kinds("post")  # the old release
    old_worker_hands_back(publish)

    database_clock(WAIT)
    backdate(publish, seconds=RETRY + 1)
    assert runner.run_claimed(publish.pk) is True

    publish = fresh(publish)
    assert (publish.status, publish.error_class) == (StepStatus.DEAD, "unknown_step_kind")
    assert "is not registered on any worker that claimed it in 3600 s" in publish.last_error
    assert [e.reason for e in events(task, EventKind.DEAD_LETTERED)] == ["unknown_step_kind"]
    assert [call["kind"] for call in recorder.calls] == ["draft"]


def only_draft(task: Task) -> Step:
    return task.steps.get(position=0)


# --- a real worker of the old release ---------------------------------------------------------


@pytest.fixture
def old_worker(
    django_db_setup: None,
    tmp_path: Any,
    module_remotes: tuple[LoopbackRemote, LoopbackRemote],
) -> Iterator[Worker]:
    """A prefork Celery worker: its process registers only the shipped workflows, so the
    tests' own are, to it, workflows only a newer release has."""
    with worker_on_test_database(tmp_path, module_remotes, what="the old worker") as process:
        yield process


@pytest.mark.e2e
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_twenty_tasks_of_a_workflow_only_the_new_release_has_wait_on_an_old_worker_and_none_dies(
    new_workflow: Callable[[], None], recorder: Recorder, old_worker: Worker
) -> None:
    tasks = [services.enqueue(NEW, {"n": n}).task for n in range(20)]
    steps = Step.objects.filter(task__in=tasks)

    def all_handed_back() -> bool:
        return steps.filter(status="pending", error_class="awaiting_version").count() == 20

    wait_for(all_handed_back, timeout=60, what=lambda: "20 hand-backs\n" + old_worker.tail())
    assert not steps.exclude(status="pending").exists()
    assert set(steps.values_list("attempts", flat=True)) == {0}

    # The old worker is rolled; this process has the new release and runs them once due.
    old_worker.stop()
    for step in steps:
        backdate(step, seconds=RETRY + 1)
        assert runner.run_claimed(step.pk) is True
    assert set(steps.values_list("status", flat=True)) == {StepStatus.SUCCEEDED}
    assert len(recorder.calls) == 20
