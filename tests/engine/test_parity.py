"""The one-by-one path and the batch path tell the same story (STYLE: "One home per rule").

``tasks_app.engine.fastpath`` restates in SQL the rules of ``services.claim_step`` and
``services.complete_step``. Each scenario below is played twice, on two tasks enqueued
alike, once through each path (``tests.parity_support``); afterwards the rows and events of
the two tasks must be the same once ids and times are normalised
(``tests.parity_support.snapshot``).

What each side exercises:

- one by one: ``services.claim_step`` (the ORM claim) and ``services.complete_step`` (the
  ORM completion). Scenarios whose handler fails, or whose success reaches an approval
  step, use ``runner.run_claimed``: the ORM claim, then the runner, which records the
  failure with ``services.fail_step`` and that success with ``services.complete_step``.
- batch: ``fastpath.claim_batch`` (``claim_sql``) and ``fastpath.complete_many``
  (``COMPLETE_SQL``). Scenarios whose handler fails, or whose success reaches an approval
  step, use ``runner.run_batch`` on the batch's claims: failures are still recorded by
  ``services.fail_step``, and a success that opens an approval request by
  ``services.complete_step``, so there the SQL under comparison is the claim.

``runner.run_claimed`` records a plain success through ``fastpath.complete_many`` too (its
``execute`` is a batch of one), so the ORM completion is called directly here: it is the
twin the SQL must match. The statements run only on PostgreSQL (elsewhere ``batch`` falls
back to the services), which is where this suite runs; the first test checks that.

Normalised: a step is named by ``(position, revision)``, an approval request by its step;
times are kept as set or unset, an ``available_at`` as due or later at snapshot time, a
lease as its length; a retry's jittered delay as present or not. Workers, actors,
reasons, results (and whether a result is SQL ``NULL``), errors and the order of events
are compared as they are.

The last scenarios fail on differences the paths show today; each is marked
``xfail(strict=True)`` naming the difference, so fixing it makes the mark fail too.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from tasks_app import services
from tasks_app.demo.workflows import flaky, validate_flaky
from tasks_app.models import Lease, Step, StepStatus, Task, TaskStatus
from tasks_app.workflows import StepSpec, Workflow, register, registry
from tests.approval_support import ARTICLE
from tests.conftest import PAIR, backdate
from tests.lease_support import step_at
from tests.parity_support import (
    BATCHED,
    ONE_BY_ONE,
    Path,
    PathsDiffer,
    assert_same,
    snapshot,
    succeed,
)

WORKER = "w1"
SLOW, FAST = "w-slow", "w-fast"
LEASE = settings.TASKS_LEASE_SECONDS
RETRY = "test.parity.retry"
PRODUCER = "cli:producer"
ONCALL = "cli:oncall"


Scenario = Callable[[Path], Task]

PARITY_SEED = 12


def both(scenario: Scenario) -> tuple[dict[str, Any], dict[str, Any]]:
    """Play ``scenario`` through each path in turn; the two snapshots.

    Each path starts from the same random state: a retry's delay is drawn with full jitter,
    and whether it is close enough for a doorbell (``dispatched_at``) must not differ by
    chance between the two."""
    state = random.getstate()
    try:
        random.seed(PARITY_SEED)
        one_task = scenario(ONE_BY_ONE)
        one = snapshot(one_task)
        random.seed(PARITY_SEED)
        batched = snapshot(scenario(BATCHED))
    finally:
        random.setstate(state)
    # The second run left the first task alone.
    assert snapshot(one_task) == one
    return one, batched


def kinds(story: dict[str, Any]) -> list[str]:
    return [event["kind"] for event in story["events"]]


def statuses(story: dict[str, Any]) -> dict[str, str]:
    return {step["step"]: step["status"] for step in story["steps"]}


def first(task: Task) -> Step:
    return step_at(task, 0)


def enqueue(workflow: str, payload: dict[str, Any]) -> Task:
    return services.enqueue(workflow, payload, actor=PRODUCER).task


# --- test workflows -------------------------------------------------------------------------


@pytest.fixture
def slow_retry() -> Iterator[str]:
    """demo.flaky's handler with a backoff of up to an hour, so a retry is surely later."""
    register(
        Workflow(
            RETRY,
            1,
            steps=(StepSpec("flaky", flaky, max_attempts=3, backoff_base=3600, backoff_cap=3600),),
            validate_payload=validate_flaky,
        )
    )
    yield RETRY
    registry.unregister(RETRY, 1)


