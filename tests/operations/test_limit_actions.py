"""Flow control as on-call sees and changes it (``tasks_app.operations.limit_use`` and
``limits``): each limit's use now, a previewed live change, a key paused and resumed,
each an audited event with who and why; and a remote's "too many requests" holding the
keys its step runs under (``exceptions.RateLimited``)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import DatabaseError, connection

from tasks_app import services
from tasks_app.db.clock import db_now
from tasks_app.engine import runner
from tasks_app.engine.limit_standing import AT_CONCURRENCY, AT_RATE, HELD, PAUSED
from tasks_app.engine.limits import Limit
from tasks_app.exceptions import InvalidInput, NotPermitted, RateLimited
from tasks_app.models import Event, EventKind, LimitKey, LimitState, Step, StepStatus
from tasks_app.operations import limit_use, why_counts
from tasks_app.operations import limits as actions
from tasks_app.operations.limit_use import holding, use_of, uses
from tasks_app.workflows import StepSpec, Workflow, register, registry
from tests.conftest import only_step
from tests.limit_support import claim, finish, refill_rate

FLOW = "test.limit_actions"
PER_CUSTOMER = Limit("acts_customers", concurrency=1, key="customer")
CALLS = Limit("acts_calls", rate="4/m")
SLOW_DOWN: dict[str, float] = {}


def _call(ctx: Any) -> dict[str, Any]:
    if "retry_after" in SLOW_DOWN:
        raise RateLimited(retry_after=SLOW_DOWN.pop("retry_after"))
    return {}


@pytest.fixture
def flow() -> Iterator[str]:
    """One step, one at a time per customer and four calls a minute overall."""
    register(Workflow(FLOW, 1, steps=(StepSpec("call", _call),), limits=(PER_CUSTOMER, CALLS)))
    yield FLOW
    registry.unregister(FLOW, 1)
    SLOW_DOWN.clear()


def enqueue(customer: str) -> Step:
    return only_step(services.enqueue(FLOW, {"customer": customer}).task)


def operator_events() -> list[tuple[str, str, str, dict[str, Any]]]:
    kinds = [EventKind.LIMIT_CHANGED, EventKind.LIMIT_KEY_PAUSED, EventKind.LIMIT_KEY_RESUMED]
    return [
        (event.kind, event.actor, event.reason, event.data)
        for event in Event.objects.filter(kind__in=kinds).order_by("id")
    ]


@pytest.mark.django_db
def test_a_limits_use_counts_running_waiting_spent_and_names_the_holders(flow: str) -> None:
    acme = [enqueue("acme") for _ in range(3)]
    enqueue("globex")
    assert sorted(claim()) == sorted(
        [acme[0].pk, Step.objects.get(task__payload__customer="globex").pk]
    )
    customers = use_of("acts_customers")
    assert (customers.running, customers.waiting) == (2, 2)
    by_key = {key.key: key for key in customers.keys}
    assert by_key["acme"].at_concurrency and by_key["acme"].holders == (acme[0].task_id,)
    assert by_key["acme"].waiting == 2
    calls = use_of("acts_calls")
    assert (calls.spent, calls.partitioned, calls.workflows) == (2, False, (FLOW,))
    assert {use.name for use in uses()} >= {"acts_customers", "acts_calls"}
    refused = holding(Step.objects.get(pk=acme[1].pk).limits)
    assert refused is not None and (refused.why, refused.limit, refused.key) == (
        AT_CONCURRENCY,
        "acts_customers",
        "acme",
    )


@pytest.mark.django_db
def test_the_rate_at_its_ceiling_says_until_when(flow: str) -> None:
    steps = [enqueue(f"c{n}") for n in range(5)]
    assert len(claim()) == 4
    refused = holding(Step.objects.get(pk=steps[4].pk).limits)
    assert refused is not None and (refused.why, refused.limit) == (AT_RATE, "acts_calls")
    assert refused.until is not None and refused.until > db_now()
    key = use_of("acts_calls").keys[0]
    assert key.at_rate and key.next_free == refused.until


@pytest.mark.django_db
def test_a_preview_says_what_a_change_lets_start_and_changes_nothing(flow: str) -> None:
    acme = [enqueue("acme") for _ in range(4)]
    assert claim() == [acme[0].pk]
    preview = actions.preview_change("acts_customers", concurrency="3", rate="")
    assert (preview.starts_now, preview.over) == (2, 0)
    assert "It lets 2 waiting steps start now." in preview.text
    assert not LimitState.objects.filter(overridden=True).exists()
    lower = actions.preview_change("acts_customers", concurrency=0, rate=None)
    assert (lower.starts_now, lower.over) == (0, 1)
    assert "1 running over the new concurrency finish first" in lower.text


@pytest.mark.django_db
def test_a_change_by_oncall_is_recorded_and_the_next_claim_obeys_it(
    flow: str, oncall: User
) -> None:
    acme = [enqueue("acme") for _ in range(3)]
    assert claim() == [acme[0].pk]
    actions.change_limit(
        "acts_customers", actor=oncall, reason="the remote raised our quota", concurrency=2, rate=""
    )
    assert claim() == [acme[1].pk]
    [(kind, actor, reason, data)] = operator_events()
    assert (kind, actor, reason) == (
        EventKind.LIMIT_CHANGED,
        oncall.username,
        "the remote raised our quota",
    )
    assert data["before"] == {"concurrency": 1, "rate": None}
    assert data["after"] == {"concurrency": 2, "rate": None}
    assert Event.objects.get(kind=EventKind.LIMIT_CHANGED).chain_hash
    assert use_of("acts_customers").source == "changed live"
    actions.reset_limit("acts_customers", actor="cli:ann", reason="quota back to normal")
    state = LimitState.objects.get(name="acts_customers")
    assert not state.overridden and state.changed_by == "cli:ann"
    assert operator_events()[-1][3]["after"] == {"concurrency": 1, "rate": None}


@pytest.mark.django_db
def test_a_change_confirmed_from_a_preview_is_refused_when_the_numbers_moved_since(
    flow: str, oncall: User
) -> None:
    """A program that confirms from a preview gets the console's guard: the numbers it saw
    (``seen``) are compared under the limit's lock, and a change from under it stores
    nothing."""
    preview = actions.preview_change("acts_customers", concurrency=3, rate="")
    seen = actions.stamp(preview.before)
    actions.change_limit("acts_customers", actor=oncall, reason="first", concurrency=2, rate="")
    with pytest.raises(actions.StaleChange, match=r"now 2 at once\)\. Preview again"):
        actions.change_limit(
            "acts_customers", actor=oncall, reason="second", concurrency=3, rate="", seen=seen
        )
    assert LimitState.objects.get(name="acts_customers").concurrency == 2
    assert [reason for _, _, reason, _ in operator_events()] == ["first"]
    fresh = actions.stamp(use_of("acts_customers").numbers)
    actions.change_limit(
        "acts_customers", actor=oncall, reason="second", concurrency=3, rate="", seen=fresh
    )
    assert LimitState.objects.get(name="acts_customers").concurrency == 3


@pytest.mark.django_db
def test_a_change_whose_event_cannot_be_written_changes_nothing(flow: str, oncall: User) -> None:
    """The live numbers and their audited event are one transaction: when the event's insert
    fails (here a trigger refuses it), the numbers stay as they were."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION test_refuse_limit_event() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN IF NEW.kind = 'limit_changed' THEN RAISE EXCEPTION 'refused by the test';"
            " END IF; RETURN NEW; END $$"
        )
        cursor.execute(
            "CREATE TRIGGER test_refuse_limit_event BEFORE INSERT ON tasks_app_event"
            " FOR EACH ROW EXECUTE FUNCTION test_refuse_limit_event()"
        )
    with pytest.raises(DatabaseError, match="refused by the test"):
        actions.change_limit("acts_customers", actor=oncall, reason="quota", concurrency=5, rate="")
    assert not LimitState.objects.filter(name="acts_customers", overridden=True).exists()
    assert use_of("acts_customers").numbers == use_of("acts_customers").configured


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("options", "field", "rule"),
    [
        ({"concurrency": "many", "rate": ""}, "concurrency", "range"),
        ({"concurrency": -1, "rate": ""}, "concurrency", "range"),
        ({"concurrency": "", "rate": "fast"}, "rate", "format"),
        ({"concurrency": "", "rate": ""}, "concurrency", "required"),
        ({"concurrency": 2, "rate": "", "reason": "  "}, "reason", "required"),
        ({"concurrency": 2, "rate": "", "name": "nonesuch"}, "name", "unknown_limit"),
    ],
)
def test_a_bad_change_names_the_field_and_stores_nothing(
    flow: str, oncall: User, options: dict[str, Any], field: str, rule: str
) -> None:
    options = {"name": "acts_customers", "reason": "why not", **options}
    with pytest.raises(InvalidInput) as refused:
        actions.change_limit(options.pop("name"), actor=oncall, **options)
    assert (refused.value.field, refused.value.rule) == (field, rule)
    assert not LimitState.objects.filter(overridden=True).exists()
    assert operator_events() == []


