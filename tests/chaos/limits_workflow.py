"""The flow-control drill's workflow (``tests/chaos/test_limits_drill.py``): ``drill.limited``,
one step under two limits, five at once per customer and 200 claims a second overall,
whose handler sleeps the payload's ``sleep`` seconds, long enough for the limits to bind.

Loaded into the drill's Celery workers with ``-I tests.chaos.limits_workflow``, so it
registers there on import. The drill's own process imports it inside a fixture, which
registers it for the drill and unregisters it after: ``make test`` collects the drill
module too, and a workflow under limits left registered would change the claims of every
other test in the run.
"""

from __future__ import annotations

import time
from typing import Any

from tasks_app.engine.limits import Limit
from tasks_app.workflows import StepContext, StepSpec, Workflow, register

MODULE = __name__
NAME = "drill.limited"
PER_KEY = Limit("drill_per_key", concurrency=5, key="customer")
RATE = Limit("drill_rate", rate="200/s")


def call(ctx: StepContext) -> dict[str, Any]:
    # The work itself: a remote call's time, spent while the step holds its slot.
    time.sleep(float(ctx.payload["sleep"]))
    return {}


DRILL = Workflow(
    NAME,
    1,
    steps=(StepSpec("call", call, limits=(PER_KEY, RATE)),),
    description="The flow-control drill: one step, 5 at once per customer, 200/s overall.",
)

register(DRILL)
