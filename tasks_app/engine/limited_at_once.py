"""The claim under limits in one round trip (PostgreSQL's fast path): the database function
``tasks_app_claim_limited`` (migrations 0031 and 0032) takes the claims' lock, admits the
due steps in claim order up to the first the limits refuse, claims them and books their
spends and turns. Where it stops short of the batch at a refusal, ``limited_claims.claim``
goes on with its own decision, the rules' home, which weighs the steps past the refusal
and says when a rate lets the queue in again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from tasks_app.db.hot_cursor import hot_cursor
from tasks_app.engine.leases import Claim, claimed_steps
from tasks_app.engine.limits import configured, declared
from tasks_app.engine.sql import STEP_COLUMNS, TASK_COLUMNS

# ORM twin: limited_claims._claim_weighing, as far as the first refusal. The claimed rows,
# in the order admitted, as the claim statements return them; then one row with no step
# that says whether the claim is decided, and whether the named step was alone.
CLAIM_SQL = f"""
SELECT {", ".join(f"(r.claimed_step).{name}" for name in STEP_COLUMNS)},
    {", ".join(f"(r.claimed_task).{name}" for name in TASK_COLUMNS)},
    r.decided, r.lone_named
FROM tasks_app_claim_limited(
    %(queue)s, %(step)s, %(only_named)s, %(limit)s, %(size)s, %(lease)s, %(worker)s,
    %(numbers)s::jsonb
) r
"""  # noqa: S608 (the column names are the models', not input)


@dataclass
class Prefix:
    """What the function claimed, whether that decides the claim (the batch is full, or the
    limits refused none of the steps it read), and whether the named step was alone."""

    claims: list[Claim] = field(default_factory=list)
    decided: bool = True
    alone: bool = False


def claim(
    *,
    queue: str | None,
    worker_id: str,
    limit: int,
    lease_seconds: int,
    step_id: int | None,
    only_named: bool,
    size: int,
) -> Prefix:
    """Claim up to ``limit`` due steps under limits, reading ``size`` of them, as far as the
    first the limits refuse."""
    with hot_cursor() as cursor:
        cursor.execute(
            CLAIM_SQL,
            {
                "queue": queue,
                "step": step_id,
                "only_named": only_named,
                "limit": limit,
                "size": size,
                "lease": lease_seconds,
                "worker": worker_id,
                "numbers": _numbers(),
            },
            prepare=True,
        )
        rows = cursor.fetchall()
    *claimed, verdict = rows
    width = len(STEP_COLUMNS) + len(TASK_COLUMNS)
    claims = [
        Claim.of(step, worker_id=worker_id, lease_seconds=lease_seconds, keep=True)
        for step in claimed_steps([row[:width] for row in claimed])
    ]
    decided, lone = verdict[width:]
    return Prefix(claims, bool(decided), bool(lone) and bool(claims))


def _numbers() -> str:
    """The numbers of every limit this worker declares, with ``TASKS_LIMITS`` applied, as
    the function reads them: ``{name: [concurrency, rate count, rate seconds]}``."""
    numbers = {}
    for name, limit in declared().items():
        known = configured(limit)
        rate = known.rate
        numbers[name] = [known.concurrency, rate and rate.count, rate and rate.seconds]
    return json.dumps(numbers)
