"""Operator actions (DESIGN rules 7 and 10): redrive, resolve and cancel are explicit,
permission-checked and audited; they keep history, step keys and the rising fence."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser, Permission, User
from django.core.exceptions import PermissionDenied

from tasks_app import services
from tasks_app.engine import runner
from tasks_app.exceptions import InvalidInput, InvalidTransition, NotPermitted
from tasks_app.models import Event, EventKind, Lease, Step, StepStatus, Task, TaskStatus
from tasks_app.validation import canonical_json
from tasks_app.workflows import StepContext, StepSpec, Workflow, register, registry
from tests.conftest import backdate, event_kinds, only_step

RETRYABLE = "tasks_app.exceptions.RetryableError"


def _flaky(payload: dict[str, Any], key: str = "flaky:report-1") -> Task:
    return services.enqueue("demo.flaky", payload, idempotency_key=key, actor="cli:producer").task


def _run(step: Step) -> None:
    """Let the step's time come (retry backoff included), then claim and run it."""
    backdate(step)
    assert runner.run_claimed(step.pk), f"step {step.pk} could not be claimed"
    step.refresh_from_db()


def _dead_flaky(payload: dict[str, Any] | None = None, key: str = "flaky:report-1") -> Task:
    """A demo.flaky task that spent its three attempts."""
    task = _flaky(payload or {"fail_first": 4}, key)
    step = only_step(task)
    for _ in range(3):
        _run(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.DEAD, 3, 3)
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD
    return task


def _dead_unknown(key: str = "flaky:report-1") -> Task:
    """A demo.flaky task whose step died at its first claim not knowing whether its call
    happened (the only kind of dead step a resolve applies to)."""
    task = _flaky({"error": "outcome_unknown", "fail_first": 1}, key)
    step = only_step(task)
    _run(step)
    assert (step.status, step.error_class) == (StepStatus.DEAD, OUTCOME_UNKNOWN)
    task.refresh_from_db()
    return task


OUTCOME_UNKNOWN = "tasks_app.exceptions.OutcomeUnknown"


def _dead_for(action: str) -> Task:
    """A dead task the action applies to."""
    return _dead_unknown() if action == "resolve" else _dead_flaky()


def _snapshot(task: Task) -> tuple[Any, ...]:
    """Everything an operator action could change."""
    task = Task.objects.get(pk=task.pk)
    steps = list(
        task.steps.order_by("position").values_list(
            "status", "attempts", "fencing_token", "available_at", "finished_at"
        )
    )
    events = list(Event.objects.for_task(task.pk).values_list("pk", flat=True))
    return (task.status, task.payload, task.cancel_requested_at, steps, events)


# --- redrive -----------------------------------------------------------------------------------


def test_redrive_keeps_history_the_step_key_and_the_rising_fencing_token(
    db: None, oncall: User
) -> None:
    task = _dead_flaky({"fail_first": 4})
    step = only_step(task)
    key = step.idempotency_key
    assert key == "flaky:report-1:0:flaky"
    dead = Event.objects.get(task_id=task.pk, kind=EventKind.DEAD_LETTERED)
    assert (dead.reason, dead.data["error_class"]) == ("max_attempts", RETRYABLE)
    history = list(Event.objects.for_task(task.pk).values_list("pk", "kind"))

    services.redrive(task, actor=oncall, reason="downstream is back")

    step.refresh_from_db()
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.PENDING, 0, 3)
    assert step.idempotency_key == key
    assert step.finished_at is None
    assert step.error_class == RETRYABLE  # the last error stays for the record
    task.refresh_from_db()
    assert task.status == TaskStatus.PENDING
    redriven = Event.objects.for_task(task.pk).last()
    assert redriven is not None
    assert redriven.kind == EventKind.REDRIVEN
    assert (redriven.actor, redriven.actor_user_id, redriven.reason) == (
        "olivia-oncall",
        oncall.pk,
        "downstream is back",
    )
    assert "old_payload" not in redriven.data

    _run(step)  # claim 4 still fails: fail_first counts claims over the step's whole life
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.PENDING, 1, 4)
    _run(step)

    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.SUCCEEDED, 2, 5)
    assert step.result == {"token": 5, "attempt": 2}
    assert step.idempotency_key == key
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    assert list(Lease.objects.filter(step=step).values_list("token", flat=True)) == [1, 2, 3, 4, 5]
    after = list(Event.objects.for_task(task.pk).values_list("pk", "kind"))
    assert after[: len(history)] == history
    assert event_kinds(task) == [
        "enqueued",
        "claimed",
        "retry_scheduled",
        "claimed",
        "retry_scheduled",
        "claimed",
        "dead_lettered",
        "redriven",
        "claimed",
        "retry_scheduled",
        "claimed",
        "succeeded",
    ]


