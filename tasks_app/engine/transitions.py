"""The pieces the engine's paths share: which path runs (the fast path's SQL or the ORM),
locking a task, a step's place in its workflow (an approval step or not), a queue's pause,
a task's current steps, and what a handler is given."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q

from tasks_app.engine import fan_outs
from tasks_app.engine.effects import Effects
from tasks_app.engine.workflows import StepContext, registry
from tasks_app.history import counting
from tasks_app.models import (
    QueueState,
    Step,
    StepStatus,
    Task,
    graphs,
)


def fast_path_enabled() -> bool:
    """Whether the hot paths run their PostgreSQL statements (``tasks_app.engine.fastpath``) or the
    ORM code they restate. The one switch: PostgreSQL with ``TASKS_SQL_FAST_PATH`` on (the
    default); off, PostgreSQL runs the same ORM code as the embedded SQLite mode, so the
    tests exercise that code in-process."""
    return connection.vendor == "postgresql" and bool(settings.TASKS_SQL_FAST_PATH)


def bump_counter(name: str, by: int = 1) -> None:
    """Add to a metrics counter in its own transaction."""
    if by <= 0:
        return
    with transaction.atomic():
        counting.upsert({name: by})


def current_steps(task: Task) -> list[Step]:
    return list(Step.objects.filter(task=task).current().order_by("position", "revision", "item"))


def lock_task(task_id: int) -> Task:
    """Lock a task row: every transition of a task takes this lock first."""
    return Task.objects.select_for_update().get(pk=task_id)


def try_lock_task(task_id: int) -> Task | None:
    """Lock a task row unless another transaction holds it (then ``None``): for the
    sweeper, which must never wait on a row a person or a worker holds. It tries again at
    the next sweep."""
    return Task.objects.select_for_update(skip_locked=True).filter(pk=task_id).first()


def completes_alone(task: Task, step: Step) -> bool:
    """Whether a success of ``step`` is recorded by itself (``leases.complete_step``)
    rather than in a batch by the fast path's SQL, which knows lines only: a step of a
    graph (what follows depends on its branches), and one whose success reaches an
    approval step, which opens a request in the same transaction (the one-by-one path's
    :func:`after_success`)."""
    return step.after is not None or is_approval(task, step.position + 1)


def is_approval(task: Task, position: int) -> bool:
    """Whether the step at ``position`` of the task's workflow version is one a person
    decides (never claimed: opened when the task reaches it)."""
    flow = registry.get(task.workflow, task.workflow_version)
    spec = flow.step(position) if flow is not None else None
    return spec is not None and spec.approval


def paused_filter() -> Q:
    return Q(queue__in=QueueState.objects.filter(paused=True).values("name"))


def step_inputs(task: Task, step: Step) -> dict[str, Any]:
    """The results, by kind, of the steps ``step`` waits for, directly or not (current
    rows): a handler's ``ctx.results``. In a line, every step before it; in a graph, its
    branches and what they waited for, never a parallel branch's. A fan-out's results come
    as one list (``fan_outs.results_of``)."""
    if graphs.is_root(step.position, step.after):
        return {}
    earlier = task.steps.current().filter(status=StepStatus.SUCCEEDED)
    if step.after is None:
        earlier = earlier.filter(position__lt=step.position)
    else:
        rows = list(task.steps.current().only("position", "after", "status"))
        earlier = earlier.filter(position__in=graphs.ancestors(rows, step.position))
    by_kind: dict[str, list[Step]] = {}
    for row in earlier.order_by("position", "revision", "item").only(
        "kind", "result", "position", "item", "attempts"
    ):
        by_kind.setdefault(row.kind, []).append(row)
    flow = registry.get(task.workflow, task.workflow_version)
    results: dict[str, Any] = {}
    for kind, found in by_kind.items():
        spec = flow.step(found[0].position) if flow is not None else None
        fanned = spec is not None and spec.fan_out is not None
        results[kind] = fan_outs.results_of(found) if fanned else found[-1].result
    return results


def step_context(
    task: Task, step: Step, *, attempt: int, token: int, timeout: float | None = None
) -> StepContext:
    """What a handler gets: the payload, earlier results, its place in the retry story, the
    effects ledger fenced by ``token``, and the request for changes it answers, if any."""
    return StepContext(
        task_id=task.pk,
        step_id=step.pk,
        payload=task.payload,
        results=step_inputs(task, step),
        attempt=attempt,
        fencing_token=token,
        step_key=step.idempotency_key,
        effects=Effects(step_id=step.pk, step_key=step.idempotency_key, fencing_token=token),
        timeout=timeout,
        revision=step.revision,
        change_request=step.change_request,
    )
