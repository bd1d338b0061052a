"""A rolling deploy, seen by on-call: a step handed back by a worker that lacks its
workflow version shows on its task page and in ``/metrics`` while it waits, and neither
once a worker that has the version ran it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tasks_app import services
from tasks_app.engine import runner
from tasks_app.workflows import StepContext, StepSpec, Workflow, register, registry
from tests.conftest import backdate, only_step
from tests.console_support import login
from tests.metrics_support import scrape, value

pytestmark = pytest.mark.django_db

ROLLED = "test.rolled"


def done(ctx: StepContext) -> dict[str, int]:
    return {"version": 2}


@pytest.fixture
def new_release() -> Iterator[str]:
    """v1 and v2 of a workflow; the tests unregister v2 to play an old worker."""
    for version in (1, 2):
        register(Workflow(ROLLED, version, steps=(StepSpec("only", done),)))
    yield ROLLED
    for version in (1, 2):
        registry.unregister(ROLLED, version)


def test_a_step_waiting_for_its_version_shows_on_its_page_and_in_the_metrics(
    new_release: str, client: Client
) -> None:
    viewer = login(User.objects.create_superuser("oncall-rolling", password="x"))
    task = services.enqueue(new_release, {}).task  # enqueued by the new release (v2)
    step = only_step(task)
    registry.unregister(new_release, 2)  # an old worker claims it
    assert runner.run_claimed(step.pk) is True

    page = viewer.get(f"/tasks/{task.pk}/").content.decode()
    assert "Waiting for a worker with this workflow version" in page
    assert f"{new_release} v2" in page
    assert "awaiting_version" in page
    samples = scrape(client)
    assert value(samples, "tasks_steps_awaiting_version", queue="default", workflow=ROLLED) == 1

    register(Workflow(new_release, 2, steps=(StepSpec("only", done),)))  # a new worker
    backdate(step, seconds=60)
    assert runner.run_claimed(step.pk) is True

    page = viewer.get(f"/tasks/{task.pk}/").content.decode()
    assert "Waiting for a worker with this workflow version" not in page
    samples = scrape(client)
    assert value(samples, "tasks_steps_awaiting_version", queue="default", workflow=ROLLED) == 0


def test_the_waiting_steps_filter_names_the_error_class_the_runner_writes() -> None:
    from django.db.models import Q

    from tasks_app.exceptions import AWAITING_VERSION
    from tasks_app.models import AWAITING_VERSION_Q, StepStatus

    assert Q(status=StepStatus.PENDING, error_class=AWAITING_VERSION) == AWAITING_VERSION_Q
