"""Flow control's live changes, as on-call makes them (``tasks_app.engine.limits``):
change a limit's numbers, put it back to what code and settings say, pause or resume one
key. Each checks the ``change_limits`` permission, needs a reason, and is an audited
event in the chain; a change can be previewed first ("raising to 50 lets 20 waiting steps
start now"). What a limit's use is now: ``tasks_app.operations.limit_use``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction

from tasks_app import validation
from tasks_app.access import Actor, actor_fields, check_permission
from tasks_app.db.clock import db_now
from tasks_app.engine.dispatch import Doorbell, ring_on_commit
from tasks_app.engine.limit_standing import Standing, numbers
from tasks_app.engine.limits import Numbers, Rate, declared
from tasks_app.exceptions import InvalidInput, InvalidTransition
from tasks_app.history.events import record_event
from tasks_app.models import EventKind, LimitKey, LimitState, Step
from tasks_app.operations.limit_use import use_of

# The largest concurrency an operator may set (a typo's guard, not a capacity).
MAX_CONCURRENCY = 100_000
# Due steps a preview or a release reads, in claim order.
PREVIEW_SCAN = 5_000
# Doorbells rung when a change or a resume lets waiting steps in.
RELEASE_RINGS = 50


def clean_numbers(concurrency: Any, rate: Any) -> Numbers:
    """The numbers an operator typed: a concurrency (blank: none) and a rate such as
    ``200/s`` (blank: none); at least one. :class:`InvalidInput` names the field."""
    cap: int | None = None
    if concurrency not in (None, ""):
        try:
            cap = int(str(concurrency).strip())
        except ValueError:
            cap = -1
        if not 0 <= cap <= MAX_CONCURRENCY:
            raise InvalidInput(
                "concurrency",
                "range",
                f"concurrency: a whole number from 0 (nothing starts) to {MAX_CONCURRENCY:,}",
            )
    parsed: Rate | None = None
    if rate not in (None, ""):
        try:
            parsed = Rate.parse(str(rate).strip())
        except ValueError as exc:
            raise InvalidInput("rate", "format", f"rate: {exc}") from exc
    if cap is None and parsed is None:
        raise InvalidInput("concurrency", "required", "concurrency: set it, a rate, or both")
    return Numbers(cap, parsed)


@dataclass(frozen=True)
class Preview:
    """What a change of a limit's numbers would do now."""

    name: str
    before: Numbers | None
    after: Numbers
    starts_now: int
    # Running steps over the new concurrency: they finish; no new one starts meanwhile.
    over: int

    @property
    def text(self) -> str:
        words = [f"{self.name}: {describe(self.before)} → {describe(self.after)}."]
        if self.starts_now:
            plural = "step" if self.starts_now == 1 else "steps"
            words.append(f"It lets {self.starts_now} waiting {plural} start now.")
        else:
            words.append("No waiting step starts because of it now.")
        if self.over:
            words.append(
                f"{self.over} running over the new concurrency finish first; none is stopped."
            )
        return " ".join(words)


def describe(value: Numbers | None) -> str:
    if value is None:
        return "not known here"
    parts = []
    if value.concurrency is not None:
        parts.append(f"{value.concurrency} at once")
    if value.rate is not None:
        parts.append(str(value.rate))
    return ", ".join(parts) or "no cap"


def stamp(value: Numbers | None) -> str:
    """A limit's numbers as one string: what a preview saw (``Preview.before``), for its
    confirm to pass to :func:`change_limit` as ``seen``."""
    if value is None:
        return "unknown"
    return f"{value.concurrency if value.concurrency is not None else '-'} {value.rate or '-'}"


class StaleChange(InvalidTransition):
    """The numbers in effect changed since the preview a change was confirmed from."""


def preview_change(name: Any, *, concurrency: Any, rate: Any) -> Preview:
    use = use_of(name)
    after = clean_numbers(concurrency, rate)
    now = db_now()
    due = _due_under(use.name)
    before_starts = _admitted(due, use.name, use.numbers, now)
    after_starts = _admitted(due, use.name, after, now)
    over = 0
    if after.concurrency is not None:
        over = sum(max(key.running - after.concurrency, 0) for key in use.keys)
    return Preview(use.name, use.numbers, after, max(after_starts - before_starts, 0), over)


def _due_under(name: str) -> list[Step]:
    due = (
        Step.objects.due()
        .filter(limit_turn__isnull=False)
        .order_by("-priority", "limit_turn", "available_at")
        .only("id", "queue", "limits", "priority", "limit_turn")
    )
    return [step for step in due[:PREVIEW_SCAN] if any(e[0] == name for e in step.limits or ())]


