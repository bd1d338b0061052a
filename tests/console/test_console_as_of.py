"""A task as it stood after any of its events (``/tasks/<id>/as-of/?at=<n>&compare=<m>``):
the task page's list of events, the page and its htmx region, what a bad address or an
outsider gets, and that reading it changes nothing."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User

from tasks_app import services
from tasks_app.history.timeline import history
from tasks_app.models import Event, Task
from tests.as_of_support import point_of, redriven_diamond
from tests.console_support import HTMX, body, login
from tests.factories import dead_task

pytestmark = pytest.mark.django_db

HOSTILE = '<script>alert(1)</script><img src=x onerror=alert(2) hx-get="/evil">'


@pytest.fixture
def task() -> Any:
    with redriven_diamond() as made:
        yield made


def as_of(task: Task, query: str = "") -> str:
    return f"/tasks/{task.pk}/as-of/{query}"


def changes(page: str) -> list[str]:
    """The lines of the difference a page shows."""
    region = page.split('<ul class="changes">', 1)[1].split("</ul>", 1)[0]
    return [re.sub(r"<[^>]+>", "", line).strip() for line in re.findall(r"<li.*?</li>", region)]


def test_the_task_page_lists_its_events_each_leading_to_the_task_as_of_it(
    auditor: User, task: Task
) -> None:
    page = body(login(auditor).get(f"/tasks/{task.pk}/"))
    assert '<h2 id="as-of-heading">As of</h2>' in page
    url = as_of(task, "?at=0")
    assert f'href="{url}" hx-get="{url}" hx-target="#as-of"' in page
    events = len(history(task.pk))
    assert page.count('class="point"') == events
    assert "No event chosen yet." in page
    # The list sits outside the region the page refreshes, so a state chosen stays put.
    region = body(login(auditor).get(f"/tasks/{task.pk}/", headers=HTMX))
    assert 'id="task"' in region and 'id="as-of"' not in region


def test_an_auditor_sees_the_task_as_it_stood_after_an_event(auditor: User, task: Task) -> None:
    dead = point_of(task, "dead_lettered")
    response = login(auditor).get(as_of(task, f"?at={dead}"))
    assert response.status_code == 200
    page = body(response)
    assert f"After event #{dead}: dead lettered" in page
    assert "<title>Task #" in page and f"as of event #{dead}" in page
    state = page.split('class="as-of-state"', 1)[1]
    assert '<span class="badge status-dead">dead</span>' in state  # the task then
    assert "&quot;title&quot;: &quot;Old&quot;" in state  # the payload then
    assert "k:1:a:write_a" in state and "k:2:b:write_b" not in state
    assert "<td>failed</td>" in state  # b's attempt had failed
    chosen = re.search(rf'<a id="as-of-at-{dead}"[^>]*>', page)
    assert chosen is not None and 'aria-current="true"' in chosen.group(0)
    assert page.count('aria-current="true"') == 1
    # Each other event offers a comparison with this one.
    assert f'href="{as_of(task)}?at={dead}&amp;compare=0"' in page


def test_without_a_point_it_shows_the_task_after_its_last_event(auditor: User, task: Task) -> None:
    last = len(history(task.pk)) - 1
    page = body(login(auditor).get(as_of(task)))
    assert f"After event #{last}: succeeded" in page
    assert "&quot;title&quot;: &quot;New&quot;" in page
    assert 'id="as-of-next"' not in page and 'id="as-of-previous"' in page


def test_two_points_show_what_changed_between_them(auditor: User, task: Task) -> None:
    redriven = point_of(task, "redriven")
    # Either order reads from the earlier point to the later one.
    for query in (
        f"?at={redriven}&compare={redriven - 1}",
        f"?at={redriven - 1}&compare={redriven}",
    ):
        page = body(login(auditor).get(as_of(task, query)))
        heading = f"from event #{redriven - 1} (dead lettered) to event #{redriven} (redriven)"
        assert f"What changed {heading}" in page
        assert changes(page) == [
            "task: dead → pending",
            "step b: dead → pending, attempts 1 → 0",
            "payload.title: &#x27;Old&#x27; → &#x27;New&#x27;",
        ]
        assert 'class="compared"' in page and "Stop comparing" in page


def test_htmx_gets_the_region_alone(auditor: User, task: Task) -> None:
    response = login(auditor).get(as_of(task, "?at=0&compare=3"), headers=HTMX)
    assert response.status_code == 200
    region = body(response)
    assert "<html" not in region and "<h1>" not in region
    assert region.lstrip().startswith('<section id="as-of"')
    assert "After event #0: enqueued" in region and '<ul class="changes">' in region


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("?at=x", "at: Enter a whole number."),
        ("?at=-1", "at: Ensure this value is greater than or equal to 0."),
        ("?at=99", "at: task #{pk} has events 0 to {last}; there is no event 99."),
        ("?at=0&compare=%3Cb%3E", "compare: Enter a whole number."),
        ("?at=0&compare=999999999999999999999", "compare: task #{pk} has events 0 to {last}"),
        ("?at=" + "9" * 5000, "at: Enter a whole number."),
    ],
)
def test_a_bad_point_is_refused_naming_its_field(
    auditor: User, task: Task, query: str, message: str
) -> None:
    expected = message.format(pk=task.pk, last=len(history(task.pk)) - 1)
    client = login(auditor)
    response = client.get(as_of(task, query))
    assert response.status_code == 400
    assert expected in body(response) and "After event" not in body(response)
    refused = client.get(as_of(task, query), headers=HTMX)
    assert refused.status_code == 400 and refused["HX-Retarget"] == "#messages"
    assert expected in body(refused)


def test_an_outsider_is_refused_and_a_missing_task_is_not_found(
    outsider: User, auditor: User, task: Task
) -> None:
    refused = login(outsider).get(as_of(task, "?at=0"))
    assert refused.status_code == 403
    assert "Old" not in body(refused) and "write_a" not in body(refused)
    assert login(auditor).get(f"/tasks/{task.pk + 1000}/as-of/?at=0").status_code == 404


def test_reading_it_changes_nothing(oncall: User, task: Task) -> None:
    before = (Event.objects.count(), Task.objects.get(pk=task.pk).updated_at)
    client = login(oncall)
    assert client.get(as_of(task, "?at=2&compare=5")).status_code == 200
    assert client.post(as_of(task, "?at=2")).status_code == 405
    assert (Event.objects.count(), Task.objects.get(pk=task.pk).updated_at) == before


def test_payloads_reasons_and_secrets_are_shown_inert(auditor: User) -> None:
    task = dead_task({"error": "permanent", "fail_first": 1, "note": "plain"})
    edited = {"error": "permanent", "fail_first": 1, "note": HOSTILE, "api_token": "s3cr3t-x"}
    services.redrive(task, actor="cli:olivia", reason=HOSTILE, payload=edited)
    redriven = point_of(task, "redriven")
    page = body(login(auditor).get(as_of(task, f"?at={redriven}&compare=0")))
    assert "<script>alert(1)" not in page and 'hx-get="/evil"' not in page
    assert "s3cr3t-x" not in page
    assert "payload.api_token: changed (a secret, not shown)" in changes(page)
    assert any(
        line.startswith("payload.note: &#x27;plain&#x27; → &#x27;&lt;script&gt;")
        for line in changes(page)
    )
    assert "“&lt;script&gt;alert(1)&lt;/script&gt;" in page  # the redrive's reason
