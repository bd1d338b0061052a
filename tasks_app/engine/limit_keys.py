"""The rows of a limit's keys that enqueue and a remote's "retry after" write: each key's
turns (fairness, ``limited_claims``) and its hold (``exceptions.RateLimited``)."""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q

from tasks_app.db.clock import db_now
from tasks_app.models import LimitKey, LimitState

# The longest a remote's "retry after" holds a key (exceptions.RateLimited).
MAX_HOLD_SECONDS = 3600.0


def hold(entries: Iterable[Sequence[Any]], seconds: float, reason: str) -> float:
    """Hold every key of a step's limits (``Step.limits``) for ``seconds`` from now (at
    most ``MAX_HOLD_SECONDS``; a later hold already in place stays): a remote asked to be
    left alone that long. Returns the seconds held."""
    if not math.isfinite(seconds) or seconds < 0:
        seconds = 0.0
    seconds = min(seconds, MAX_HOLD_SECONDS)
    pairs = sorted({(str(name), str(key)) for name, key, _weight in entries})
    if not pairs or seconds == 0:
        return seconds
    with transaction.atomic():
        until = db_now() + timedelta(seconds=seconds)
        # In key order, as the claims write them (limited_claims._Decision.book).
        for name, key in pairs:
            LimitKey.objects.filter(limit=name, key=key).filter(
                Q(held_until__isnull=True) | Q(held_until__lt=until)
            ).update(held_until=until, held_reason=reason[:500])
    return seconds


def assign_turns(
    turn_keys: Sequence[tuple[str, str] | None], pairs: Iterable[tuple[str, str]]
) -> list[int | None]:
    """Turns for items about to be enqueued, in order: each item's key takes the turns after
    its last one, or after its limit's clock when that is later (an idle key starts where
    the others are). Creates the rows of the limits and keys (``pairs``) the claims read."""
    pairs = sorted(set(pairs))
    LimitState.objects.bulk_create(
        [LimitState(name=name) for name in sorted({name for name, _ in pairs})],
        ignore_conflicts=True,
    )
    LimitKey.objects.bulk_create(
        [LimitKey(limit=name, key=key) for name, key in pairs], ignore_conflicts=True
    )
    by_key: dict[tuple[str, str], int] = collections.Counter(k for k in turn_keys if k)
    clocks = dict(
        LimitState.objects.filter(name__in={name for name, _ in by_key}).values_list("name", "turn")
    )
    firsts: dict[tuple[str, str], int] = {}
    # In key order, as the claims write them (limited_claims._Decision.book).
    for (name, key), count in sorted(by_key.items()):
        row = LimitKey.objects.select_for_update().get(limit=name, key=key)
        start = max(clocks.get(name, 0), row.last_turn)
        LimitKey.objects.filter(pk=row.pk).update(last_turn=start + count)
        firsts[(name, key)] = start + 1
    turns: list[int | None] = []
    for turn_key in turn_keys:
        if turn_key is None:
            turns.append(None)
            continue
        turns.append(firsts[turn_key])
        firsts[turn_key] += 1
    return turns