def _noop(ctx: Any) -> dict[str, Any]:
    return {}


# Two roots, a fan-out after the first, a join of the second and the fan-out.
GRAPH = Workflow(
    "test.parity.graph",
    1,
    steps=(
        StepSpec("left", _noop, after=()),
        StepSpec("right", _noop, after=()),
        StepSpec("each", _noop, after=("left",), fan_out=lambda results: [1, 2]),
        StepSpec("join", _noop, after=("right", "each")),
    ),
)


@pytest.fixture(autouse=True)
def _graph() -> Iterator[None]:
    register(GRAPH)
    yield
    registry.unregister(GRAPH.name, GRAPH.version)


# --- the scenarios --------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_batch_path_runs_its_own_statements_here() -> None:
    # Elsewhere batch.* falls back to the services, and every comparison below is void.
    assert connection.vendor == "postgresql"


@pytest.mark.django_db
def test_a_one_step_task_succeeds_alike() -> None:
    def scenario(path: Path) -> Task:
        task = enqueue("demo.noop", {"n": 1})
        claim = path.claim(first(task), WORKER)
        assert succeed(path, claim, {"kept": [1, "two", None]})
        return task

    one, batched = both(scenario)

    assert kinds(one) == ["enqueued", "claimed", "succeeded"]
    assert one["task"]["status"] == TaskStatus.SUCCEEDED
    assert one["task"]["finished_at"] is True
    assert_same(one, batched)


@pytest.mark.django_db
def test_a_step_whose_next_step_becomes_due_succeeds_alike(pair: str) -> None:
    def scenario(path: Path) -> Task:
        task = enqueue(pair, {})
        claim = path.claim(first(task), WORKER)
        assert succeed(path, claim, {"done": "draft"})
        return task

    one, batched = both(scenario)

    assert kinds(one) == ["enqueued", "claimed", "succeeded"]
    assert statuses(one) == {"0.0": StepStatus.SUCCEEDED, "1.0": StepStatus.PENDING}
    assert one["steps"][1]["available_at"] == "due"
    assert (one["task"]["status"], one["task"]["finished_at"]) == (TaskStatus.PENDING, False)
    assert_same(one, batched)


@pytest.mark.django_db
def test_the_last_step_of_a_task_succeeds_alike(pair: str) -> None:
    def scenario(path: Path) -> Task:
        task = enqueue(pair, {})
        assert succeed(path, path.claim(first(task), WORKER), {"done": "draft"})
        assert succeed(path, path.claim(step_at(task, 1), WORKER), {"done": "publish"})
        return task

    one, batched = both(scenario)

    assert kinds(one) == ["enqueued", "claimed", "succeeded", "claimed", "succeeded"]
    assert statuses(one) == {"0.0": StepStatus.SUCCEEDED, "1.0": StepStatus.SUCCEEDED}
    assert (one["task"]["status"], one["task"]["finished_at"]) == (TaskStatus.SUCCEEDED, True)
    assert_same(one, batched)


@pytest.mark.django_db
def test_a_failure_with_attempts_left_is_retried_alike(slow_retry: str) -> None:
    def scenario(path: Path) -> Task:
        task = enqueue(slow_retry, {"fail_first": 1})
        path.run(first(task))
        return task

    one, batched = both(scenario)

    assert kinds(one) == ["enqueued", "claimed", "retry_scheduled"]
    [step] = one["steps"]
    assert (step["status"], step["attempts"], step["available_at"]) == (
        StepStatus.PENDING,
        1,
        "later",
    )
    assert step["error_class"] == "tasks_app.exceptions.RetryableError"
    assert one["events"][-1]["data"]["retry_in"] == "<jittered delay>"
    assert one["task"]["status"] == TaskStatus.PENDING
    assert_same(one, batched)