def test_redrive_with_an_edited_payload_keeps_the_old_one_in_the_event(
    db: None, oncall: User
) -> None:
    task = _dead_flaky({"fail_first": 10})
    original_hash = task.payload_hash

    services.redrive(task, actor=oncall, reason="bad input", payload={"fail_first": 0})

    task.refresh_from_db()
    assert task.payload == {"fail_first": 0}
    assert task.payload_hash == original_hash
    redriven = Event.objects.get(task_id=task.pk, kind=EventKind.REDRIVEN)
    assert redriven.data["old_payload"] == {"fail_first": 10}
    assert redriven.data["new_payload"] == {"fail_first": 0}
    # The key still names the same business action: enqueueing it again finds this task.
    again = services.enqueue("demo.flaky", {"fail_first": 10}, idempotency_key="flaky:report-1")
    assert (again.task.pk, again.created) == (task.pk, False)

    step = only_step(task)
    _run(step)

    assert (step.status, step.fencing_token) == (StepStatus.SUCCEEDED, 4)
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED


def test_redrive_stores_an_edited_negative_zero_as_zero_as_enqueue_does(
    db: None, oncall: User
) -> None:
    task = _dead_flaky({"fail_first": 10})
    edited = {"fail_first": 0, "fail_rate": -0.0, "notes": [-0.0]}

    returned = services.redrive(task, actor=oncall, reason="bad input", payload=edited)

    as_stored = '{"fail_first":0,"fail_rate":0.0,"notes":[0.0]}'
    task.refresh_from_db()
    redriven = Event.objects.get(task_id=task.pk, kind=EventKind.REDRIVEN)
    # The task handed back holds what the database holds (jsonb has no negative zero).
    assert canonical_json(returned.payload) == canonical_json(task.payload) == as_stored
    assert canonical_json(redriven.data["new_payload"]) == as_stored


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ([1, 2], "payload"),
        ({"fail_first": float("nan")}, "payload"),
        ({"fail_first": "many"}, "payload.fail_first"),
        ({"error": "sometimes"}, "payload.error"),
    ],
    ids=["not-an-object", "nan", "workflow-rule", "workflow-choice"],
)
def test_redrive_with_an_invalid_payload_changes_nothing(
    db: None, oncall: User, payload: Any, field: str
) -> None:
    task = _dead_flaky()
    before = _snapshot(task)

    with pytest.raises(InvalidInput) as excinfo:
        services.redrive(task, actor=oncall, reason="fix input", payload=payload)

    assert excinfo.value.field.startswith(field)
    assert _snapshot(task) == before


def test_redrive_needs_a_dead_step(db: None, oncall: User) -> None:
    pending = _flaky({}, "flaky:pending")
    succeeded = _flaky({}, "flaky:done")
    _run(only_step(succeeded))
    before = [_snapshot(pending), _snapshot(succeeded)]

    for task in (pending, succeeded):
        with pytest.raises(InvalidTransition):
            services.redrive(task, actor=oncall, reason="try again")

    assert [_snapshot(pending), _snapshot(succeeded)] == before


@pytest.mark.parametrize("reason", ["", "   ", None])
def test_operator_actions_need_a_reason(db: None, oncall: User, reason: Any) -> None:
    task = _dead_flaky()
    before = _snapshot(task)
    actions: list[Callable[[], Any]] = [
        lambda: services.redrive(task, actor=oncall, reason=reason),
        lambda: services.resolve(task, actor=oncall, reason=reason, outcome="done"),
        lambda: services.cancel(task, actor=oncall, reason=reason),
    ]

    for action in actions:
        with pytest.raises(InvalidInput) as excinfo:
            action()
        assert excinfo.value.field == "reason"
        assert "reason" in str(excinfo.value)

    assert _snapshot(task) == before


# --- resolve -----------------------------------------------------------------------------------


def test_resolve_refuses_an_unknown_outcome(db: None, oncall: User) -> None:
    task = _dead_flaky()
    before = _snapshot(task)

    with pytest.raises(InvalidInput) as excinfo:
        services.resolve(task, actor=oncall, reason="checked", outcome="ignore")

    assert excinfo.value.field == "outcome"
    assert _snapshot(task) == before


