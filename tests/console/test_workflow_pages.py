"""The workflows pages (``/workflows/``, ``/workflows/<name>/``): the figures of every
workflow over a chosen window, one workflow's over the hour, day and week with its charts
and its dead letters by cause; a bad window is refused naming the rule, an unknown
workflow is not found, and both pages need ``view_task``."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tasks_app import services
from tasks_app.db.clock import db_now
from tasks_app.engine import runner
from tasks_app.observability import workflow_samples as ws
from tests.console_support import HTMX, body, login
from tests.factories import dead_task

pytestmark = pytest.mark.django_db(transaction=True)


def history() -> None:
    """Work an hour and a half apart: two noop runs and a dead flaky task before the
    sample, three noop runs after it."""
    for n in range(2):
        runner.run_task_steps(services.enqueue("demo.noop", {"n": n}).task)
    dead_task()
    ws.take_sample(now=db_now() - timedelta(minutes=90), force=True)
    for n in range(3):
        runner.run_task_steps(services.enqueue("demo.noop", {"n": 10 + n}).task)


def cell(page: str, workflow: str, figure: str) -> str:
    row = re.search(rf'<tr data-workflow="{re.escape(workflow)}">(.*?)</tr>', page, re.S)
    assert row, f"no row for {workflow}"
    found = re.search(rf'data-figure="{figure}">(.*?)</td>', row.group(1), re.S)
    assert found, f"no {figure} for {workflow}"
    return re.sub(r"<[^>]+>", "", found.group(1)).strip()


# --- the list -----------------------------------------------------------------------------------


def test_the_list_shows_each_workflows_figures_over_the_chosen_window(oncall: User) -> None:
    history()
    client = login(oncall)

    hour = body(client.get("/workflows/", {"window": "hour"}))
    # The steps are counted since the sample, and the page says over how long; the tasks
    # that succeeded in the hour are counted from the tasks.
    assert cell(hour, "demo.noop", "succeeded") == "3 over 1 h 30 min"
    assert cell(hour, "demo.noop", "tasks_succeeded") == "5"
    assert cell(hour, "demo.noop", "failure_rate") == "0.0%"
    day = body(client.get("/workflows/"))  # the day is the default
    assert 'aria-current="true">Last day<' in day
    # The sample is the first: the day counts from it, and says since when.
    assert cell(day, "demo.noop", "succeeded") == "3 over 1 h 30 min"
    assert re.search(r'demo\.noop</a> <span class="small muted">\(since <time', day)
    assert 'href="/workflows/demo.noop/?window=day"' in day
    # A registered workflow that never ran is listed, with nothing to show yet.
    assert re.search(r'data-workflow="ticket_reply">.*?Nothing counted yet', day, re.S)


def test_a_dead_letter_shows_in_the_failure_rate(oncall: User) -> None:
    runner.run_task_steps(services.enqueue("demo.noop", {}).task)
    ws.take_sample(now=db_now() - timedelta(minutes=30), force=True)
    runner.run_task_steps(services.enqueue("demo.flaky", {}).task)
    ws.take_sample(now=db_now() - timedelta(minutes=20), force=True)
    dead_task()
    page = body(login(oncall).get("/workflows/", {"window": "hour"}))
    assert cell(page, "demo.flaky", "failure_rate") == "50.0% (1 dead)"
    assert cell(page, "demo.flaky", "retry_rate") == "0.0%"
    assert cell(page, "demo.flaky", "succeeded") == "1 over 30 min"


def test_a_bad_window_is_refused_naming_the_field_and_the_rule(oncall: User) -> None:
    client = login(oncall)
    for url in ("/workflows/", "/workflows/demo.noop/"):
        response = client.get(url, {"window": "fortnight"})
        assert response.status_code == 400
        assert "window: one of hour, day, week" in body(response)
        partial = client.get(url, {"window": "fortnight"}, headers=HTMX)
        assert partial.status_code == 400 and "<html" not in body(partial)


def test_with_nothing_counted_the_pages_say_so(oncall: User) -> None:
    client = login(oncall)
    page = body(client.get("/workflows/"))
    assert "Nothing counted yet" in page
    # Counted, but the sweeper has not sampled it yet.
    runner.run_task_steps(services.enqueue("demo.noop", {}).task)
    assert re.search(
        r'data-workflow="demo.noop">.*?Not sampled yet', body(client.get("/workflows/")), re.S
    )
    detail = client.get("/workflows/demo.noop/")
    assert detail.status_code == 200
    assert "No samples of this workflow yet" in body(detail)
    causes = client.get("/workflows/demo.noop/causes/", headers=HTMX)
    assert "None: no step of this workflow is dead now." in body(causes)


@pytest.mark.parametrize(
    ("url", "region"),
    [("/workflows/", '<section id="figures"'), ("/workflows/demo.noop/", '<section id="charts"')],
)
def test_htmx_gets_the_region_and_a_plain_request_the_page(
    url: str, region: str, oncall: User
) -> None:
    client = login(oncall)
    full, partial = (
        client.get(url, {"window": "week"}),
        client.get(url, {"window": "week"}, headers=HTMX),
    )
    assert "<html" in body(full) and region in body(full)
    assert "<html" not in body(partial) and body(partial).lstrip().startswith(region)


# --- one workflow -------------------------------------------------------------------------------


def test_a_workflow_shows_its_hour_day_and_week_and_the_charts_of_the_window(
    oncall: User,
) -> None:
    history()
    page = body(login(oncall).get("/workflows/demo.noop/", {"window": "hour"}))
    assert "<h1>demo.noop</h1>" in page
    succeeded = re.findall(r'data-figure="succeeded">(\d+)<', page)
    assert succeeded == ["3", "3", "3"]
    assert page.count('<svg role="img"') == 3
    assert "Steps succeeded per 5 minutes: 3 in all" in page
    # Twelve bars of five minutes; the percentiles' lines and their log scale.
    assert len(re.findall(r'<rect [^>]*class="bar"', page)) >= 1
    assert 'class="line line-p50"' in page and "<li>10 ms</li>" in page
    assert 'aria-current="true">Last hour<' in page
    assert "style=" not in page


def test_a_workflows_dead_letters_are_grouped_by_cause_with_links(oncall: User) -> None:
    dead_task()
    dead_task({"error": "permanent", "fail_first": 1, "n": 2})
    client = login(oncall)
    page = body(client.get("/workflows/demo.flaky/"))
    assert 'href="/dead/groups/?workflow=demo.flaky"' in page
    assert 'href="/dead/?workflow=demo.flaky"' in page
    # The causes come in a request of their own, once the page is shown.
    assert 'hx-get="/workflows/demo.flaky/causes/" hx-trigger="load"' in page
    causes = body(client.get("/workflows/demo.flaky/causes/", headers=HTMX))
    assert causes.lstrip().startswith('<div id="causes">')
    # The two died of one cause: one group of two, linking to its dead letters.
    groups = re.findall(r'<tr data-fingerprint="([0-9a-f]{16})">', causes)
    assert len(groups) == 1
    assert f'href="/dead/?workflow=demo.flaky&amp;fingerprint={groups[0]}">Show 2<' in causes
    # Asked for outside the page, the region sends the reader to the page.
    plain = client.get("/workflows/demo.flaky/causes/")
    assert (plain.status_code, plain["Location"]) == (302, "/workflows/demo.flaky/#dead-heading")
    assert client.get("/workflows/retired.flow/causes/", headers=HTMX).status_code == 404


def test_an_unknown_workflow_is_not_found(oncall: User) -> None:
    client = login(oncall)
    assert client.get("/workflows/no.such.flow/").status_code == 404
    assert client.get("/workflows/no.such.flow/", {"window": "hour"}).status_code == 404


def test_a_workflow_no_longer_registered_still_has_its_page(oncall: User) -> None:
    from tasks_app.history import counting

    counting.upsert({"enqueued:retired.flow#0": 2})
    page = body(login(oncall).get("/workflows/retired.flow/"))
    assert "<h1>retired.flow</h1>" in page
    assert "no longer registered" in page and "/dead/?workflow=retired.flow" not in page


# --- who may see them ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url", ["/workflows/", "/workflows/demo.noop/", "/workflows/demo.noop/causes/"]
)
@pytest.mark.parametrize(
    ("role", "expected"),
    [("editor", 200), ("oncall", 200), ("auditor", 200), ("superuser", 200), ("outsider", 403)],
)
def test_reading_the_figures_needs_view_task(
    url: str, role: str, expected: int, request: pytest.FixtureRequest
) -> None:
    user: User = request.getfixturevalue(role)
    response = login(user).get(url, headers=HTMX if url.endswith("causes/") else {})
    assert response.status_code == expected
    if expected == 403:
        assert "demo.noop" not in body(response)


@pytest.mark.parametrize("url", ["/workflows/", "/workflows/demo.noop/"])
def test_an_anonymous_visitor_is_sent_to_the_login(url: str, client: Client) -> None:
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


def test_the_nav_offers_workflows_after_dead_letters_to_those_who_may_read(
    oncall: User, outsider: User
) -> None:
    page = body(login(oncall).get("/workflows/"))
    nav = page[page.index('<nav aria-label="Sections">') :]
    assert nav.index(">Dead letters<") < nav.index(">Workflows<") < nav.index(">Queues<")
    assert re.search(r'href="/workflows/" aria-current="page">Workflows<', nav)
    assert ">Workflows<" not in body(login(outsider).get("/"))
