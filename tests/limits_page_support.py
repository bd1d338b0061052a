"""A workflow under limits for the Limits page's tests (``tests/console/test_console_limits.py``
and ``tests/browser/test_limits.py``): one step, at most one at a time per customer, and
four calls a minute overall. The live server runs in the test process, so a workflow
registered here is the page's too. Steps run by claiming through the engine, as a worker
would, and stay running until the test finishes them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tasks_app import services
from tasks_app.engine.limits import Limit
from tasks_app.models import Step
from tasks_app.workflows import StepSpec, Workflow, register, registry
from tests.conftest import only_step
from tests.limit_support import claim

FLOW = "test.limits_page"
# Partitioned by the payload's customer.
CUSTOMERS = Limit("page_customers", concurrency=1, key="customer")
# A dot in its name, as a limit's name may have: its element ids and selectors hold it.
CALLS = Limit("page.calls", rate="4/m")


def _call(ctx: Any) -> dict[str, Any]:
    return {}


@contextmanager
def limited_flow() -> Iterator[str]:
    register(Workflow(FLOW, 1, steps=(StepSpec("call", _call),), limits=(CUSTOMERS, CALLS)))
    try:
        yield FLOW
    finally:
        registry.unregister(FLOW, 1)


def enqueue(customer: str) -> Step:
    return only_step(services.enqueue(FLOW, {"customer": customer}).task)


def busy() -> dict[str, list[Step]]:
    """Three steps of acme (one running, two waiting behind it) and one of globex
    (running): acme is at its concurrency, the calls have spent 2 of 4 this minute."""
    steps = {"acme": [enqueue("acme") for _ in range(3)], "globex": [enqueue("globex")]}
    claimed = claim()
    assert sorted(claimed) == sorted([steps["acme"][0].pk, steps["globex"][0].pk])
    return steps
