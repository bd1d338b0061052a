"""The console's comforts: the header's "go to task" box, the task list's key filter by
prefix, live lists that keep their filter and page, and moments shown with their zone and
how long ago."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.template import Context, Template
from django.test import override_settings

from console import presenters
from tasks_app import services
from tasks_app.operations import listings
from tests.console_support import body, login
from tests.factories import noop

# --- go to task #id -------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("typed", ["{pk}", "#{pk}", " # {pk} "])
def test_the_go_to_box_jumps_to_a_task_by_its_number_with_or_without_a_hash(
    typed: str, oncall: User
) -> None:
    task = noop()
    response = login(oncall).get("/tasks/go/", {"id": typed.format(pk=task.pk)})
    assert response.status_code == 302
    assert response["Location"] == f"/tasks/{task.pk}/"


@pytest.mark.django_db
@pytest.mark.parametrize("typed", ["", "abc", "12a", "-3", "1.5", "#", "#-1", "٣", "1" * 20])
def test_the_go_to_box_refuses_what_is_not_a_task_number_naming_the_field_and_rule(
    typed: str, oncall: User
) -> None:
    response = login(oncall).get("/tasks/go/", {"id": typed})
    assert response.status_code == 400
    page = body(response)
    assert "<html" in page and "Bad request" in page
    assert "id: write a task number, such as 123 or #123 (digits only)." in page


@pytest.mark.django_db
@pytest.mark.parametrize("typed", ["#987654", "0", "9" * 19])
def test_the_go_to_box_says_when_there_is_no_such_task(typed: str, oncall: User) -> None:
    noop()
    response = login(oncall).get("/tasks/go/", {"id": typed})
    assert response.status_code == 404
    page = body(response)
    assert "<html" in page and "Not found" in page
    assert f"There is no task #{int(typed.lstrip('#'))}." in page


@pytest.mark.django_db
def test_the_go_to_box_is_for_those_who_may_see_tasks(oncall: User, outsider: User) -> None:
    task = noop()
    refused = login(outsider).get("/tasks/go/", {"id": task.pk})
    assert refused.status_code == 403 and f"#{task.pk}" not in body(refused)
    assert 'class="goto"' not in body(refused)
    page = body(login(oncall).get("/"))
    form = re.search(r'<form class="goto" method="get" action="/tasks/go/".*?</form>', page, re.S)
    assert form is not None
    assert '<label for="goto-id" class="visually-hidden">Go to task</label>' in form.group()


# --- the key filter -------------------------------------------------------------------------


def _listed(client_user: User, query: dict[str, str]) -> set[int]:
    page = body(login(client_user).get("/tasks/", query))
    return {int(pk) for pk in re.findall(r'href="/tasks/(\d+)/"', page)}


@pytest.mark.django_db
def test_the_key_filter_finds_tasks_by_the_start_of_their_key(superuser: User) -> None:
    first = noop("publish:article-001:v1")
    second = noop("publish:article-001:v2")
    other = noop("publish:article-002:v1")
    noop()  # no key

    assert _listed(superuser, {"key": "publish:article-001"}) == {first.pk, second.pk}
    assert _listed(superuser, {"key": "publish:"}) == {first.pk, second.pk, other.pk}
    assert _listed(superuser, {"key": "publish:article-001:v2"}) == {second.pk}
    # The start, not anywhere in the key.
    assert _listed(superuser, {"key": "article-001"}) == set()


@pytest.mark.django_db
def test_wildcards_typed_into_the_key_filter_match_only_themselves(superuser: User) -> None:
    percent = noop("rate:100%:a")
    noop("rate:1000:a")
    underscore = noop("a_b")
    noop("axb")
    backslash = noop("c\\d")
    noop("cd")

    assert _listed(superuser, {"key": "rate:100%"}) == {percent.pk}
    assert _listed(superuser, {"key": "a_"}) == {underscore.pk}
    assert _listed(superuser, {"key": "c\\"}) == {backslash.pk}


@pytest.mark.django_db
def test_the_key_filter_says_it_matches_the_start(superuser: User) -> None:
    page = body(login(superuser).get("/tasks/"))
    assert "Its start is enough, e.g. publish:article-001" in page


@pytest.mark.django_db
@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the index and its plan are PostgreSQL's"
)
def test_a_key_prefix_filter_is_served_by_the_prefix_index(db: None) -> None:
    services.enqueue_many(
        [
            {"workflow": "demo.noop", "payload": {}, "idempotency_key": f"explain:{n:05d}"}
            for n in range(2000)
        ]
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE tasks_app_task")
    # The task list's query: a prefix under a wildcard the user typed, newest first, a page.
    page = listings.tasks(listings.TaskFilter(key="explain:0012_")).order_by("-id")[:26]
    plan = page.explain()
    assert "task_key_prefix_idx" in plan, plan
    assert "Seq Scan" not in plan, plan
    assert len(list(page)) == 0  # "_" is a character here, not a wildcard


# --- live lists -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_task_list_refreshes_its_results_with_the_filter_and_page_it_shows(
    superuser: User,
) -> None:
    page = body(login(superuser).get("/tasks/", {"status": "pending", "key": "a:b", "after": "7"}))
    results = re.search(r'<section id="results"[^>]*>', page)
    assert results is not None
    region = results.group()
    assert 'hx-get="/tasks/?status=pending&amp;key=a%3Ab&amp;after=7"' in region
    assert 'hx-trigger="every 5s, refresh"' in region and "data-poll" in region
    # Only the results refresh: the filter form is before the region, not in it.
    assert page.index('<form class="filters"') < page.index('<section id="results"')
    assert "</form>" not in page[page.index('<section id="results"') :]


@pytest.mark.django_db
def test_the_queues_refresh_their_tables_and_keep_the_notices(superuser: User) -> None:
    page = body(login(superuser).get("/queues/"))
    region = re.search(r'<div id="queue-tables"[^>]*>', page)
    assert region is not None
    assert 'hx-select="#queue-tables"' in region.group() and "data-poll" in region.group()
    assert page.index('<section id="queues">') < page.index('<div id="queue-tables"')


# --- moments --------------------------------------------------------------------------------

NOW = datetime(2026, 1, 15, 12, 0, tzinfo=UTC)


@override_settings(TIME_ZONE="Europe/Berlin")
def test_a_moment_is_shown_in_the_sites_zone_with_its_abbreviation() -> None:
    winter, _ = presenters.moment(NOW, NOW)
    summer, _ = presenters.moment(datetime(2026, 7, 1, 10, 0, tzinfo=UTC), NOW)
    assert winter == "2026-01-15 13:00:00 CET"
    assert summer == "2026-07-01 12:00:00 CEST"


def test_a_moment_in_utc_says_utc() -> None:
    assert presenters.moment(NOW, NOW)[0] == "2026-01-15 12:00:00 UTC"


@pytest.mark.parametrize(
    ("offset", "relative"),
    [
        (timedelta(0), "just now"),
        (timedelta(milliseconds=-400), "just now"),
        (timedelta(seconds=-42), "42 s ago"),
        (timedelta(minutes=-3, seconds=-10), "3 min ago"),
        (timedelta(days=-2, hours=-5), "2 d 5 h ago"),
        (timedelta(seconds=30), "in 30 s"),
        (timedelta(hours=2), "in 2 h"),
        (timedelta(hours=47, minutes=59), "in 1 d 23 h"),
    ],
)
def test_a_moment_says_how_long_ago_or_ahead_it_is(offset: timedelta, relative: str) -> None:
    assert presenters.moment(NOW + offset, NOW)[1] == relative


@override_settings(TIME_ZONE="Europe/Berlin")
def test_the_when_tag_puts_the_zone_on_hover_or_in_full() -> None:
    moment = datetime(2020, 1, 1, 8, 30, tzinfo=UTC)
    short = Template("{% load console %}{% when t %}").render(Context({"t": moment}))
    full = Template('{% load console %}{% when t "full" %}').render(Context({"t": moment}))
    none = Template("{% load console %}{% when t %}").render(Context({"t": None}))
    assert re.fullmatch(
        r'<time datetime="2020-01-01T08:30:00\+00:00" title="2020-01-01 09:30:00 CET" '
        r'data-when="relative">\d+ d( \d+ h)? ago</time>',
        short,
    ), short
    assert re.fullmatch(
        r'<time datetime="2020-01-01T08:30:00\+00:00" title="[^"]+ ago" data-when="full">'
        r'2020-01-01 09:30:00 CET <span class="muted">\([^)]+ ago\)</span></time>',
        full,
    ), full
    assert none == "—"
