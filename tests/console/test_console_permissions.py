"""Who may see each console page and take each action: one table each, checked for every
role. A refused action answers 403 and changes no row."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from approvals.models import ApprovalRequest
from tasks_app.models import Event, QueueState, Step, Task
from tests.approval_support import advance, article, pending_request
from tests.console_support import login
from tests.factories import dead_task

# Page by role: status. Reading needs ``view_task`` (every group has it); the approvals
# pages need ``view_approvalrequest`` (editors); the audit log and its export need the
# auditors' permissions. Superusers (admin) have all. An outsider is a logged-in user
# without any group.
PAGE_MATRIX = """
page          editor  oncall  auditor  admin  outsider
overview      200     200     200      200    403
tasks         200     200     200      200    403
task          200     200     200      200    403
dead          200     200     200      200    403
approvals     200     403     403      200    403
review        200     403     403      200    403
queues        200     200     200      200    403
audit         403     403     200      200    403
audit_export  403     403     200      200    403
"""

# Action by role: "done" or 403.
ACTION_MATRIX = """
action        editor  oncall  auditor  admin  outsider
redrive       403     done    403      done   403
resolve       403     done    403      done   403
cancel        403     done    403      done   403
bulk          403     done    403      done   403
pause         403     done    403      done   403
resume        403     done    403      done   403
decide        done    403     403      done   403
"""


def _table(text: str) -> list[tuple[str, str, str]]:
    lines = [line.split() for line in text.strip().splitlines()]
    roles = lines[0][1:]
    return [
        (row[0], role, cell) for row in lines[1:] for role, cell in zip(roles, row[1:], strict=True)
    ]


PAGE_CASES = _table(PAGE_MATRIX)
ACTION_CASES = _table(ACTION_MATRIX)


@pytest.fixture
def persona(request: pytest.FixtureRequest) -> Callable[[str], User]:
    """The user of a role: the test module's personas, by role name."""
    fixtures = {
        "editor": "editor",
        "oncall": "oncall",
        "auditor": "auditor",
        "admin": "superuser",
        "outsider": "outsider",
    }
    return lambda role: request.getfixturevalue(fixtures[role])


@pytest.fixture
def world(author: User) -> dict[str, Any]:
    """A dead task, a task waiting for review (enqueued by the author) and a queue."""
    review_task = advance(article(actor=author))
    return {"dead": dead_task(), "review": pending_request(review_task)}


def _page_url(page: str, world: dict[str, Any]) -> str:
    return {
        "overview": "/",
        "tasks": "/tasks/",
        "task": f"/tasks/{world['dead'].pk}/",
        "dead": "/dead/",
        "approvals": "/approvals/",
        "review": f"/approvals/{world['review'].pk}/",
        "queues": "/queues/",
        "audit": "/audit/",
        "audit_export": "/audit/export.csv",
    }[page]


def test_the_tables_name_every_role_for_every_page_and_action() -> None:
    assert len(PAGE_CASES) == 9 * 5
    assert len(ACTION_CASES) == 7 * 5
    assert {cell for _, _, cell in PAGE_CASES} == {"200", "403"}
    assert {cell for _, _, cell in ACTION_CASES} == {"done", "403"}


@pytest.mark.django_db
@pytest.mark.parametrize(("page", "role", "expected"), PAGE_CASES)
def test_each_page_answers_each_role_as_the_table_says(
    page: str, role: str, expected: str, persona: Callable[[str], User], world: dict[str, Any]
) -> None:
    client = login(persona(role))
    response = client.get(_page_url(page, world))
    assert response.status_code == int(expected)


@pytest.mark.django_db
@pytest.mark.parametrize("page", sorted({page for page, _, _ in PAGE_CASES}))
def test_every_page_sends_an_anonymous_visitor_to_the_login(
    page: str, client: Client, world: dict[str, Any]
) -> None:
    url = _page_url(page, world)
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


