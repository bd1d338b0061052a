"""The side-effects ledger: external writes at most once per step key.

Two phases. A fenced ``started`` row is committed before the remote call, and the result
is recorded after it. A later attempt that finds a recorded result returns it without
calling. One that finds ``started`` with no result cannot know whether the call happened:
it calls again with the same key if the remote honours idempotency keys, and otherwise
raises :class:`OutcomeUnknown` so a person decides.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypeVar, cast

from django.db import IntegrityError, transaction
from django.utils import timezone

from tasks_app.engine import tracing_hooks
from tasks_app.exceptions import (
    EffectNotApplied,
    OutcomeUnknown,
    RemoteRefused,
    UndecodableValue,
)
from tasks_app.models import Effect, Step, StepStatus
from tasks_app.models.json_columns import is_undecodable

T = TypeVar("T")


class LeaseLost(Exception):
    """This attempt no longer holds its step: it may not start an external write."""


class Effects:
    def __init__(self, *, step_id: int, step_key: str, fencing_token: int) -> None:
        self.step_id = step_id
        self.step_key = step_key
        self.fencing_token = fencing_token

    def key(self, name: str) -> str:
        return f"{self.step_key}:{name}"

    def run(self, name: str, call: Callable[[str], T], *, idempotent_remote: bool) -> T:
        """Perform ``call(key)`` at most once for this step and ``name``.

        1. A recorded result is returned as is.
        2. A ``started`` row without a result: call again with the same key if the remote
           honours it, otherwise raise :class:`OutcomeUnknown`.
        3. Otherwise commit a ``started`` row (only while this attempt holds the lease),
           call, and record the result. A timeout after sending leaves the row
           ``started`` and follows rule 2 at once; :class:`EffectNotApplied` (the remote
           refused before acting) and :class:`RemoteRefused` (it refused for good) remove
           the row, so a retry or a redrive may call again.
        """
        key = self.key(name)
        # Traced as "effect <name>" (tracing_hooks: nothing with tracing off); the span
        # tells a replayed result from a call by whether ``call`` ran.
        with tracing_hooks.effect(key, name) as traced:
            call = traced.wrap(call)
            existing = Effect.objects.filter(key=key).first()
            if existing is not None and existing.status == Effect.Status.DONE:
                if is_undecodable(existing.result):
                    raise UndecodableValue(f"the recorded result of effect {key} {existing.result}")
                return cast("T", existing.result)
            if existing is not None and not idempotent_remote:
                raise OutcomeUnknown(f"effect {key} was started and has no recorded result")
            if existing is None:
                self._start(key, idempotent_remote=idempotent_remote)
            try:
                result = call(key)
            except (EffectNotApplied, RemoteRefused):
                Effect.objects.filter(key=key, status=Effect.Status.STARTED).delete()
                raise
            except TimeoutError as exc:
                if idempotent_remote:
                    raise
                raise OutcomeUnknown(f"effect {key} timed out after sending: {exc}") from exc
            json.dumps(result, allow_nan=False)  # the ledger stores JSON only
            # Recorded even if this attempt lost its lease meanwhile: the call happened.
            Effect.objects.filter(key=key).update(
                status=Effect.Status.DONE, result=result, finished_at=timezone.now()
            )
            return result

    def _start(self, key: str, *, idempotent_remote: bool) -> None:
        with transaction.atomic():
            holds_lease = (
                Step.objects.select_for_update()
                .filter(
                    pk=self.step_id, status=StepStatus.RUNNING, fencing_token=self.fencing_token
                )
                .exists()
            )
            if not holds_lease:
                raise LeaseLost(
                    f"step {self.step_id} is no longer held by token {self.fencing_token}"
                )
            try:
                with transaction.atomic():
                    Effect.objects.create(key=key, step_id=self.step_id, token=self.fencing_token)
            except IntegrityError:
                # Another attempt of the same step started it first: its outcome is unknown.
                if not idempotent_remote:
                    raise OutcomeUnknown(f"effect {key} was started by another attempt") from None
