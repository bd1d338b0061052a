"""Flow control (``tasks_app.engine.limits``, ``limited_claims``): limits declared with a
workflow, recorded on its steps at enqueue, and enforced where the claim is decided.

A step over its limit stays pending, spends no attempt and is claimed once its limit lets
it; keys take turns; the numbers come from the declaration, ``TASKS_LIMITS`` and an
operator's live change, the later winning. Time moves by back-dating the rate windows,
never by sleeping.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from tasks_app import services
from tasks_app.engine import leases, runner
from tasks_app.engine.limit_standing import Window
from tasks_app.engine.limits import Limit, Rate
from tasks_app.exceptions import InvalidPayload
from tasks_app.models import LimitKey, LimitState, Step, StepStatus, Task
from tasks_app.workflows import StepSpec, Workflow, register, registry
from tests.conftest import BrokerView, only_step, together
from tests.lease_support import WORKER
from tests.limit_support import claim, finish, refill_rate

LIMITED = "test.limited"
PER_CUSTOMER = Limit("customers", concurrency=2, key="customer")
SENDS = Limit("sends", rate="3/30s", weight="cost")


def _ok(ctx: Any) -> dict[str, Any]:
    return {}


@pytest.fixture
def limited() -> Iterator[str]:
    """One step under two limits: two at once per customer, three units in 30 seconds overall
    (each step spends its payload's ``cost``)."""
    register(Workflow(LIMITED, 1, steps=(StepSpec("send", _ok),), limits=(PER_CUSTOMER, SENDS)))
    yield LIMITED
    registry.unregister(LIMITED, 1)


def enqueue(customer: str, cost: int = 1, **options: Any) -> Step:
    task = services.enqueue(LIMITED, {"customer": customer, "cost": cost}, **options).task
    return only_step(task)


# --- declarations ---------------------------------------------------------------------------


def test_rates_read_as_count_per_period() -> None:
    assert Rate.parse("200/s") == Rate(200, 1.0)
    assert Rate.parse("1000/m") == Rate(1000, 60.0)
    assert Rate.parse("50/10s") == Rate(50, 10.0)
    assert str(Rate.parse("5/h")) == "5/h"
    assert str(Rate.parse("50/10s")) == "50/10s"
    for bad in ("", "200", "0/s", "10/0s", "ten/s", "5/d"):
        with pytest.raises(ValueError, match="rate"):
            Rate.parse(bad)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"name": "Bad Name", "concurrency": 1}, "lowercase"),
        ({"name": "nothing"}, "set concurrency, rate or both"),
        ({"name": "zero", "concurrency": 0}, "at least 1"),
        ({"name": "weighed", "concurrency": 2, "weight": "cost"}, "needs a rate"),
    ],
)
def test_a_limit_declared_wrongly_is_refused_when_declared(
    options: dict[str, Any], words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        Limit(**options)


def test_two_workflows_declaring_one_limit_name_differently_are_refused() -> None:
    register(Workflow("test.one", 1, steps=(StepSpec("a", _ok),), limits=(Limit("x", 1),)))
    try:
        with pytest.raises(ValueError, match="declared otherwise"):
            register(Workflow("test.two", 1, steps=(StepSpec("a", _ok),), limits=(Limit("x", 2),)))
    finally:
        registry.unregister("test.one", 1)
    assert "test.two" not in registry.names()


# --- what enqueue records -------------------------------------------------------------------


@pytest.mark.django_db
def test_enqueue_records_each_steps_limits_key_weight_and_turn(limited: str) -> None:
    first, second = enqueue("acme", cost=2), enqueue("acme")
    other = enqueue("globex")
    assert first.limits == [["customers", "acme", 1], ["sends", "", 2]]
    assert (first.limit_turn, second.limit_turn, other.limit_turn) == (1, 2, 1)
    assert set(LimitState.objects.values_list("name", flat=True)) == {"customers", "sends"}
    assert LimitKey.objects.get(limit="customers", key="acme").last_turn == 2


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("payload", "field", "rule"),
    [
        ({"cost": 1}, "payload.customer", "limit_key"),
        ({"customer": ["a"], "cost": 1}, "payload.customer", "limit_key"),
        ({"customer": "acme", "cost": 0}, "payload.cost", "limit_weight"),
        ({"customer": "acme", "cost": 4}, "payload.cost", "limit_weight"),
    ],
)
def test_a_payload_without_a_usable_key_or_weight_is_refused_and_nothing_stored(
    limited: str, payload: dict[str, Any], field: str, rule: str
) -> None:
    with pytest.raises(InvalidPayload) as refused:
        services.enqueue(LIMITED, payload)
    assert (refused.value.field, refused.value.rule) == (field, rule)
    assert field in str(refused.value)
    assert not Task.objects.exists() and not LimitKey.objects.exists()


