"""US in the faults cell: the workflow ``bench.effect``, one step that applies an external
effect through the product's effects ledger, keyed by its step key, to the fake remote of
``bench/fake_remote.py`` (which applies every call it gets, so the ledger is told the remote
honours no key: ``idempotent_remote=False``).

Loaded into the faults cell's Celery workers with ``-I bench.effect_workflow`` and imported
by its producer (``bench/phase_producer.py``) after Django is set up.
"""

from __future__ import annotations

import time
from typing import Any

from bench import fake_remote
from tasks_app.workflows import StepContext, StepSpec, Workflow, register

WORKFLOW = "bench.effect"


def apply_effect(ctx: StepContext) -> dict[str, Any]:
    fake_remote.record_run(ctx.task_id)
    answer = ctx.effects.run("apply", fake_remote.apply, idempotent_remote=False)
    time.sleep(fake_remote.WORK_SECONDS)
    return {"applied": answer["applied"]}


register(
    Workflow(
        WORKFLOW,
        1,
        # As many attempts as repeated kills may cost a step, retried at once as the peers
        # retry theirs.
        steps=(
            StepSpec("apply", apply_effect, max_attempts=10, backoff_base=0.1, backoff_cap=1.0),
        ),
        description="Applies one effect to the bench's fake remote, through the ledger.",
    )
)
