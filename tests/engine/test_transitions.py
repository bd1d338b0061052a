"""Every transition and its record commit together (DESIGN rule 8): its Event, or the row
that records it (an attempt's Lease row holds its claim and its success); and the
database's clock decides what is due and what has expired (rule 3).

The record's write is made to fail for real, by a PostgreSQL trigger on the event table
that refuses one kind, or on the lease table; the transition that needed it must leave
nothing behind. The trigger lives in the test's transaction and goes with it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from approvals import services as approvals
from approvals.models import ApprovalStatus
from tasks_app import services
from tasks_app.engine import fastpath
from tasks_app.history import TaskState, fold, timeline
from tasks_app.models import Lease, Step, StepStatus, Task, TaskStatus
from tests.approval_support import advance, article, current, pending_request
from tests.conftest import backdate, only_step

REFUSE = """
CREATE FUNCTION pg_temp.refuse_event() RETURNS trigger AS $$
BEGIN
    IF NEW.kind = TG_ARGV[0] THEN
        RAISE EXCEPTION 'the % event cannot be written', NEW.kind;
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER refuse_event BEFORE INSERT ON tasks_app_event
    FOR EACH ROW EXECUTE FUNCTION pg_temp.refuse_event('{kind}');
"""


REFUSE_LEASES = """
CREATE FUNCTION pg_temp.refuse_lease() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'the attempt record of step % cannot be written', NEW.step_id;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER refuse_lease BEFORE INSERT OR UPDATE ON tasks_app_lease
    FOR EACH ROW EXECUTE FUNCTION pg_temp.refuse_lease();
"""


@pytest.fixture
def refuse_events(db: None) -> Iterator[Callable[[str], None]]:
    def refuse(kind: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(REFUSE.format(kind=kind))

    yield refuse


def _state(task: Task) -> tuple[Any, ...]:
    task = Task.objects.get(pk=task.pk)
    steps = list(task.steps.order_by("position", "revision").values_list("status", "attempts"))
    return (
        task.status,
        task.cancel_requested_at,
        steps,
        Lease.objects.filter(step__task=task).count(),
        [entry.kind for entry in timeline.history(task.pk)],
    )


def _noop() -> Task:
    return services.enqueue("demo.noop", {}, actor="cli:producer").task


class Undone(Exception):
    pass


@pytest.mark.parametrize("path", ["one step", "batch"])
def test_a_claim_is_recorded_by_the_write_that_makes_it(db: None, path: str) -> None:
    """The claim's record is the lease it puts on its step: one row, so a claim rolled back
    leaves no claim in the history, and one committed is in it."""
    task = _noop()
    before = _state(task)

    def claim() -> None:
        if path == "one step":
            assert services.claim_step(only_step(task).pk, worker_id="w1") is not None
        else:
            assert fastpath.claim_batch(worker_id="w1", limit=5, queue="default")

    with pytest.raises(Undone), transaction.atomic():
        claim()
        assert _state(task)[-1] == ["enqueued", "claimed"]
        raise Undone

    assert _state(task) == before
    claim()
    assert _state(task)[-1] == ["enqueued", "claimed"]


@pytest.mark.parametrize("path", ["one step", "batch"])
def test_a_completion_whose_attempt_record_cannot_be_written_completes_nothing(
    db: None, path: str
) -> None:
    task = _noop()
    claim = services.claim_step(only_step(task).pk, worker_id="w1")
    assert claim is not None
    before = _state(task)
    with connection.cursor() as cursor:
        cursor.execute(REFUSE_LEASES)

    with pytest.raises(DatabaseError, match="attempt record"):
        if path == "one step":
            services.complete_step(claim, {"done": True})
        else:
            fastpath.complete_many([(claim, {"done": True})])

    assert _state(task) == before
    assert only_step(task).result is None


REFUSE_STEPS = """
CREATE FUNCTION pg_temp.refuse_step() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'the step at position % cannot be written', NEW.position;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER refuse_step BEFORE INSERT ON tasks_app_step
    FOR EACH ROW EXECUTE FUNCTION pg_temp.refuse_step();
