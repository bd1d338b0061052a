"""Why isn't this running? (``tasks_app.operations.why``): for each kind of blocker, a task
held back by it is said to be, in words with a link and the facts that matter; the task
list's bulk form answers the same in a few queries; the Overview counts steps by reason
(``why_counts``) without asking step by step."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tasks_app import services
from tasks_app.models import Task
from tasks_app.operations import why_counts
from tasks_app.operations.why import Blocker, why, why_many, why_step
from tests import why_support as made
from tests.conftest import only_step

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("why_workflows")]

why_workflows = made.why_workflows


@pytest.fixture(autouse=True)
def _a_live_worker() -> None:
    """A worker consumes the default queue, so each test sees only the blocker it made."""
    made.live_worker("default")


def kinds(task: Task) -> list[str]:
    return [blocker.kind for blocker in why(task)]


def only(task: Task, kind: str) -> Blocker:
    found = [blocker for blocker in why(task) if blocker.kind == kind]
    assert len(found) == 1, why(task)
    return found[0]


def test_a_paused_queue_names_who_paused_it_when_and_why() -> None:
    task = made.paused_queue()
    blocker = only(task, "queue_paused")
    assert kinds(task) == ["queue_paused", "earlier_step"]
    assert (blocker.subject, blocker.who, blocker.reason) == (
        "default",
        "cli:olivia",
        "database failover",
    )
    assert blocker.since is not None and blocker.link == "/queues/"
    assert "paused by cli:olivia" in blocker.words and "database failover" in blocker.words


def test_a_limit_at_its_concurrency_names_the_tasks_that_hold_it() -> None:
    holder, task = made.at_concurrency()
    blocker = only(task, "limit_concurrency")
    assert blocker.tasks == (holder.pk,)
    assert blocker.subject == "why-slots:acme"
    assert f"task #{holder.pk} holds it" in blocker.words
    assert "concurrency of 1" in blocker.words
    assert blocker.link.endswith("#limit-why-slots")


def test_a_limit_at_its_rate_says_when_the_next_unit_frees() -> None:
    task = made.at_rate()
    blocker = only(task, "limit_rate")
    now = services.db_now()
    # The sliced window counts a spend for up to one slice (3 minutes) past its hour.
    assert blocker.until is not None and now < blocker.until <= now + timedelta(minutes=63)
    assert "at its rate of 1/h" in blocker.words and "frees at" in blocker.words
    assert blocker.short == "rate limit why-hourly"


def test_a_paused_limit_key_names_who_paused_it_and_why() -> None:
    task = made.paused_limit_key()
    blocker = only(task, "limit_paused")
    assert (blocker.who, blocker.reason) == ("cli:olivia", "their API is down")
    assert blocker.since is not None
    assert "(key “globex”) was paused by cli:olivia" in blocker.words


def test_a_remotes_retry_after_holds_the_key_until_a_time() -> None:
    task = made.held_by_remote()
    blocker = only(task, "limit_held")
    now = services.db_now()
    assert blocker.until is not None
    assert now + timedelta(minutes=9) < blocker.until <= now + timedelta(minutes=10)
    assert "429 from the remote" in blocker.reason


def test_a_limit_no_worker_here_declares_is_named() -> None:
    task = made.unknown_limit()
    blocker = only(task, "limit_unknown")
    assert blocker.subject == "why-hourly"
    assert "declares" in blocker.words


def test_a_running_step_names_its_worker_token_and_lease_expiry() -> None:
    task = made.running()
    blocker = only(task, "lease")
    step = task.steps.get(position=0)
    assert (blocker.who, blocker.step_id) == (step.lease_worker, step.pk)
    assert blocker.until == step.lease_expires_at and blocker.since == step.started_at
    assert f"token {step.fencing_token}" in blocker.words
    assert blocker.link == "/queues/#workers"


def test_a_lease_that_ran_out_says_the_sweeper_reaps_it() -> None:
    task = made.expired_lease()
    assert "lease_expired" in kinds(task) and "lease" not in kinds(task)
    assert "sweeper" in only(task, "lease_expired").words


def test_an_approval_names_the_group_since_expiry_and_links_the_review() -> None:
    task = made.waiting_approval()
    blocker = only(task, "approval")
    request = task.approval_requests.get(status="pending")
    assert (blocker.who, blocker.since, blocker.until) == (
        "editors",
        request.created_at,
        request.expires_at,
    )
    assert blocker.link == f"/approvals/{request.pk}/"
    assert "0 of 1 approval" in blocker.words and "dead-lettered" in blocker.words


def test_a_step_awaiting_its_workflow_version_says_which_and_when_it_is_tried_again() -> None:
    task = made.awaiting_version()
    blocker = only(task, "awaiting_version")
    assert blocker.subject == f"{made.ROLLED} v2"
    assert blocker.until == only_step(task).available_at
    assert blocker.link == f"/workflows/{made.ROLLED}/"


def test_run_after_in_the_future_is_its_start_time() -> None:
    task = made.run_after()
    blocker = only(task, "run_after")
    assert blocker.until == task.steps.get(position=0).available_at
    assert "run_after" in blocker.words


def test_a_retry_names_the_failed_attempt_and_when_it_is_tried_again() -> None:
    task = made.retrying()
    blocker = only(task, "retry")
    assert blocker.until == only_step(task).available_at
    assert "Attempt 1 of 3" in blocker.words


def test_a_blocked_step_names_the_step_it_waits_for() -> None:
    task = made.running()
    blocker = only(task, "earlier_step")
    assert blocker.step_id == task.steps.get(position=1).pk
    assert blocker.words == "Step 1 (publish) waits for step 0 (draft), which is running."
    assert why_step(task.steps.get(position=1)) == [blocker]


def test_a_dead_step_waits_for_a_person_and_links_its_cause() -> None:
    task = made.dead()
    blocker = only(task, "dead")
    step = only_step(task)
    assert blocker.link == f"/dead/?fingerprint={step.error_fingerprint}"
    assert "redrive" in blocker.words


def test_a_queue_no_live_worker_consumes_is_named() -> None:
    task = made.no_worker()
    assert kinds(task) == ["due", "earlier_step"]
    made.live_worker("other")  # the one worker now consumes another queue
    assert kinds(task) == ["no_worker", "earlier_step"]
    assert "celery -A config worker -Q default" in only(task, "no_worker").words


def test_a_due_step_nothing_holds_says_so() -> None:
    task = made.no_worker()
    assert "Nothing holds step 0 (draft) back" in only(task, "due").words


def test_a_finished_task_has_nothing_holding_it() -> None:
    task = made.no_worker()
    services.cancel(task, actor="cli:olivia", reason="not needed")
    task.refresh_from_db()
    assert why(task) == []


def test_the_bulk_form_answers_as_one_task_at_a_time_in_a_few_queries() -> None:
    tasks = [fixture() for fixture in made.EACH.values() if fixture is not made.unknown_limit]
    tasks = [Task.objects.get(pk=task.pk) for task in tasks]
    with CaptureQueriesContext(connection) as queries:
        bulk = why_many(tasks)
    assert len(queries) <= 12, [q["sql"][:120] for q in queries]
    # The times in the words are said against the moment each call read.
    assert {pk: [b.kind for b in blockers] for pk, blockers in bulk.items()} == {
        task.pk: kinds(task) for task in tasks
    }


def test_the_overview_counts_waiting_steps_by_reason_in_a_few_queries() -> None:
    made.at_concurrency()
    made.at_rate()
    made.enqueue(f"{made.LIMITED}.hourly")
    made.waiting_approval()
    made.retrying()
    made.paused_queue()
    with CaptureQueriesContext(connection) as queries:
        counts = why_counts.waiting()
    assert len(queries) <= 16, [q["sql"][:120] for q in queries]
    words = {count.words for count in counts}
    assert "5 steps wait in the paused queue default" in words
    assert "1 step waits on the concurrency limit why-slots" in words
    assert "2 steps wait on the rate limit why-hourly" in words
    assert "1 step waits for a person's approval" in words
    assert "1 step waits to be retried after a failure" in words
    assert [count.steps for count in counts] == sorted((c.steps for c in counts), reverse=True)


def test_the_overview_counts_a_queue_no_live_worker_consumes() -> None:
    made.no_worker()
    made.live_worker("other")
    [count] = [c for c in why_counts.waiting() if c.kind == "no_worker"]
    assert (count.steps, count.subject) == (1, "default")
