"""Retry delays: capped exponential backoff with full jitter (``StepSpec.backoff``).

The delay after attempt ``n`` is drawn uniformly from ``[0, min(cap, base * 2**(n-1))]``:
never outside those bounds, capped however many attempts came before, and spread over the
whole range rather than fixed. The worker records each drawn delay as ``retry_in`` on its
``retry_scheduled`` event, within the bound for that attempt.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks_app import services
from tasks_app.demo.workflows import flaky
from tasks_app.engine import runner
from tasks_app.models import Event, EventKind, StepStatus, TaskStatus
from tasks_app.workflows import StepSpec, registry
from tests.conftest import backdate, only_step

# ``2 ** (attempt - 1)`` is an int; past 2**1023 it no longer converts to a float.
MAX_FLOAT_ATTEMPT = 1024
DRAWS = 2_000


def handler(ctx: Any) -> None:
    return None


def ceiling(spec: StepSpec, attempt: int) -> float:
    """The documented bound: ``min(cap, base * 2**(attempt-1))`` (attempt 1 waits up to base)."""
    return float(min(spec.backoff_cap, spec.backoff_base * 2 ** max(attempt - 1, 0)))


@st.composite
def specs(draw: st.DrawFn, min_base: float = 0) -> StepSpec:
    base = draw(st.floats(min_value=min_base, max_value=60, allow_nan=False, allow_infinity=False))
    extra = draw(st.floats(min_value=0, max_value=3600, allow_nan=False, allow_infinity=False))
    return StepSpec("retry", handler, backoff_base=base, backoff_cap=base + extra)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(
    spec=specs(),
    attempt=st.integers(min_value=1, max_value=MAX_FLOAT_ATTEMPT),
    seed=st.integers(min_value=0, max_value=2**64),
)
def test_every_delay_is_within_zero_and_the_capped_exponential_bound(
    spec: StepSpec, attempt: int, seed: int
) -> None:
    rng = random.Random(seed)
    bound = ceiling(spec, attempt)
    assert 0 <= bound <= spec.backoff_cap
    for _ in range(20):
        delay = spec.backoff(attempt, rng)
        assert 0 <= delay <= bound


@settings(max_examples=100, derandomize=True, deadline=None)
@given(
    spec=specs(min_base=0.001),
    attempt=st.integers(min_value=64, max_value=MAX_FLOAT_ATTEMPT),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_the_cap_holds_however_many_attempts_came_before(
    spec: StepSpec, attempt: int, seed: int
) -> None:
    # 2**63 times a base of 0.001 or more is past every cap drawn here: the bound is the cap.
    rng = random.Random(seed)
    assert ceiling(spec, attempt) == spec.backoff_cap
    assert all(0 <= spec.backoff(attempt, rng) <= spec.backoff_cap for _ in range(20))


@pytest.mark.parametrize("attempt", [MAX_FLOAT_ATTEMPT + 1, 10_000])
def test_the_cap_holds_past_the_float_range_of_the_exponent(attempt: int) -> None:
    spec = StepSpec("retry", handler, backoff_base=0.1, backoff_cap=1.0)
    assert 0 <= spec.backoff(attempt, random.Random(attempt)) <= 1.0


@pytest.mark.parametrize("attempt", [1, 2, 3, 4, 5, 12, 40])
@pytest.mark.parametrize(("base", "cap"), [(0.1, 1.0), (1.0, 300.0), (2.5, 30.0)])
def test_delays_spread_over_the_whole_range_full_jitter(
    attempt: int, base: float, cap: float
) -> None:
    spec = StepSpec("retry", handler, backoff_base=base, backoff_cap=cap)
    bound = ceiling(spec, attempt)
    rng = random.Random(f"{attempt}:{base}:{cap}")
    delays = [spec.backoff(attempt, rng) for _ in range(DRAWS)]

    assert all(0 <= d <= bound for d in delays)
    # Uniform on [0, bound]: mean bound/2 (its standard error is under 0.7 % of bound).
    assert abs(sum(delays) / DRAWS - bound / 2) <= 0.05 * bound
    assert min(delays) <= 0.01 * bound
    assert max(delays) >= 0.99 * bound
    # Every tenth of the range is used about as often as the others: not a fixed delay.
    tenths = [0] * 10
    for d in delays:
        tenths[min(int(d / bound * 10), 9)] += 1
    assert all(DRAWS / 10 * 0.7 <= n <= DRAWS / 10 * 1.3 for n in tenths), tenths
    assert len(set(delays)) == DRAWS


def test_the_module_random_is_used_without_an_rng() -> None:
    spec = StepSpec("retry", handler, backoff_base=0.1, backoff_cap=1.0)
    delays = {spec.backoff(3) for _ in range(200)}
    assert all(0 <= d <= 0.4 for d in delays)
    assert len(delays) > 100


def test_backoff_is_capped_exponential_with_full_jitter() -> None:
    spec = StepSpec("x", flaky, backoff_base=1.0, backoff_cap=300.0)
    ceilings = [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]
    rng, twin = random.Random(42), random.Random(42)
    for attempt, ceiling in enumerate(ceilings, start=1):
        delay = spec.backoff(attempt, rng)
        assert 0 <= delay <= ceiling
        # Full jitter: uniform over the whole range up to the capped ceiling.
        assert delay == twin.uniform(0, ceiling)

    for attempt, ceiling in enumerate(ceilings, start=1):
        delays = [spec.backoff(attempt, rng) for _ in range(500)]
        assert max(delays) <= ceiling
        assert max(delays) > 0.9 * ceiling
        assert min(delays) < 0.1 * ceiling


def test_backoff_never_exceeds_the_cap_even_for_huge_attempt_numbers() -> None:
    spec = StepSpec("x", flaky, backoff_base=0.1, backoff_cap=1.0)
    rng = random.Random(7)
    assert all(0 <= spec.backoff(attempt, rng) <= 1.0 for attempt in (11, 50, 1000))


@pytest.mark.django_db
def test_a_flaky_task_records_each_retry_within_the_bound_for_its_attempt() -> None:
    """demo.flaky (3 attempts, base 0.1 s, cap 1 s) failing on its first 7 claims: two
    retries, dead, redriven, two retries, dead, redriven, one retry, then success."""
    fail_first = 7
    flow = registry.latest("demo.flaky")
    spec = flow.steps[0]
    task = services.enqueue("demo.flaky", {"fail_first": fail_first}).task
    step = only_step(task)

    claims = 0
    while True:
        backdate(step)
        assert runner.run_claimed(step.pk)
        claims += 1
        step.refresh_from_db()
        if step.status == StepStatus.DEAD:
            services.redrive(task, actor="cli:backoff-test", reason="once more")
            continue
        if step.status == StepStatus.SUCCEEDED:
            break
        assert step.status == StepStatus.PENDING
        assert claims < 20
    assert claims == fail_first + 1
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED

    retries = list(
        Event.objects.filter(task_id=task.pk, kind=EventKind.RETRY_SCHEDULED).order_by("pk")
    )
    # Claims 1, 2, 4, 5 and 7 were retried; 3 and 6 were the last of their budget.
    attempts = [event.data["steps"][str(step.pk)][1] for event in retries]
    assert attempts == [1, 2, 1, 2, 1]
    for event, attempt in zip(retries, attempts, strict=True):
        retry_in = event.data["retry_in"]
        assert isinstance(retry_in, float)
        assert 0 <= retry_in <= ceiling(spec, attempt) <= spec.backoff_cap
    assert len({event.data["retry_in"] for event in retries}) == len(retries)
    dead = Event.objects.filter(task_id=task.pk, kind=EventKind.DEAD_LETTERED)
    assert [event.data["retry_in"] for event in dead] == [None, None]
