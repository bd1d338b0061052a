"""A rewind of many tasks is a bulk action (the ``rewind`` row of the operator actions):
each task runs again from its step of the kind given, under one bulk plan whose id every
``rewound`` event carries. Nobody is there to say whether a write in doubt happened, so a
task with one is skipped and reported (its page asks), as is a task with no step of that
kind.

The newsletter's mail service is an in-process fake (``tests.rewind_support``); everything
of ours runs for real.
"""

from __future__ import annotations

from collections.abc import Iterator
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError

from console.plans import BulkPlan
from tasks_app import services
from tasks_app.exceptions import InvalidInput, InvalidTransition
from tasks_app.models import Effect, Event, EventKind, StepStatus, Task, TaskStatus
from tasks_app.operations.listings import DeadFilter
from tasks_app.operations.task_actions import Action
from tests.console_support import body, confirm_bulk, login, post_bulk
from tests.factories import dead_task
from tests.graph_support import registered, run, step_of
from tests.rewind_support import NAME, Mailer, newsletter, sent_task

REASON = "the list address is fixed"


@pytest.fixture
def mailer(db: None) -> Iterator[Mailer]:
    made = Mailer()
    with registered(newsletter(made)):
        yield made


def _rewound(task: Task) -> list[Event]:
    return list(Event.objects.for_task(task.pk).filter(kind=EventKind.REWOUND))


def test_a_bulk_plan_rewinds_each_dead_letter_from_the_kind_and_skips_what_it_may_not(
    mailer: Mailer, oncall: User
) -> None:
    first = sent_task(mailer, topic="first", refuse=True)
    second = sent_task(mailer, topic="second", refuse=True)
    doubtful = sent_task(mailer, topic="doubtful", lose_answer=True)
    other = dead_task()
    assert mailer.sent == ["News: doubtful"]
    [in_doubt] = Effect.objects.filter(step__task=doubtful, status=Effect.Status.STARTED)

    plan = BulkPlan.make(
        action=Action.REWIND,
        filters=DeadFilter(),
        limit=10,
        user_id=oncall.pk,
        params={"from_step": "draft"},
    )
    assert plan.ids == (first.pk, second.pk, doubtful.pk, other.pk)
    report = plan.apply(actor=oncall, reason=REASON)

    assert report.changed == [first.pk, second.pk]
    skipped = dict(report.skipped)
    assert set(skipped) == {doubtful.pk, other.pk}
    assert skipped[doubtful.pk] == (
        f"task #{doubtful.pk} has writes in doubt ({in_doubt.key}): rewind it from its page, "
        "saying whether each happened"
    )
    assert f"task #{other.pk} has no step draft to rewind from" in skipped[other.pk]

    # One rewound event per task rewound, carrying the plan's id; none for the others.
    for task in (first, second):
        [event] = _rewound(task)
        assert (event.actor, event.reason, event.data["plan"]) == (
            oncall.username,
            REASON,
            plan.id,
        )
        assert event.data["rerun"] == ["draft", "mail", "archive"]
        task.refresh_from_db()
        assert task.status == TaskStatus.PENDING
        assert step_of(task, "draft").status == StepStatus.PENDING
        assert step_of(task, "fetch").revision == 0
    assert Event.objects.filter(kind=EventKind.REWOUND, data__plan=plan.id).count() == 2

    # What was skipped is as it was: dead, the write in doubt still in doubt.
    for task in (doubtful, other):
        assert _rewound(task) == []
        task.refresh_from_db()
        assert task.status == TaskStatus.DEAD
    in_doubt.refresh_from_db()
    assert in_doubt.status == Effect.Status.STARTED

    # The rewound tasks run on to the end, each mail sent once.
    for kind in ("draft", "mail", "archive"):
        run(first, kind)
    first.refresh_from_db()
    assert first.status == TaskStatus.SUCCEEDED
    assert mailer.sent == ["News: doubtful", "News: first"]


def test_a_rewind_of_a_finished_task_skips_the_mail_it_sent_by_its_key(
    mailer: Mailer, oncall: User
) -> None:
    task = sent_task(mailer)
    assert task.status == TaskStatus.SUCCEEDED

    report = services.act_on_tasks(
        [task],
        action=Action.REWIND,
        actor=oncall,
        reason=REASON,
        limit=5,
        params={"from_step": "mail"},
    )
    assert report.changed == [task.pk]
    [event] = _rewound(task)
    assert event.data["plan"] == report.plan
    for kind in ("mail", "archive"):
        run(task, kind)
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    assert mailer.sent == ["News: spring"]


def test_it_refuses_a_task_still_at_work_and_a_step_kind_left_out(
    mailer: Mailer, oncall: User
) -> None:
    pending = services.enqueue("test.rewind.newsletter", {"topic": "x"}).task
    with pytest.raises(InvalidTransition, match="a rewind starts again a task that succeeded"):
        services.rewind_from(pending, actor=oncall, reason=REASON, from_step="fetch")

    dead = sent_task(mailer, refuse=True)
    with pytest.raises(InvalidInput, match="from_step: is required"):
        services.rewind_from(dead, actor=oncall, reason=REASON, from_step="  ")
    with pytest.raises(InvalidInput, match="from_step: is required"):
        services.act_on_tasks([dead], action=Action.REWIND, actor=oncall, reason=REASON, limit=5)
    assert _rewound(dead) == []


def test_the_command_rewinds_by_kind_and_says_what_it_skipped(mailer: Mailer) -> None:
    rewound = sent_task(mailer, topic="first", refuse=True)
    doubtful = sent_task(mailer, topic="doubtful", lose_answer=True)
    ids = [str(rewound.pk), str(doubtful.pk)]

    out = StringIO()
    call_command(
        "rewind", *ids, from_step="mail", reason=REASON, actor="ops:olivia", dry_run=True,
        stdout=out,
    )  # fmt: skip
    assert "2 of 2 task(s) apply" in out.getvalue()
    assert _rewound(rewound) == []

    out = StringIO()
    call_command("rewind", *ids, from_step="mail", reason=REASON, actor="ops:olivia", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "rewind: 1 changed, 1 skipped"
    assert lines[1] == f"changed: {rewound.pk}"
    assert lines[2].startswith(f"skipped {doubtful.pk}: task #{doubtful.pk} has writes in doubt")
    [event] = _rewound(rewound)
    assert event.actor == "ops:olivia"

    with pytest.raises(CommandError, match="from_step: is required"):
        call_command("rewind", *ids, reason=REASON)


def test_the_dead_letters_preview_a_bulk_rewind_and_confirm_it(
    mailer: Mailer, oncall: User
) -> None:
    rewound = sent_task(mailer, topic="first", refuse=True)
    doubtful = sent_task(mailer, topic="doubtful", lose_answer=True)
    client = login(oncall)
    fields = {"action": "rewind", "from_step": "draft", "workflow": NAME}

    preview = body(post_bulk(client, **fields))
    assert "Rewind 2 tasks" in preview
    assert "those tasks are skipped: rewind them one by one from their page" in preview
    assert _rewound(rewound) == []

    response = confirm_bulk(client, **fields)
    assert "1 task changed, 1 skipped" in body(response)
    assert "has writes in doubt" in body(response)
    [event] = _rewound(rewound)
    assert event.actor == oncall.username
    assert _rewound(doubtful) == []
