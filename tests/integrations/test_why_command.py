"""``manage.py why <task id>``: what holds a task back as plain lines with the console's
links; an unknown or malformed id is refused with one line and exit status 2."""

from __future__ import annotations

import pytest
from django.conf import settings

from tasks_app import services
from tests import why_support as made
from tests.command_support import lines, refused, run

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("why_workflows")]

why_workflows = made.why_workflows


def test_why_names_each_blocker_with_its_link() -> None:
    made.live_worker("default")
    holder, task = made.at_concurrency()

    out = lines(run("why", str(task.pk)))

    assert out[0] == f"Task #{task.pk} {made.LIMITED}.slots: pending"
    assert out[1].startswith("- Limit “why-slots” (key “acme”) is at its concurrency of 1:")
    assert f"task #{holder.pk} holds it" in out[1]
    base = settings.CONSOLE_BASE_URL.rstrip("/")
    assert out[2] == f"  limit why-slots: {base}/limits/#limit-why-slots"


def test_why_names_a_paused_queue_and_a_missing_worker() -> None:
    task = made.paused_queue()

    out = run("why", str(task.pk))

    assert "Queue “default” was paused by cli:olivia" in out
    assert "database failover" in out
    assert "No live worker consumes queue “default”" in out
    assert "Step 1 (publish) waits for step 0 (draft), which is pending." in out


def test_why_says_a_finished_task_has_nothing_holding_it() -> None:
    task = made.enqueue(made.PAIR)
    services.cancel(task, actor="cli:olivia", reason="not needed")

    assert lines(run("why", str(task.pk))) == [
        f"Task #{task.pk} {made.PAIR}: cancelled",
        "It has ended: nothing holds it back.",
    ]


def test_why_refuses_an_unknown_task_id() -> None:
    assert refused("why", "999999") == "task_id: no task with id 999999"


def test_why_refuses_a_task_id_that_is_no_number() -> None:
    assert "task_id" in refused("why", "abc")
