"""Why isn't this running? on the console: the task page's panel names each blocker in words
with its link, the task list's "Waiting on" column says it in short for a page of rows in a
few queries, and the Overview lists what steps wait on, counted by reason."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tasks_app import services
from tests import why_support as made
from tests.console_support import body, login

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("why_workflows")]

why_workflows = made.why_workflows


@pytest.fixture(autouse=True)
def _a_live_worker() -> None:
    made.live_worker("default")


def panel(page: str) -> str:
    found = re.search(r"<section class=\"panel notice why\".*?</section>", page, re.S)
    assert found, "no Why panel on the page"
    return found.group(0)


def test_the_task_page_names_what_holds_the_task_back_with_its_link(oncall: User) -> None:
    holder, task = made.at_concurrency()
    page = body(login(oncall).get(f"/tasks/{task.pk}/"))
    why = panel(page)
    assert '<h2 id="why-heading">Why isn\'t this running?</h2>' in why
    assert 'data-blocker="limit_concurrency"' in why
    assert f"task #{holder.pk} holds it" in why
    assert 'href="/limits/#limit-why-slots"' in why
    assert f'href="/tasks/{holder.pk}/">#{holder.pk}</a>' in why


def test_the_panel_names_a_paused_queue_and_its_reason_escaped(oncall: User) -> None:
    task = made.enqueue(made.PAIR)
    services.pause_queue("default", actor="cli:olivia", reason="<b>failover</b>")
    why = panel(body(login(oncall).get(f"/tasks/{task.pk}/")))
    assert "&lt;b&gt;failover&lt;/b&gt;" in why and "<b>failover" not in why
    assert 'href="/queues/"' in why


def test_a_finished_task_has_no_panel(oncall: User) -> None:
    task = made.enqueue(made.PAIR)
    services.cancel(task, actor="cli:olivia", reason="not needed")
    assert "Why isn" not in body(login(oncall).get(f"/tasks/{task.pk}/"))


def test_the_task_list_says_what_each_row_waits_on_in_a_few_queries(oncall: User) -> None:
    client = login(oncall)
    client.get("/tasks/")  # the session and the user's first reads
    approval = made.waiting_approval()
    retry = made.retrying()
    running = made.running()
    with CaptureQueriesContext(connection) as few:
        body(client.get("/tasks/"))
    due = [made.enqueue(made.PAIR) for _ in range(20)]
    with CaptureQueriesContext(connection) as many:
        page = body(client.get("/tasks/"))
    # Twenty rows more cost no query more.
    assert len(many) == len(few), [q["sql"][:100] for q in many]
    assert '<th scope="col">Waiting on</th>' in page
    rows = dict(re.findall(r'href="/tasks/(\d+)/">#\d+</a></th>(.*?)</tr>', page, re.S))
    assert "approval by editors" in rows[str(approval.pk)]
    assert "retry backoff" in rows[str(retry.pk)]
    assert f"running on {made.WORKER}" in rows[str(running.pk)]
    assert "a free worker" in rows[str(due[0].pk)]


def test_the_overview_lists_what_steps_wait_on(oncall: User) -> None:
    made.at_rate()
    made.enqueue(f"{made.LIMITED}.hourly")
    made.paused_queue()
    page = body(login(oncall).get("/"))
    waiting = page[page.index("data-waiting") :]
    assert re.search(
        r"<strong>2 steps wait</strong> <a href=\"/limits/#limit-why-hourly\">"
        r"on the rate limit <code>why-hourly</code></a>",
        waiting,
    )
    assert "in the paused queue <code>default</code>" in waiting


def test_the_overview_says_when_nothing_waits(oncall: User) -> None:
    page = body(login(oncall).get("/"))
    assert "No step waits on a pause, a limit, a person or a missing worker." in page
