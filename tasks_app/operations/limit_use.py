"""Flow control as on-call sees it (``tasks_app.engine.limits``): each limit's use now
(running, spent this period, waiting), its keys at their limit and the tasks that hold
them, and what holds one waiting step back. Read by the Limits page, the metrics and
``tasks_app.operations.why``; the live changes are ``tasks_app.operations.limits``.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Q

from tasks_app.db.clock import db_now
from tasks_app.engine.limit_standing import (
    Refusal,
    Standing,
    numbers,
    running_counts,
    waiting_weights,
)
from tasks_app.engine.limits import Numbers, configured, declared
from tasks_app.exceptions import InvalidInput
from tasks_app.models import LimitKey, LimitState, Step, StepStatus

type Pair = tuple[str, str]

# The keys with work a limit's use lists at most (those at their limit first).
MAX_KEYS = 200


def lightest(waiting_weights: Sequence[tuple[int, int]]) -> int:
    """The weight of the lightest waiting step (``KeyUse.waiting_weights``, lightest
    first); one unit when none waits."""
    return waiting_weights[0][0] if waiting_weights else 1


@dataclass(frozen=True)
class KeyUse:
    """One key of a limit now ('' for an unpartitioned limit)."""

    key: str
    running: int
    waiting: int
    # Units of the rate spent in the period that ends now (None: the limit has no rate).
    spent: int | None
    numbers: Numbers | None
    # Tasks with a step running under this key (few: at most the concurrency).
    holders: tuple[int, ...] = ()
    paused_at: datetime | None = None
    paused_by: str = ""
    paused_reason: str = ""
    held_until: datetime | None = None
    held_reason: str = ""
    # When the rate lets the lightest waiting step in, or one unit when none waits (None:
    # it has room, or no rate).
    next_free: datetime | None = None
    # The waiting steps by the weight each spends of the limit: (weight, steps), lightest
    # first.
    waiting_weights: tuple[tuple[int, int], ...] = ()

    @property
    def at_concurrency(self) -> bool:
        cap = self.numbers.concurrency if self.numbers else None
        return cap is not None and self.running >= cap

    @property
    def at_rate(self) -> bool:
        """Whether the rate holds back every waiting step (not one more unit fits, when
        none waits)."""
        rate = self.numbers.rate if self.numbers else None
        if rate is None or self.spent is None:
            return False
        return self.spent + lightest(self.waiting_weights) > rate.count

    @property
    def waiting_on_rate(self) -> int:
        """The waiting steps whose own weight does not fit in what the rate has left."""
        rate = self.numbers.rate if self.numbers else None
        if rate is None or self.spent is None:
            return 0
        left = rate.count - self.spent
        return sum(steps for weight, steps in self.waiting_weights if weight > left)

    @property
    def at_limit(self) -> bool:
        return self.paused_at is not None or self.at_concurrency or self.at_rate


@dataclass(frozen=True)
class LimitUse:
    """A limit now: its numbers in effect and where they come from, and its keys."""

    name: str
    numbers: Numbers | None
    # The declaration with TASKS_LIMITS applied (None: no workflow here declares it).
    configured: Numbers | None
    overridden: bool
    changed_by: str
    changed_at: datetime | None
    partitioned: bool
    workflows: tuple[str, ...]
    # The keys read: those at their limit first, paused, held and the unpartitioned one
    # always; at most MAX_KEYS with work (``more_keys``: how many more have work).
    keys: tuple[KeyUse, ...] = field(default=())
    # Over every key, counted by the database.
    running: int = 0
    waiting: int = 0
    active_keys: int = 0
    more_keys: int = 0

    @property
    def spent(self) -> int:
        """Units spent this period over the keys read."""
        return sum(key.spent or 0 for key in self.keys)

    @property
    def at_limit(self) -> tuple[KeyUse, ...]:
        return tuple(key for key in self.keys if key.at_limit)

    @property
    def paused(self) -> tuple[KeyUse, ...]:
        return tuple(key for key in self.keys if key.paused_at is not None)

    @property
    def source(self) -> str:
        if self.overridden:
            return "changed live"
        if self.configured is not None and self.name in _settings():
            return "TASKS_LIMITS"
        return "code" if self.configured is not None else "unknown here"


def _settings() -> dict[str, Any]:
    from django.conf import settings

    return dict(getattr(settings, "TASKS_LIMITS", {}))


def _workflows_of() -> dict[str, list[str]]:
    """The workflows declaring each limit (their latest versions here)."""
    from tasks_app.engine.workflows import registry

    names: dict[str, list[str]] = collections.defaultdict(list)
    for name in registry.names():
        for limit in registry.latest(name).all_limits():
            names[limit.name].append(name)
    return names


def waiting_counts(
    names: Iterable[str] | None = None,
) -> tuple[collections.Counter[Pair], dict[Pair, dict[int, int]]]:
    """Due pending steps under each limit and key (step_limited_due_idx), and how many of
    them spend each weight."""
    wanted = set(names) if names is not None else None
    counts: collections.Counter[Pair] = collections.Counter()
    weights: dict[Pair, dict[int, int]] = collections.defaultdict(dict)
    for (name, key, weight), count in waiting_weights().items():
        if wanted is None or name in wanted:
            counts[(name, key)] += count
            weights[(name, key)][weight] = count
    return counts, weights


def holders(pairs: Iterable[Pair] | None = None) -> dict[Pair, list[int]]:
    """The tasks with a step running under each limit and key, oldest claim first."""
    wanted = set(pairs) if pairs is not None else None
    held: dict[Pair, list[int]] = collections.defaultdict(list)
    running = Step.objects.filter(status=StepStatus.RUNNING, limit_turn__isnull=False)
    for task_id, entries in running.order_by("started_at", "pk").values_list("task_id", "limits"):
        for name, key, _ in entries or ():
            if wanted is None or (name, key) in wanted:
                held[(name, key)].append(task_id)
    return held


def uses(now: datetime | None = None) -> list[LimitUse]:
    """Every limit the workflows here declare or the database knows, by name. Its totals
    count every key; the keys it lists are bounded (``MAX_KEYS`` with work per limit), so
    a limit partitioned by customer costs the same with ten customers or a million."""
    now = now or db_now()
    known = declared()
    states = {state.name: state for state in LimitState.objects.all()}
    names = sorted(set(known) | set(states))
    effective = {name: numbers(states.get(name), known.get(name)) for name in names}
    waiting, weights = waiting_counts(names)
    running = running_counts()
    marked = LimitKey.objects.filter(limit__in=names).filter(
        Q(key="") | Q(paused_at__isnull=False) | Q(held_until__gt=now)
    )
    chosen: set[Pair] = set(marked.values_list("limit", "key"))
    active: dict[str, list[Pair]] = collections.defaultdict(list)
    for pair in set(waiting) | {pair for pair in running if pair[0] in effective}:
        active[pair[0]].append(pair)
    more: dict[str, int] = {}
    for name, pairs in active.items():
        numbers_ = effective.get(name)
        cap = numbers_.concurrency if numbers_ is not None else None

        def urgency(pair: Pair, cap: int | None = cap) -> tuple[bool, int, int, str]:
            full = cap is not None and running[pair] >= cap
            return (not full, -waiting[pair], -running[pair], pair[1])

        pairs.sort(key=urgency)
        chosen.update(pairs[:MAX_KEYS])
        more[name] = max(len(pairs) - MAX_KEYS, 0)
    standing = Standing.read(chosen, now)
    rows = standing.keys
    held = holders(chosen)
    flows = _workflows_of()
    result = []
    for name in names:
        limit = known.get(name)
        state = states.get(name)
        in_effect = effective[name]
        keys = [
            _key_use(
                pair, in_effect, standing, waiting, weights, rows.get(pair), held.get(pair, [])
            )
            for pair in sorted(pair for pair in chosen if pair[0] == name)
        ]
        keys.sort(key=lambda use: (not use.at_limit, -use.waiting, -use.running, use.key))
        result.append(
            LimitUse(
                name=name,
                numbers=in_effect,
                configured=configured(limit) if limit is not None else None,
                overridden=bool(state and state.overridden),
                changed_by=state.changed_by if state else "",
                changed_at=state.changed_at if state else None,
                partitioned=bool(limit and limit.key is not None) or any(key.key for key in keys),
                workflows=tuple(flows.get(name, ())),
                keys=tuple(keys),
                running=sum(n for pair, n in running.items() if pair[0] == name),
                waiting=sum(n for pair, n in waiting.items() if pair[0] == name),
                active_keys=len(active.get(name, ())),
                more_keys=more.get(name, 0),
            )
        )
    return result


def _key_use(
    pair: Pair,
    in_effect: Numbers | None,
    standing: Standing,
    waiting: collections.Counter[Pair],
    weights: dict[Pair, dict[int, int]],
    row: LimitKey | None,
    held: list[int],
) -> KeyUse:
    window = standing.windows.get(pair)
    rate = in_effect.rate if in_effect else None
    waiting_weights = tuple(sorted(weights.get(pair, {}).items()))
    next_free = None
    if window is not None and rate is not None:
        # When the lightest waiting step fits (one unit when none waits).
        weight = lightest(waiting_weights)
        if window.used + weight > rate.count:
            next_free = window.frees_at(weight, rate.count)
    return KeyUse(
        key=pair[1],
        running=standing.running[pair],
        waiting=waiting[pair],
        waiting_weights=waiting_weights,
        spent=window.used if window is not None else None,
        numbers=in_effect,
        holders=tuple(held),
        paused_at=row.paused_at if row else None,
        paused_by=row.paused_by if row else "",
        paused_reason=row.paused_reason if row else "",
        held_until=_live(row.held_until if row else None, standing.now),
        held_reason=row.held_reason if row else "",
        next_free=next_free,
    )


def _live(until: datetime | None, now: datetime) -> datetime | None:
    return until if until is not None and until > now else None


def use_of(name: Any) -> LimitUse:
    """One limit now; :class:`InvalidInput` (``name``, ``unknown_limit``) if none is known."""
    for use in uses():
        if use.name == name:
            return use
    raise InvalidInput("name", "unknown_limit", f"name: no limit is called {name!r}")


def holding(entries: Sequence[Sequence[Any]] | None, now: datetime | None = None) -> Refusal | None:
    """What holds a due step under ``entries`` (``Step.limits``) back now, if anything."""
    entries = entries or ()
    pairs = {(str(name), str(key)) for name, key, _ in entries}
    return Standing.read(pairs, now or db_now()).refusal(entries) if pairs else None
