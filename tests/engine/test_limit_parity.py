"""The claim under limits takes its admitted steps by one statement on PostgreSQL
(``sql.CLAIM_IDS_SQL``) or by the ORM code it restates (``limited_claims._take``, the
embedded mode's): one story played through each leaves the same rows.

Each story runs in a transaction rolled back once its rows are read, so both start from the
same limits and keys; ids and times are normalised (``tests.parity_support.snapshot``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from tasks_app import services
from tasks_app.engine import limit_keys
from tasks_app.engine.limits import Limit
from tasks_app.models import LimitKey, LimitState, Step
from tasks_app.workflows import StepSpec, Workflow, register, registry
from tests.conftest import only_step
from tests.limit_support import HELD, claim, finish, refill_rate
from tests.parity_support import assert_same, snapshot

LIMITED = "test.limit_parity"


def _ok(ctx: Any) -> dict[str, Any]:
    return {"sent": ctx.payload["customer"]}


@pytest.fixture(autouse=True)
def limited() -> Iterator[None]:
    """Two at once per customer; six units in 30 seconds overall, a step spending its
    payload's ``cost``."""
    register(
        Workflow(
            LIMITED,
            1,
            steps=(StepSpec("send", _ok),),
            limits=(
                Limit("parity_customers", concurrency=2, key="customer"),
                Limit("parity_sends", rate="6/30s", weight="cost"),
            ),
        )
    )
    yield
    registry.unregister(LIMITED, 1)


class _Undo(Exception):
    """Rolls a story back once its rows are read."""


def _story(fast: bool, settings: Any) -> dict[str, Any]:
    """Nine steps over five customers, one customer's key paused and one's held by a
    remote's retry-after; two claims, one step finished and the rate's period over between
    them."""
    settings.TASKS_SQL_FAST_PATH = fast
    read: dict[str, Any] = {}
    try:
        with transaction.atomic():
            plan = [("acme", 1)] * 4 + [("globex", 1), ("initech", 3), ("globex", 1)]
            plan += [("hooli", 1), ("stark", 1)]
            steps = [
                only_step(services.enqueue(LIMITED, {"customer": c, "cost": n}).task)
                for c, n in plan
            ]
            place = {step.pk: index for index, step in enumerate(steps)}
            LimitKey.objects.filter(limit="parity_customers", key="hooli").update(
                paused_at=timezone.now()
            )
            limit_keys.hold([("parity_customers", "stark", 1)], 3600, "429 from the remote")
            refill_rate()
            first = claim(limit=5)
            claims = [HELD[pk] for pk in first]
            finish(first[:1])
            refill_rate()
            second = claim(limit=5)
            claims += [HELD.pop(pk) for pk in second]
            HELD.clear()
            read = {
                "claimed": [[place[pk] for pk in first], [place[pk] for pk in second]],
                "claims": [
                    (place[c.step_id], c.token, c.attempt, c.queue, c.lease_seconds) for c in claims
                ],
                "claimed_rows": [
                    (place[c.step_id], c.step.status, c.step.attempts, c.step.task.status)
                    for c in claims
                    if c.step is not None
                ],
                "tasks": [snapshot(step.task) for step in steps],
                "keys": [
                    {
                        "key": (row.limit, row.key),
                        "last_turn": row.last_turn,
                        "spent": sum(row.window.get("spent", ())),
                        "held": row.held_until is not None,
                        "paused": row.paused_at is not None,
                    }
                    for row in LimitKey.objects.order_by("limit", "key")
                ],
                "turns": dict(LimitState.objects.values_list("name", "turn")),
                "pending": sorted(
                    place[pk]
                    for pk in Step.objects.filter(pk__in=place, status="pending").values_list(
                        "pk", flat=True
                    )
                ),
            }
            raise _Undo
    except _Undo:
        pass
    return read


@pytest.mark.django_db
def test_a_claim_under_limits_leaves_the_same_rows_by_its_statement_and_by_the_orm(
    settings: Any,
) -> None:
    by_statement = _story(True, settings)
    by_orm = _story(False, settings)
    # The story reaches every rule. Keys take turns (acme 1-4, globex 1-2, initech 1): the
    # first claim takes four steps worth six units, and refuses globex's second by the rate
    # and acme's third and fourth by concurrency; with acme's first done and the rate's
    # period over, the second takes those two in turn and refuses acme's fourth again. The
    # paused and the held customer's steps wait through both.
    assert by_statement["claimed"] == [[0, 4, 5, 1], [6, 2]]
    assert by_statement["pending"] == [3, 7, 8]
    assert_same(by_orm, by_statement, names=("the ORM", "the statement"))
