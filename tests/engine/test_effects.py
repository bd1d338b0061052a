"""The side-effects ledger (DESIGN rule 5): an external write happens at most once per step
key and effect name, an unknown outcome goes to a person, and resolving it finishes the
step either way.

The remote is an in-process fake standing for a service outside the product; everything
of ours runs for real: the runner, the services, the ledger and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.contrib.auth.models import User

from tasks_app import services
from tasks_app.engine import runner
from tasks_app.engine.effects import Effects, LeaseLost
from tasks_app.exceptions import (
    LEASE_EXPIRED,
    EffectNotApplied,
    InvalidInput,
    InvalidTransition,
    PermanentError,
    RetryableError,
)
from tasks_app.models import Effect, Event, EventKind, Step, StepStatus, Task, TaskStatus
from tasks_app.workflows import StepContext, StepSpec, Workflow, register, registry
from tests.conftest import backdate, event_kinds

OUTCOME_UNKNOWN = "tasks_app.exceptions.OutcomeUnknown"


# --- the remote and the workflows that call it ---------------------------------------------


class WorkerDied(BaseException):
    """Stands for the worker process dying mid-call: nothing of ours catches it."""


@dataclass
class FakeRemote:
    """An external service: records every call and the key it carried.

    ``plan`` says what each successive call does: ``"ok"``; ``"refuse"`` (EffectNotApplied
    before acting); ``"timeout"`` (applies, then the answer is lost); ``"die"`` (applies,
    then the worker dies). A remote that ``honours_keys`` applies each key once and answers
    a repeat with the first result.
    """

    honours_keys: bool
    plan: list[str] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __call__(self, key: str) -> dict[str, Any]:
        self.calls.append(key)
        behaviour = self.plan.pop(0) if self.plan else "ok"
        if behaviour == "refuse":
            raise EffectNotApplied("remote refused before acting")
        if key not in self.results or not self.honours_keys:
            self.writes.append(key)
            self.results[key] = {"remote_id": f"post-{len(self.writes)}"}
        if behaviour == "timeout":
            raise TimeoutError("no answer after sending")
        if behaviour == "die":
            raise WorkerDied
        return self.results[key]


def publish_handler(
    remote: FakeRemote, *, fail_after_effect: Callable[[StepContext], BaseException | None]
) -> Callable[[StepContext], Any]:
    def publish(ctx: StepContext) -> dict[str, Any]:
        result = ctx.effects.run("publish", remote, idempotent_remote=remote.honours_keys)
        error = fail_after_effect(ctx)
        if error is not None:
            raise error
        return {"published": result}

    return publish


def never(ctx: StepContext) -> None:
    return None


def notify(ctx: StepContext) -> dict[str, Any]:
    return {"notified_about": ctx.results["publish"]}


@pytest.fixture
def flows(request: pytest.FixtureRequest) -> Iterator[Callable[..., Workflow]]:
    """Registers test-only workflows for one test and removes them afterwards."""
    made: list[Workflow] = []

    def make(
        remote: FakeRemote,
        *,
        fail_after_effect: Callable[[StepContext], BaseException | None] = never,
        then_notify: bool = False,
    ) -> Workflow:
        steps = [
            StepSpec(
                "publish",
                publish_handler(remote, fail_after_effect=fail_after_effect),
                max_attempts=3,
                backoff_base=0.1,
                backoff_cap=1.0,
            )
        ]
        if then_notify:
            steps.append(StepSpec("notify", notify))
        name = f"test.effects.{request.node.name}"[:100]
        flow = register(Workflow(name, 1, steps=tuple(steps)))
        made.append(flow)
        return flow

    yield make
    for flow in made:
        registry.unregister(flow.name, flow.version)


def _enqueue(flow: Workflow, key: str = "post:article-7:v1") -> Task:
    return services.enqueue(flow.name, {"article_id": "article-7"}, idempotency_key=key).task


def _publish_step(task: Task) -> Step:
    return task.steps.get(position=0)


def _run(step: Step) -> None:
    """Let the step's time come (retry backoff included), then claim and run it."""
    backdate(step)
    assert runner.run_claimed(step.pk), f"step {step.pk} could not be claimed"
    step.refresh_from_db()


def _reap(step: Step) -> None:
    """Let the step's lease run out and have the sweeper return it."""
    backdate(step)
    assert services.reap_expired_leases() == 1
    step.refresh_from_db()