@pytest.mark.django_db
def test_people_without_the_permission_are_refused_and_nothing_changes(
    flow: str, editor: User, auditor: User
) -> None:
    enqueue("acme")
    for person in (editor, auditor):
        with pytest.raises(NotPermitted):
            actions.change_limit("acts_customers", actor=person, reason="r", concurrency=5, rate="")
        with pytest.raises(NotPermitted):
            actions.pause_key("acts_customers", "acme", actor=person, reason="r")
    assert operator_events() == []
    assert not LimitKey.objects.exclude(paused_at=None).exists()


@pytest.mark.django_db
def test_a_paused_key_waits_while_others_run_and_resuming_lets_it_in(
    flow: str, oncall: User
) -> None:
    acme, globex = enqueue("acme"), enqueue("globex")
    actions.pause_key("acts_customers", "acme", actor=oncall, reason="acme asked us to stop")
    # Twice is once: the second changes nothing and records nothing.
    actions.pause_key("acts_customers", "acme", actor=oncall, reason="again")
    assert claim() == [globex.pk]
    refused = holding(Step.objects.get(pk=acme.pk).limits)
    assert refused is not None and (refused.why, refused.key) == (PAUSED, "acme")
    paused = {key.key: key for key in use_of("acts_customers").keys}["acme"]
    assert (paused.paused_by, paused.paused_reason) == (oncall.username, "acme asked us to stop")
    actions.resume_key("acts_customers", "acme", actor=oncall, reason="acme is ready")
    assert claim() == [acme.pk]
    assert [(kind, data["key"]) for kind, _, _, data in operator_events()] == [
        (EventKind.LIMIT_KEY_PAUSED, "acme"),
        (EventKind.LIMIT_KEY_RESUMED, "acme"),
    ]
    with pytest.raises(InvalidInput) as refused_key:
        actions.pause_key("acts_calls", "acme", actor=oncall, reason="r")
    assert refused_key.value.field == "key"


