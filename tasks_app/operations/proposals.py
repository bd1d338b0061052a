"""Plans programs propose and people sign: an operator action (a row of
``task_actions.ACTIONS`` on dead letters or on named tasks, or a queue's pause or resume)
chosen exactly as the console's preview chooses it, stored until a person applies or
declines it in the console, or until it expires (``API_PLAN_HOURS``).

Each step is an event in the audit chain: ``plan_proposed`` by the program (its actor is
``<user> via <token>``), ``plan_applied`` or ``plan_declined`` by whoever decided, naming
the proposer; every task event of its application carries the plan's id, as a bulk
action's do. A token applies its own plan only where its ``auto_apply`` setting allows
(:func:`applies_itself`) and its permissions do; everything else waits for a person.

Applying touches the tasks the proposal chose and nothing else: those that still
qualify (still dead letters matching its filter, for a plan chosen by filter; the action's
own rule, for named tasks), each in its own transaction as ``act_on_tasks`` does; the
others are skipped and kept in the plan's outcome.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet

from tasks_app import validation
from tasks_app.access import Actor, actor_fields, check_permission
from tasks_app.db.clock import db_now
from tasks_app.exceptions import InvalidInput, InvalidTransition, NotPermitted
from tasks_app.history.events import record_event
from tasks_app.models import (
    ApiToken,
    AutoApply,
    EventKind,
    PlanStatus,
    ProposedPlan,
    Step,
    StepStatus,
    Task,
)
from tasks_app.operations import listings, operator_actions, selectors, tokens
from tasks_app.operations.listings import DeadFilter
from tasks_app.operations.task_actions import ACTIONS, OUTCOME_UNKNOWN

DECIDED_FIELDS = ["status", "decided_by", "decided_by_user", "decided_at", "decision_reason"]
# A queue's pause and resume, beside the task actions of the table.
QUEUE_ACTIONS = {
    "pause_queue": operator_actions.pause_queue,
    "resume_queue": operator_actions.resume_queue,
}


def action_label(action: str) -> str:
    if action in QUEUE_ACTIONS:
        return "Pause queue" if action == "pause_queue" else "Resume queue"
    return ACTIONS[action].label


def propose(
    *,
    actor: Actor,
    action: Any,
    reason: Any,
    filters: DeadFilter | None = None,
    task_ids: Sequence[int] | None = None,
    limit: int | None = None,
    params: Mapping[str, Any] | None = None,
    queue: Any = "",
) -> ProposedPlan:
    """A plan for ``action`` with ``reason``: on the dead letters matching ``filters`` (at
    most ``limit``, oldest first), on the tasks ``task_ids`` names, or (a queue action) on
    ``queue``. The proposer needs the action's permission; a token whose setting allows it
    applies the plan at once (:func:`applies_itself`)."""
    if action in QUEUE_ACTIONS:
        plan = _queue_plan(actor, str(action), reason, queue)
    else:
        plan = _task_plan(actor, action, reason, filters, task_ids, limit, params or {})
    token = tokens.token_of(actor)
    name, user_id = actor_fields(actor)
    now = db_now()
    plan.id = operator_actions.new_plan_id()
    plan.token = token
    plan.proposed_by = name
    plan.proposed_by_user_id = user_id
    plan.proposed_at = now
    plan.expires_at = now + timedelta(hours=settings.API_PLAN_HOURS)
    with transaction.atomic():
        plan.save(force_insert=True)
        record_event(
            EventKind.PLAN_PROPOSED,
            task_id=None,
            actor=actor,
            reason=plan.reason,
            plan=plan.id,
            **_described(plan),
        )
    if token is not None and applies_itself(token, plan):
        return apply(plan, actor=actor)
    return plan


def _task_plan(
    actor: Actor,
    action: Any,
    reason: Any,
    filters: DeadFilter | None,
    task_ids: Sequence[int] | None,
    limit: int | None,
    params: Mapping[str, Any],
) -> ProposedPlan:
    if (filters is None) == (task_ids is None):
        raise InvalidInput("task_ids", "choice", "task_ids: give task ids or a filter, not both")
    if task_ids is not None:
        ids = sorted(set(task_ids))
        limit = len(ids)
    limit = operator_actions.bulk_limit() if limit is None else limit
    text = operator_actions.check_bulk(
        action, actor=actor, reason=reason, limit=limit, params=params
    )
    operator_actions.check_params(action, params)
    if filters is not None:
        matching = listings.dead_tasks(filters).order_by("id")
        ids = list(matching.values_list("pk", flat=True)[:limit])
        matched = matching.count()
    else:
        found = set(Task.objects.filter(pk__in=ids).values_list("pk", flat=True))
        missing = [pk for pk in ids if pk not in found]
        if missing:
            raise InvalidInput("task_ids", "unknown", f"task_ids: no task #{missing[0]}")
        matched = len(ids)
    if not ids:
        raise InvalidTransition("no dead letter matches the filter: nothing to propose")
    return ProposedPlan(
        action=action,
        filters=asdict(filters) if filters is not None else {},
        task_ids=ids,
        matched=matched,
        limit=limit,
        params=dict(params),
        in_doubt=len(in_doubt(ids)),
        reason=text,
    )


def in_doubt(task_ids: Sequence[int]) -> set[int]:
    """The tasks among ``task_ids`` whose dead step has a write in doubt: an effect started
    with no recorded outcome, or a death of an unknown outcome."""
    unknown = Step.objects.filter(
        task_id__in=list(task_ids), status=StepStatus.DEAD, error_class=OUTCOME_UNKNOWN
    ).values_list("task_id", flat=True)
    return {*selectors.dead_step_ledger(task_ids).in_doubt, *unknown}


def _queue_plan(actor: Actor, action: str, reason: Any, queue: Any) -> ProposedPlan:
    check_permission(actor, "pause_queue")
    text = validation.require_text(reason, "reason")
    if queue not in settings.TASKS_QUEUES:
        raise InvalidInput("queue", "choice", f"queue: one of {', '.join(settings.TASKS_QUEUES)}")
    return ProposedPlan(action=action, queue=queue, reason=text)


def applies_itself(token: ApiToken, plan: ProposedPlan) -> bool:
    """Whether ``token`` may apply ``plan`` without a person: any plan, or (``one_task``)
    a plan on one task whose dead step has no write in doubt, as its setting says."""
    if token.auto_apply == AutoApply.ANY:
        return True
    if token.auto_apply == AutoApply.ONE_TASK:
        return plan.action not in QUEUE_ACTIONS and len(plan.task_ids) == 1 and not plan.in_doubt
    return False


def apply(plan: ProposedPlan, *, actor: Actor, note: Any = "") -> ProposedPlan:
    """Sign and apply ``plan``: once, while it awaits a signature and has not expired,
    by a person with its action's permission, or by its own token where
    :func:`applies_itself`. ``note`` is the signer's word, kept on ``plan_applied``; the
    task events carry the proposal's reason and the plan's id."""
    token = tokens.token_of(actor)
    if token is not None and (token.pk != plan.token_id or not applies_itself(token, plan)):
        raise NotPermitted("this token may not apply the plan itself: a person signs it")
    _check_permission(plan, actor)
    note = str(note or "").strip()
    locked = _decide(plan, PlanStatus.APPLIED, actor=actor, text=note, reason=note or plan.reason)
    locked.outcome = _carry_out(locked, actor)
    ProposedPlan.objects.filter(pk=locked.pk).update(outcome=locked.outcome)
    return locked


def decline(plan: ProposedPlan, *, actor: Actor, reason: Any) -> ProposedPlan:
    """Refuse ``plan``: nothing of it is applied. A person with its action's permission
    declines it, with a reason."""
    if tokens.token_of(actor) is not None:
        raise NotPermitted("a person declines a plan, in the console")
    _check_permission(plan, actor)
    text = validation.require_text(reason, "reason")
    return _decide(plan, PlanStatus.DECLINED, actor=actor, text=text, reason=text)


def _decide(
    plan: ProposedPlan, status: PlanStatus, *, actor: Actor, text: str, reason: str
) -> ProposedPlan:
    """Mark ``plan`` applied or declined by ``actor`` (once, while it awaits a signature),
    with its event naming the proposer, in one transaction."""
    name, user_id = actor_fields(actor)
    with transaction.atomic():
        locked = _awaiting(plan.pk)
        locked.status = status
        locked.decided_by, locked.decided_by_user_id = name, user_id
        locked.decided_at = db_now()
        locked.decision_reason = text
        locked.save(update_fields=DECIDED_FIELDS)
        record_event(
            EventKind.PLAN_APPLIED if status == PlanStatus.APPLIED else EventKind.PLAN_DECLINED,
            task_id=None,
            actor=actor,
            reason=reason,
            plan=locked.id,
            proposed_by=locked.proposed_by,
            **_described(locked),
        )
    return locked


def _check_permission(plan: ProposedPlan, actor: Actor) -> None:
    permission = "pause_queue" if plan.action in QUEUE_ACTIONS else ACTIONS[plan.action].permission
    check_permission(actor, permission)


def _awaiting(pk: str) -> ProposedPlan:
    """The plan, locked, if it still awaits a signature; else why not."""
    locked = ProposedPlan.objects.select_for_update().get(pk=pk)
    if locked.status != PlanStatus.PROPOSED:
        raise InvalidTransition(
            f"the plan was {locked.get_status_display().lower()} by {locked.decided_by} already"
        )
    if locked.expires_at <= db_now():
        raise InvalidTransition("the plan expired: the program must propose it again")
    return locked


def _carry_out(plan: ProposedPlan, actor: Actor) -> dict[str, Any]:
    """The plan's action on what it chose, as the signer; what changed and what was
    skipped, and why."""
    if plan.action in QUEUE_ACTIONS:
        QUEUE_ACTIONS[plan.action](plan.queue, actor=actor, reason=plan.reason)
        return {"queue": plan.queue}
    chosen = Task.objects.filter(pk__in=plan.task_ids)
    gone: list[tuple[int, str]] = []
    if plan.filters:
        qualifying = set(
            listings.dead_tasks(DeadFilter(**plan.filters))
            .filter(pk__in=plan.task_ids)
            .values_list("pk", flat=True)
        )
        chosen = chosen.filter(pk__in=qualifying)
        gone = [
            (pk, f"task #{pk} is no longer a dead letter matching the filter")
            for pk in plan.task_ids
            if pk not in qualifying
        ]
    report = operator_actions.act_on_tasks(
        chosen.order_by("id"),
        action=plan.action,
        actor=actor,
        reason=plan.reason,
        limit=plan.limit,
        plan=plan.id,
        params=plan.params,
    )
    return {"changed": report.changed, "skipped": [list(item) for item in [*gone, *report.skipped]]}


def _described(plan: ProposedPlan) -> dict[str, Any]:
    """What the plan's events record of it."""
    described: dict[str, Any] = {"action": plan.action}
    if plan.action in QUEUE_ACTIONS:
        described["queue"] = plan.queue
        return described
    described.update(tasks=len(plan.task_ids), matched=plan.matched, task_ids=plan.task_ids)
    if plan.filters:
        described["filters"] = {key: value for key, value in plan.filters.items() if value}
    if plan.params:
        described["params"] = plan.params
    if plan.token_id is not None:
        # The program by its token's name ("token" itself is a secret's name to redaction).
        described["program"] = plan.token.name if plan.token else plan.token_id
    return described


# --- reads ------------------------------------------------------------------------------------


def awaiting() -> QuerySet[ProposedPlan]:
    """Plans awaiting a signature that have not expired, oldest first (the inbox)."""
    return ProposedPlan.objects.filter(
        status=PlanStatus.PROPOSED, expires_at__gt=db_now()
    ).order_by("proposed_at")


def is_expired(plan: ProposedPlan) -> bool:
    return plan.status == PlanStatus.PROPOSED and plan.expires_at <= db_now()
