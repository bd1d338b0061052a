"""The console answers an htmx request with the region it swaps and a plain one with the
whole page, and loads htmx without the debug script that would replace the document."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from tests.console_support import HTMX, body, login
from tests.factories import dead_task

pytestmark = pytest.mark.django_db


PARTIALS = {
    "/": 'id="overview"',
    "/tasks/": 'id="results"',
    # The filter swaps the list and the bulk form together.
    "/dead/": 'id="dead"',
    "/approvals/": 'id="results"',
    "/queues/": 'id="queues"',
    "/audit/": 'id="results"',
}


@pytest.mark.parametrize(("url", "region"), PARTIALS.items())
def test_htmx_requests_get_the_region_and_plain_ones_the_whole_page(
    url: str, region: str, superuser: User
) -> None:
    client = login(superuser)
    full, partial = client.get(url), client.get(url, headers=HTMX)
    assert full.status_code == partial.status_code == 200
    assert "<html" in body(full) and region in body(full)
    assert "<html" not in body(partial) and region in body(partial)
    assert body(partial).lstrip().startswith("<section")


def test_a_task_page_answers_htmx_with_its_task_region(superuser: User) -> None:
    task = dead_task()
    partial = login(superuser).get(f"/tasks/{task.pk}/", headers=HTMX)
    assert "<html" not in body(partial)
    assert body(partial).lstrip().startswith('<div id="task"')


def test_pages_load_htmx_without_the_debug_script_that_replaces_the_document(
    oncall: User, settings: Any
) -> None:
    settings.DEBUG = True
    page = body(login(oncall).get("/dead/"))
    assert "htmx-2.min.js" in page
    assert "django-htmx.js" not in page
