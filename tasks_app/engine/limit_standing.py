"""How steps under limits stand against them (``tasks_app.engine.limits``): each limit's
numbers in effect, its running steps, its rate windows, and why a step may not start now.
The claims under limits (``limited_claims``) decide by these; the console reads them to
say why work waits.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import connection
from django.db.models import Q
from django.db.models.functions import Now

from tasks_app.db.hot_cursor import hot_cursor
from tasks_app.db.rows import from_row
from tasks_app.engine.limits import Limit, Numbers, Rate, configured, declared
from tasks_app.engine.transitions import fast_path_enabled
from tasks_app.models import LimitKey, LimitState, Step, StepStatus

# Slices per period in a rate's window.
SLICES = 20

# Why a due step was not claimed.
PAUSED = "paused"
AT_CONCURRENCY = "concurrency"
AT_RATE = "rate"
HELD = "held"
UNKNOWN_LIMIT = "unknown_limit"


@dataclass
class Window:
    """A rate's spend by slice of its period: ``spent`` covers the ``SLICES + 1`` slices a
    period ending in slice ``slice`` reaches into, oldest first."""

    width: float
    slice: int
    spent: list[int]

    @classmethod
    def at(cls, stored: dict[str, Any], rate: Rate, now: datetime) -> Window:
        """The window as stored, moved on to the slice ``now`` is in. Kept under another
        period (the rate was changed), its whole spend counts as spent now."""
        width = rate.seconds / SLICES
        current = math.floor(now.timestamp() / width)
        spent = [0] * (SLICES + 1)
        if stored:
            if stored.get("width") == width:
                # Each slice moves ``shift`` places older; the oldest leave, the newest
                # start empty.
                shift = max(current - int(stored["slice"]), 0)
                kept = list(stored["spent"])[shift:] if shift <= SLICES else []
                spent = kept + [0] * (SLICES + 1 - len(kept))
            else:
                spent[-1] = sum(stored.get("spent", ()))
        return cls(width, current, spent)

    @property
    def used(self) -> int:
        return sum(self.spent)

    def spend(self, units: int) -> None:
        self.spent[-1] += units

    def frees_at(self, units: int, count: int) -> datetime | None:
        """When ``units`` more fit under ``count``, as older slices leave the period."""
        left = self.used
        for index, spent in enumerate(self.spent):
            if left + units <= count:
                break
            left -= spent
            if left + units <= count:
                leaves = self.slice + index + 1
                return datetime.fromtimestamp(leaves * self.width, tz=UTC)
        return None

    def stored(self) -> dict[str, Any]:
        return {"width": self.width, "slice": self.slice, "spent": self.spent}


def numbers(state: LimitState | None, limit: Limit | None) -> Numbers | None:
    """A limit's numbers in effect: an operator's live change, else the declaration with
    TASKS_LIMITS; None when neither is known here (this worker does not declare it)."""
    if state is not None and state.overridden:
        return Numbers(state.concurrency, Rate.parse(state.rate) if state.rate else None)
    return configured(limit) if limit is not None else None


@dataclass(frozen=True)
class Refusal:
    """Why a step may not start now: what holds it (``PAUSED``, ``HELD``,
    ``AT_CONCURRENCY``, ``AT_RATE``, ``UNKNOWN_LIMIT``), under which limit and key, and when
    that lets it in (None: when something else happens, such as a running step ending or a
    person resuming the key)."""

    why: str
    limit: str
    key: str
    until: datetime | None = None


@dataclass
class Standing:
    """The limits of some keys as they stand at ``now``: each limit's numbers in effect,
    each key's row, the running steps and the rate windows. A claim reads it under its
    lock; the console reads it to say why a step waits."""

    now: datetime
    pairs: set[tuple[str, str]]
    states: dict[str, LimitState]
    effective: dict[str, Numbers | None]
    keys: dict[tuple[str, str], LimitKey]
    running: collections.Counter[tuple[str, str]]
    windows: dict[tuple[str, str], Window]

    @classmethod
    def read(cls, pairs: set[tuple[str, str]], now: datetime) -> Standing:
        names = {name for name, _ in pairs}
        if fast_path_enabled():
            states, keys, running = read_at_once(pairs)
        else:
            states = {state.name: state for state in LimitState.objects.filter(name__in=names)}
            keys, running = keys_of(pairs), running_counts()
        known = declared()
        effective = {name: numbers(states.get(name), known.get(name)) for name in names}
        standing = cls(now, pairs, states, effective, keys, running, {})
        standing.reset_windows()
        return standing

    def reset_windows(self) -> None:
        """The rate windows as stored (dropping spends counted since the read)."""
        self.windows = {}
        for name, key in self.pairs:
            numbers_ = self.effective.get(name)
            if numbers_ is not None and numbers_.rate is not None:
                row = self.keys.get((name, key))
                self.windows[(name, key)] = Window.at(
                    row.window if row else {}, numbers_.rate, self.now
                )

    def admit(self, entries: Sequence[Sequence[Any]]) -> None:
        """Count a step as started: its running slots, and its spend of each rate."""
        for name, key, weight in entries:
            self.running[(name, key)] += 1
            if (name, key) in self.windows:
                self.windows[(name, key)].spend(weight)

    def refusal(self, entries: Sequence[Sequence[Any]]) -> Refusal | None:
        """Why a step under ``entries`` (``Step.limits``) may not start now; None: it may."""
        latest: Refusal | None = None
        for name, key, weight in entries:
            numbers_ = self.effective.get(name)
            if numbers_ is None:
                return Refusal(UNKNOWN_LIMIT, name, key)
            row = self.keys.get((name, key))
            if row is not None and row.paused_at is not None:
                return Refusal(PAUSED, name, key)
            if numbers_.concurrency is not None and (
                self.running[(name, key)] >= numbers_.concurrency
            ):
                return Refusal(AT_CONCURRENCY, name, key)
            waits: list[Refusal] = []
            if row is not None and row.held_until is not None and row.held_until > self.now:
                waits.append(Refusal(HELD, name, key, row.held_until))
            window = self.windows.get((name, key))
            rate = numbers_.rate
            if window is not None and rate is not None and window.used + weight > rate.count:
                at = window.frees_at(weight, rate.count)
                if at is None:
                    return Refusal(AT_RATE, name, key)
                waits.append(Refusal(AT_RATE, name, key, at))
            # It starts once every rate and hold it is under lets it in: the latest names it.
            for wait in waits:
                assert wait.until is not None
                if latest is None or latest.until is None or wait.until > latest.until:
                    latest = wait
        return latest


KEYS_SQL = (
    'SELECT * FROM tasks_app_limitkey WHERE ("limit", key) IN'
    " (SELECT * FROM unnest(%s::text[], %s::text[]))"
)


def keys_of(pairs: set[tuple[str, str]]) -> dict[tuple[str, str], LimitKey]:
    """The rows of these limits' keys that exist."""
    if not pairs:
        return {}
    if connection.vendor == "postgresql":
        names, keys = zip(*pairs, strict=True)
        rows = LimitKey.objects.raw(KEYS_SQL, [list(names), list(keys)])
        return {(row.limit, row.key): row for row in rows}
    where = Q()
    for name, key in pairs:
        where |= Q(limit=name, key=key)
    return {(row.limit, row.key): row for row in LimitKey.objects.filter(where)}