def test_resolve_needs_a_dead_step(db: None, oncall: User) -> None:
    task = _flaky({})
    before = _snapshot(task)

    with pytest.raises(InvalidTransition):
        services.resolve(task, actor=oncall, reason="checked", outcome="done")

    assert _snapshot(task) == before


@pytest.mark.parametrize("dead", [_dead_unknown, _dead_flaky])
def test_resolving_a_dead_task_as_done_succeeds_it_with_a_note(
    db: None, oncall: User, dead: Callable[[], Task]
) -> None:
    # Whether the call happened or a person did the work by hand.
    task = dead()

    services.resolve(task, actor=oncall, reason="report sent by hand", outcome="done")

    step = only_step(task)
    assert step.status == StepStatus.SUCCEEDED
    assert step.result == {"resolved": "done", "by": "olivia-oncall", "note": "report sent by hand"}
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    assert task.finished_at is not None
    resolved = Event.objects.get(task_id=task.pk, kind=EventKind.RESOLVED)
    assert (resolved.actor_user_id, resolved.data["outcome"]) == (oncall.pk, "done")


def test_resolving_a_dead_task_as_retry_gives_it_a_fresh_budget(db: None, oncall: User) -> None:
    task = _dead_unknown()

    services.resolve(task, actor=oncall, reason="try once more", outcome="retry")

    step = only_step(task)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.PENDING, 0, 1)
    _run(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.SUCCEEDED, 1, 2)


def test_running_again_refuses_a_step_whose_outcome_is_known(db: None, oncall: User) -> None:
    task = _dead_flaky()
    before = _snapshot(task)

    with pytest.raises(InvalidTransition, match=r"known outcome .*: redrive it"):
        services.resolve(task, actor=oncall, reason="checked", outcome="retry")

    assert _snapshot(task) == before


def test_redrive_refuses_a_step_whose_outcome_is_unknown(db: None, oncall: User) -> None:
    # Its started call would be found again and the step would stop again without calling.
    task = _dead_unknown()
    before = _snapshot(task)

    with pytest.raises(InvalidTransition, match=r"unknown outcome.*resolve it instead"):
        services.redrive(task, actor=oncall, reason="try again")

    assert _snapshot(task) == before


# --- cancel ------------------------------------------------------------------------------------


def _cancelled_event(task: Task) -> Event:
    return Event.objects.get(task_id=task.pk, kind=EventKind.CANCELLED)


def test_cancelling_pending_work_cancels_it_at_once_and_it_is_never_claimed(
    db: None, oncall: User, broker: Any
) -> None:
    task = _flaky({})
    step = only_step(task)

    services.cancel(task, actor=oncall, reason="customer withdrew")

    task.refresh_from_db()
    step.refresh_from_db()
    assert task.status == TaskStatus.CANCELLED
    assert task.finished_at is not None
    assert step.status == StepStatus.CANCELLED
    event = _cancelled_event(task)
    assert (event.actor, event.actor_user_id, event.reason) == (
        "olivia-oncall",
        oncall.pk,
        "customer withdrew",
    )
    assert event.data["steps"] == {str(step.pk): ["cancelled", 0, 0]}

    backdate(step)
    assert services.claim_step(step.pk, worker_id="w1") is None
    assert not runner.run_claimed(step.pk)
    assert services.redispatch_due() == 0
    step.refresh_from_db()
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.CANCELLED, 0, 0)
    assert event_kinds(task) == ["enqueued", "cancelled"]


def test_cancelling_dead_work_cancels_it(db: None, oncall: User) -> None:
    task = _dead_flaky()

    services.cancel(task, actor=oncall, reason="report no longer needed")

    task.refresh_from_db()
    step = only_step(task)
    assert task.status == TaskStatus.CANCELLED
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.CANCELLED, 3, 3)
    assert _cancelled_event(task).reason == "report no longer needed"
    with pytest.raises(InvalidTransition):
        services.redrive(task, actor=oncall, reason="changed my mind")
    with pytest.raises(InvalidTransition):
        services.resolve(task, actor=oncall, reason="changed my mind", outcome="retry")


@pytest.fixture
def two_steps(request: pytest.FixtureRequest) -> Iterator[Workflow]:
    def draft(ctx: StepContext) -> dict[str, Any]:
        return {"draft": "v1"}

    def send(ctx: StepContext) -> dict[str, Any]:
        return {"sent": True}

    flow = register(
        Workflow(
            f"test.ops.{request.node.name}"[:100],
            1,
            steps=(StepSpec("draft", draft), StepSpec("send", send)),
        )
    )
    yield flow
    registry.unregister(flow.name, flow.version)