@pytest.mark.django_db
def test_a_retried_step_is_claimed_again_and_succeeds_alike(slow_retry: str) -> None:
    def scenario(path: Path) -> Task:
        task = enqueue(slow_retry, {"fail_first": 1})
        path.run(first(task))
        backdate(first(task), seconds=2 * 3600)
        claim = path.claim(first(task), WORKER)
        assert succeed(path, claim, {"token": claim.token, "attempt": claim.attempt})
        return task

    one, batched = both(scenario)

    assert kinds(one) == ["enqueued", "claimed", "retry_scheduled", "claimed", "succeeded"]
    assert one["steps"][0]["result"] == {"token": 2, "attempt": 2}
    assert one["task"]["status"] == TaskStatus.SUCCEEDED
    assert_same(one, batched)


@pytest.mark.django_db
def test_a_failed_last_attempt_dead_letters_alike(slow_retry: str) -> None:
    def scenario(path: Path) -> Task:
        task = enqueue(slow_retry, {"fail_first": 3})
        for _ in range(3):
            backdate(first(task), seconds=2 * 3600)
            path.run(first(task))
        return task

    one, batched = both(scenario)

    assert kinds(one) == [
        "enqueued",
        *["claimed", "retry_scheduled"] * 2,
        "claimed",
        "dead_lettered",
    ]
    assert one["events"][-1]["reason"] == "max_attempts"
    assert (one["steps"][0]["status"], one["steps"][0]["attempts"]) == (StepStatus.DEAD, 3)
    assert (one["task"]["status"], one["task"]["finished_at"]) == (TaskStatus.DEAD, True)
    assert_same(one, batched)


@pytest.mark.django_db
def test_a_permanent_error_dead_letters_alike(slow_retry: str) -> None:
    def scenario(path: Path) -> Task:
        task = enqueue(slow_retry, {"fail_first": 1, "error": "permanent"})
        path.run(first(task))
        return task

    one, batched = both(scenario)

    assert kinds(one) == ["enqueued", "claimed", "dead_lettered"]
    assert one["events"][-1]["reason"] == "permanent_error"
    assert one["steps"][0]["error_class"] == "tasks_app.exceptions.PermanentError"
    assert (one["steps"][0]["status"], one["steps"][0]["attempts"]) == (StepStatus.DEAD, 1)
    assert one["task"]["status"] == TaskStatus.DEAD
    assert_same(one, batched)


@pytest.mark.django_db
def test_a_graph_runs_its_branches_fan_out_and_join_alike() -> None:
    """The claims differ (the SQL's batch, the ORM's one by one); a graph's successes are
    recorded one by one on both (``transitions.completes_alone``)."""

    def scenario(path: Path) -> Task:
        task = enqueue(GRAPH.name, {})
        for kind in ("left", "right", "each", "each", "join"):
            step = task.steps.filter(kind=kind, status=StepStatus.PENDING).order_by("item")[0]
            path.run(step)
        return task

    one, batched = both(scenario)

    assert statuses(one) == {
        "0.0": StepStatus.SUCCEEDED,
        "1.0": StepStatus.SUCCEEDED,
        "2.0": StepStatus.SUCCEEDED,
        "2.0#1": StepStatus.SUCCEEDED,
        "3.0": StepStatus.SUCCEEDED,
    }
    assert one["task"]["status"] == TaskStatus.SUCCEEDED
    assert_same(one, batched)


@pytest.mark.django_db
def test_a_draft_that_reaches_an_approval_step_opens_its_request_alike() -> None:
    def scenario(path: Path) -> Task:
        task = enqueue("publish_article", ARTICLE)
        path.run(first(task))
        return task

    one, batched = both(scenario)

    assert kinds(one) == ["enqueued", "claimed", "succeeded", "approval_requested"]
    assert statuses(one) == {
        "0.0": StepStatus.SUCCEEDED,
        "1.0": StepStatus.WAITING_APPROVAL,
        "2.0": StepStatus.BLOCKED,
        "3.0": StepStatus.BLOCKED,
    }
    [request] = one["approval_requests"]
    assert (request["request"], request["status"], request["revision"]) == (
        "request of 1.0",
        "pending",
        0,
    )
    assert one["events"][-1]["data"]["request"] == "request of 1.0"
    assert one["task"]["status"] == TaskStatus.WAITING_APPROVAL
    assert_same(one, batched)


