"""The task list: its filters by status, workflow, key, payload field and time, its
pages by keyset, and a filter it cannot use refused rather than widened."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from tests.console_support import body, login
from tests.factories import backdate_task, dead_task, enqueued, noop

pytestmark = pytest.mark.django_db


def test_the_task_list_filters_by_status_workflow_key_and_payload_field(superuser: User) -> None:
    keep = enqueued("demo.noop", {"customer": {"id": 42}}, key="k-1")
    other = enqueued("demo.noop", {"customer": {"id": 7}}, key="k-2")
    dead = dead_task()
    client = login(superuser)

    def ids(query: str) -> set[int]:
        page = body(client.get("/tasks/?" + query))
        return {int(pk) for pk in re.findall(r'href="/tasks/(\d+)/"', page)}

    assert ids("status=dead") == {dead.pk}
    assert ids("workflow=demo.flaky") == {dead.pk}
    assert ids("key=k-2") == {other.pk}
    assert ids("payload=customer.id%3D42") == {keep.pk}
    assert ids("payload=customer.id%3D%2242%22") == set()  # the text "42" is not 42
    assert ids("payload=error%3Dpermanent") == {dead.pk}


def test_the_task_list_filters_by_time_and_explains_a_bad_value(superuser: User) -> None:
    old = enqueued("demo.noop", {"n": 1})
    new = enqueued("demo.noop", {"n": 2})
    backdate_task(old, created_at=timedelta(days=2))
    client = login(superuser)
    since = (timezone.now() - timedelta(days=1)).strftime("%Y-%m-%d %H:%M")
    page = body(client.get("/tasks/", {"since": since}))
    assert f'href="/tasks/{new.pk}/"' in page and f'href="/tasks/{old.pk}/"' not in page
    bad = body(client.get("/tasks/", {"since": "yesterday-ish"}))
    assert "Enter a valid date/time" in bad


def test_the_task_list_pages_by_keyset_without_repeating_rows(
    superuser: User, settings: object
) -> None:
    settings.CONSOLE_PAGE_SIZE = 2  # type: ignore[attr-defined]
    tasks = [enqueued("demo.noop", {"n": i}) for i in range(5)]
    client = login(superuser)
    seen: list[int] = []
    url = "/tasks/"
    while url:
        page = body(client.get(url))
        seen += [int(pk) for pk in re.findall(r'<th scope="row"><a href="/tasks/(\d+)/"', page)]
        older = re.search(r'href="(\?after=\d+)" hx-get', page)
        url = "/tasks/" + older.group(1) if older else ""
    assert seen == sorted((task.pk for task in tasks), reverse=True)


@pytest.mark.parametrize(
    "payload",
    [
        'a="\\u0000"',
        'a="\\ud800"',
        "a=NaN",
        "a=Infinity",
        "a=-Infinity",
        "a=1e400",
        "a=" + "[" * 10_000,
    ],
)
def test_a_task_filter_postgresql_cannot_compare_is_refused_with_400(
    oncall: User, payload: str
) -> None:
    noop()
    response = login(oncall).get("/tasks/", {"payload": payload})
    assert response.status_code == 400
    assert "The filter cannot be used: payload: " in body(response)
    assert "<table" not in body(response)


@pytest.mark.parametrize("query", [{"since": "not-a-date"}, {"status": "lost"}, {"after": "x"}])
def test_a_bad_task_filter_is_refused_not_widened(oncall: User, query: dict[str, str]) -> None:
    noop()
    response = login(oncall).get("/tasks/", query)
    assert response.status_code == 400
    assert "<table" not in body(response)


@pytest.mark.parametrize(
    ("payload", "secret"),
    [
        ("api_token=right", "api_token"),
        ("api_token=wrong", "api_token"),
        ("auth.Client-Secret=s-1", "Client-Secret"),
        ('auth={"password": "pw-1"}', "password"),
        ('items=[{"session_id": "s-1"}]', "session_id"),
    ],
)
def test_a_payload_filter_that_would_compare_a_secret_is_refused_whatever_the_guess(
    oncall: User, payload: str, secret: str
) -> None:
    enqueued(
        "demo.noop",
        {
            "api_token": "right",
            "auth": {"Client-Secret": "s-1", "password": "pw-1"},
            "items": [{"session_id": "s-1"}],
        },
    )
    response = login(oncall).get("/tasks/", {"payload": payload})
    assert response.status_code == 400
    page = body(response)
    assert f"The filter cannot be used: payload: &#x27;{secret}&#x27; is a secret" in page
    assert "REDACT_KEY_PATTERNS" in page
    assert "<table" not in page and "/tasks/1" not in page


def test_a_payload_filter_on_a_field_beside_a_secret_still_lists_its_tasks(oncall: User) -> None:
    task = enqueued("demo.noop", {"ticket": {"id": 7, "token": "t-1"}})
    page = body(login(oncall).get("/tasks/", {"payload": "ticket.id=7"}))
    assert f'href="/tasks/{task.pk}/"' in page


def test_the_status_filter_names_each_status_as_people_read_it(oncall: User) -> None:
    page = body(login(oncall).get("/tasks/"))

    assert '<option value="waiting_approval">Waiting Approval</option>' in page
    assert ">waiting_approval<" not in page
