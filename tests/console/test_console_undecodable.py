"""The task list and a task's page answer for a task whose payload or result no Python
process can decode (stored by SQL, nested past the decoder's recursion limit): the list
shows its row, the page renders with a note where the value would be."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from tasks_app.models import Task
from tests.console_support import body, login
from tests.factories import noop, succeeded
from tests.lease_support import step_at
from tests.poison_support import poison

NOTE = "this value cannot be decoded (nested deeper than Python&#x27;s JSON decoder reads"


def _page(user: User, url: str) -> str:
    response = login(user).get(url)
    assert response.status_code == 200, body(response)[:2000]
    return body(response)


@pytest.mark.django_db
def test_the_task_list_shows_a_task_whose_payload_cannot_be_decoded(oncall: User) -> None:
    task = noop()
    poison(task.pk)

    page = _page(oncall, "/tasks/")

    assert f'href="/tasks/{task.pk}/"' in page


@pytest.mark.django_db
def test_a_task_page_notes_an_undecodable_payload_and_result_instead_of_their_values(
    oncall: User,
) -> None:
    task: Task = succeeded()
    poison(task.pk)
    poison(step_at(task, 0).pk, "result")

    page = _page(oncall, f"/tasks/{task.pk}/")

    assert page.count(NOTE) >= 2, page
    assert "[[[[" not in page
