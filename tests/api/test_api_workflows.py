"""Per-workflow figures as the API reads them: the same numbers as the console's
``/workflows/`` pages, every workflow over a window and one over each window with its
bars; an unknown workflow is not found."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User

from api.workflow_routes import RunTimeOut
from tasks_app import services
from tasks_app.db.clock import db_now
from tasks_app.engine import runner
from tasks_app.history import counting
from tasks_app.observability import workflow_samples as ws
from tests.api_support import call, conforms, token_for
from tests.factories import dead_task

# The sweeper's samples carry the database's clock: each test commits what it ran.
pytestmark = pytest.mark.django_db(transaction=True)

WORKFLOWS = "/api/v1/workflows/"
WORKFLOW = "/api/v1/workflows/{name}"


def history() -> None:
    """Two noop runs and a dead flaky task before a sample taken 90 minutes ago, three
    noop runs after it (as the console's page tests have it)."""
    for n in range(2):
        runner.run_task_steps(services.enqueue("demo.noop", {"n": n}).task)
    dead_task()
    ws.take_sample(now=db_now() - timedelta(minutes=90), force=True)
    for n in range(3):
        runner.run_task_steps(services.enqueue("demo.noop", {"n": 10 + n}).task)


def read(secret: str, path: str, template: str) -> Any:
    answer = call("GET", path, secret)
    assert answer.status_code == 200, answer.content
    return conforms(answer, "GET", template)


def by_workflow(listing: dict[str, Any]) -> dict[str, Any]:
    return {row["workflow"]: row for row in listing["items"]}


def test_the_list_gives_each_workflows_figures_over_the_window(oncall: User) -> None:
    history()
    secret = token_for(oncall, "oncall")
    hour = read(secret, f"{WORKFLOWS}?window=hour", WORKFLOWS)
    assert hour["window"] == "hour"
    noop = by_workflow(hour)["demo.noop"]
    assert noop["tasks_succeeded"] == 5
    figures = noop["figures"]
    assert (figures["succeeded"], figures["dead_lettered"], figures["failure_rate"]) == (3, 0, 0)
    assert figures["p50"]["over"] is False and figures["p50"]["seconds"] > 0
    assert noop["url"].endswith("/workflows/demo.noop/")
    assert noop["api_url"].endswith(f"{WORKFLOWS}demo.noop")
    # The day is the default; a registered workflow that never ran is listed, uncounted.
    day = read(secret, WORKFLOWS, WORKFLOWS)
    assert day["window"] == "day"
    never = by_workflow(day)["ticket_reply"]
    assert (never["counted"], never["figures"], never["tasks_succeeded"]) == (False, None, 0)


def test_a_dead_letter_counts_in_the_failure_rate(oncall: User) -> None:
    runner.run_task_steps(services.enqueue("demo.noop", {}).task)
    ws.take_sample(now=db_now() - timedelta(minutes=30), force=True)
    runner.run_task_steps(services.enqueue("demo.flaky", {}).task)
    ws.take_sample(now=db_now() - timedelta(minutes=20), force=True)
    dead_task()
    hour = read(token_for(oncall, "oncall"), f"{WORKFLOWS}?window=hour", WORKFLOWS)
    flaky = by_workflow(hour)["demo.flaky"]["figures"]
    assert (flaky["succeeded"], flaky["dead_lettered"]) == (1, 1)
    assert (flaky["failure_rate"], flaky["retry_rate"]) == (0.5, 0)


def test_one_workflow_gives_each_window_and_the_bars_of_the_chosen_one(oncall: User) -> None:
    history()
    one = read(token_for(oncall, "oncall"), f"{WORKFLOWS}demo.noop?window=hour", WORKFLOW)
    assert one["name"] == "demo.noop"
    assert list(one["windows"]) == ["hour", "day", "week"]
    assert [w["figures"]["succeeded"] for w in one["windows"].values()] == [3, 3, 3]
    assert [w["tasks_succeeded"] for w in one["windows"].values()] == [5, 5, 5]
    # Twelve bars of five minutes, oldest first, the last ending now.
    assert one["window"] == "hour" and len(one["bars"]) == 12
    assert one["bars"][-1]["end"] == one["now"]
    assert one["dead_groups_url"].endswith("/api/v1/dead/groups/?workflow=demo.noop")


def test_a_workflow_no_longer_registered_has_figures_and_no_dead_letter_link(
    oncall: User,
) -> None:
    counting.upsert({"enqueued:retired.flow#0": 2})
    one = read(token_for(oncall, "oncall"), f"{WORKFLOWS}retired.flow", WORKFLOW)
    assert one["name"] == "retired.flow"
    assert one["dead_groups_url"] is None


def test_an_unknown_workflow_is_not_found_whatever_the_window(oncall: User) -> None:
    secret = token_for(oncall, "oncall")
    for query in ("", "?window=hour", "?window=month"):
        answer = call("GET", f"{WORKFLOWS}no.such.flow{query}", secret)
        assert answer.status_code == 404
        assert conforms(answer, "GET", WORKFLOW)["error"] == "not_found"


def test_a_run_time_past_the_histograms_last_bound_says_so() -> None:
    last = counting.STEP_SECONDS_BUCKETS[-1]
    assert RunTimeOut.of(math.inf) == RunTimeOut(seconds=last, over=True)
    assert RunTimeOut.of(0.25) == RunTimeOut(seconds=0.25, over=False)
    assert RunTimeOut.of(None) is None