def _dead_lettered_as_outcome_unknown(step: Step) -> Event:
    assert step.status == StepStatus.DEAD
    assert step.error_class == OUTCOME_UNKNOWN
    assert "OutcomeUnknown" in step.last_error
    event = Event.objects.filter(step_id=step.pk, kind=EventKind.DEAD_LETTERED).get()
    assert event.reason == "outcome_unknown"
    assert event.data["error_class"] == OUTCOME_UNKNOWN
    assert Task.objects.get(pk=step.task_id).status == TaskStatus.DEAD
    return event


# --- a recorded result -------------------------------------------------------------------------


@pytest.mark.parametrize("honours_keys", [True, False], ids=["idempotent", "not-idempotent"])
def test_a_result_is_recorded_once_when_its_step_runs_twice(
    db: None, flows: Callable[..., Workflow], honours_keys: bool
) -> None:
    remote = FakeRemote(honours_keys=honours_keys)
    flow = flows(
        remote,
        fail_after_effect=lambda ctx: (
            RetryableError("answer lost after publishing") if ctx.attempt == 1 else None
        ),
    )
    task = _enqueue(flow)
    step = _publish_step(task)
    key = "post:article-7:v1:0:publish:publish"
    assert step.idempotency_key + ":publish" == key

    _run(step)
    assert (step.status, step.attempts) == (StepStatus.PENDING, 1)
    effect = Effect.objects.get(step=step)
    assert (effect.key, effect.status, effect.token) == (key, Effect.Status.DONE, 1)
    assert effect.result == {"remote_id": "post-1"}

    _run(step)

    assert remote.calls == [key]
    assert remote.writes == [key]
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.SUCCEEDED, 2, 2)
    assert step.result == {"published": {"remote_id": "post-1"}}
    effect = Effect.objects.get(step=step)
    assert (effect.key, effect.status, effect.token) == (key, Effect.Status.DONE, 1)
    assert effect.result == {"remote_id": "post-1"}
    assert effect.finished_at is not None
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED


def test_a_redriven_step_returns_the_result_recorded_before_it_died(
    db: None, flows: Callable[..., Workflow]
) -> None:
    remote = FakeRemote(honours_keys=False)
    flow = flows(
        remote,
        fail_after_effect=lambda ctx: (
            PermanentError("bad template after publishing") if ctx.fencing_token == 1 else None
        ),
    )
    task = _enqueue(flow)
    step = _publish_step(task)
    _run(step)
    assert step.status == StepStatus.DEAD

    services.redrive(task, actor="cli:alice", reason="template fixed")
    _run(step)

    assert remote.calls == ["post:article-7:v1:0:publish:publish"]
    assert (step.status, step.fencing_token) == (StepStatus.SUCCEEDED, 2)
    assert step.result == {"published": {"remote_id": "post-1"}}
    assert Effect.objects.get(step=step).status == Effect.Status.DONE


# --- a started effect without a result ----------------------------------------------------------


def test_a_timeout_after_sending_calls_an_idempotent_remote_again_with_the_same_key(
    db: None, flows: Callable[..., Workflow]
) -> None:
    remote = FakeRemote(honours_keys=True, plan=["timeout"])
    task = _enqueue(flows(remote))
    step = _publish_step(task)

    _run(step)
    assert (step.status, step.error_class) == (StepStatus.PENDING, "builtins.TimeoutError")
    effect = Effect.objects.get(step=step)
    assert (effect.status, effect.result) == (Effect.Status.STARTED, None)

    _run(step)

    key = "post:article-7:v1:0:publish:publish"
    assert remote.calls == [key, key]
    assert remote.writes == [key]
    assert step.status == StepStatus.SUCCEEDED
    assert step.result == {"published": {"remote_id": "post-1"}}
    effect.refresh_from_db()
    assert (effect.status, effect.result) == (Effect.Status.DONE, {"remote_id": "post-1"})


def test_a_worker_that_died_mid_call_leaves_a_started_effect_an_idempotent_remote_repeats(
    db: None, flows: Callable[..., Workflow]
) -> None:
    remote = FakeRemote(honours_keys=True, plan=["die"])
    task = _enqueue(flows(remote))
    step = _publish_step(task)

    with pytest.raises(WorkerDied):
        _run(step)
    step.refresh_from_db()
    assert (step.status, step.fencing_token) == (StepStatus.RUNNING, 1)
    assert Effect.objects.get(step=step).status == Effect.Status.STARTED
    _reap(step)
    assert step.status == StepStatus.PENDING

    _run(step)

    key = "post:article-7:v1:0:publish:publish"
    assert remote.calls == [key, key]
    assert remote.writes == [key]
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.SUCCEEDED, 2, 2)
    effect = Effect.objects.get(step=step)
    assert (effect.status, effect.result) == (Effect.Status.DONE, {"remote_id": "post-1"})
    assert event_kinds(task) == [
        "enqueued",
        "claimed",
        "lease_expired",
        "claimed",
        "succeeded",
    ]