def test_cancelling_running_work_asks_it_to_stop_and_its_late_result_does_not_revive_the_task(
    db: None, oncall: User, two_steps: Workflow
) -> None:
    task = services.enqueue(two_steps.name, {}, idempotency_key="letter:42").task
    first, second = task.steps.order_by("position")
    backdate(first)
    claim = services.claim_step(first.pk, worker_id="w1")
    assert claim is not None

    services.cancel(task, actor=oncall, reason="wrong recipient")

    task.refresh_from_db()
    assert task.status == TaskStatus.RUNNING
    assert task.cancel_requested_at is not None
    requested = Event.objects.get(task_id=task.pk, kind=EventKind.CANCEL_REQUESTED)
    assert (requested.actor, requested.reason) == ("olivia-oncall", "wrong recipient")
    second.refresh_from_db()
    assert second.status == StepStatus.CANCELLED
    assert services.heartbeat(claim) == services.HeartbeatResult(alive=True, cancel_requested=True)
    with pytest.raises(InvalidTransition):
        services.cancel(task, actor=oncall, reason="twice")

    assert services.complete_step(claim, {"draft": "v1"})

    task.refresh_from_db()
    first.refresh_from_db()
    second.refresh_from_db()
    assert task.status == TaskStatus.CANCELLED
    assert task.finished_at is not None
    assert first.status == StepStatus.SUCCEEDED  # it did finish; that is not undone
    assert second.status == StepStatus.CANCELLED
    assert event_kinds(task) == [
        "enqueued",
        "claimed",
        "cancel_requested",
        "succeeded",
        "cancelled",
    ]
    backdate(second)
    assert services.claim_step(second.pk, worker_id="w2") is None
    with pytest.raises(InvalidTransition):
        services.cancel(task, actor=oncall, reason="again")


def test_a_one_step_task_whose_running_step_succeeds_after_a_cancel_ends_cancelled(
    db: None, oncall: User
) -> None:
    task = _flaky({})
    step = only_step(task)
    backdate(step)
    claim = services.claim_step(step.pk, worker_id="w1")
    assert claim is not None
    services.cancel(task, actor=oncall, reason="stop it")

    runner.execute(claim)

    step.refresh_from_db()
    task.refresh_from_db()
    # The step keeps its true outcome; the task stays cancelled.
    assert (step.status, step.result) == (StepStatus.SUCCEEDED, {"token": 1, "attempt": 1})
    assert task.status == TaskStatus.CANCELLED
    assert task.finished_at is not None
    assert event_kinds(task) == [
        "enqueued",
        "claimed",
        "cancel_requested",
        "succeeded",
        "cancelled",
    ]
    with pytest.raises(InvalidTransition):
        services.cancel(task, actor=oncall, reason="again")


def test_a_running_step_that_fails_after_a_cancel_ends_cancelled_not_retried(
    db: None, oncall: User
) -> None:
    task = _flaky({"fail_first": 1})
    step = only_step(task)
    backdate(step)
    claim = services.claim_step(step.pk, worker_id="w1")
    assert claim is not None
    services.cancel(task, actor=oncall, reason="stop it")

    runner.execute(claim)

    step.refresh_from_db()
    task.refresh_from_db()
    assert (step.status, step.attempts) == (StepStatus.CANCELLED, 1)
    assert task.status == TaskStatus.CANCELLED
    assert event_kinds(task) == ["enqueued", "claimed", "cancel_requested", "cancelled"]
    backdate(step)
    assert services.claim_step(step.pk, worker_id="w2") is None


def test_a_running_step_whose_lease_expires_after_a_cancel_ends_cancelled(
    db: None, oncall: User
) -> None:
    task = _flaky({})
    step = only_step(task)
    backdate(step)
    assert services.claim_step(step.pk, worker_id="w1") is not None
    services.cancel(task, actor=oncall, reason="stop it")

    backdate(step)
    assert services.reap_expired_leases() == 1

    step.refresh_from_db()
    task.refresh_from_db()
    assert step.status == StepStatus.CANCELLED
    assert task.status == TaskStatus.CANCELLED
    assert Event.objects.get(task_id=task.pk, kind=EventKind.LEASE_EXPIRED).data["outcome"] == (
        "cancelled"
    )
    assert event_kinds(task) == [
        "enqueued",
        "claimed",
        "cancel_requested",
        "lease_expired",
        "cancelled",
    ]
    backdate(step)
    assert services.claim_step(step.pk, worker_id="w2") is None


