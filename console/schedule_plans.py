"""A schedule's resume or backfill plan as its preview showed it, signed, so that confirming
applies that plan and no other.

The plan (``tasks_app.operations.schedules.SchedulePlan``: the schedule, its state when
previewed and the exact slots to enqueue and record as missed) travels in the confirm form
as a signed token (``django.core.signing``, salted for this use, bound to the user who
previewed it, valid for ``CONSOLE_BULK_PLAN_SECONDS``), as a bulk plan does
(``console.plans``). The token is signed, not sealed: whoever holds the page can read it,
and it holds nothing the page does not show.

A plan is applied once. The service refuses a plan whose id an applied resume or backfill
already carries, or whose schedule changed since the preview (``PlanStale``), under the
schedule's lock, so two confirms at the same moment apply it once.
"""

from __future__ import annotations

from typing import Any

from console.plans import PlanRefused, sign, unsign
from tasks_app.operations.schedules import SchedulePlan

SALT = "console.schedule-plan"


def token(plan: SchedulePlan, *, user_id: int) -> str:
    """The plan as its confirm form carries it."""
    return sign({"plan": plan.as_data(), "user_id": user_id}, SALT)


def load(value: str, *, user_id: int, name: str, action: str) -> SchedulePlan:
    """The plan a token holds, if it is intact, recent, this user's and of this schedule
    and action; else :class:`PlanRefused` saying why."""
    data = unsign(
        value,
        SALT,
        user_id=user_id,
        again=f"preview the {action} again",
        missing=f"this form carries no preview of a {action}: preview it",
    )
    try:
        plan = SchedulePlan.from_data(_mapping(data.get("plan")))
    except (KeyError, TypeError) as exc:
        raise PlanRefused(f"this preview cannot be read: preview the {action} again") from exc
    if plan.name != name or plan.action != action:
        raise PlanRefused(f"this preview is of another schedule or action: preview the {action}")
    return plan


def _mapping(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError("a plan is a mapping")
    return value
