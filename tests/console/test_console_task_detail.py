"""A task's page: its steps, lanes and timeline, the actions its state allows, and how
an action is refused, answered or redirected."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User

from tasks_app.models import Event, Task, TaskStatus
from tests.console_support import HTMX, body, login
from tests.factories import dead_task, enqueued, noop, unknown_outcome

pytestmark = pytest.mark.django_db


def test_a_task_page_shows_steps_leases_lanes_and_the_timeline(oncall: User) -> None:
    task = dead_task()
    page = body(login(oncall).get(f"/tasks/{task.pk}/"))
    assert "tasks_app.exceptions.PermanentError" in page
    assert 'class="seg seg-failed"' in page  # the attempt drawn in its lane
    for kind in ("enqueued", "claimed", "dead lettered"):
        assert f"<strong>{kind}</strong>" in page
    # On-call sees the actions a dead letter allows.
    assert ">Redrive</button>" in page and ">Redrive with changes</button>" in page
    assert ">Cancel task</button>" in page
    # Done by hand, yes; run again without its started calls is for an unknown outcome.
    assert ">Mark done</button>" in page
    assert ">Run again</button>" not in page


def test_an_unknown_outcome_offers_mark_done_and_run_again(oncall: User, auditor: User) -> None:
    task = unknown_outcome()
    page = body(login(oncall).get(f"/tasks/{task.pk}/"))
    assert ">Mark done</button>" in page and ">Run again</button>" in page
    # Not a redrive: it would find the call's started effect and die again without calling.
    assert ">Redrive</button>" not in page
    # Someone without the permissions sees the task and no action.
    assert '<form method="post" action="/tasks/' not in body(
        login(auditor).get(f"/tasks/{task.pk}/")
    )


def test_an_unknown_outcome_says_only_what_is_known(oncall: User) -> None:
    page = body(login(oncall).get(f"/tasks/{unknown_outcome().pk}/"))
    assert "Nobody knows whether the remote call of this step happened" in page
    assert "no external write" not in page
    assert "The effects ledger holds no entry for this step" in page
    # A step that died for another reason with nothing in the ledger made no write.
    assert "this step made no external write" in body(
        login(oncall).get(f"/tasks/{dead_task().pk}/")
    )


def test_mark_done_resolves_the_step_with_the_reason(oncall: User) -> None:
    task = unknown_outcome()
    response = login(oncall).post(
        f"/tasks/{task.pk}/resolve/", {"reason": "the mail went out", "outcome": "done"}
    )
    assert response.status_code == 302
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    event = task_events(task)[-1]
    assert (event.kind, event.actor, event.reason) == (
        "resolved",
        oncall.username,
        "the mail went out",
    )


def task_events(task: Task) -> list[Event]:
    return list(Event.objects.for_task(task.pk))


def test_an_action_without_a_reason_is_refused_on_its_field(oncall: User) -> None:
    task = dead_task()
    response = login(oncall).post(f"/tasks/{task.pk}/redrive/", {"reason": "  "}, headers=HTMX)
    assert response.status_code == 400
    assert "reason: " in body(response) and 'class="field invalid"' in body(response)
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD


def test_redrive_with_changes_checks_the_payload_by_the_input_rules(oncall: User) -> None:
    task = dead_task()
    client = login(oncall)
    for bad, message in (
        ("[1]", "payload: must be a JSON object"),
        ("{not json", "payload: not valid JSON"),
        ('{"error": "permanent", "sleep": NaN}', "payload"),
        ('{"a": "\\u0000"}', "payload: $.a contains \\u0000"),
    ):
        response = client.post(
            f"/tasks/{task.pk}/redrive/", {"reason": "try", "payload": bad}, headers=HTMX
        )
        assert response.status_code == 400, bad
        assert message in body(response), bad
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD
    assert task.payload == {"error": "permanent", "fail_first": 1}


def test_redrive_with_changes_keeps_the_secrets_the_editor_never_saw(oncall: User) -> None:
    task = dead_task({"error": "permanent", "fail_first": 1, "token": "t-secret"})
    edited = '{"error": "permanent", "fail_first": 0, "token": "•••redacted•••"}'
    response = login(oncall).post(
        f"/tasks/{task.pk}/redrive/", {"reason": "input fixed", "payload": edited}
    )
    assert response.status_code == 302
    task.refresh_from_db()
    assert task.payload == {"error": "permanent", "fail_first": 0, "token": "t-secret"}


def test_an_action_that_no_longer_applies_answers_409_with_the_reason(oncall: User) -> None:
    task = enqueued()
    response = login(oncall).post(f"/tasks/{task.pk}/redrive/", {"reason": "x"}, headers=HTMX)
    assert response.status_code == 409
    assert "no dead step to redrive" in body(response)


def test_a_plain_post_redirects_to_the_task_with_a_message(oncall: User) -> None:
    task = dead_task()
    client = login(oncall)
    response = client.post(f"/tasks/{task.pk}/cancel/", {"reason": "not needed"}, follow=True)
    assert response.redirect_chain == [(f"/tasks/{task.pk}/", 302)]
    assert f"Task #{task.pk}: cancel requested." in body(response)


@pytest.mark.parametrize(("status", "live"), [("pending", True), ("dead", False)])
def test_a_task_page_refreshes_itself_while_its_task_is_at_work(
    oncall: User, status: str, live: bool
) -> None:
    task = noop() if status == "pending" else dead_task()
    page = body(login(oncall).get(f"/tasks/{task.pk}/"))
    polls = f'hx-get="/tasks/{task.pk}/" hx-trigger="every 3s, refresh"' in page
    assert polls == live


def test_a_payload_nested_ten_thousand_deep_is_a_form_error(oncall: User) -> None:
    task = dead_task()
    response = login(oncall).post(
        f"/tasks/{task.pk}/redrive/",
        {"reason": "try", "payload": '{"a": ' * 10_000 + "1" + "}" * 10_000},
        headers=HTMX,
    )
    assert response.status_code == 400
    assert "payload: nesting deeper than 32 levels" in body(response)
    assert Task.objects.get(pk=task.pk).status == TaskStatus.DEAD


def test_every_required_reason_is_marked_required(oncall: User) -> None:
    client = login(oncall)
    pages = [
        body(client.get(f"/tasks/{unknown_outcome().pk}/")),
        body(client.get(f"/tasks/{dead_task().pk}/")),
        body(client.get("/queues/")),
    ]
    for page in pages:
        fields = re.findall(r'<(?:textarea|input)[^>]*name="reason"[^>]*>', page)
        assert fields and all(" required" in field for field in fields), fields
        labels = re.findall(r"<label [^>]*>Reason[^<]*(.*?)</label>", page, re.S)
        assert labels and all("(required)" in label for label in labels), labels