# --- the claim enforces them ----------------------------------------------------------------


@pytest.mark.django_db
def test_concurrency_per_key_holds_back_the_third_step_until_one_ends(limited: str) -> None:
    acme = [enqueue("acme") for _ in range(3)]
    globex = enqueue("globex")
    refill_rate()
    first = claim()
    assert sorted(first) == sorted([acme[0].pk, acme[1].pk, globex.pk])
    waiting = Step.objects.get(pk=acme[2].pk)
    assert (waiting.status, waiting.attempts) == (StepStatus.PENDING, 0)
    assert claim() == []
    finish([acme[0].pk])
    refill_rate()
    assert claim() == [acme[2].pk]


@pytest.mark.django_db(transaction=True)
def test_a_rate_lets_its_count_in_per_period_and_rings_for_when_it_frees(
    limited: str, broker: BrokerView
) -> None:
    steps = [enqueue(f"c{n}") for n in range(5)]
    broker.purge()
    assert claim() == [steps[0].pk, steps[1].pk, steps[2].pk]
    assert claim() == []
    # Refused for the rate: one doorbell for the first waiting step, delayed to when the
    # window lets it in.
    assert broker.step_ids() == [steps[3].pk]
    assert Step.objects.get(pk=steps[3].pk).attempts == 0
    refill_rate()
    assert claim() == [steps[3].pk, steps[4].pk]


@pytest.mark.django_db
def test_a_weight_spends_that_many_units_of_the_rate(limited: str) -> None:
    heavy, light = enqueue("a", cost=3), enqueue("b", cost=1)
    assert claim() == [heavy.pk]
    refill_rate()
    assert claim() == [light.pk]


@pytest.mark.django_db
def test_keys_take_turns_and_an_idle_key_starts_where_the_clock_stands(limited: str) -> None:
    register_wide = Limit("wide", concurrency=100, key="customer")
    register(Workflow("test.wide", 1, steps=(StepSpec("send", _ok),), limits=(register_wide,)))
    try:
        busy = [
            only_step(services.enqueue("test.wide", {"customer": "busy", "n": n}).task)
            for n in range(20)
        ]
        lone = only_step(services.enqueue("test.wide", {"customer": "lone"}).task)
        # The lone key's step goes with the busy key's first, not after its twenty.
        assert claim(limit=2) == [busy[0].pk, lone.pk]
        assert claim(limit=8) == [step.pk for step in busy[1:9]]
        assert LimitState.objects.get(name="wide").turn == 9
        late = only_step(services.enqueue("test.wide", {"customer": "late"}).task)
        assert late.limit_turn == 10
        assert claim(limit=2) == [busy[9].pk, late.pk]
    finally:
        registry.unregister("test.wide", 1)


@pytest.mark.django_db
def test_a_doorbell_naming_a_later_step_does_not_let_it_ahead_of_its_turn(limited: str) -> None:
    wide = Limit("wide_named", concurrency=100, key="customer")
    register(Workflow("test.named", 1, steps=(StepSpec("send", _ok),), limits=(wide,)))
    try:
        busy = [
            only_step(services.enqueue("test.named", {"customer": "busy", "n": n}).task)
            for n in range(20)
        ]
        # A batch enqueue rings for its first step: the 16th here. The claim still goes by
        # turn, and the limit's clock stays where the turns claimed are.
        assert claim(limit=1, step_id=busy[15].pk, queue=None) == [busy[0].pk]
        assert LimitState.objects.get(name="wide_named").turn == 1
        lone = only_step(services.enqueue("test.named", {"customer": "lone"}).task)
        assert claim(limit=2) == [busy[1].pk, lone.pk]
    finally:
        registry.unregister("test.named", 1)


