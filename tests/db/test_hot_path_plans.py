"""The hot path's statements reach their rows the way that stays cheap as history grows:
a completion finds its steps by primary key, never through ``step_lease_idx``, whose
entries for steps finished since the last vacuum a bitmap scan visits every time (it does
not mark dead entries, as an index scan does), so each completion of a long drain cost
more than the one before; and the look for due steps under limits reads their index in its
order, never the table from its start."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection, transaction

from tasks_app import services
from tasks_app.engine import fastpath
from tasks_app.engine.limits import Limit
from tasks_app.engine.sql import COMPLETE_SQL, LIMITED_DUE_SQL
from tasks_app.workflows import StepSpec, Workflow, register, registry

pytestmark = pytest.mark.django_db


def plan(sql: str, params: dict[str, Any]) -> str:
    """The plan PostgreSQL chooses for ``sql`` (not run), as JSON text."""
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        return json.dumps(cursor.fetchone()[0])


def test_a_completion_finds_its_steps_by_primary_key() -> None:
    services.enqueue_many([{"workflow": "demo.noop", "payload": {"n": n}} for n in range(300)])
    # The statistics as a drain's start leaves them: nothing running.
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE tasks_app_step")
    with transaction.atomic():
        claims = fastpath.claim_batch(worker_id="w1", limit=50, queue="default")
    assert len(claims) == 50

    chosen = plan(
        COMPLETE_SQL,
        fastpath.completion_params([(claim, None) for claim in claims], cancelled=False),
    )

    assert "step_lease_idx" not in chosen
    assert "tasks_app_step_pkey" in chosen


def _ok(ctx: Any) -> dict[str, Any]:
    return {}


def test_the_look_for_due_steps_under_limits_reads_their_index() -> None:
    """Planned as the statistics of a backlog under limits have it (every row due), a look
    that could take any row scanned the table from its start, past every step already run."""
    register(
        Workflow(
            "test.plans_limited",
            1,
            steps=(StepSpec("send", _ok),),
            limits=(Limit("plans_rate", rate="1000/s"),),
        )
    )
    try:
        services.enqueue_many(
            [{"workflow": "test.plans_limited", "payload": {"n": n}} for n in range(300)]
        )
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE tasks_app_step")
            cursor.execute(f"EXPLAIN (FORMAT JSON) {LIMITED_DUE_SQL}", ["default"])
            chosen = json.dumps(cursor.fetchone()[0])
    finally:
        registry.unregister("test.plans_limited", 1)

    assert "step_limited_due_idx" in chosen
    assert "Seq Scan" not in chosen