@pytest.mark.django_db
def test_a_remotes_retry_after_holds_the_keys_and_the_steps_behind_spend_nothing(
    flow: str,
) -> None:
    first, behind = enqueue("acme"), enqueue("globex")
    SLOW_DOWN["retry_after"] = 120
    before = db_now()
    assert runner.run_claimed(first.pk)
    step = Step.objects.get(pk=first.pk)
    assert (step.status, step.attempts, step.error_class) == (
        StepStatus.PENDING,
        1,
        "tasks_app.exceptions.RateLimited",
    )
    assert step.available_at is not None
    assert timedelta(seconds=119) <= step.available_at - before <= timedelta(seconds=121)
    held = LimitKey.objects.get(limit="acts_calls", key="")
    assert held.held_until is not None and held.held_until - before >= timedelta(seconds=119)
    # The other customer's step is under the held rate too: it waits, unclaimed.
    assert claim() == []
    refused = holding(Step.objects.get(pk=behind.pk).limits)
    assert refused is not None and (refused.why, refused.until) == (HELD, held.held_until)
    assert Step.objects.get(pk=behind.pk).attempts == 0
    LimitKey.objects.update(held_until=db_now() - timedelta(seconds=1))
    refill_rate()
    assert claim() == [behind.pk]
    finish([behind.pk])


@pytest.mark.django_db
def test_a_limits_totals_count_every_key_and_it_lists_those_at_their_limit_first(
    flow: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limit_use, "MAX_KEYS", 2)
    held = [enqueue("acme"), enqueue("acme")]
    for n in range(4):
        enqueue(f"quiet{n}")
    assert claim(limit=1) == [held[0].pk]
    customers = use_of("acts_customers")
    assert (customers.running, customers.waiting, customers.active_keys) == (1, 5, 5)
    assert customers.more_keys == 3
    listed = [key.key for key in customers.keys]
    assert len(listed) == 2 and listed[0] == "acme" and customers.keys[0].at_concurrency


@pytest.fixture
def weighted() -> Iterator[str]:
    """One step spending its payload's ``cost`` of five units a minute."""
    name = "test.limit_actions.weighted"
    register(
        Workflow(
            name,
            1,
            steps=(StepSpec("call", _call),),
            limits=(Limit("acts_tokens", rate="5/m", weight="cost"),),
        )
    )
    yield name
    registry.unregister(name, 1)


@pytest.mark.django_db
def test_a_step_too_heavy_for_what_the_rate_has_left_is_counted_as_waiting_on_it(
    weighted: str,
) -> None:
    """Four of five units spent: a step of three waits on the rate though a unit is left,
    as its task page says, and the Overview and the Limits page count it so."""
    heavy, light, heavier = (
        only_step(services.enqueue(weighted, {"cost": cost}).task) for cost in (3, 1, 3)
    )
    refill_rate()
    assert claim() == [heavy.pk, light.pk]
    refused = holding(Step.objects.get(pk=heavier.pk).limits)
    assert refused is not None and (refused.why, refused.limit) == (AT_RATE, "acts_tokens")
    [key] = use_of("acts_tokens").keys
    assert (key.spent, key.waiting, key.waiting_weights) == (4, 1, ((3, 1),))
    assert key.at_rate and key.waiting_on_rate == 1
    assert key.next_free == refused.until
    [count] = [c for c in why_counts.waiting() if c.subject == "acts_tokens"]
    assert (count.kind, count.steps) == ("limit_rate", 1)
