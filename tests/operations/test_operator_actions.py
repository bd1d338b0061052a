"""Operator actions (DESIGN rules 7 and 10): redrive, resolve and cancel are explicit,
permission-checked and audited; they keep history, step keys and the rising fence."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser, Permission, User
from django.core.exceptions import PermissionDenied

from tasks_app import services
from tasks_app.exceptions import InvalidInput, InvalidTransition, NotPermitted
from tasks_app.models import Event, EventKind, Lease, StepStatus, Task, TaskStatus
from tasks_app.validation import canonical_json
from tests.conftest import event_kinds, only_step
from tests.operator_support import (
    RETRYABLE,
    dead_flaky,
    dead_for,
    dead_unknown,
    flaky,
    run_due,
    snapshot,
)

# --- redrive -----------------------------------------------------------------------------------


def test_redrive_keeps_history_the_step_key_and_the_rising_fencing_token(
    db: None, oncall: User
) -> None:
    task = dead_flaky({"fail_first": 4})
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

    run_due(step)  # claim 4 still fails: fail_first counts claims over the step's whole life
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.PENDING, 1, 4)
    run_due(step)

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
    task = dead_flaky({"fail_first": 10})
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
    run_due(step)

    assert (step.status, step.fencing_token) == (StepStatus.SUCCEEDED, 4)
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED


def test_redrive_stores_an_edited_negative_zero_as_zero_as_enqueue_does(
    db: None, oncall: User
) -> None:
    task = dead_flaky({"fail_first": 10})
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
    task = dead_flaky()
    before = snapshot(task)

    with pytest.raises(InvalidInput) as excinfo:
        services.redrive(task, actor=oncall, reason="fix input", payload=payload)

    assert excinfo.value.field.startswith(field)
    assert snapshot(task) == before


def test_redrive_needs_a_dead_step(db: None, oncall: User) -> None:
    pending = flaky({}, "flaky:pending")
    succeeded = flaky({}, "flaky:done")
    run_due(only_step(succeeded))
    before = [snapshot(pending), snapshot(succeeded)]

    for task in (pending, succeeded):
        with pytest.raises(InvalidTransition):
            services.redrive(task, actor=oncall, reason="try again")

    assert [snapshot(pending), snapshot(succeeded)] == before


@pytest.mark.parametrize("reason", ["", "   ", None])
def test_operator_actions_need_a_reason(db: None, oncall: User, reason: Any) -> None:
    task = dead_flaky()
    before = snapshot(task)
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

    assert snapshot(task) == before


# --- resolve -----------------------------------------------------------------------------------


def test_resolve_refuses_an_unknown_outcome(db: None, oncall: User) -> None:
    task = dead_flaky()
    before = snapshot(task)

    with pytest.raises(InvalidInput) as excinfo:
        services.resolve(task, actor=oncall, reason="checked", outcome="ignore")

    assert excinfo.value.field == "outcome"
    assert snapshot(task) == before


def test_resolve_needs_a_dead_step(db: None, oncall: User) -> None:
    task = flaky({})
    before = snapshot(task)

    with pytest.raises(InvalidTransition):
        services.resolve(task, actor=oncall, reason="checked", outcome="done")

    assert snapshot(task) == before


@pytest.mark.parametrize("dead", [dead_unknown, dead_flaky])
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
    task = dead_unknown()

    services.resolve(task, actor=oncall, reason="try once more", outcome="retry")

    step = only_step(task)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.PENDING, 0, 1)
    run_due(step)
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.SUCCEEDED, 1, 2)


def test_running_again_refuses_a_step_whose_outcome_is_known(db: None, oncall: User) -> None:
    task = dead_flaky()
    before = snapshot(task)

    with pytest.raises(InvalidTransition, match=r"known outcome .*: redrive it"):
        services.resolve(task, actor=oncall, reason="checked", outcome="retry")

    assert snapshot(task) == before


def test_redrive_refuses_a_step_whose_outcome_is_unknown(db: None, oncall: User) -> None:
    # Its started call would be found again and the step would stop again without calling.
    task = dead_unknown()
    before = snapshot(task)

    with pytest.raises(InvalidTransition, match=r"unknown outcome.*resolve it instead"):
        services.redrive(task, actor=oncall, reason="try again")

    assert snapshot(task) == before


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
    task = dead_for(action)
    before = snapshot(task)

    for actor in (outsider, auditor, AnonymousUser()):
        with pytest.raises(NotPermitted) as excinfo:
            ACTIONS[action](task, actor)
        assert isinstance(excinfo.value, PermissionDenied)

    assert snapshot(task) == before


PERMISSION_OF = {"redrive": "redrive_task", "resolve": "resolve_task", "cancel": "cancel_task"}
ON_CALL_PERMISSIONS = ["redrive_task", "resolve_task", "cancel_task", "pause_queue"]


@pytest.mark.parametrize("action", ACTIONS)
def test_each_action_checks_its_own_permission(db: None, outsider: User, action: str) -> None:
    # Every on-call permission but the one this action needs.
    others = [name for name in ON_CALL_PERMISSIONS if name != PERMISSION_OF[action]]
    outsider.user_permissions.add(*Permission.objects.filter(codename__in=others))
    user = User.objects.get(pk=outsider.pk)  # a fresh permission cache
    task = dead_for(action)
    before = snapshot(task)

    with pytest.raises(NotPermitted, match=PERMISSION_OF[action]):
        ACTIONS[action](task, user)

    assert snapshot(task) == before
    user.user_permissions.add(Permission.objects.get(codename=PERMISSION_OF[action]))
    ACTIONS[action](task, User.objects.get(pk=user.pk))
    assert snapshot(task) != before


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("persona", ["oncall", "superuser"])
def test_on_call_engineers_and_superusers_may_act_and_are_recorded(
    db: None, request: pytest.FixtureRequest, action: str, persona: str
) -> None:
    user: User = request.getfixturevalue(persona)
    task = dead_for(action)

    ACTIONS[action](task, user)

    event = Event.objects.for_task(task.pk).last()
    assert event is not None
    assert event.kind == EVENT_OF[action]
    assert (event.actor, event.actor_user_id, event.reason) == (user.username, user.pk, "because")
    assert Task.objects.get(pk=task.pk).status != TaskStatus.DEAD


@pytest.mark.parametrize("action", ACTIONS)
def test_string_actors_are_trusted_callers(db: None, action: str) -> None:
    task = dead_for(action)

    ACTIONS[action](task, "cli:alice")

    event = Event.objects.for_task(task.pk).last()
    assert event is not None
    assert event.kind == EVENT_OF[action]
    assert (event.actor, event.actor_user_id) == ("cli:alice", None)
    assert Task.objects.get(pk=task.pk).status != TaskStatus.DEAD


def test_every_event_of_one_bulk_action_carries_its_plan_id(db: None, oncall: User) -> None:
    tasks = [dead_flaky(key=f"flaky:plan-{n}") for n in range(2)]
    other = dead_flaky(key="flaky:plan-other")

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
