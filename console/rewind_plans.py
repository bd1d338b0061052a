"""A rewind's plan as its preview showed it (the task, the step, the edited payload and the
plan's fingerprint), signed, so that confirming applies that rewind and no other.

The plan travels in the confirm form as a signed token (``django.core.signing``, salted
for this use, bound to the user who previewed it, valid for ``CONSOLE_BULK_PLAN_SECONDS``),
as a bulk plan does (``console.plans``). It holds the payload as the person typed it, with
the redaction placeholders they saw: a token can be decoded by whoever holds the page, and
the secrets it hid stay on the server (they are put back when confirming, as they were
for the preview).

A plan is applied once. The ``rewound`` event carries the plan's id, and a confirm whose
plan has one is refused. Two confirms at the same moment are decided by the service: the
task's lock orders them, and the second finds the task changed since the preview.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from console.plans import PlanApplied, PlanRefused, sign, unsign
from tasks_app import services
from tasks_app.models import Event, EventKind

SALT = "console.rewind-plan"


@dataclass(frozen=True)
class SignedRewind:
    id: str
    task_id: int
    step_id: int
    # The edited payload as typed (placeholders where secrets were hidden); None keeps it.
    payload: Any
    fingerprint: str
    user_id: int

    @classmethod
    def make(cls, plan: services.RewindPlan, *, payload: Any, user_id: int) -> SignedRewind:
        return cls(
            id=services.new_plan_id(),
            task_id=plan.task_id,
            step_id=plan.step_id,
            payload=payload,
            fingerprint=plan.fingerprint,
            user_id=user_id,
        )

    def token(self) -> str:
        return sign(asdict(self), SALT)

    @classmethod
    def load(cls, token: str, *, user_id: int, task_id: int) -> SignedRewind:
        """The plan a token holds, if it is intact, recent, this user's and this task's."""
        plan = cls(
            **unsign(
                token,
                SALT,
                user_id=user_id,
                again="preview the rewind again",
                missing="this form carries no preview of a rewind: preview it",
            )
        )
        if plan.task_id != task_id:
            raise PlanRefused(f"this preview is of task #{plan.task_id}, not this one")
        return plan

    def check_unspent(self) -> None:
        """Raise :class:`PlanApplied` if a rewind with this plan's id was recorded."""
        applied = Event.objects.for_task(self.task_id).filter(
            kind=EventKind.REWOUND, data__plan=self.id
        )
        if applied.exists():
            raise PlanApplied("this rewind was already confirmed and applied")