@pytest.mark.django_db
@pytest.mark.parametrize("workflow", ["demo.noop", PAIR])
def test_a_success_arriving_after_a_cancel_was_requested_ends_the_task_cancelled_alike(
    pair: str, workflow: str
) -> None:
    def scenario(path: Path) -> Task:
        task = enqueue(workflow, {})
        claim = path.claim(first(task), WORKER)
        services.cancel(task, actor=ONCALL, reason="withdrawn")
        assert succeed(path, claim, {"late": True})
        return task

    one, batched = both(scenario)

    assert kinds(one) == ["enqueued", "claimed", "cancel_requested", "succeeded", "cancelled"]
    assert one["steps"][0]["result"] == {"late": True}
    assert all(step["status"] == StepStatus.CANCELLED for step in one["steps"][1:])
    assert (one["task"]["status"], one["task"]["finished_at"]) == (TaskStatus.CANCELLED, True)
    assert one["task"]["cancel_requested_at"] is True
    assert_same(one, batched)


@pytest.mark.django_db
def test_a_late_completion_under_a_reaped_and_reclaimed_lease_is_refused_alike() -> None:
    def scenario(path: Path) -> Task:
        task = enqueue("demo.noop", {})
        stale = path.claim(first(task), SLOW)
        backdate(first(task), seconds=LEASE + 60)
        assert services.reap_expired_leases() == 1
        current = path.claim(first(task), FAST)
        assert not succeed(path, stale, {"by": "slow"})
        assert succeed(path, current, {"by": "fast"})
        return task

    one, batched = both(scenario)

    assert kinds(one) == [
        "enqueued",
        "claimed",
        "lease_expired",
        "claimed",
        "stale_write_rejected",
        "succeeded",
    ]
    rejected = one["events"][4]
    assert (rejected["actor"], rejected["data"]) == (
        f"worker:{SLOW}",
        {
            "operation": "complete",
            "token": 1,
            "current_token": 2,
            "current_status": StepStatus.RUNNING,
        },
    )
    assert one["steps"][0]["result"] == {"by": "fast"}
    assert [(lease["token"], lease["outcome"]) for lease in one["leases"]] == [
        (1, Lease.Outcome.EXPIRED),
        (2, Lease.Outcome.SUCCEEDED),
    ]
    assert_same(one, batched)


@pytest.mark.django_db
def test_a_late_completion_under_a_reaped_lease_is_refused_alike() -> None:
    def scenario(path: Path) -> Task:
        task = enqueue("demo.noop", {})
        stale = path.claim(first(task), SLOW)
        backdate(first(task), seconds=LEASE + 60)
        assert services.reap_expired_leases() == 1
        assert not succeed(path, stale, {"by": "slow"})
        return task

    one, batched = both(scenario)

    assert kinds(one) == ["enqueued", "claimed", "lease_expired", "stale_write_rejected"]
    assert one["events"][-1]["data"]["current_status"] == StepStatus.PENDING
    assert (one["steps"][0]["status"], one["steps"][0]["result"]) == (StepStatus.PENDING, None)
    assert_same(one, batched)


# --- where the paths differ today -----------------------------------------------------------
#
# Each scenario below fails on a difference between the paths; the comparison is as strict
# as above, and the mark names what differs (``raises=PathsDiffer``: any other failure,
# such as the one-by-one story changing, still fails).


@pytest.mark.django_db
def test_a_handler_result_of_none_is_stored_alike(pair: str) -> None:
    def scenario(path: Path) -> Task:
        task = enqueue(pair, {})
        assert succeed(path, path.claim(first(task), WORKER), None)
        return task

    one, batched = both(scenario)

    assert kinds(one) == ["enqueued", "claimed", "succeeded"]
    assert (one["steps"][0]["result"], one["steps"][0]["result_is_sql_null"]) == (None, True)
    assert_same(one, batched)


