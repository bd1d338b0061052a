"""The overview: work counted by state, recent successes, and the paused queues."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User

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
