"""The graph drill's workflows (``tests/chaos/test_graph_drill.py``), two shapes of the same
work: ``start``, then :data:`WIDTH` runs in parallel, each writing once to the publishing
remote (which honours idempotency keys), then ``join``, which waits for all of them, checks
what it got and records its own run with one more write.

- ``chaos.fan_out`` declares its :data:`WIDTH` branches (``branch_0`` ..), and its join
  checks each branch's result by name;
- ``chaos.fan_out_items`` declares one step, ``branch``, that fans out at run time over the
  :data:`ITEMS` ``start`` gives, one row per item, and its join checks it got their results
  as one list in item order.

Each write's answer comes back :data:`ANSWER_SECONDS` after the remote applied it, so a
worker killed in that window leaves the write applied and its ledger row ``started``: the
next attempt calls again with the same key, and the remote applies it once.

Loaded into the drill's Celery workers with ``-I tests.chaos.graph_workflow``, so they
register there on import. The drill's own process imports it inside a fixture, which
registers them for the drill and unregisters them after (``make test`` collects the drill
module too, and leaves the registry as it found it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.conf import settings

from approvals import remote
from tasks_app.exceptions import PermanentError
from tasks_app.workflows import Handler, StepContext, StepSpec, Workflow, register

MODULE = __name__
NAME = "chaos.fan_out"
ITEMS_NAME = "chaos.fan_out_items"
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


def step(
    kind: str,
    handler: Handler,
    after: tuple[str, ...],
    *,
    fan_out: Callable[[Mapping[str, Any]], Sequence[Any]] | None = None,
    max_items: int = 100,
) -> StepSpec:
    return StepSpec(
        kind,
        handler,
        after=after,
        max_attempts=ATTEMPTS,
        backoff_base=0.1,
        backoff_cap=1.0,
        fan_out=fan_out,
        max_items=max_items,
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


# --- the same work fanned out at run time ----------------------------------------------------

# The fan-out's items, as many as the declared branches: both shapes make 12 rows a task.
ITEMS = tuple(f"item_{n}" for n in range(WIDTH))
ITEM_KIND = "branch"


def start_items(ctx: StepContext) -> dict[str, Any]:
    return {"task": ctx.task_id, "items": list(ITEMS)}


def items_of(results: Mapping[str, Any]) -> list[str]:
    return list(results["start"]["items"])


def item(ctx: StepContext) -> dict[str, Any]:
    # An item sees what the fan-out waits for, never another item's result, and gets the
    # item its index names, on every attempt (a run after a kill asks for it again).
    if dict(ctx.results) != {"start": {"task": ctx.task_id, "items": list(ITEMS)}}:
        raise PermanentError(f"item {ctx.item_index} got results {sorted(ctx.results)}")
    if ctx.item != f"item_{ctx.item_index}":
        raise PermanentError(f"item {ctx.item_index} got the item {ctx.item!r}")
    time.sleep(BEFORE_SECONDS)
    answer = write(ctx, "write", {"task": ctx.task_id, "step": ITEM_KIND, "item": ctx.item})
    return {"item": ctx.item, "remote_id": answer["id"]}


def join_items(ctx: StepContext) -> dict[str, Any]:
    got = ctx.results.get(ITEM_KIND)
    named = [(result or {}).get("item") for result in got] if isinstance(got, list) else got
    if named != list(ITEMS):
        raise PermanentError(f"join expected the items {list(ITEMS)} in order: got {named}")
    answer = write(ctx, "record", {"task": ctx.task_id, "step": "join", "joined": len(named)})
    return {"joined": named, "remote_id": answer["id"]}


FAN_OUT = Workflow(
    ITEMS_NAME,
    1,
    steps=(
        step("start", start_items, ()),
        # The bound met exactly: one item too many for it would be refused, and the task dead.
        step(ITEM_KIND, item, ("start",), fan_out=items_of, max_items=WIDTH),
        step("join", join_items, (ITEM_KIND,)),
    ),
    description=f"The graph drill fanned out at run time: start, {WIDTH} items, a join.",
)

# Per workflow, the kinds of the steps its join waits for, whose rows each write once.
FLOWS = (DRILL, FAN_OUT)
BRANCH_KINDS = {NAME: KINDS, ITEMS_NAME: (ITEM_KIND,)}

register(DRILL)
register(FAN_OUT)