"""


@pytest.mark.parametrize("many", [False, True], ids=["enqueue", "enqueue_many"])
def test_an_enqueue_whose_steps_cannot_be_written_creates_no_task(db: None, many: bool) -> None:
    # The task row and its first steps record the enqueue together (no event of its own).
    with connection.cursor() as cursor:
        cursor.execute(REFUSE_STEPS)

    with pytest.raises(DatabaseError, match="cannot be written"):
        if many:
            services.enqueue_many([{"workflow": "demo.noop", "payload": {}}] * 2)
        else:
            services.enqueue("demo.noop", {}, idempotency_key="lost:1")

    assert not Task.objects.exists() and not Step.objects.exists()


def test_a_cancel_whose_event_cannot_be_written_cancels_nothing(
    refuse_events: Callable[[str], None], oncall: User
) -> None:
    task = _noop()
    before = _state(task)
    refuse_events("cancelled")

    with pytest.raises(DatabaseError, match="cancelled event"):
        services.cancel(task, actor=oncall, reason="withdrawn")

    assert _state(task) == before


@pytest.mark.parametrize(
    ("kind", "decide"),
    [
        ("approved", lambda request, actor: approvals.approve(request, actor=actor)),
        ("rejected", lambda request, actor: approvals.reject(request, actor=actor, comment="no")),
        (
            "changes_requested",
            lambda request, actor: approvals.request_changes(request, actor=actor, comment="more"),
        ),
    ],
)
def test_a_decision_whose_event_cannot_be_written_is_not_recorded(
    refuse_events: Callable[[str], None], editor: User, kind: str, decide: Any
) -> None:
    task = advance(article())
    request = pending_request(task)
    before = _state(task)
    refuse_events(kind)

    with pytest.raises(DatabaseError, match=f"{kind} event"):
        decide(request, editor)

    assert _state(task) == before
    request.refresh_from_db()
    assert (request.status, request.decided_by) == (ApprovalStatus.PENDING, "")


def test_reaching_an_approval_step_whose_event_cannot_be_written_keeps_the_draft_unfinished(
    refuse_events: Callable[[str], None],
) -> None:
    task = article()
    refuse_events("approval_requested")

    with pytest.raises(DatabaseError, match="approval_requested event"):
        advance(task)

    # The draft's success and the request are one commit: neither happened.
    assert current(task, "generate_draft").status == StepStatus.RUNNING
    assert current(task, "editor_review").status == StepStatus.BLOCKED
    assert not task.approval_requests.exists()


@pytest.mark.no_fold_check
def test_fold_notices_a_transition_written_without_its_event(db: None) -> None:
    task = _noop()
    assert fold(task) == TaskState.from_db(task)

    Step.objects.filter(task=task).update(status=StepStatus.CANCELLED)
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.CANCELLED)

    assert fold(task) != TaskState.from_db(task)


# --- the database's clock (PostgreSQL) ---------------------------------------------------------


@pytest.fixture
def clock_two_hours_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's clock runs two hours ahead of the database's."""
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(hours=2))


def test_a_worker_with_a_fast_clock_does_not_run_a_step_early(
    db: None, clock_two_hours_fast: None
) -> None:
    task = services.enqueue("demo.noop", {}, run_after=services.db_now() + timedelta(hours=1)).task
    step = only_step(task)

    assert services.claim_step(step.pk, worker_id="fast") is None
    assert fastpath.claim_batch(worker_id="fast", limit=5, queue="default") == []
    assert services.redispatch_due() == 0
    assert only_step(task).status == StepStatus.PENDING


def test_a_worker_with_a_fast_clock_does_not_steal_a_live_lease(
    db: None, clock_two_hours_fast: None
) -> None:
    task = _noop()
    step = only_step(task)
    claim = services.claim_step(step.pk, worker_id="slow-clock")
    assert claim is not None

    # By this process's clock the lease ran out two hours ago; by the database's it did not.
    assert services.reap_expired_leases() == 0
    assert services.claim_step(step.pk, worker_id="fast") is None
    assert services.heartbeat(claim).alive is True
    backdate(step, 60)  # now it really expired
    assert services.reap_expired_leases() == 1