def test_cancelling_a_finished_task_is_refused(db: None, oncall: User) -> None:
    succeeded = _flaky({}, "flaky:done")
    _run(only_step(succeeded))
    cancelled = _flaky({}, "flaky:cancelled")
    services.cancel(cancelled, actor=oncall, reason="not needed")
    before = [_snapshot(succeeded), _snapshot(cancelled)]

    for task in (succeeded, cancelled):
        with pytest.raises(InvalidTransition):
            services.cancel(task, actor=oncall, reason="again")

    assert [_snapshot(succeeded), _snapshot(cancelled)] == before


# --- permissions and the actor on record -----------------------------------------------------


ACTIONS: dict[str, Callable[[Task, Any], Task]] = {
    "redrive": lambda task, actor: services.redrive(task, actor=actor, reason="because"),
    "resolve": lambda task, actor: services.resolve(
        task, actor=actor, reason="because", outcome="done"
    ),
    "cancel": lambda task, actor: services.cancel(task, actor=actor, reason="because"),
}
EVENT_OF = {"redrive": "redriven", "resolve": "resolved", "cancel": "cancelled"}


@pytest.mark.parametrize("action", ACTIONS)
def test_a_user_without_the_permission_is_refused_and_nothing_changes(
    db: None, outsider: User, auditor: User, action: str
) -> None:
    task = _dead_for(action)
    before = _snapshot(task)

    for actor in (outsider, auditor, AnonymousUser()):
        with pytest.raises(NotPermitted) as excinfo:
            ACTIONS[action](task, actor)
        assert isinstance(excinfo.value, PermissionDenied)

    assert _snapshot(task) == before


PERMISSION_OF = {"redrive": "redrive_task", "resolve": "resolve_task", "cancel": "cancel_task"}
ON_CALL_PERMISSIONS = ["redrive_task", "resolve_task", "cancel_task", "pause_queue"]


@pytest.mark.parametrize("action", ACTIONS)
def test_each_action_checks_its_own_permission(db: None, outsider: User, action: str) -> None:
    # Every on-call permission but the one this action needs.
    others = [name for name in ON_CALL_PERMISSIONS if name != PERMISSION_OF[action]]
    outsider.user_permissions.add(*Permission.objects.filter(codename__in=others))
    user = User.objects.get(pk=outsider.pk)  # a fresh permission cache
    task = _dead_for(action)
    before = _snapshot(task)

    with pytest.raises(NotPermitted, match=PERMISSION_OF[action]):
        ACTIONS[action](task, user)

    assert _snapshot(task) == before
    user.user_permissions.add(Permission.objects.get(codename=PERMISSION_OF[action]))
    ACTIONS[action](task, User.objects.get(pk=user.pk))
    assert _snapshot(task) != before


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("persona", ["oncall", "superuser"])
def test_on_call_engineers_and_superusers_may_act_and_are_recorded(
    db: None, request: pytest.FixtureRequest, action: str, persona: str
) -> None:
    user: User = request.getfixturevalue(persona)
    task = _dead_for(action)

    ACTIONS[action](task, user)

    event = Event.objects.for_task(task.pk).last()
    assert event is not None
    assert event.kind == EVENT_OF[action]
    assert (event.actor, event.actor_user_id, event.reason) == (user.username, user.pk, "because")
    assert Task.objects.get(pk=task.pk).status != TaskStatus.DEAD


@pytest.mark.parametrize("action", ACTIONS)
def test_string_actors_are_trusted_callers(db: None, action: str) -> None:
    task = _dead_for(action)

    ACTIONS[action](task, "cli:alice")

    event = Event.objects.for_task(task.pk).last()
    assert event is not None
    assert event.kind == EVENT_OF[action]
    assert (event.actor, event.actor_user_id) == ("cli:alice", None)
    assert Task.objects.get(pk=task.pk).status != TaskStatus.DEAD


def test_every_event_of_one_bulk_action_carries_its_plan_id(db: None, oncall: User) -> None:
    tasks = [_dead_flaky(key=f"flaky:plan-{n}") for n in range(2)]
    other = _dead_flaky(key="flaky:plan-other")

    report = services.act_on_tasks(tasks, action="redrive", actor=oncall, reason="x", limit=5)
    services.redrive(other, actor=oncall, reason="alone")

    plans = {
        event.task_id: event.data.get("plan")
        for event in Event.objects.filter(kind=EventKind.REDRIVEN)
    }
    assert report.plan and plans == {
        tasks[0].pk: report.plan,
        tasks[1].pk: report.plan,
        other.pk: None,
    }
