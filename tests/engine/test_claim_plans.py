"""The hot path's statements are planned once per connection, not at every call: each is a
prepared statement PostgreSQL can run on its generic plan (a claim's plan cost 0.7-1.5 ms,
as much as the rest of a small claim)."""

from __future__ import annotations

import pytest
from django.db import connection

from tasks_app import services
from tasks_app.engine import fastpath

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="prepared statements are PostgreSQL's"
)

CALLS = 12


def plans() -> list[tuple[str, int, int]]:
    """Each prepared statement (its words on one line) with its generic and custom plans."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
        return [(" ".join(sql.split()), generic, custom) for sql, generic, custom in cursor]


def test_claims_and_completions_run_on_generic_plans(db: None) -> None:
    services.enqueue_many([{"workflow": "demo.noop", "payload": {}} for _ in range(CALLS * 6)])
    for size in (4, 2):
        for _ in range(CALLS):
            claims = fastpath.claim_batch(worker_id="w", limit=size, queue="default")
            assert len(claims) == size
            fastpath.complete_many([(claim, None) for claim in claims])

    found = plans()
    claims_ = [(g, c) for sql, g, c in found if sql.startswith("WITH target AS")]
    completions = [(g, c) for sql, g, c in found if "released AS" in sql]
    assert len(completions) == 1
    assert len(claims_) == 2  # one statement per batch size
    for generic, custom in [*claims_, *completions]:
        # PostgreSQL plans the first five calls for their values, then keeps the generic
        # plan when it costs no more than theirs.
        assert custom <= 5 and generic >= CALLS - 5
