"""The overview: work counted by state, recent successes, and the paused queues."""

from __future__ import annotations

import html
import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tasks_app import services
from tests.console_support import body, login
from tests.factories import backdate_task, dead_task, enqueued, retrying, succeeded

pytestmark = pytest.mark.django_db


def _stat(page: str, name: str) -> int:
    found = re.search(rf'data-stat="{name}">(\d+)<', page)
    assert found, name
    return int(found.group(1))


def test_the_overview_counts_work_by_state_and_recent_successes(superuser: User) -> None:
    enqueued("demo.noop", {"n": 1})
    enqueued("demo.noop", {"n": 2})
    dead_task()
    retrying(retry_in=timedelta(hours=1))
    succeeded()
    old = succeeded()
    backdate_task(old, finished_at=timedelta(hours=3))

    page = body(login(superuser).get("/"))

    assert _stat(page, "pending") == 2
    assert _stat(page, "retry_scheduled") == 1
    assert _stat(page, "dead") == 1
    assert _stat(page, "waiting_approval") == 0
    assert _stat(page, "succeeded_last_hour") == 1
    assert _stat(page, "succeeded_last_day") == 2
    assert "Tasks succeeded per minute, last hour: 1 in all" in page


def test_the_overview_lists_paused_queues_with_who_and_why(superuser: User) -> None:
    services.pause_queue("default", actor=superuser, reason="database failover")
    page = body(login(superuser).get("/"))
    assert "database failover" in page and superuser.username in page


def _card_link(page: str, name: str) -> str:
    found = re.search(rf'<a href="([^"]+)"><span class="value" data-stat="{name}">', page)
    assert found, name
    return html.unescape(found.group(1))


def _listed(client: Client, url: str) -> set[int]:
    return {int(pk) for pk in re.findall(r'<a href="/tasks/(\d+)/">#', body(client.get(url)))}


def test_each_card_opens_a_list_of_exactly_what_it_counts(superuser: User) -> None:
    due = enqueued("demo.noop", {"n": 1})
    retry = retrying(retry_in=timedelta(hours=1))
    recent = succeeded()
    earlier = succeeded()
    backdate_task(earlier, finished_at=timedelta(hours=3))
    old = succeeded()
    backdate_task(old, finished_at=timedelta(days=2))
    client = login(superuser)
    page = body(client.get("/"))

    assert _listed(client, _card_link(page, "pending")) == {due.pk}
    assert _listed(client, _card_link(page, "retry_scheduled")) == {retry.pk}
    assert _listed(client, _card_link(page, "succeeded_last_hour")) == {recent.pk}
    assert _listed(client, _card_link(page, "succeeded_last_day")) == {recent.pk, earlier.pk}
    # The list names the filter as people read it.
    assert '<option value="retry_scheduled" selected>Retry scheduled</option>' in body(
        client.get(_card_link(page, "retry_scheduled"))
    )


def test_the_overview_and_the_workflows_page_count_the_same_successes(superuser: User) -> None:
    for _ in range(3):
        succeeded()
    earlier = succeeded()
    backdate_task(earlier, finished_at=timedelta(hours=2))
    client = login(superuser)
    overview = body(client.get("/"))
    for window, stat in (("hour", "succeeded_last_hour"), ("day", "succeeded_last_day")):
        figures = body(client.get("/workflows/", {"window": window}))
        row = re.search(
            r'data-workflow="demo.noop">.*?data-figure="tasks_succeeded">(\d+)<', figures, re.S
        )
        assert row, figures
        assert int(row.group(1)) == _stat(overview, stat) == (3 if window == "hour" else 4)
        detail = body(client.get("/workflows/demo.noop/"))
        assert re.findall(r'data-figure="tasks_succeeded">(\d+)<', detail) == ["3", "4", "4"]
    # Nothing is extrapolated to a rate per hour.
    assert "Per hour" not in figures and "Per hour" not in detail