@pytest.mark.django_db
@pytest.mark.xfail(
    strict=True,
    raises=PathsDiffer,
    reason=(
        "a stale completion and the current one of the same step in one "
        "fastpath.complete_many: both paths refuse the stale one and record the current one, "
        "but one by one writes the events in the order given (stale_write_rejected, then "
        "succeeded, the refusal seeing the step running) while the batch writes the "
        "accepted completions first and the refusals after them (seeing it succeeded); "
        "the runner never hands it two claims of one step"
    ),
)
def test_a_stale_completion_batched_with_the_current_one_is_refused_alike() -> None:
    def scenario(path: Path) -> Task:
        task = enqueue("demo.noop", {})
        stale = path.claim(first(task), SLOW)
        backdate(first(task), seconds=LEASE + 60)
        assert services.reap_expired_leases() == 1
        current = path.claim(first(task), FAST)
        accepted = path.complete([(stale, {"by": "slow"}), (current, {"by": "fast"})])
        assert accepted == {task.steps.get().pk}
        return task

    one, batched = both(scenario)

    assert kinds(one)[-2:] == ["stale_write_rejected", "succeeded"]
    assert [event["actor"] for event in one["events"][-2:]] == [
        f"worker:{SLOW}",
        f"worker:{FAST}",
    ]
    assert one["steps"][0]["result"] == {"by": "fast"}
    assert_same(one, batched)


@pytest.mark.django_db
def test_a_completion_delivered_twice_in_one_batch_is_refused_the_second_time_alike() -> None:
    def scenario(path: Path) -> Task:
        task = enqueue("demo.noop", {})
        claim = path.claim(first(task), WORKER)
        assert path.complete([(claim, {"n": 1}), (claim, {"n": 2})]) == {claim.step_id}
        return task

    one, batched = both(scenario)

    assert kinds(one) == ["enqueued", "claimed", "succeeded", "stale_write_rejected"]
    assert one["events"][-1]["data"]["current_status"] == StepStatus.SUCCEEDED
    assert one["steps"][0]["result"] == {"n": 1}
    assert_same(one, batched)


# --- enqueue: the insert statement (sql.INSERT_SQL) and the ORM's (enqueueing._insert_with_orm)


@pytest.mark.django_db
def test_an_enqueue_writes_the_same_rows_through_the_statement_and_the_orm(
    pair: str, settings: Any
) -> None:
    """Keyed and keyless items, one and two steps, a graph (two roots, a fan-out, a join),
    due now and later: the statement inserts the keyed ones with ON CONFLICT and the keyless
    ones without, and both must leave what the ORM leaves."""

    later = datetime(2099, 1, 1, tzinfo=UTC)

    def items(tag: str) -> list[dict[str, Any]]:
        return [
            {"workflow": "demo.noop", "payload": {"n": 1}, "idempotency_key": f"k-{tag}"},
            {"workflow": "demo.noop", "payload": {"n": 2}, "priority": 5},
            {"workflow": pair, "payload": {"n": 3}, "run_after": later},
            {"workflow": GRAPH.name, "payload": {"n": 4}, "idempotency_key": f"g-{tag}"},
        ]

    def enqueued(tag: str) -> list[dict[str, Any]]:
        tasks = [result.task for result in services.enqueue_many(items(tag), actor=PRODUCER)]
        return [
            {
                **snapshot(task),
                "row": (task.queue, task.priority, task.payload, task.workflow_version),
                "keyed": task.idempotency_key is not None,
            }
            for task in tasks
        ]

    by_statement = enqueued("sql")
    settings.TASKS_SQL_FAST_PATH = False
    by_orm = enqueued("orm")

    assert [task["keyed"] for task in by_statement] == [True, False, False, True]
    graph = by_statement[3]["steps"]
    assert [(s["kind"], s["status"], s["after"]) for s in graph] == [
        ("left", "pending", []),
        ("right", "pending", []),
        ("each", "blocked", [0]),
        ("join", "blocked", [1, 2]),
    ]
    for statement, orm in zip(by_statement, by_orm, strict=True):
        assert_same(orm, statement)
