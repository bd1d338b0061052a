"""The claim under limits in one round trip (``limited_at_once``, the database function
``tasks_app_claim_limited``): it takes the steps the limits let in, in claim order, as far
as the first they refuse, and books their spends and turns as the decision in Python would
(``limited_claims``, the rules' home); past a refusal it leaves the claim to that decision.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from django.db import DatabaseError, connection, transaction

from tasks_app import services
from tasks_app.engine import limited_at_once, limited_claims
from tasks_app.engine.limit_standing import SLICES, Window
from tasks_app.engine.limits import Limit, Rate
from tasks_app.models import LimitKey, LimitState, Step
from tasks_app.workflows import StepSpec, Workflow, register, registry
from tests.conftest import BrokerView, only_step
from tests.e2e_support import database_url
from tests.lease_support import WORKER

AT_ONCE = "test.limited_at_once"
SENDS = Rate(5, 30.0)


def _ok(ctx: Any) -> dict[str, Any]:
    return {}


@pytest.fixture(autouse=True)
def limited() -> Iterator[None]:
    """Two at once per customer; five units in 30 seconds overall, a step spending its
    payload's ``cost``."""
    register(
        Workflow(
            AT_ONCE,
            1,
            steps=(StepSpec("send", _ok),),
            limits=(
                Limit("once_customers", concurrency=2, key="customer"),
                Limit("once_sends", rate=str(SENDS), weight="cost"),
            ),
        )
    )
    yield
    registry.unregister(AT_ONCE, 1)


def _enqueue(customer: str, cost: int = 1) -> Step:
    return only_step(services.enqueue(AT_ONCE, {"customer": customer, "cost": cost}).task)


def _claim(limit: int, step: Step | None = None) -> limited_at_once.Prefix:
    return limited_at_once.claim(
        queue=None if step else "default",
        worker_id=WORKER,
        limit=limit,
        lease_seconds=60,
        step_id=step.pk if step else None,
        only_named=False,
        size=limit,
    )


def _window() -> dict[str, Any]:
    return dict(LimitKey.objects.get(limit="once_sends", key="").window)


@pytest.mark.django_db
def test_a_batch_the_limits_let_in_is_claimed_and_booked_as_python_books_it() -> None:
    steps = [_enqueue("acme", 2), _enqueue("globex"), _enqueue("acme")]
    # Spends from earlier slices of the period: the function moves them on as Window.at does.
    assert steps[0].available_at is not None
    before = Window.at({}, SENDS, steps[0].available_at)
    before.spend(1)
    stored = before.stored() | {"slice": before.slice - 7}
    LimitKey.objects.filter(limit="once_sends").update(window=stored)

    prefix = _claim(3)

    assert prefix.decided and not prefix.alone
    assert [c.step_id for c in prefix.claims] == [steps[0].pk, steps[1].pk, steps[2].pk]
    claimed = Step.objects.get(pk=steps[0].pk)
    assert claimed.status == "running" and claimed.attempts == 1
    assert claimed.started_at is not None
    # Fenced and leased as every claim is: a raised token, the holder, the lease's end.
    assert claimed.fencing_token == steps[0].fencing_token + 1 == prefix.claims[0].token
    assert claimed.lease_worker == WORKER
    assert claimed.lease_expires_at == claimed.started_at + timedelta(seconds=60)
    expected = Window.at(stored, SENDS, claimed.started_at)
    expected.spend(4)
    assert _window() == expected.stored()
    assert sum(_window()["spent"]) == 5
    # The turn clock stands at the latest turn claimed (acme's second).
    assert LimitState.objects.get(name="once_customers").turn == 2


@pytest.mark.django_db
def test_it_stops_at_the_first_refusal_and_the_decision_here_weighs_the_rest() -> None:
    acme = [_enqueue("acme") for _ in range(3)]
    globex = _enqueue("globex")
    # Turns: acme 1, 2, 3; globex 1: acme's first, globex, acme's second, then acme's third
    # is refused by concurrency.
    prefix = _claim(4)
    assert not prefix.decided
    assert {c.step_id for c in prefix.claims} == {acme[0].pk, acme[1].pk, globex.pk}
    assert Step.objects.get(pk=acme[2].pk).status == "pending"
    # The whole claim: the rest is weighed in Python, which refuses it too.
    assert limited_claims.claim(queue="default", worker_id=WORKER, limit=4, lease_seconds=60)
    assert Step.objects.get(pk=acme[2].pk).status == "pending"


@pytest.mark.django_db
def test_a_rate_refuses_a_step_whose_weight_does_not_fit() -> None:
    heavy, light = _enqueue("acme", 4), _enqueue("globex", 2)
    prefix = _claim(2)
    assert [c.step_id for c in prefix.claims] == [heavy.pk] and not prefix.decided
    assert sum(_window()["spent"]) == 4
    assert Step.objects.get(pk=light.pk).status == "pending"


@pytest.mark.django_db
def test_an_operators_change_is_the_number_in_effect() -> None:
    first, second = _enqueue("acme"), _enqueue("globex")
    LimitState.objects.filter(name="once_sends").update(overridden=True, rate="1/2m")
    prefix = _claim(2)
    assert [c.step_id for c in prefix.claims] == [first.pk] and not prefix.decided
    assert _window()["width"] == 120.0 / SLICES
    LimitState.objects.filter(name="once_sends").update(rate="", concurrency=None)
    assert [c.step_id for c in _claim(2).claims] == [second.pk]


