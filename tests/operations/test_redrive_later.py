"""Retry after a delay (``redrive_later``): a redrive whose dead step becomes due only once
the delay has passed by the database's clock, with a fresh attempt budget, the same step
key and the rising token, audited as a ``redriven`` event carrying the delay."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db.models import F

from approvals.models import ApprovalRequest
from tasks_app import services
from tasks_app.engine import runner
from tasks_app.exceptions import InvalidInput, InvalidTransition, NotPermitted
from tasks_app.history import TaskState, fold
from tasks_app.models import Event, EventKind, StepStatus, TaskStatus
from tasks_app.observability import invariants
from tasks_app.operations import listings, selectors
from tasks_app.operations.task_actions import Action
from tests.approval_support import advance, article, pending_request
from tests.conftest import BrokerView, backdate, only_step
from tests.console_support import body, confirm_bulk, login, plan_of, post_bulk
from tests.factories import dead_task, enqueued, noop, unknown_outcome
from tests.operator_support import snapshot

LATER = Action.REDRIVE_LATER


def test_the_dead_step_is_due_after_the_delay_by_the_database_clock(db: None, oncall: User) -> None:
    task = dead_task()
    step = only_step(task)
    before = services.db_now()

    services.redrive(task, actor=oncall, reason="the remote is back at noon", delay="15m")

    after = services.db_now()
    step.refresh_from_db()
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.PENDING, 0, 1)
    due = step.available_at
    assert due is not None
    assert before + timedelta(minutes=15) <= due <= after + timedelta(minutes=15)
    # Not claimable until then: the claim asks the database's clock.
    assert not runner.run_claimed(step.pk)
    backdate(step, seconds=15 * 60)
    assert runner.run_claimed(step.pk)
    step.refresh_from_db()
    # demo.flaky failed its first claim only: the fresh budget's first attempt succeeds.
    assert (step.status, step.attempts, step.fencing_token) == (StepStatus.SUCCEEDED, 1, 2)


def test_it_is_audited_with_who_why_and_the_delay(db: None, oncall: User) -> None:
    task = dead_task()

    services.run_action(LATER, task, actor=oncall, reason="wait for the fix", delay=3600)

    event = Event.objects.for_task(task.pk).last()
    assert event is not None and event.kind == EventKind.REDRIVEN
    # The history still folds to the stored state, and the invariants hold.
    assert fold(task) == TaskState.from_db(task)
    assert invariants.check(since=None).findings == []
    assert (event.actor, event.actor_user_id, event.reason) == (
        oncall.username,
        oncall.pk,
        "wait for the fix",
    )
    assert event.data["delay_seconds"] == 3600
    task.refresh_from_db()
    assert task.status == TaskStatus.PENDING


def test_a_near_delay_rings_with_a_countdown_and_a_far_one_leaves_it_to_the_sweeper(
    transactional_db: None, oncall: User, broker: BrokerView
) -> None:
    near, far = dead_task(), dead_task()
    broker.purge()

    services.redrive(near, actor=oncall, reason="soon", delay=timedelta(seconds=30))
    services.redrive(far, actor=oncall, reason="later", delay=timedelta(hours=1))

    # Only the near one is rung (its message waits out the countdown); the far one has no
    # doorbell and is left for the sweeper to ring once it is due.
    assert broker.step_ids() == [only_step(near).pk]
    assert only_step(near).dispatched_at is not None
    assert only_step(far).dispatched_at is None
    broker.purge()
    assert services.redispatch_due() == 0  # not due yet: the sweeper leaves it
    backdate(only_step(far), seconds=3600)
    assert services.redispatch_due() == 1
    assert broker.step_ids() == [only_step(far).pk]


@pytest.mark.parametrize(
    ("delay", "rule"),
    [
        ("", "format"),
        ("soon", "format"),
        ("0", "range"),
        (0, "range"),
        (-5, "range"),
        ("8d", "range"),
        (timedelta(days=7, seconds=1), "range"),
        (10**30, "range"),
        (1.5, "format"),
        (True, "format"),
    ],
)
def test_a_bad_delay_is_refused_naming_the_field_and_stores_nothing(
    db: None, oncall: User, delay: Any, rule: str
) -> None:
    task = dead_task()
    before = snapshot(task)

    with pytest.raises(InvalidInput) as refused:
        services.redrive(task, actor=oncall, reason="why not", delay=delay)

    assert (refused.value.field, refused.value.rule) == ("delay", rule)
    assert str(refused.value).startswith("delay: more than 0 and at most 7 days")
    assert snapshot(task) == before


def test_the_longest_delay_is_seven_days(db: None, oncall: User) -> None:
    task = dead_task()
    services.redrive(task, actor=oncall, reason="after the freeze", delay="7d")
    due = only_step(task).available_at
    assert due is not None and due - services.db_now() > timedelta(days=6, hours=23)


def test_it_refuses_what_a_redrive_refuses(db: None, oncall: User) -> None:
    unknown, running_fine = unknown_outcome(), noop()
    for task in (unknown, running_fine):
        before = snapshot(task)
        with pytest.raises(InvalidTransition):
            services.redrive(task, actor=oncall, reason="try", delay="5m")
        assert snapshot(task) == before


def test_it_refuses_an_approval_step_which_a_person_decides(db: None, oncall: User) -> None:
    task = advance(article())
    ApprovalRequest.objects.filter(pk=pending_request(task).pk).update(
        expires_at=F("expires_at") - timedelta(hours=49)
    )
    services.sweep()  # the article's review expires and dead-letters for on-call
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD
    before = snapshot(task)

    with pytest.raises(InvalidTransition, match="approval: a person decides it"):
        services.redrive(task, actor=oncall, reason="ask again later", delay="1h")

    assert snapshot(task) == before


def test_it_needs_the_redrive_permission(db: None, auditor: User) -> None:
    task = dead_task()
    before = snapshot(task)
    with pytest.raises(NotPermitted):
        services.redrive(task, actor=auditor, reason="no", delay="5m")
    assert snapshot(task) == before


def test_a_delayed_redrive_is_listed_as_retry_scheduled(db: None, oncall: User) -> None:
    task, plain = dead_task(), dead_task()
    services.redrive(task, actor=oncall, reason="later", delay="1h")
    services.redrive(plain, actor=oncall, reason="now")
    waiting = enqueued("demo.noop", {})

    scheduled = listings.task_page(listings.TaskFilter(status=listings.RETRY_SCHEDULED), after=None)
    assert [row.pk for row in scheduled.rows] == [task.pk]
    assert selectors.overview().retry_scheduled == 1
    pending = listings.task_page(listings.TaskFilter(status=TaskStatus.PENDING), after=None)
    assert {row.pk for row in pending.rows} == {plain.pk, waiting.pk}


def test_the_bulk_entry_needs_the_delay_and_checks_it_before_anything(
    db: None, oncall: User
) -> None:
    task = dead_task()
    before = snapshot(task)
    for params, rule in (({}, "required"), ({"delay": "9d"}, "range")):
        with pytest.raises(InvalidInput) as refused:
            services.act_on_tasks(
                [task], action=LATER, actor=oncall, reason="r", limit=5, params=params
            )
        assert (refused.value.field, refused.value.rule) == ("delay", rule)
    with pytest.raises(InvalidInput) as refused:
        services.act_on_tasks(
            [task], action=Action.CANCEL, actor=oncall, reason="r", limit=5, params={"delay": "5m"}
        )
    assert refused.value.field == "delay"
    assert snapshot(task) == before

    report = services.act_on_tasks(
        [task], action=LATER, actor=oncall, reason="r", limit=5, params={"delay": "5m"}
    )
    assert report.changed == [task.pk]
    assert Event.objects.for_task(task.pk).last().data["delay_seconds"] == 300  # type: ignore[union-attr]


def test_the_commands_take_the_delay(db: None) -> None:
    first, second = dead_task(), dead_task()

    call_command("redrive", str(first.pk), reason="after lunch", delay="1h", actor="alice")
    call_command("task_action", "redrive_later", str(second.pk), reason="x", delay="5")

    first_event = Event.objects.for_task(first.pk).last()
    assert first_event is not None
    assert (first_event.actor, first_event.data["delay_seconds"]) == ("cli:alice", 3600)
    assert Event.objects.for_task(second.pk).last().data["delay_seconds"] == 300  # type: ignore[union-attr]
    third = dead_task()
    with pytest.raises(CommandError, match="delay: more than 0"):
        call_command("redrive", str(third.pk), reason="x", delay="0")
    with pytest.raises(CommandError, match="delay: is required"):
        call_command("task_action", "redrive_later", str(third.pk), reason="x")
    assert only_step(third).status == StepStatus.DEAD


def test_the_bulk_form_refuses_a_bad_delay_and_a_plan_whose_delay_changed(
    db: None, oncall: User
) -> None:
    task = dead_task()
    before = snapshot(task)
    client = login(oncall)

    refused = post_bulk(client, action=LATER, delay="0")
    assert refused.status_code == 400
    assert "delay: more than 0 and at most 7 days" in body(refused)
    preview = post_bulk(client, action=LATER, delay="15m")
    assert preview.status_code == 200
    changed = post_bulk(client, action=LATER, delay="1h", confirm="1", plan=plan_of(preview))
    assert changed.status_code == 409
    assert "the delay changed since the preview" in body(changed)
    assert snapshot(task) == before

    applied = confirm_bulk(client, action=LATER, delay="15m")
    assert applied.status_code == 200
    event = Event.objects.for_task(task.pk).get(kind=EventKind.REDRIVEN)
    assert (event.actor, event.data["delay_seconds"]) == (oncall.username, 900)