def test_a_timeout_after_sending_to_a_remote_without_keys_dead_letters_as_outcome_unknown(
    db: None, flows: Callable[..., Workflow]
) -> None:
    remote = FakeRemote(honours_keys=False, plan=["timeout"])
    task = _enqueue(flows(remote))
    step = _publish_step(task)

    _run(step)

    # Attempts remained, but retrying could publish twice: a person decides.
    assert (step.attempts, step.max_attempts) == (1, 3)
    _dead_lettered_as_outcome_unknown(step)
    assert remote.calls == ["post:article-7:v1:0:publish:publish"]
    effect = Effect.objects.get(step=step)
    assert (effect.status, effect.result) == (Effect.Status.STARTED, None)


def test_a_started_effect_left_by_a_dead_worker_dead_letters_without_calling_again(
    db: None, flows: Callable[..., Workflow]
) -> None:
    remote = FakeRemote(honours_keys=False, plan=["die"])
    task = _enqueue(flows(remote))
    step = _publish_step(task)
    with pytest.raises(WorkerDied):
        _run(step)
    _reap(step)

    _run(step)

    assert remote.calls == ["post:article-7:v1:0:publish:publish"]
    assert step.fencing_token == 2
    _dead_lettered_as_outcome_unknown(step)
    effect = Effect.objects.get(step=step)
    assert (effect.status, effect.token, effect.result) == (Effect.Status.STARTED, 1, None)


# --- a person resolves an unknown outcome ------------------------------------------------------


@pytest.fixture
def unknown_outcome(db: None, flows: Callable[..., Workflow]) -> tuple[Task, Step, FakeRemote]:
    """A two-step task whose publish timed out on a remote without idempotency keys."""
    remote = FakeRemote(honours_keys=False, plan=["timeout"])
    task = _enqueue(flows(remote, then_notify=True))
    step = _publish_step(task)
    _run(step)
    _dead_lettered_as_outcome_unknown(step)
    return task, step, remote


def test_resolving_as_done_marks_the_effect_done_and_lets_the_task_continue(
    unknown_outcome: tuple[Task, Step, FakeRemote], oncall: User
) -> None:
    task, step, remote = unknown_outcome
    note = "the post is live on the site"

    services.resolve(task, actor=oncall, reason=note, outcome="done")

    step.refresh_from_db()
    assert step.status == StepStatus.SUCCEEDED
    assert step.result == {"resolved": "done", "by": "olivia-oncall", "note": note}
    effect = Effect.objects.get(step=step)
    assert effect.status == Effect.Status.DONE
    assert effect.result == {"resolved_by": "olivia-oncall", "note": note}
    resolved = Event.objects.get(task_id=task.pk, kind=EventKind.RESOLVED)
    assert (resolved.actor, resolved.actor_user_id, resolved.reason) == (
        "olivia-oncall",
        oncall.pk,
        note,
    )
    assert (resolved.step_id, resolved.data["outcome"]) == (step.pk, "done")
    following = task.steps.get(position=1)
    assert following.status == StepStatus.PENDING
    task.refresh_from_db()
    assert task.status == TaskStatus.PENDING

    _run(following)

    assert following.status == StepStatus.SUCCEEDED
    assert following.result == {"notified_about": step.result}
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    assert len(remote.calls) == 1


def test_resolving_as_retry_forgets_the_started_effect_and_calls_the_remote_again(
    unknown_outcome: tuple[Task, Step, FakeRemote], oncall: User
) -> None:
    task, step, remote = unknown_outcome

    services.resolve(task, actor=oncall, reason="nothing arrived remotely", outcome="retry")

    step.refresh_from_db()
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.PENDING, 0, 1)
    assert not Effect.objects.filter(step=step).exists()
    resolved = Event.objects.get(task_id=task.pk, kind=EventKind.RESOLVED)
    assert (resolved.actor, resolved.reason, resolved.data["outcome"]) == (
        "olivia-oncall",
        "nothing arrived remotely",
        "retry",
    )
    task.refresh_from_db()
    assert task.status == TaskStatus.PENDING

    _run(step)

    key = "post:article-7:v1:0:publish:publish"
    assert remote.calls == [key, key]
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.SUCCEEDED, 1, 2)
    assert step.result == {"published": {"remote_id": "post-2"}}
    effect = Effect.objects.get(step=step)
    assert (effect.status, effect.token, effect.result) == (
        Effect.Status.DONE,
        2,
        {"remote_id": "post-2"},
    )
    _run(task.steps.get(position=1))
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED


