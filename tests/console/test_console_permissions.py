"""Who may see each console page and take each action: one table each, checked for every
role. A refused action answers 403 and changes no row."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tasks_app.models import Event
from tests.approval_support import advance, article, pending_request
from tests.console_support import login
from tests.factories import dead_task
from tests.limits_page_support import limited_flow
from tests.permission_tables import (
    ACTION_CASES,
    PAGE_CASES,
    action_request,
    page_url,
    post_action,
    prepare,
)
from tests.rows import action_rows


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
def world(author: User) -> Iterator[dict[str, Any]]:
    """A dead task, a task waiting for review (enqueued by the author), a queue and a
    workflow under limits."""
    review_task = advance(article(actor=author))
    with limited_flow():
        yield {"dead": dead_task(), "review": pending_request(review_task)}


def test_the_tables_name_every_role_for_every_page_and_action() -> None:
    assert len(PAGE_CASES) == 14 * 5
    assert len(ACTION_CASES) == 17 * 5
    assert {cell for _, _, cell in PAGE_CASES} == {"200", "403"}
    assert {cell for _, _, cell in ACTION_CASES} == {"done", "403"}


@pytest.mark.django_db
@pytest.mark.parametrize(("page", "role", "expected"), PAGE_CASES)
def test_each_page_answers_each_role_as_the_table_says(
    page: str, role: str, expected: str, persona: Callable[[str], User], world: dict[str, Any]
) -> None:
    client = login(persona(role))
    response = client.get(page_url(page, world))
    assert response.status_code == int(expected)


@pytest.mark.django_db
@pytest.mark.parametrize("page", sorted({page for page, _, _ in PAGE_CASES}))
def test_every_page_sends_an_anonymous_visitor_to_the_login(
    page: str, client: Client, world: dict[str, Any]
) -> None:
    url = page_url(page, world)
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


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
    url, data = action_request(action, world)
    # A wrong draft hash, a bad reason: the refusal comes before any of it is read.
    data = {**data, "draft_hash": "0" * 64, "payload": "[" * 10_000}
    before = action_rows()

    response = login(persona(role)).post(url, data, headers={"HX-Request": "true"})

    assert response.status_code == 403
    assert (response["HX-Retarget"], response["HX-Reswap"]) == ("#messages", "innerHTML show:top")
    _assert_bare_refusal(response.content.decode())
    assert "<html" not in response.content.decode()
    assert action_rows() == before


@pytest.mark.django_db
@pytest.mark.parametrize(("action", "role", "expected"), ACTION_CASES)
def test_each_action_is_done_or_refused_for_each_role_as_the_table_says(
    action: str, role: str, expected: str, persona: Callable[[str], User], world: dict[str, Any]
) -> None:
    prepare(action)
    user = persona(role)
    client = login(user)
    before = action_rows()
    before_events = Event.objects.count()

    response = post_action(client, action, world)

    if expected == "403":
        assert response.status_code == 403
        assert action_rows() == before
        _assert_bare_refusal(response.content.decode())
    else:
        assert response.status_code == 302, response.content.decode()[:500]
        new = Event.objects.filter(pk__gt=max([0, *[pk for pk, _ in before[2]]]))
        assert Event.objects.count() > before_events
        # The action's event names the person who took it.
        assert new.filter(actor=user.username).exists()
