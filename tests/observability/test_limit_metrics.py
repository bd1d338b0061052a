"""/metrics on flow control (``tasks_app.observability.limit_metrics``): per limit, its steps
running and waiting, its numbers, its keys at their limit, its rate's spend, its refusals,
and whether it is saturated, read as a scrape reads them. Time moves by back-dating the
rate windows, never by sleeping."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from tasks_app import services
from tasks_app.engine import fastpath, limit_keys
from tasks_app.engine.limit_standing import SLICES
from tasks_app.engine.limits import Limit
from tasks_app.models import LimitKey, Step
from tasks_app.operations import limits as limit_actions
from tasks_app.services import Claim
from tasks_app.workflows import StepSpec, Workflow, register, registry
from tests.conftest import only_step
from tests.metrics_support import Samples, scrape, value

METERED = "test.metered"
CUSTOMERS = Limit("metered_customers", concurrency=1, key="customer")
SENDS = Limit("metered_sends", rate="3/m")


def _ok(ctx: Any) -> dict[str, Any]:
    return {}


@pytest.fixture
def metered() -> Iterator[str]:
    """One step under two limits: one at a time per customer, three claims a minute overall."""
    register(Workflow(METERED, 1, steps=(StepSpec("meter", _ok),), limits=(CUSTOMERS, SENDS)))
    yield METERED
    registry.unregister(METERED, 1)


def enqueue(customer: str) -> Step:
    return only_step(services.enqueue(METERED, {"customer": customer}).task)


def claim() -> list[Claim]:
    return fastpath.claim_batch(worker_id="box:1", limit=50, queue="default")


def refill_rate() -> None:
    """A period later: every rate window's spend has left it."""
    for row in LimitKey.objects.exclude(window={}):
        window = dict(row.window)
        window["slice"] -= SLICES + 1
        LimitKey.objects.filter(pk=row.pk).update(window=window)


def figures(samples: Samples, limit: str) -> dict[str, float]:
    names = (
        "running_steps",
        "waiting_steps",
        "active_keys",
        "keys_at_limit",
        "saturated",
        "refusals_total",
    )
    return {name: value(samples, f"tasks_limit_{name}", limit=limit) for name in names}


def exported(samples: Samples, name: str, limit: str) -> bool:
    return (name, (("limit", limit),)) in samples


@pytest.mark.django_db(transaction=True)
def test_a_limit_full_while_steps_wait_is_saturated_and_its_refusals_counted(
    client: Client, metered: str
) -> None:
    for customer in ("acme", "acme", "globex", "initech", "initech"):
        enqueue(customer)
    # One per customer starts (three, the rate's whole period); the second acme and the
    # second initech wait, held back first by their customer's concurrency.
    running = claim()
    assert len(running) == 3

    samples = scrape(client)

    assert figures(samples, "metered_customers") == {
        "running_steps": 3,
        "waiting_steps": 2,
        "active_keys": 3,
        "keys_at_limit": 3,
        "saturated": 1,
        "refusals_total": 1,
    }
    assert figures(samples, "metered_sends") == {
        "running_steps": 3,
        "waiting_steps": 2,
        "active_keys": 1,
        "keys_at_limit": 1,
        "saturated": 1,
        "refusals_total": 0,
    }
    assert value(samples, "tasks_limit_concurrency", limit="metered_customers") == 1
    assert value(samples, "tasks_limit_rate_units", limit="metered_sends") == 3
    assert value(samples, "tasks_limit_rate_period_seconds", limit="metered_sends") == 60
    assert value(samples, "tasks_limit_rate_spent_units", limit="metered_sends") == 3
    # A limit without a rate (or a concurrency) has no series for it, not a made-up 0.
    assert not exported(samples, "tasks_limit_rate_units", "metered_customers")
    assert not exported(samples, "tasks_limit_concurrency", "metered_sends")
    # Every limit declared here is reported, the demo's among them, before it ever refused.
    assert exported(samples, "tasks_limit_refusals_total", "demo_llm")
    assert exported(samples, "tasks_limit_saturated", "demo_customer")


@pytest.mark.django_db(transaction=True)
def test_once_the_running_steps_end_only_the_spent_rate_holds_them_back(
    client: Client, metered: str
) -> None:
    for customer in ("acme", "acme", "globex", "initech"):
        enqueue(customer)
    fastpath.complete_many([(c, {}) for c in claim()])
    # The customers have room; the rate, spent for the minute, refuses the step.
    assert claim() == []

    samples = scrape(client)

    customers, sends = figures(samples, "metered_customers"), figures(samples, "metered_sends")
    assert (customers["running_steps"], customers["keys_at_limit"]) == (0, 0)
    assert (customers["waiting_steps"], customers["saturated"]) == (1, 0)
    assert (sends["waiting_steps"], sends["saturated"], sends["refusals_total"]) == (1, 1, 1)

    refill_rate()
    refilled = scrape(client)
    assert value(refilled, "tasks_limit_rate_spent_units", limit="metered_sends") == 0
    assert value(refilled, "tasks_limit_saturated", limit="metered_sends") == 0
    # A counter never goes down.
    assert value(refilled, "tasks_limit_refusals_total", limit="metered_sends") == 1


@pytest.mark.django_db(transaction=True)
def test_a_paused_key_and_a_held_one_saturate_their_limit_while_steps_wait(
    client: Client, metered: str
) -> None:
    enqueue("acme")
    limit_actions.pause_key(
        "metered_customers", "acme", actor="cli:oncall", reason="customer asked us to stop"
    )

    paused = scrape(client)
    assert value(paused, "tasks_limit_keys_paused", limit="metered_customers") == 1
    assert value(paused, "tasks_limit_keys_at_limit", limit="metered_customers") == 1
    assert value(paused, "tasks_limit_saturated", limit="metered_customers") == 1
    assert value(paused, "tasks_limit_saturated", limit="metered_sends") == 0

    # A remote answered 429 for globex's step: all its keys are held, its due steps wait.
    globex = enqueue("globex")
    limit_keys.hold(globex.limits or [], 120, "429 from the remote")
    held = scrape(client)
    assert value(held, "tasks_limit_keys_held", limit="metered_customers") == 1
    assert value(held, "tasks_limit_keys_held", limit="metered_sends") == 1
    assert value(held, "tasks_limit_saturated", limit="metered_sends") == 1
    assert value(held, "tasks_limit_waiting_steps", limit="metered_sends") == 2


@pytest.mark.django_db(transaction=True)
def test_a_key_at_its_limit_with_nothing_waiting_is_busy_not_saturated(
    client: Client, metered: str
) -> None:
    enqueue("acme")
    assert len(claim()) == 1

    samples = scrape(client)
    assert value(samples, "tasks_limit_keys_at_limit", limit="metered_customers") == 1
    assert value(samples, "tasks_limit_saturated", limit="metered_customers") == 0
