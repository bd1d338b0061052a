"""US/LIM in the drain cell: the workflow ``bench.limited``, ``demo.noop``'s one step that
returns at once, under two limits set far above what any machine does (10,000 at once per
key over four keys, 1,000,000 claims a second), so that none of them ever holds a step
back and the drain measures only what the limits' bookkeeping costs each claim (the claim
lock, the running counts, the rate windows, the turns; ``tasks_app.engine.limited_claims``).

Loaded into US/LIM's Celery workers with ``-I bench.limited_workflow`` and imported by its
producer (``bench/producer.py``) after Django is set up.
"""

from __future__ import annotations

from typing import Any

from tasks_app.engine.limits import Limit
from tasks_app.workflows import StepContext, StepSpec, Workflow, register

WORKFLOW = "bench.limited"
# The partition keys the producer spreads the tasks over, in turn.
KEYS = 4
PER_KEY = Limit("bench_per_key", concurrency=10_000, key="key")
RATE = Limit("bench_rate", rate="1000000/s")


def noop(ctx: StepContext) -> dict[str, Any]:
    return {}


def payload(seq: int) -> dict[str, Any]:
    """The ``seq``-th task's payload: its partition key."""
    return {"key": f"k{seq % KEYS}"}


register(
    Workflow(
        WORKFLOW,
        1,
        steps=(StepSpec("noop", noop),),
        limits=(PER_KEY, RATE),
        description="demo.noop under limits far above the machine: their bookkeeping alone.",
    )
)