def test_resolving_needs_a_known_outcome_and_a_dead_step(
    unknown_outcome: tuple[Task, Step, FakeRemote], oncall: User
) -> None:
    task, step, _ = unknown_outcome
    events = Event.objects.filter(task_id=task.pk).count()

    with pytest.raises(InvalidInput) as excinfo:
        services.resolve(task, actor=oncall, reason="checked", outcome="maybe")
    assert excinfo.value.field == "outcome"

    step.refresh_from_db()
    assert step.status == StepStatus.DEAD
    assert Effect.objects.get(step=step).status == Effect.Status.STARTED
    assert Event.objects.filter(task_id=task.pk).count() == events

    services.resolve(task, actor=oncall, reason="checked", outcome="done")
    with pytest.raises(InvalidTransition):
        services.resolve(task, actor=oncall, reason="again", outcome="retry")
    assert Event.objects.filter(task_id=task.pk, kind=EventKind.RESOLVED).count() == 1


# --- a remote that refused, and an attempt that lost its lease ----------------------------------


def test_a_remote_that_refused_before_acting_is_called_again_on_retry(
    db: None, flows: Callable[..., Workflow]
) -> None:
    remote = FakeRemote(honours_keys=False, plan=["refuse"])
    task = _enqueue(flows(remote))
    step = _publish_step(task)

    _run(step)
    assert (step.status, step.error_class) == (
        StepStatus.PENDING,
        "tasks_app.exceptions.EffectNotApplied",
    )
    assert not Effect.objects.filter(step=step).exists()
    assert Event.objects.filter(step_id=step.pk, kind=EventKind.RETRY_SCHEDULED).exists()

    _run(step)

    key = "post:article-7:v1:0:publish:publish"
    assert remote.calls == [key, key]
    assert remote.writes == [key]
    assert step.status == StepStatus.SUCCEEDED
    effect = Effect.objects.get(step=step)
    assert (effect.status, effect.token, effect.result) == (
        Effect.Status.DONE,
        2,
        {"remote_id": "post-1"},
    )


def _claim(step: Step, worker: str) -> services.Claim:
    backdate(step)
    claim = services.claim_step(step.pk, worker_id=worker)
    assert claim is not None
    return claim


def test_an_attempt_that_lost_its_lease_cannot_start_an_effect(
    db: None, flows: Callable[..., Workflow]
) -> None:
    remote = FakeRemote(honours_keys=False)
    task = _enqueue(flows(remote))
    step = _publish_step(task)
    old = _claim(step, "slow-worker")
    _reap(step)
    new = _claim(step, "fresh-worker")
    assert (old.token, new.token) == (1, 2)

    def ledger(claim: services.Claim) -> Effects:
        return Effects(step_id=step.pk, step_key=step.idempotency_key, fencing_token=claim.token)

    with pytest.raises(LeaseLost):
        ledger(old).run("publish", remote, idempotent_remote=False)

    assert remote.calls == []
    assert not Effect.objects.filter(step=step).exists()

    assert ledger(new).run("publish", remote, idempotent_remote=False) == {"remote_id": "post-1"}
    effect = Effect.objects.get(step=step)
    assert (effect.status, effect.token) == (Effect.Status.DONE, 2)
    assert services.complete_step(new, {"published": effect.result})


def test_a_stale_attempt_run_by_the_worker_writes_nothing_and_calls_nothing(
    db: None, flows: Callable[..., Workflow]
) -> None:
    remote = FakeRemote(honours_keys=True)
    task = _enqueue(flows(remote))
    step = _publish_step(task)
    old = _claim(step, "slow-worker")
    _reap(step)
    _claim(step, "fresh-worker")

    runner.execute(old)

    assert remote.calls == []
    assert not Effect.objects.filter(step=step).exists()
    step.refresh_from_db()
    # The error is the sweeper's, not the stale attempt's.
    assert (step.status, step.fencing_token) == (StepStatus.RUNNING, 2)
    assert step.error_class == LEASE_EXPIRED
    rejected = Event.objects.get(step_id=step.pk, kind=EventKind.STALE_WRITE_REJECTED)
    assert (rejected.data["operation"], rejected.data["token"]) == ("fail", 1)
    assert rejected.data["current_token"] == 2
