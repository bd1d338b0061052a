"""Claiming and finishing steps under limits in tests, and moving a rate's period on
(``tasks_app.engine.limited_claims``): time moves by back-dating the windows."""

from __future__ import annotations

from typing import Any

from tasks_app.engine import fastpath
from tasks_app.engine.limit_standing import SLICES
from tasks_app.models import LimitKey
from tasks_app.services import Claim
from tests.lease_support import WORKER

# The claims taken, by step id, for finish() to complete.
HELD: dict[int, Claim] = {}


def claim(limit: int = 50, **options: Any) -> list[int]:
    options.setdefault("queue", "default")
    claims = fastpath.claim_batch(worker_id=WORKER, limit=limit, **options)
    HELD.update({c.step_id: c for c in claims})
    return [c.step_id for c in claims]


def finish(step_ids: list[int]) -> None:
    fastpath.complete_many([(HELD.pop(pk), {}) for pk in step_ids])


def refill_rate() -> None:
    """A period later: every rate window's spend has left it."""
    for row in LimitKey.objects.exclude(window={}):
        window = dict(row.window)
        window["slice"] -= SLICES + 1
        LimitKey.objects.filter(pk=row.pk).update(window=window)
