"""A bulk action's plan: what its preview showed (the filter, the action, the limit and the
exact tasks it will touch), signed, so that confirming applies that and nothing else.

The plan travels in the confirm form as a signed token (``django.core.signing``, salted
for this use, bound to the user who previewed it, valid for ``CONSOLE_BULK_PLAN_SECONDS``).
Confirming checks the token and that the form still asks for the same filter, action and
limit; any difference asks for a new preview. Each event the action writes carries the
plan's id. A plan is applied once: a second confirm of it is refused (409) and changes
nothing, even while its token is still valid.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from typing import Any

from django.conf import settings
from django.core import signing
from django.core.cache import cache

from tasks_app import services
from tasks_app.models import Task
from tasks_app.operations import audit_log, listings, selectors
from tasks_app.operations.listings import DeadFilter
from tasks_app.operations.task_actions import ACTIONS

SALT = "console.bulk-plan"

logger = logging.getLogger(__name__)


class PlanRefused(Exception):
    """The confirm does not match a valid plan; the message says why."""


class PlanApplied(PlanRefused):
    """The plan was applied already: a plan is applied once."""


def sign(data: dict[str, Any], salt: str) -> str:
    """A plan's data as the token its confirm form carries."""
    return signing.dumps(data, salt=salt, compress=True)


def unsign(token: str, salt: str, *, user_id: int, again: str, missing: str) -> dict[str, Any]:
    """The data a plan's token holds, if it is intact, no older than
    ``CONSOLE_BULK_PLAN_SECONDS`` and made by ``user_id``; else :class:`PlanRefused` saying
    why, and what to do (``again``; ``missing``: what a form without a plan is told)."""
    try:
        data: dict[str, Any] = signing.loads(
            token, salt=salt, max_age=settings.CONSOLE_BULK_PLAN_SECONDS
        )
    except signing.SignatureExpired:
        raise PlanRefused(f"the preview is too old: {again}") from None
    except signing.BadSignature:
        raise PlanRefused(missing) from None
    if data.get("user_id") != user_id:
        raise PlanRefused(f"this preview was made by someone else: {again}")
    return data


@dataclass(frozen=True)
class BulkPlan:
    id: str
    action: str
    filters: DeadFilter
    limit: int
    # The tasks it will touch, oldest first: the first ``limit`` matching at preview.
    ids: tuple[int, ...]
    # How many matched at preview (more than ``ids`` when the limit cut them).
    matched: int
    user_id: int
    # The action's parameters as the preview was asked for them (a delay), as typed.
    params: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def make(
        cls,
        *,
        action: str,
        filters: DeadFilter,
        limit: int,
        user_id: int,
        params: dict[str, Any] | None = None,
    ) -> BulkPlan:
        matching = listings.dead_tasks(filters).order_by("id")
        return cls(
            id=services.new_plan_id(),
            action=action,
            filters=filters,
            limit=limit,
            ids=tuple(matching.values_list("pk", flat=True)[:limit]),
            matched=matching.count(),
            user_id=user_id,
            params=dict(params or {}),
        )

    @property
    def button(self) -> str:
        """What the confirm button says: "Cancel 3 tasks"."""
        return ACTIONS[self.action].button_text(len(self.ids))

    @property
    def label(self) -> str:
        return ACTIONS[self.action].label

    @property
    def limited(self) -> bool:
        return self.matched > len(self.ids)

    @cached_property
    def ledger(self) -> selectors.LedgerSummary:
        """What the effects ledger holds for the dead steps of the plan's tasks: which
        have external writes in doubt, which have writes that happened."""
        return selectors.dead_step_ledger(self.ids)

    def token(self) -> str:
        return sign({**asdict(self), "ids": list(self.ids)}, SALT)

    @classmethod
    def load(cls, token: str, *, user_id: int) -> BulkPlan:
        """The plan a token holds, if it is intact, recent and this user's."""
        data = unsign(
            token,
            SALT,
            user_id=user_id,
            again="preview again",
            missing="confirm a preview: this form carries none",
        )
        return cls(**{**data, "filters": DeadFilter(**data["filters"]), "ids": tuple(data["ids"])})

    def difference(
        self,
        *,
        action: str,
        filters: DeadFilter,
        limit: int,
        params: dict[str, Any] | None = None,
    ) -> str | None:
        """What the confirming form asks differently from the plan, or None."""
        if action != self.action:
            return f"the action changed from {self.label} to {ACTIONS[action].label}"
        asked = params or {}
        changed = sorted(k for k in {*asked, *self.params} if asked.get(k) != self.params.get(k))
        if changed:
            return f"the {', '.join(changed)} changed"
        if filters != self.filters:
            return "the filter changed"
        if limit != self.limit:
            return f"the limit changed from {self.limit} to {limit}"
        return None

    def apply(self, *, actor: services.Actor, reason: str) -> services.BulkReport:
        """The plan's action on its tasks that are still dead letters matching its filter,
        through the bulk service (one transaction and one event, with the plan's id, per
        task); the others are skipped and reported, and no other task is touched. Once:
        a refusal (a reason missing) leaves the plan to confirm again, an application
        spends it (:meth:`spend`)."""
        services.check_bulk(
            self.action, actor=actor, reason=reason, limit=self.limit, params=self.params
        )
        self.spend()
        qualifying = set(
            listings.dead_tasks(self.filters).filter(pk__in=self.ids).values_list("pk", flat=True)
        )
        report = services.act_on_tasks(
            Task.objects.filter(pk__in=qualifying).order_by("id"),
            action=self.action,
            actor=actor,
            reason=reason,
            limit=self.limit,
            plan=self.id,
            params=self.params,
        )
        gone = [
            (pk, f"task #{pk} is no longer a dead letter matching the filter")
            for pk in self.ids
            if pk not in qualifying
        ]
        return replace(report, skipped=[*gone, *report.skipped], limited=self.limited)

    def spend(self) -> None:
        """Mark the plan applied, or raise :class:`PlanApplied` if it was. Its mark in the
        cache decides between confirms at the same moment (``add`` is atomic, and it
        outlives the token's validity); the events carrying its id are the record that
        needs no cache, for when the mark was lost."""
        try:
            first = cache.add(
                f"{SALT}:applied:{self.id}",
                self.user_id,
                timeout=settings.CONSOLE_BULK_PLAN_SECONDS + 60,
            )
        except Exception:
            logger.warning("bulk plan %s: the cache cannot be reached", self.id, exc_info=True)
            first = True
        if not first or audit_log.audit_events(audit_log.AuditFilter(plan=self.id)).exists():
            raise PlanApplied("this preview was already confirmed and applied")