_KEY_COLUMNS = tuple(field.attname for field in LimitKey._meta.concrete_fields)
_STATE_COLUMNS = tuple(field.attname for field in LimitState._meta.concrete_fields)
# ORM twin: the LimitState query, keys_of and running_counts above. One row per pair: its
# key's row and its limit's (each NULL where none exists yet), and its running steps.
STANDING_SQL = f"""
WITH pairs AS (
    SELECT DISTINCT * FROM unnest(%(names)s::text[], %(keys)s::text[]) AS p(name, key)
), running AS (
    SELECT e->>0 AS name, e->>1 AS key, count(*) AS n
    FROM tasks_app_step s, jsonb_array_elements(s.limits) e
    WHERE s.status = 'running' AND s.limit_turn IS NOT NULL
    GROUP BY 1, 2
)
SELECT p.name, p.key, COALESCE(r.n, 0),
    {", ".join(f'k."{name}"' for name in _KEY_COLUMNS)},
    {", ".join(f'st."{name}"' for name in _STATE_COLUMNS)}
FROM pairs p
LEFT JOIN tasks_app_limitkey k ON k."limit" = p.name AND k.key = p.key
LEFT JOIN running r ON r.name = p.name AND r.key = p.key
LEFT JOIN tasks_app_limitstate st ON st.name = p.name
"""  # noqa: S608 (the column names are the models', not input)


