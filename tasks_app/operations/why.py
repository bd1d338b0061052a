"""Why isn't this running? What holds back an unfinished task or step, each blocker named
in words with a link, for the task page, the task list, the Overview and ``manage.py why``.

This is the one home of that answer: every surface reads :func:`why_many` (or its forms
for one task and one step) and formats what it returns; none of them restates a rule.
The rules read what the engine decides by: the queue switches, the limits' standing
(``limit_standing.Standing``, as ``limit_use.holding`` reads it for one step), the live
lease on a step row, the pending approval request, the workers' heartbeats, and the
database's clock. They are read once for a whole batch of tasks, so a page of fifty rows
costs about ten queries, not ten per row. The Overview's counts by reason are in
``tasks_app.operations.why_counts``: aggregates, never this per step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.apps import apps
from django.db.models import Count

from tasks_app.db.clock import db_now
from tasks_app.engine import limit_standing, presence
from tasks_app.engine.limit_standing import Refusal, Standing
from tasks_app.exceptions import AWAITING_VERSION, error_summary
from tasks_app.models import (
    ACTIVE_TASK_STATUSES,
    FINAL_STEP_STATUSES,
    QueueState,
    Step,
    StepStatus,
    Task,
    graphs,
)
from tasks_app.operations import limit_use
from tasks_app.operations.why_blockers import (
    AWAITING_VERSION_KIND,
    DUE,
    NO_WORKER,
    QUEUE_PAUSED,
    RETRY,
    RUN_AFTER,
    Blocker,
    Facts,
    approval_blocker,
    dead_blocker,
    earlier_blocker,
    lease_blocker,
    limit_blocker,
)
from tasks_app.operations.why_words import at, because, link, one_line, quoted, sentence, when

__all__ = ["Blocker", "why", "why_many", "why_step"]


# --- the public forms -------------------------------------------------------------------------


def why(task: Task) -> list[Blocker]:
    """What holds ``task`` back now, the step it is at first; [] once it has ended."""
    return why_many([task])[task.pk]


def why_step(step: Step) -> list[Blocker]:
    """What holds one step back now ([] for a step that has ended)."""
    if step.status in FINAL_STEP_STATUSES:
        return []
    before = None
    if step.status == StepStatus.BLOCKED:
        before = waited_for(step, Step.objects.current().filter(task_id=step.task_id))
    facts = _read_facts([step])
    return _step_blockers(step, before, facts)


def why_many(tasks: Iterable[Task]) -> dict[int, list[Blocker]]:
    """:func:`why` for many tasks (a page of the task list) in a few queries: every task
    by id, [] for those that ended."""
    tasks = list(tasks)
    result: dict[int, list[Blocker]] = {task.pk: [] for task in tasks}
    unfinished = [task.pk for task in tasks if task.status in ACTIVE_TASK_STATUSES]
    if not unfinished:
        return result
    rows = (
        Step.objects.current()
        .filter(task_id__in=unfinished)
        .select_related("task")
        .order_by("task_id", "position")
    )
    by_task: dict[int, list[Step]] = {}
    for step in rows:
        by_task.setdefault(step.task_id, []).append(step)
    open_steps = [s for steps in by_task.values() for s in steps if _open(s)]
    facts = _read_facts(open_steps)
    for task_id, steps in by_task.items():
        result[task_id] = _task_blockers(steps, facts)
    return result


def _open(step: Step) -> bool:
    return step.status not in FINAL_STEP_STATUSES and step.status != StepStatus.BLOCKED


def _task_blockers(steps: Sequence[Step], facts: Facts) -> list[Blocker]:
    """The blockers of each step the task is at (sequential steps: one, but a dead step and
    a later one alike are said), then the first step that waits for an earlier one."""
    found: list[Blocker] = []
    for step in steps:
        if _open(step):
            found.extend(_step_blockers(step, None, facts))
    blocked = next((s for s in steps if s.status == StepStatus.BLOCKED), None)
    if blocked is not None:
        found.extend(_step_blockers(blocked, waited_for(blocked, steps), facts))
    return found


def waited_for(blocked: Step, current: Iterable[Step]) -> Step | None:
    """The step ``blocked`` waits for (among its task's ``current`` rows): in a line the
    one before it; in a graph the first of its dependencies that has not succeeded."""
    deps = graphs.waits_for(blocked)
    rows = sorted((s for s in current if s.position in deps), key=lambda s: s.position)
    return next((s for s in rows if s.status != StepStatus.SUCCEEDED), rows[0] if rows else None)


# --- the facts --------------------------------------------------------------------------------


def _read_facts(steps: Sequence[Step]) -> Facts:
    now = db_now()
    pending = [step for step in steps if step.status == StepStatus.PENDING]
    paused: dict[str, QueueState] = {}
    consumed: set[str] = set()
    if pending:
        queues = {step.queue for step in pending}
        paused = {q.name: q for q in QueueState.objects.filter(paused=True, name__in=queues)}
        consumed = {
            queue for row in presence.workers() if row.state == "live" for queue in row.queues
        }
    due = [s for s in pending if s.limits and s.available_at and s.available_at <= now]
    pairs = {(str(name), str(key)) for s in due for name, key, _ in s.limits or ()}
    standing = Standing.read(pairs, now) if pairs else None
    crowded = {
        (refusal.limit, refusal.key)
        for refusal in (_refusal(step, standing) for step in due)
        if refusal is not None and refusal.why == limit_standing.AT_CONCURRENCY
    }
    waiting = [s.pk for s in steps if s.status == StepStatus.WAITING_APPROVAL]
    return Facts(
        now=now,
        paused=paused,
        consumed=consumed,
        standing=standing,
        holders=limit_use.holders(crowded) if crowded else {},
        requests=_pending_requests(waiting) if waiting else {},
    )


def _refusal(step: Step, standing: Standing | None) -> Refusal | None:
    """What holds a due step under limits back (``limit_use.holding``, on a standing read
    once for the batch)."""
    if standing is None or not step.limits:
        return None
    return standing.refusal(step.limits)


def _pending_requests(step_ids: list[int]) -> dict[int, Any]:
    # The core does not import the approvals app (it builds on the core): its model is
    # looked up only when it is installed, as ``observability.invariants`` does.
    if not apps.is_installed("approvals"):
        return {}
    model = apps.get_model("approvals", "ApprovalRequest")
    rows = model.objects.filter(step_id__in=step_ids, status="pending").annotate(
        approvals=Count("votes")
    )
    return {row.step_id: row for row in rows}


# --- the rules --------------------------------------------------------------------------------


def _step_blockers(step: Step, before: Step | None, facts: Facts) -> list[Blocker]:
    """What holds ``step`` back (``before``: the step before a blocked one)."""
    name = f"step {step.position} ({step.kind})"
    if step.status == StepStatus.BLOCKED:
        return [earlier_blocker(step, before, name)]
    if step.status == StepStatus.DEAD:
        return [dead_blocker(step, name, facts)]
    if step.status == StepStatus.WAITING_APPROVAL:
        return [approval_blocker(step, name, facts)]
    if step.status == StepStatus.RUNNING:
        return [lease_blocker(step, name, facts)]
    if step.status != StepStatus.PENDING:
        return []
    found = []
    state = facts.paused.get(step.queue)
    if state is not None:
        found.append(
            Blocker(
                QUEUE_PAUSED,
                f"Queue {quoted(step.queue)} was paused by {state.changed_by or 'someone'} "
                f"{at(state.changed_at, facts.now)}{because(state.reason)}. Nothing in it "
                "starts until someone resumes it.",
                f"paused queue {step.queue}",
                step.pk,
                link("console:queues"),
                "the queues",
                subject=step.queue,
                who=state.changed_by,
                reason=one_line(state.reason),
                since=state.changed_at,
            )
        )
    found.extend(_schedule(step, name, facts))
    if step.queue not in facts.consumed:
        found.append(
            Blocker(
                NO_WORKER,
                f"No live worker consumes queue {quoted(step.queue)}: {name} waits until one "
                f"starts (celery -A config worker -Q {step.queue}).",
                f"no worker on {step.queue}",
                step.pk,
                link("console:queues", anchor="workers"),
                "the workers",
                subject=step.queue,
            )
        )
    if not found:
        found.append(
            Blocker(
                DUE,
                f"Nothing holds {name} back: it is due since {when(step.available_at, facts.now)}, "
                f"and the next worker of queue {quoted(step.queue)} takes it.",
                "a free worker",
                step.pk,
                subject=step.queue,
                since=step.available_at,
            )
        )
    return found


def _schedule(step: Step, name: str, facts: Facts) -> list[Blocker]:
    """A pending step's own time: waiting for its workflow version, a scheduled start or a
    retry's backoff; once due, its limits."""
    now, due_at = facts.now, step.available_at
    if step.error_class == AWAITING_VERSION:
        task = step.task
        wanted = f"{task.workflow} v{task.workflow_version}"
        return [
            Blocker(
                AWAITING_VERSION_KIND,
                f"A worker without {wanted} handed {name} back: it waits for a worker that "
                f"has that version (a deploy in progress), and is tried again "
                f"{at(due_at, now)}.",
                f"a worker with v{task.workflow_version}",
                step.pk,
                link("console:workflow", task.workflow),
                f"workflow {task.workflow}",
                subject=wanted,
                until=due_at,
            )
        ]
    if due_at is not None and due_at > now:
        # The display state "retry scheduled" (selectors.scheduled_retries, its twin):
        # claimed before, by a failed attempt or before an operator's delayed redrive.
        if step.attempts > 0:
            error = one_line(error_summary(step.last_error)) or step.error_class or "an error"
            words = (
                f"Attempt {step.attempts} of {step.max_attempts} of {name} failed ({error}); "
                f"it is tried again {at(due_at, now)}, after a backoff."
            )
            return [Blocker(RETRY, words, "retry backoff", step.pk, until=due_at)]
        if step.fencing_token > 0:
            words = f"{sentence(name)} was redriven to run again after a delay: {at(due_at, now)}."
            return [Blocker(RETRY, words, "a delayed redrive", step.pk, until=due_at)]
        words = f"{sentence(name)} is scheduled to start {at(due_at, now)} (run_after)."
        return [Blocker(RUN_AFTER, words, "its start time", step.pk, until=due_at)]
    refusal = _refusal(step, facts.standing)
    return [] if refusal is None else [limit_blocker(step, name, refusal, facts)]
