"""The graph drill's workflow (``tests/chaos/test_graph_drill.py``): ``chaos.fan_out``,
``start``, then :data:`WIDTH` branches in parallel, each writing once to the publishing
remote (which honours idempotency keys), then ``join``, which waits for all of them, checks
it got each branch's result by name and records its own run with one more write.

Each write's answer comes back :data:`ANSWER_SECONDS` after the remote applied it, so a
worker killed in that window leaves the write applied and its ledger row ``started``: the
next attempt calls again with the same key, and the remote applies it once.

Loaded into the drill's Celery workers with ``-I tests.chaos.graph_workflow``, so it
registers there on import. The drill's own process imports it inside a fixture, which
registers it for the drill and unregisters it after (``make test`` collects the drill
module too, and leaves the registry as it found it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.conf import settings

from approvals import remote
from tasks_app.exceptions import PermanentError
from tasks_app.workflows import Handler, StepContext, StepSpec, Workflow, register

MODULE = __name__
NAME = "chaos.fan_out"
WIDTH = 10
# A handler's time before its write, and the write's answer's time on the way back. Short:
# the drill runs 200 tasks of 12 steps on a shared 2-CPU machine, and a kill needs only a window
# to land in, which the drill waits for (it reads the ledger and the remote).
BEFORE_SECONDS = 0.02
ANSWER_SECONDS = 0.1
# Five, not the default three: a whole worker killed charges every step it held an attempt
# when their leases run out, and a step the drill cuts three times is not what it tests.
ATTEMPTS = 5


def write(ctx: StepContext, name: str, body: dict[str, Any]) -> dict[str, Any]:
    """One write to the publishing remote through the effects ledger, answered late."""

    def call(key: str) -> dict[str, Any]:
        answer = remote.post_json(
            settings.PUBLISH_URL,
            body,
            idempotency_key=key,
            honours_key=True,
            token=settings.PUBLISH_TOKEN,
        )
        # Applied by now; the ledger records it only once this returns.
        time.sleep(ANSWER_SECONDS)
        return answer

    return ctx.effects.run(name, call, idempotent_remote=True)


def start(ctx: StepContext) -> dict[str, Any]:
    return {"task": ctx.task_id}


def branch(kind: str) -> Callable[[StepContext], dict[str, Any]]:
    def run(ctx: StepContext) -> dict[str, Any]:
        # A branch sees what it waits for, never a parallel branch's result.
        if dict(ctx.results) != {"start": {"task": ctx.task_id}}:
            raise PermanentError(f"{kind} got results {sorted(ctx.results)}")
        time.sleep(BEFORE_SECONDS)
        answer = write(ctx, "write", {"task": ctx.task_id, "step": kind})
        return {"branch": kind, "remote_id": answer["id"]}

    return run


def join(ctx: StepContext) -> dict[str, Any]:
    missing = [kind for kind in KINDS if (ctx.results.get(kind) or {}).get("branch") != kind]
    if missing:
        raise PermanentError(f"join is missing the results of {missing}: got {dict(ctx.results)}")
    answer = write(ctx, "record", {"task": ctx.task_id, "step": "join", "joined": len(KINDS)})
    return {"joined": list(KINDS), "remote_id": answer["id"]}


def step(kind: str, handler: Handler, after: tuple[str, ...]) -> StepSpec:
    return StepSpec(
        kind, handler, after=after, max_attempts=ATTEMPTS, backoff_base=0.1, backoff_cap=1.0
    )


def branch_steps(width: int) -> tuple[StepSpec, ...]:
    """``branch_0`` .. ``branch_<width - 1>``, each waiting for ``start`` alone."""
    return tuple(step(f"branch_{n}", branch(f"branch_{n}"), ("start",)) for n in range(width))


BRANCHES = branch_steps(WIDTH)
KINDS = tuple(spec.kind for spec in BRANCHES)

DRILL = Workflow(
    NAME,
    1,
    steps=(step("start", start, ()), *BRANCHES, step("join", join, KINDS)),
    description=f"The graph drill: start, {WIDTH} branches writing once each, a join.",
)

register(DRILL)