@pytest.mark.django_db
def test_a_paused_key_a_held_key_and_an_undeclared_limit_each_stop_it() -> None:
    paused, held, other = _enqueue("acme"), _enqueue("globex"), _enqueue("initech")
    LimitKey.objects.filter(limit="once_customers", key="acme").update(
        paused_at=datetime(2026, 1, 1, tzinfo=UTC)
    )
    LimitKey.objects.filter(limit="once_customers", key="globex").update(
        held_until=datetime(2100, 1, 1, tzinfo=UTC)
    )
    assert _claim(3).claims == []
    LimitKey.objects.filter(limit="once_customers").update(paused_at=None, held_until=None)
    Step.objects.filter(pk=paused.pk).update(limits=[["nobody_declares", "", 1]])
    prefix = _claim(3)
    assert prefix.claims == [] and not prefix.decided
    assert Step.objects.filter(pk__in=[held.pk, other.pk], status="pending").count() == 2


@pytest.mark.django_db
def test_a_named_step_whose_lease_ran_out_is_claimed_alone() -> None:
    named, _ = _enqueue("acme"), _enqueue("globex")
    Step.objects.filter(pk=named.pk).update(error_class="lease_expired")
    prefix = _claim(5, step=named)
    assert [c.step_id for c in prefix.claims] == [named.pk]
    assert prefix.alone and prefix.decided


@pytest.mark.django_db
def test_a_queue_with_no_step_under_limits_due_takes_no_lock() -> None:
    """Claims of queues without steps under limits do not wait for the claims that have
    some: the function looks before it takes the lock."""
    with psycopg.connect(database_url(connection.settings_dict), autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s)", [limited_claims.LOCK])
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '300ms'")
        assert _claim(3) == limited_at_once.Prefix()
        # With a step due, the claim waits for the lock (and here gives up).
        _enqueue("acme")
        with pytest.raises(DatabaseError, match="lock timeout"), transaction.atomic():
            _claim(3)


@pytest.mark.django_db(transaction=True)
def test_a_claim_that_took_steps_does_not_ring_for_the_ones_a_rate_holds(
    broker: BrokerView,
) -> None:
    first, second, third = _enqueue("acme", 2), _enqueue("globex", 2), _enqueue("initech", 3)
    broker.purge()
    options: dict[str, Any] = {"queue": "default", "worker_id": WORKER, "lease_seconds": 60}
    # The function takes two (four units of five), the decision here refuses the third.
    taken = limited_claims.claim(limit=3, **options)
    assert [c.step_id for c in taken.claims] == [first.pk, second.pk]
    assert taken.retry_at is None and broker.step_ids() == []
    # A claim that takes nothing rings once for when the rate lets the third in.
    held = limited_claims.claim(limit=3, **options)
    assert held.claims == [] and held.retry_at is not None
    assert broker.step_ids() == [third.pk]


def _a_burst_after_a_quiet_hour() -> None:
    """2,001 steps due, the statistics taken when the steps' table held one, in one page: a
    fresh deployment's table. (Emptied by a truncate inside the test's transaction: the
    pages earlier tests left would make the statistics say fewer rows still, the case these
    tests do not hold; see docs/performance.md, "Steps locked by key".)"""
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("TRUNCATE tasks_app_step, tasks_app_task CASCADE")
    _enqueue("acme")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE tasks_app_step, tasks_app_task")
    services.enqueue_many(
        [{"workflow": AT_ONCE, "payload": {"customer": f"c{i}", "cost": 1}} for i in range(2000)]
    )


@pytest.mark.django_db
def test_a_claim_reads_its_admitted_steps_by_key_though_planned_on_one_row() -> None:
    """Planned from statistics taken while the steps' table was nearly empty (the function
    keeps one plan a session), the claim still reads the steps it admitted by their keys,
    not every pending step: a burst after a quiet start costs each claim the batch, not the
    backlog."""
    _a_burst_after_a_quiet_hour()
    before = _step_rows_read()
    prefix = _claim(5)
    assert len(prefix.claims) == 5
    # The candidates read in claim order, the five claimed, the running steps counted: a
    # few rows a step, against 2,001 pending.
    assert _step_rows_read() - before < 50


@pytest.mark.django_db
def test_the_decision_here_takes_its_admitted_steps_by_key_though_planned_on_one_row() -> None:
    """The twin of the function's claim (``sql.CLAIM_IDS_SQL``, which the decision in
    Python claims its admitted steps by) reads them by their keys too."""
    _a_burst_after_a_quiet_hour()
    before = _step_rows_read()
    taken = limited_claims._weigh_and_claim("default", WORKER, 5, 60, None, False)
    assert len(taken.claims) == 5
    assert _step_rows_read() - before < 50


def _step_rows_read() -> int:
    """Rows of the steps' table this transaction has read so far, through an index or by
    a scan of the whole table."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(idx_tup_fetch, 0) + seq_tup_read FROM pg_stat_xact_user_tables"
            " WHERE relname = 'tasks_app_step'"
        )
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])