def read_at_once(
    pairs: set[tuple[str, str]],
) -> tuple[
    dict[str, LimitState], dict[tuple[str, str], LimitKey], collections.Counter[tuple[str, str]]
]:
    """The limits' rows, their keys' rows and their running steps, for ``pairs``, in one
    statement (PostgreSQL's fast path)."""
    states: dict[str, LimitState] = {}
    keys: dict[tuple[str, str], LimitKey] = {}
    running: collections.Counter[tuple[str, str]] = collections.Counter()
    if not pairs:
        return states, keys, running
    names, key_names = zip(*pairs, strict=True)
    with hot_cursor() as cursor:
        cursor.execute(STANDING_SQL, {"names": list(names), "keys": list(key_names)}, prepare=True)
        rows = cursor.fetchall()
    width = len(_KEY_COLUMNS)
    for name, key, count, *rest in rows:
        if count:
            running[(name, key)] = count
        key_row, state_row = rest[:width], rest[width:]
        if key_row[0] is not None:
            keys[(name, key)] = from_row(LimitKey, _KEY_COLUMNS, key_row)
        if state_row[0] is not None and name not in states:
            states[name] = from_row(LimitState, _STATE_COLUMNS, state_row)
    return states, keys, running


def running_counts() -> collections.Counter[tuple[str, str]]:
    """The running steps under each limit and key (step_lease_idx: running rows only)."""
    return tally(StepStatus.RUNNING)


TALLY_SQL = (
    "SELECT e->>0, e->>1, count(*) FROM tasks_app_step s, jsonb_array_elements(s.limits) e"
    " WHERE s.status = %s AND s.limit_turn IS NOT NULL GROUP BY 1, 2"
)
# The due steps under limits by limit, key and weight (step_limited_due_idx).
WAITING_SQL = (
    "SELECT e->>0, e->>1, (e->>2)::bigint, count(*)"
    " FROM tasks_app_step s, jsonb_array_elements(s.limits) e"
    " WHERE s.status = 'pending' AND s.limit_turn IS NOT NULL"
    " AND s.available_at <= statement_timestamp() GROUP BY 1, 2, 3"
)


def tally(status: str) -> collections.Counter[tuple[str, str]]:
    """The steps under limits in ``status``, counted by limit and key. On PostgreSQL the
    database counts them and returns a row per key; elsewhere they are counted here."""
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(TALLY_SQL, [status])
            for name, key, count in cursor.fetchall():
                counts[(name, key)] += count
        return counts
    steps = Step.objects.filter(status=status, limit_turn__isnull=False)
    for entries in steps.values_list("limits", flat=True):
        for name, key, _weight in entries or ():
            counts[(name, key)] += 1
    return counts


def waiting_weights() -> collections.Counter[tuple[str, str, int]]:
    """The due steps under limits, counted by limit, key and the weight they spend of it:
    a step waits on a rate when its own weight does not fit, whatever its key's others
    spend (the claim weighs each step by itself)."""
    counts: collections.Counter[tuple[str, str, int]] = collections.Counter()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(WAITING_SQL)
            for name, key, weight, count in cursor.fetchall():
                counts[(name, key, int(weight))] += count
        return counts
    due = Step.objects.filter(
        status=StepStatus.PENDING, limit_turn__isnull=False, available_at__lte=Now()
    )
    for entries in due.values_list("limits", flat=True):
        for name, key, weight in entries or ():
            counts[(name, key, int(weight))] += 1
    return counts