def _action(action: str, world: dict[str, Any]) -> tuple[str, dict[str, str]]:
    dead: Task = world["dead"]
    review: ApprovalRequest = world["review"]
    return {
        "redrive": (f"/tasks/{dead.pk}/redrive/", {"reason": "fixed the remote"}),
        "resolve": (f"/tasks/{dead.pk}/resolve/", {"reason": "checked", "outcome": "done"}),
        "cancel": (f"/tasks/{dead.pk}/cancel/", {"reason": "not needed"}),
        "bulk": ("/dead/bulk/", {"action": "cancel", "reason": "incident", "confirm": "1"}),
        "pause": ("/queues/default/pause/", {"reason": "incident"}),
        "resume": ("/queues/default/resume/", {"reason": "over"}),
        "decide": (
            f"/approvals/{review.pk}/decide/",
            {"decision": "approve", "comment": "", "draft_hash": review.draft_hash},
        ),
    }[action]


def post_action(client: Client, action: str, world: dict[str, Any]) -> Any:
    """Take the action as its page does: a bulk action confirms the plan its preview made
    (a role refused the preview confirms without one, and is refused again)."""
    url, data = _action(action, world)
    if action == "bulk":
        preview = client.post(url, {**data, "confirm": ""}).content.decode()
        found = re.search(r'name="plan" value="([^"]+)"', preview)
        if found:
            data["plan"] = found.group(1)
    return client.post(url, data)


# What the task page, a review or the queues page show, none of which a refusal may.
CONTENT_OF_OBJECTS = ("<table", "fail_first", "Traceback", "draft_hash", "PermanentError")


def _assert_bare_refusal(page: str) -> None:
    assert "Not permitted" in page
    for content in CONTENT_OF_OBJECTS:
        assert content not in page, f"{content!r} shown behind a refusal"


@pytest.mark.django_db
@pytest.mark.parametrize(("action", "role"), [(a, r) for a, r, e in ACTION_CASES if e == "403"])
def test_a_refused_htmx_action_shows_only_its_reason_in_the_message_region(
    action: str, role: str, persona: Callable[[str], User], world: dict[str, Any]
) -> None:
    url, data = _action(action, world)
    # A wrong draft hash, a bad reason: the refusal comes before any of it is read.
    data = {**data, "draft_hash": "0" * 64, "payload": "[" * 10_000}
    before = snapshot()

    response = login(persona(role)).post(url, data, headers={"HX-Request": "true"})

    assert response.status_code == 403
    assert (response["HX-Retarget"], response["HX-Reswap"]) == ("#messages", "innerHTML show:top")
    _assert_bare_refusal(response.content.decode())
    assert "<html" not in response.content.decode()
    assert snapshot() == before


def snapshot() -> tuple[Any, ...]:
    """Every row an action could change."""
    return (
        list(Task.objects.order_by("pk").values_list("pk", "status", "payload")),
        list(Step.objects.order_by("pk").values_list("pk", "status", "attempts")),
        list(Event.objects.order_by("pk").values_list("pk", "kind")),
        list(QueueState.objects.order_by("name").values_list("name", "paused")),
        list(ApprovalRequest.objects.order_by("pk").values_list("pk", "status")),
    )


@pytest.mark.django_db
@pytest.mark.parametrize(("action", "role", "expected"), ACTION_CASES)
def test_each_action_is_done_or_refused_for_each_role_as_the_table_says(
    action: str, role: str, expected: str, persona: Callable[[str], User], world: dict[str, Any]
) -> None:
    if action == "resume":
        QueueState.objects.create(name="default", paused=True, changed_by="cli:x", reason="x")
    user = persona(role)
    client = login(user)
    before = snapshot()
    before_events = Event.objects.count()

    response = post_action(client, action, world)

    if expected == "403":
        assert response.status_code == 403
        assert snapshot() == before
        _assert_bare_refusal(response.content.decode())
    else:
        assert response.status_code == 302, response.content.decode()[:500]
        new = Event.objects.filter(pk__gt=max([0, *[pk for pk, _ in before[2]]]))
        assert Event.objects.count() > before_events
        # The action's event names the person who took it.
        assert new.filter(actor=user.username).exists()
