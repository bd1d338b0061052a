"""Fixtures for "Why isn't this running?" (``tasks_app.operations.why``): one task held back
by each kind of blocker, built as production builds it (enqueue, claims through the engine,
approvals run to their review, queues paused through the services), and time moved by
back-dating rows. Used by the operations, console, command and browser tests alike."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from tasks_app import services
from tasks_app.engine import fastpath, presence, runner
from tasks_app.engine.limits import Limit
from tasks_app.exceptions import RateLimited
from tasks_app.models import LimitKey, Step, StepStatus, Task
from tasks_app.operations import limits as limit_actions
from tasks_app.workflows import StepContext, StepSpec, Workflow, register, registry
from tests.approval_support import advance, article
from tests.conftest import only_step
from tests.lease_support import WORKER as WORKER
from tests.lease_support import claim

LIMITED = "test.why.limited"
ONE_AT_A_TIME = Limit("why-slots", concurrency=1, key="customer")
HOURLY = Limit("why-hourly", rate="1/h")
REMOTE = Limit("why-remote", concurrency=5)
ROLLED = "test.why.rolled"
PAIR = "test.why.pair"


def _ok(ctx: StepContext) -> dict[str, Any]:
    return {}


def _too_many(ctx: StepContext) -> dict[str, Any]:
    if ctx.payload.get("refuse"):
        raise RateLimited("429 from the remote", retry_after=600)
    return {}


@pytest.fixture
def why_workflows() -> Iterator[None]:
    """The workflows the blockers are built from: two steps; steps under a concurrency, a
    rate and a remote that answers 429; one known in v1 and v2."""
    flows = [
        Workflow(PAIR, 1, steps=(StepSpec("draft", _ok), StepSpec("publish", _ok))),
        Workflow(f"{LIMITED}.slots", 1, steps=(StepSpec("send", _ok),), limits=(ONE_AT_A_TIME,)),
        Workflow(f"{LIMITED}.hourly", 1, steps=(StepSpec("send", _ok),), limits=(HOURLY,)),
        Workflow(f"{LIMITED}.remote", 1, steps=(StepSpec("call", _too_many),), limits=(REMOTE,)),
        Workflow(ROLLED, 1, steps=(StepSpec("publish", _ok),)),
        Workflow(ROLLED, 2, steps=(StepSpec("publish", _ok),)),
    ]
    for flow in flows:
        register(flow)
    yield
    for flow in flows:
        if flow.version in registry.versions(flow.name):
            registry.unregister(flow.name, flow.version)


def live_worker(*queues: str) -> None:
    """A worker node that reports itself live, consuming ``queues``."""
    presence.worker_started(
        presence.NodeInfo("celery@why-host", "why-host", 4242, list(queues), 1, [4242])
    )


def enqueue(workflow: str, payload: dict[str, Any] | None = None, **options: Any) -> Task:
    return services.enqueue(workflow, payload or {}, actor="cli:producer", **options).task


def claim_under_limits(task: Task) -> None:
    """Claim ``task``'s step through the claim of steps under limits, as a worker does."""
    claims = fastpath.claim_batch(worker_id=WORKER, limit=1, step_id=only_step(task).pk)
    assert [c.step_id for c in claims] == [only_step(task).pk]


# --- one task per blocker -------------------------------------------------------------------


def paused_queue() -> Task:
    task = enqueue(PAIR)
    services.pause_queue("default", actor="cli:olivia", reason="database failover")
    return task


def at_concurrency() -> tuple[Task, Task]:
    """The holder (its step running) and the task it holds back."""
    holder = enqueue(f"{LIMITED}.slots", {"customer": "acme"})
    waiting = enqueue(f"{LIMITED}.slots", {"customer": "acme"})
    claim_under_limits(holder)
    return holder, waiting


def at_rate() -> Task:
    first = enqueue(f"{LIMITED}.hourly")
    waiting = enqueue(f"{LIMITED}.hourly")
    claim_under_limits(first)
    return waiting


def paused_limit_key() -> Task:
    waiting = enqueue(f"{LIMITED}.slots", {"customer": "globex"})
    limit_actions.pause_key(
        ONE_AT_A_TIME.name, "globex", actor="cli:olivia", reason="their API is down"
    )
    return waiting


def held_by_remote() -> Task:
    refused = enqueue(f"{LIMITED}.remote", {"refuse": True})
    waiting = enqueue(f"{LIMITED}.remote")
    assert runner.run_claimed(only_step(refused).pk)
    assert LimitKey.objects.get(limit=REMOTE.name).held_until is not None
    return waiting


def unknown_limit() -> Task:
    waiting = enqueue(f"{LIMITED}.hourly")
    registry.unregister(f"{LIMITED}.hourly", 1)
    return waiting


def running() -> Task:
    task = enqueue(PAIR)
    claim(task.steps.get(position=0))
    return task


def expired_lease() -> Task:
    task = running()
    step = task.steps.get(position=0)
    Step.objects.filter(pk=step.pk).update(lease_expires_at=timezone.now() - timedelta(minutes=5))
    return task


def waiting_approval() -> Task:
    task = advance(article())
    assert task.status == "waiting_approval", task.status
    return task


def awaiting_version() -> Task:
    task = enqueue(ROLLED)
    registry.unregister(ROLLED, 2)  # an old worker claims it and hands it back
    assert runner.run_claimed(only_step(task).pk) is True
    return task


def run_after() -> Task:
    return enqueue(PAIR, run_after=timezone.now() + timedelta(hours=2))


def retrying() -> Task:
    task = enqueue("demo.flaky", {"fail_first": 1})
    assert runner.run_claimed(only_step(task).pk)
    Step.objects.filter(pk=only_step(task).pk).update(
        available_at=timezone.now() + timedelta(minutes=30)
    )
    step = only_step(task)
    assert (step.status, step.attempts) == (StepStatus.PENDING, 1)
    return task


def dead() -> Task:
    task = enqueue("demo.flaky", {"error": "permanent", "fail_first": 1})
    runner.run_task_steps(task)
    task.refresh_from_db()
    return task


def no_worker() -> Task:
    return enqueue(PAIR)


# Each kind of blocker and the fixture that makes one, for the tests that go through them all.
EACH: dict[str, Callable[[], Task]] = {
    "limit_concurrency": lambda: at_concurrency()[1],
    "limit_rate": at_rate,
    "limit_paused": paused_limit_key,
    "limit_held": held_by_remote,
    "limit_unknown": unknown_limit,
    "lease": running,
    "lease_expired": expired_lease,
    "approval": waiting_approval,
    "awaiting_version": awaiting_version,
    "run_after": run_after,
    "retry": retrying,
    "earlier_step": running,
    "dead": dead,
    "no_worker": no_worker,
    # Last: nothing is claimed in a paused queue, so the fixtures above could not claim.
    "queue_paused": paused_queue,
}

# Where some kinds' first link leads.
LINKS = {
    "limit_concurrency": "/limits/#limit-why-slots",
    "limit_rate": "/limits/#limit-why-hourly",
    "queue_paused": "/queues/",
}
