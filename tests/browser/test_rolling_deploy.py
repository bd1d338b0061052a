"""On-call during a rolling deploy, in a real browser: a task whose step an old worker
handed back (it lacks the task's workflow version) shows why it waits and when it is tried
again, offers no action on it, and the notice reads well on a phone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from tasks_app import services
from tasks_app.engine import runner
from tasks_app.workflows import StepContext, StepSpec, Workflow, register, registry
from tests.browser.support import SCREENSHOTS, log_in
from tests.conftest import only_step

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(120),
    pytest.mark.django_db(transaction=True),
]

ROLLED = "demo.rolled"


def done(ctx: StepContext) -> dict[str, int]:
    return {"version": 2}


@pytest.fixture
def new_release() -> Iterator[str]:
    for version in (1, 2):
        register(Workflow(ROLLED, version, steps=(StepSpec("publish", done),)))
    yield ROLLED
    for version in (1, 2):
        registry.unregister(ROLLED, version)


def test_oncall_sees_a_step_waiting_for_a_worker_with_its_version(
    page: Page, oncall: User, new_release: str
) -> None:
    task = services.enqueue(new_release, {"story": 7}, idempotency_key="rolled-7").task
    registry.unregister(new_release, 2)  # an old worker claims it and hands it back
    assert runner.run_claimed(only_step(task).pk) is True

    log_in(page, oncall)
    page.goto(f"/tasks/{task.pk}/")
    notice = page.get_by_role("region", name="Waiting for a worker with this workflow version")
    expect(notice).to_be_visible()
    expect(notice).to_contain_text(f"{ROLLED} v2")
    expect(notice).to_contain_text("it has v1")
    expect(page.locator(".badge.status-pending").first).to_be_visible()
    # Nothing to do but wait: no redrive or resolve is offered for a pending task.
    expect(page.get_by_role("button", name="Redrive")).to_have_count(0)
    page.screenshot(path=str(SCREENSHOTS / "awaiting-version.png"), full_page=True)

    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    expect(notice).to_be_visible()
    width = page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= 390, width
