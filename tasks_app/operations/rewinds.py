"""Rewind: run a finished, dead or cancelled task again from one of its steps, with the
effects it would repeat shown first.

A person chooses a step, and may edit the payload. :func:`plan_rewind` says what confirming
will do: the steps that run again (the chosen one, every step that waits for it, and every
other step that has not succeeded, so the task can finish) and, for every external write
the ledger holds for them, whether it was applied (the rerun finds it by its key and skips
it: a remote does not see it again, nor the edited input), or is in doubt (it was started
and never answered: a person says whether it happened, as for an unknown outcome). A step
with no ledger entry makes any write afresh. The plan carries a fingerprint of all that.

:func:`rewind` applies a plan only while the task is as it was shown (the same fingerprint,
under the task's lock): the rewound rows are superseded (kept as history) and replaced by
rows of a new revision that keep their step keys, so their ledger entries still answer;
each write in doubt is recorded as the person decided (happened: done, and skipped;
did not: forgotten, and made again); the steps whose dependencies stand are made due. One
``rewound`` event (chained) records who, why, the step, the decisions and the input's
difference. Which tasks may be rewound is the actions rule's
(``task_actions.rewind_refusal``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from django.db import transaction

from tasks_app import validation
from tasks_app.access import Actor, actor_fields, check_permission
from tasks_app.db.clock import db_now
from tasks_app.engine.dispatch import Doorbell, ring_on_commit
from tasks_app.engine.states import Following, settle_and_record, start, supersede
from tasks_app.engine.transitions import lock_task
from tasks_app.engine.waiting import open_approval_step, row_again
from tasks_app.engine.workflows import registry
from tasks_app.exceptions import InvalidInput, InvalidTransition
from tasks_app.models import Effect, EventKind, Step, StepStatus, Task, graphs
from tasks_app.models.json_columns import described
from tasks_app.operations.task_actions import rewind_refusal

APPLIED = "applied"
IN_DOUBT = "in_doubt"
# What a person says of a write in doubt.
HAPPENED = "happened"
NOT_HAPPENED = "not_happened"
DECISIONS = (HAPPENED, NOT_HAPPENED)


@dataclass(frozen=True)
class RerunStep:
    step_id: int
    position: int
    item: int
    kind: str
    status: str


@dataclass(frozen=True)
class Write:
    """An external write the ledger holds for a step that will run again."""

    key: str
    kind: str
    state: str


@dataclass(frozen=True)
class RewindPlan:
    task_id: int
    step_id: int
    steps: tuple[RerunStep, ...]
    writes: tuple[Write, ...]
    # The kinds of the steps that run again with no ledger entry: any write they make runs.
    unrecorded: tuple[str, ...]
    old_payload: Any
    new_payload: Any
    fingerprint: str

    @property
    def in_doubt(self) -> tuple[Write, ...]:
        return tuple(write for write in self.writes if write.state == IN_DOUBT)

    @property
    def payload_changed(self) -> bool:
        return self.new_payload is not None


def plan_rewind(task: Task, step_id: int, payload: Any = None) -> RewindPlan:
    """What rewinding ``task`` from its step ``step_id`` (with ``payload``, when given,
    in place of the task's) will do, or :class:`InvalidTransition` saying why it may not."""
    new_payload = _checked_payload(task, payload)
    return _plan(task, step_id, new_payload)


def rewind(
    task: Task,
    *,
    step_id: int,
    actor: Actor,
    reason: str,
    fingerprint: str,
    payload: Any = None,
    decisions: Mapping[str, str] | None = None,
    plan: str | None = None,
) -> Task:
    """Apply the rewind :func:`plan_rewind` showed with ``fingerprint``; ``decisions``
    says, for each write in doubt by its key, ``happened`` or ``not_happened``."""
    check_permission(actor, "redrive_task")
    new_payload = _checked_payload(task, payload)
    decided = dict(decisions or {})
    with transaction.atomic():
        locked = lock_task(task.pk)
        shown = _plan(locked, step_id, new_payload)
        # A plan that no longer matches is refused first, whatever else the confirm lacks:
        # its preview cannot be shown again to be completed.
        if shown.fingerprint != fingerprint:
            raise InvalidTransition(changed_since_preview(task.pk))
        reason = validation.require_text(reason, "reason")
        _check_decisions(shown, decided)
        now = db_now()
        name, _ = actor_fields(actor)
        _settle_writes(shown, decided, name, reason, now)
        rerun = {(s.position, s.item) for s in shown.steps}
        old = [
            s for s in Step.objects.current().filter(task=locked) if (s.position, s.item) in rerun
        ]
        supersede(old, now)
        revision = max(locked.steps.values_list("revision", flat=True)) + 1
        fresh = [
            row_again(locked, row, revision, row.idempotency_key) for row in old if row.item == 0
        ]
        Step.objects.bulk_create(fresh)
        if new_payload is not None:
            locked.payload = new_payload
        locked.cancel_requested_at = None
        locked.save(update_fields=["payload", "cancel_requested_at", "updated_at"])
        following = Following()
        rows = list(Step.objects.current().filter(task=locked))
        for row in graphs.ready(rows, StepStatus.SUCCEEDED, StepStatus.BLOCKED):
            start(locked, row, now, following)
        data: dict[str, Any] = {
            "from_step": step_id,
            "revision": revision,
            "rerun": [f"{s.kind}" + (f" #{s.item + 1}" if s.item else "") for s in shown.steps],
            "decisions": decided,
            **({"plan": plan} if plan else {}),
        }
        if new_payload is not None:
            data.update(old_payload=described(shown.old_payload), new_payload=new_payload)
        if following.fanned_out:
            data["fanned_out"] = following.fanned_out
        if following.refused:
            raise InvalidTransition(
                f"task #{task.pk} cannot be rewound: {following.refused[0].last_error}"
            )
        settle_and_record(
            EventKind.REWOUND,
            locked,
            step_id=step_id,
            actor=actor,
            reason=reason,
            steps=[*old, *fresh, *following.changed],
            **data,
        )
        for approval in following.approvals:
            open_approval_step(locked, approval, actor=actor)
        ring_on_commit([Doorbell(s.pk, s.queue) for s in following.due])
    return locked


def rewind_from(
    task: Task, *, actor: Actor, reason: str, from_step: str, plan: str | None = None
) -> Task:
    """Rewind ``task`` from its current step of the kind ``from_step`` (its first item), as
    the operator action ``rewind`` does for many tasks at once: planned and applied at once,
    with the plan's fingerprint, and the bulk plan's id on the event.

    Nobody is there to say whether a write in doubt happened, so a task with one is refused
    (:class:`InvalidTransition`, which a bulk action skips and reports), as is a task with
    no step of that kind (a dead letter of another workflow matched by the same filter)."""
    check_permission(actor, "redrive_task")
    reason = validation.require_text(reason, "reason")
    kind = validation.require_text(from_step, "from_step")
    current = Step.objects.current().filter(task=task, item=0).order_by("position")
    step = current.filter(kind=kind).first()
    if step is None:
        kinds = ", ".join(current.values_list("kind", flat=True))
        raise InvalidTransition(
            f"task #{task.pk} has no step {kind} to rewind from (from_step; its steps: {kinds})"
        )
    shown = plan_rewind(task, step.pk)
    if shown.in_doubt:
        keys = ", ".join(write.key for write in shown.in_doubt)
        raise InvalidTransition(
            f"task #{task.pk} has writes in doubt ({keys}): rewind it from its page, saying "
            "whether each happened"
        )
    # The plan is made again under the task's lock: a task changed since is refused there.
    return rewind(
        task,
        step_id=step.pk,
        actor=actor,
        reason=reason,
        fingerprint=shown.fingerprint,
        plan=plan,
    )


def changed_since_preview(task_id: int) -> str:
    """Why a plan is refused once its task no longer matches it."""
    return f"task #{task_id} changed since the rewind was previewed: preview it again"


# --- the plan ---------------------------------------------------------------------------------


def _checked_payload(task: Task, payload: Any) -> Any:
    """The edited payload, canonical and passed by the workflow's rules; None for none, or
    for one the same as the task's (no edit to record)."""
    if payload is None:
        return None
    canonical = json.loads(validation.validate_payload(payload))
    if canonical == task.payload:
        return None
    flow = registry.get(task.workflow, task.workflow_version)
    if flow is not None:
        flow.check_payload(canonical)
    return canonical


def _plan(task: Task, step_id: int, new_payload: Any) -> RewindPlan:
    current = list(Step.objects.current().filter(task=task).order_by("position", "item"))
    chosen = next((s for s in current if s.pk == step_id), None)
    running = any(s.status == StepStatus.RUNNING for s in current)
    why = rewind_refusal(task, chosen, step_id, running=running)
    if why is not None:
        raise InvalidTransition(why)
    assert chosen is not None
    positions = {chosen.position} | graphs.descendants(current, chosen.position)
    for row in current:
        if row.status != StepStatus.SUCCEEDED and row.position not in positions:
            positions |= {row.position} | graphs.descendants(current, row.position)
    rerun = [s for s in current if s.position in positions]
    standing = {s.position for s in current if s.position not in positions}
    for row in rerun:
        missing = [p for p in graphs.waits_for(row) if p not in positions and p not in standing]
        if missing:
            raise InvalidTransition(f"step {row.kind} waits for a step the task no longer has")
    ledger = Effect.objects.filter(step__in=rerun).select_related("step").order_by("step_id", "key")
    writes = tuple(
        Write(e.key, e.step.kind, APPLIED if e.status == Effect.Status.DONE else IN_DOUBT)
        for e in ledger
    )
    recorded = {e.step.kind for e in ledger}
    shown = {
        "task_id": task.pk,
        "step_id": step_id,
        "steps": tuple(RerunStep(s.pk, s.position, s.item, s.kind, s.status) for s in rerun),
        "writes": writes,
        "unrecorded": tuple(sorted({s.kind for s in rerun} - recorded)),
        "old_payload": task.payload,
        "new_payload": new_payload,
    }
    tokens = [(s.pk, s.fencing_token, s.status) for s in rerun]
    material = json.dumps(
        [task.status, str(task.updated_at), tokens, [asdict(w) for w in writes], new_payload],
        sort_keys=True,
        default=str,
    )
    return RewindPlan(**shown, fingerprint=hashlib.sha256(material.encode()).hexdigest()[:32])


def _check_decisions(plan: RewindPlan, decided: dict[str, str]) -> None:
    """Each write in doubt has a decision, and no decision names anything else."""
    doubtful = {write.key for write in plan.in_doubt}
    for key, decision in decided.items():
        if key not in doubtful:
            raise InvalidInput("decisions", "in_doubt", f"decisions: {key!r} is not in doubt")
        if decision not in DECISIONS:
            raise InvalidInput(
                "decisions", "choice", f"decisions: {key!r} must be {' or '.join(DECISIONS)}"
            )
    missing = sorted(doubtful - set(decided))
    if missing:
        raise InvalidInput(
            "decisions",
            "required",
            f"decisions: say whether each write in doubt happened: {', '.join(missing)}",
        )


def _settle_writes(
    plan: RewindPlan, decided: dict[str, str], name: str, reason: str, now: Any
) -> None:
    """Record each write in doubt as decided: done (the rerun skips it by its key) or
    forgotten (the rerun makes it again)."""
    happened = [key for key, decision in decided.items() if decision == HAPPENED]
    Effect.objects.filter(key__in=happened, status=Effect.Status.STARTED).update(
        status=Effect.Status.DONE,
        result={"resolved_by": name, "note": reason},
        finished_at=now,
    )
    forgotten = [key for key, decision in decided.items() if decision == NOT_HAPPENED]
    Effect.objects.filter(key__in=forgotten, status=Effect.Status.STARTED).delete()