def _admitted(due: Sequence[Step], name: str, value: Numbers | None, now: datetime) -> int:
    """How many of ``due`` would start now with ``name`` at ``value``."""
    pairs = {(n, k) for step in due for n, k, _ in step.limits or ()}
    standing = Standing.read(pairs, now)
    standing.effective[name] = value
    standing.reset_windows()
    admitted = 0
    for step in due:
        if standing.refusal(step.limits or ()) is None:
            standing.admit(step.limits or ())
            admitted += 1
    return admitted


def change_limit(
    name: Any,
    *,
    actor: Actor,
    reason: Any,
    concurrency: Any,
    rate: Any,
    seen: str | None = None,
) -> None:
    """Set a limit's numbers live, over its declaration and TASKS_LIMITS. With ``seen``
    (:func:`stamp` of the numbers a preview showed), refused by :class:`StaleChange` and
    nothing stored when the numbers in effect are no longer those."""
    check_permission(actor, "change_limits")
    after = clean_numbers(concurrency, rate)
    _change(name, actor=actor, reason=reason, after=after, seen=seen)


def reset_limit(name: Any, *, actor: Any, reason: Any) -> None:
    """Put a limit back to what its declaration and TASKS_LIMITS say."""
    check_permission(actor, "change_limits")
    _change(name, actor=actor, reason=reason, after=None)


def _change(
    name: Any, *, actor: Actor, reason: Any, after: Numbers | None, seen: str | None = None
) -> None:
    use = use_of(name)
    reason = validation.require_text(reason, "reason")
    if after is None and use.configured is None:
        raise InvalidInput("name", "unknown_limit", f"name: no workflow here declares {name!r}")
    who, _ = actor_fields(actor)
    with transaction.atomic():
        state, _ = LimitState.objects.select_for_update().get_or_create(name=use.name)
        # The numbers in effect as the locked row says: a change committed since the
        # lookup above is seen here, by the preview's check and in the event's "before".
        before = numbers(state, declared().get(use.name))
        if seen is not None and stamp(before) != seen:
            raise StaleChange(
                f"Nothing changed: the numbers of {use.name} were changed since your "
                f"preview (now {describe(before)}). Preview again."
            )
        state.overridden = after is not None
        state.concurrency = after.concurrency if after is not None else None
        state.rate = str(after.rate) if after is not None and after.rate else ""
        state.changed_by = who
        state.changed_at = db_now()
        state.save()
        effect = after if after is not None else use.configured
        _release(use.name)
        record_event(
            EventKind.LIMIT_CHANGED,
            task_id=None,
            actor=actor,
            reason=reason,
            limit=use.name,
            before=_stored(before),
            after=_stored(effect),
            live=after is not None,
        )


def _stored(value: Numbers | None) -> dict[str, Any] | None:
    if value is None:
        return None
    return {"concurrency": value.concurrency, "rate": str(value.rate) if value.rate else None}


def pause_key(name: Any, key: Any, *, actor: Actor, reason: Any) -> None:
    """Stop claims under one key of a limit; its running steps finish."""
    _set_key(name, key, paused=True, actor=actor, reason=reason)


def resume_key(name: Any, key: Any, *, actor: Actor, reason: Any) -> None:
    _set_key(name, key, paused=False, actor=actor, reason=reason)


def _set_key(name: Any, key: Any, *, paused: bool, actor: Actor, reason: Any) -> None:
    check_permission(actor, "change_limits")
    use = use_of(name)
    if not isinstance(key, str) or len(key) > 200:
        raise InvalidInput("key", "format", "key: text of at most 200 characters")
    if not use.partitioned and key:
        raise InvalidInput("key", "unknown_key", f"key: limit {use.name} has no keys")
    reason = validation.require_text(reason, "reason")
    who, _ = actor_fields(actor)
    with transaction.atomic():
        LimitState.objects.get_or_create(name=use.name)
        row, _ = LimitKey.objects.select_for_update().get_or_create(limit=use.name, key=key)
        if (row.paused_at is not None) == paused:
            return
        row.paused_at = db_now() if paused else None
        row.paused_by = who if paused else ""
        row.paused_reason = reason if paused else ""
        row.save(update_fields=["paused_at", "paused_by", "paused_reason"])
        if not paused:
            _release(use.name)
        record_event(
            EventKind.LIMIT_KEY_PAUSED if paused else EventKind.LIMIT_KEY_RESUMED,
            task_id=None,
            actor=actor,
            reason=reason,
            limit=use.name,
            key=key,
        )


def _release(name: str) -> None:
    """Ring for the due steps under ``name`` once this commits: a change or a resume may
    let them in, and they should not wait for the backstop's poll."""
    bells = [Doorbell(step.pk, step.queue) for step in _due_under(name)[:RELEASE_RINGS]]
    ring_on_commit(bells)