@pytest.mark.django_db
def test_a_doorbell_naming_a_step_already_run_claims_the_queues_steps_under_limits(
    limited: str,
) -> None:
    # A drain that stops at its deadline, or recruits another worker, rings naming the last
    # step it ran: the worker that answers claims what waits in that queue.
    first, second = enqueue("acme"), enqueue("globex")
    assert claim(limit=1) == [first.pk]
    finish([first.pk])
    refill_rate()
    assert claim(limit=5, step_id=first.pk, queue=None) == [second.pk]


@pytest.mark.django_db
def test_priority_orders_steps_before_turns(limited: str) -> None:
    low = enqueue("a")
    high = enqueue("b", priority=10)
    assert claim(limit=1) == [high.pk]
    assert claim(limit=1) == [low.pk]


@pytest.mark.django_db
def test_only_the_limited_claim_takes_a_step_under_limits(limited: str) -> None:
    step = enqueue("acme")
    noop = only_step(services.enqueue("demo.noop", {}).task)
    assert leases.claim_step(step.pk, worker_id=WORKER) is None
    LimitKey.objects.filter(limit="customers").update(paused_at=timezone.now())
    # Paused: the batch takes the step without limits and leaves it.
    assert claim() == [noop.pk]
    assert Step.objects.get(pk=step.pk).status == StepStatus.PENDING
    LimitKey.objects.update(paused_at=None)
    assert runner.run_claimed(step.pk)
    assert Step.objects.get(pk=step.pk).status == StepStatus.SUCCEEDED


@pytest.mark.django_db
def test_settings_then_an_operators_change_override_the_declaration(
    limited: str, settings: Any
) -> None:
    steps = [enqueue("acme") for _ in range(4)]
    refill_rate()
    settings.TASKS_LIMITS = {"customers": {"concurrency": 1}, "sends": {"rate": "100/m"}}
    assert claim() == [steps[0].pk]
    LimitState.objects.filter(name="customers").update(overridden=True, concurrency=3)
    assert claim() == [steps[1].pk, steps[2].pk]


@pytest.mark.django_db
def test_the_orm_path_enforces_limits_as_well(limited: str, settings: Any) -> None:
    settings.TASKS_SQL_FAST_PATH = False
    acme = [enqueue("acme") for _ in range(3)]
    assert acme[0].limit_turn == 1 and acme[2].limit_turn == 3
    assert claim() == [acme[0].pk, acme[1].pk]


@pytest.mark.django_db(transaction=True)
def test_workers_claiming_at_once_never_exceed_a_limit(limited: str) -> None:
    steps = [enqueue("acme") for _ in range(12)]
    refill_rate()
    taken: list[list[int]] = []
    errors = together(*[lambda: taken.append(claim(limit=5)) for _ in range(4)])
    assert not errors
    claimed = [pk for batch in taken for pk in batch]
    assert len(claimed) == 2 and len(set(claimed)) == 2
    assert set(claimed) <= {step.pk for step in steps}
    assert connection.vendor == "postgresql"


# --- the rate's window ----------------------------------------------------------------------


def test_a_window_counts_every_slice_a_period_reaches_into() -> None:
    rate = Rate(10, 1.0)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    window = Window.at({}, rate, start)
    window.spend(10)
    assert window.frees_at(1, 10) == start + timedelta(seconds=1.05)
    later = Window.at(window.stored(), rate, start + timedelta(seconds=1.0))
    assert later.used == 10
    gone = Window.at(window.stored(), rate, start + timedelta(seconds=1.05))
    assert gone.used == 0
    # Kept under another period: the whole spend counts as spent now.
    changed = Window.at(window.stored(), Rate(10, 2.0), start)
    assert changed.used == 10


def test_a_window_lets_each_spend_leave_a_period_after_its_own_slice() -> None:
    rate = Rate(10, 1.0)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    window = Window.at({}, rate, start)
    window.spend(4)
    half = start + timedelta(seconds=0.5)
    window = Window.at(window.stored(), rate, half)
    window.spend(6)
    assert window.used == 10
    # The first spend leaves a period (and its slice) after it, the second half a period
    # later: each in its turn, not both with the newest.
    assert window.frees_at(4, 10) == start + timedelta(seconds=1.05)
    first_gone = Window.at(window.stored(), rate, start + timedelta(seconds=1.05))
    assert first_gone.used == 6
    assert first_gone.frees_at(5, 10) == half + timedelta(seconds=1.05)
    both_gone = Window.at(first_gone.stored(), rate, half + timedelta(seconds=1.05))
    assert both_gone.used == 0
