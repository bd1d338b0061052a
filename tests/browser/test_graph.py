"""On-call, in the browser, reads a graph task's page: the drawing of its steps with each
one's state, a box followed to its row in the steps table; no Content-Security-Policy
violation, no serious accessibility problem, no sideways scroll on a phone, and a
screenshot for the docs.

The steps run in this process (``tests.graph_support``); no worker runs in this module.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from tasks_app.engine import leases
from tasks_app.models import Task
from tests.browser.support import (
    OVERFLOW,
    PHONE,
    RECORD_CSP,
    SCREENSHOTS,
    accessibility_problems,
    log_in,
)
from tests.graph_support import Remote, diamond, enqueue, registered, run, step_of

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(120),
    pytest.mark.django_db(transaction=True),
]

BRANCHES = ("fetch_orders", "fetch_invoices", "fetch_refunds")


@pytest.fixture
def task() -> Iterator[Task]:
    """A diamond under way: start and one branch succeeded, one branch running, one dead
    (its remote refused), the join and the last step blocked."""
    flow = diamond("test.graph.browser", Remote(failing={"fetch_refunds"}), branches=BRANCHES)
    with registered(flow):
        made = enqueue(flow)
        for kind in ("start", "fetch_orders", "fetch_refunds"):
            run(made, kind)
        assert leases.claim_step(step_of(made, "fetch_invoices").pk, worker_id="worker-1")
        yield made


def test_oncall_reads_a_graph_task_and_follows_a_step_to_its_row(
    page: Page, oncall: User, task: Task
) -> None:
    page.add_init_script(RECORD_CSP)
    log_in(page, oncall)
    page.goto(f"/tasks/{task.pk}/")

    graph = page.locator("svg.graph")
    expect(graph).to_be_visible()
    picture = graph.locator('[role="img"]')
    expect(picture).to_have_attribute(
        "aria-label",
        "6 steps in 4 columns, each waiting for the steps before it: "
        "2 blocked, 1 running, 2 succeeded, 1 dead",
    )
    nodes = graph.locator(".graph-node")
    expect(nodes).to_have_count(6)
    for kind, state in (
        ("start", "succeeded"),
        ("fetch_orders", "succeeded"),
        ("fetch_invoices", "running"),
        ("fetch_refunds", "dead"),
        ("join", "blocked"),
        ("finish", "blocked"),
    ):
        node = nodes.filter(has=page.locator(".graph-kind", has_text=kind))
        expect(node.locator(".graph-state")).to_have_text(state)
    expect(graph.locator(".graph-edge")).to_have_count(7)
    page.locator("section:has(#graph-heading)").screenshot(path=SCREENSHOTS / "task-graph.png")

    # The dead branch's box leads to its row in the steps table.
    dead = step_of(task, "fetch_refunds")
    link = graph.locator(f'a[href="#step-{dead.pk}"]')
    expect(link.locator("title")).to_have_text("fetch_refunds: dead, attempts 1 / 1")
    link.click()
    expect(page).to_have_url(f"/tasks/{task.pk}/#step-{dead.pk}")
    row = page.locator(f"tr#step-{dead.pk}")
    expect(row).to_be_in_viewport()
    expect(row).to_contain_text("fetch_refunds")

    assert page.evaluate("window.__csp") == []
    assert accessibility_problems(page, Axe()) == []


def test_on_a_phone_the_graph_scrolls_in_its_box(page: Page, oncall: User, task: Task) -> None:
    log_in(page, oncall)
    page.set_viewport_size(PHONE)
    page.goto(f"/tasks/{task.pk}/")
    expect(page.locator("svg.graph .graph-node")).to_have_count(6)
    widths = page.evaluate(OVERFLOW)
    assert max(widths["document"], widths["body"]) <= widths["window"], widths
    box = page.locator(".graph-wrap")
    assert box.evaluate("(e) => e.scrollWidth > e.clientWidth")
    # The boxes keep their natural size, so their kinds stay readable.
    assert page.locator("svg.graph").evaluate("(e) => e.getBoundingClientRect().width") > 600
