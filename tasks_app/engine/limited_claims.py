"""Claims of steps under limits (``tasks_app.engine.limits``), exact across every worker.

Such claims are decided one at a time, after a transaction-level advisory lock on PostgreSQL
(where, while the limits have room, a claim is one database function: ``limited_at_once``)
and in a write transaction on SQLite, so each reads the running steps and rate windows as
every earlier claim left them. A step over a limit stays pending: it is not claimed, spends
no attempt, and the worker does not spin on it; when a rate is what holds the queue back,
the claim rings once for the time it frees (:attr:`Claimed.retry_at`).

- **concurrency**: the running steps under the same limit and key, counted from the step
  rows (few: only running ones), so nothing drifts when a step ends by any path.
- **rate**: each key's spend by slice of the period (:class:`Window`), counted whole for
  every slice the period reaches into, so no period, wherever it starts, holds more than
  the rate (a claim may wait up to one slice, 1/``SLICES`` of the period, longer than a
  sliding log would make it).
- **fairness**: due steps are taken by priority, then turn: enqueue gives a key's steps
  turns from where its limit's clock stands (``LimitState.turn``, the latest turn claimed)
  or after the key's last turn, whichever is later; so a key with 10,000 waiting steps
  takes one turn, then another key's step takes the next.
"""

from __future__ import annotations

import collections
import json
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from django.db import connection, transaction
from django.db.models import QuerySet

from tasks_app.db.clock import db_now
from tasks_app.db.hot_cursor import hot_cursor
from tasks_app.engine import limited_at_once
from tasks_app.engine.dispatch import Doorbell, ring_on_commit
from tasks_app.engine.leases import Claim, claimed_steps
from tasks_app.engine.limit_standing import AT_RATE, HELD, Standing, Window
from tasks_app.engine.sql import (
    CLAIM_IDS_SQL,
    LIMITED_BOOK_SQL,
    LIMITED_DUE_SQL,
    limited_candidates_sql,
)
from tasks_app.engine.states import start_attempts
from tasks_app.engine.transitions import fast_path_enabled, paused_filter
from tasks_app.exceptions import LEASE_EXPIRED
from tasks_app.history import counting
from tasks_app.models import LimitKey, LimitState, Step, StepStatus, Task

# Due steps under limits read per claim, in claim order: at first the batch and FIRST_SCAN
# more, and up to SCAN when limits refused some of those.
FIRST_SCAN = 10
SCAN = 500
# The advisory lock every claim under limits takes first (PostgreSQL).
LOCK = zlib.crc32(b"tasks_app.limited_claims")


@dataclass
class Claimed:
    """What a claim under limits took, and when a rate lets more in (None: no rate holds
    the queue back)."""

    claims: list[Claim] = field(default_factory=list)
    retry_at: datetime | None = None
    # The named step's last lease ran out: it is the whole batch (exceptions.LEASE_EXPIRED).
    alone: bool = False


def _serialize() -> datetime:
    """Wait for the claims before this one; the database's time once they are done."""
    if connection.vendor == "postgresql":
        with hot_cursor() as cursor:
            # The lock is taken before the clock is read (the select list runs in order),
            # so this claim's time is never before that of the claim it waited for.
            # Bitmap scans are off for the claim: the running steps are read through
            # step_lease_idx, whose entries of steps that ran and ended stay until a vacuum,
            # and only a plain index scan marks them dead for the next claim to skip (a
            # drain's claims read thousands of them each, then a handful).
            cursor.execute(
                "SELECT pg_advisory_xact_lock(%s), clock_timestamp(),"
                " set_config('enable_bitmapscan', 'off', true)",
                [LOCK],
                prepare=True,
            )
            row = cursor.fetchone()
            assert row is not None
            now: datetime = row[1]
            return now
    return db_now()


def has_due(queue: str) -> bool:
    """Whether ``queue`` has a due step under limits (step_limited_due_idx)."""
    if fast_path_enabled():
        with hot_cursor() as cursor:
            cursor.execute(LIMITED_DUE_SQL, [queue], prepare=True)
            row = cursor.fetchone()
            return row is not None and bool(row[0])
    return Step.objects.due().filter(queue=queue, limit_turn__isnull=False).exists()


def claim(
    *,
    queue: str | None,
    worker_id: str,
    limit: int,
    lease_seconds: int,
    step_id: int | None = None,
    only_named: bool = False,
) -> Claimed:
    """Claim up to ``limit`` due steps under limits of ``queue`` (or the named step's),
    ``step_id`` first if it may run now; with ``only_named``, that step or nothing."""
    if not fast_path_enabled():
        return _weigh_and_claim(queue, worker_id, limit, lease_seconds, step_id, only_named)
    # One round trip takes the steps the limits let in, as far as the first they refuse
    # (so it reads no more than the batch); past it, the decision here weighs the rest.
    prefix = limited_at_once.claim(
        queue=queue,
        worker_id=worker_id,
        limit=limit,
        lease_seconds=lease_seconds,
        step_id=step_id,
        only_named=only_named,
        size=limit,
    )
    _count(prefix.claims)
    if prefix.decided:
        return Claimed(prefix.claims, None, prefix.alone)
    taken = prefix.claims
    if taken:
        queue = queue or taken[0].queue
        if step_id in {c.step_id for c in taken}:
            step_id = None
    rest = _weigh_and_claim(
        queue, worker_id, limit - len(taken), lease_seconds, step_id, only_named, bool(taken)
    )
    return Claimed(taken + rest.claims, rest.retry_at, rest.alone)


def _weigh_and_claim(
    queue: str | None,
    worker_id: str,
    limit: int,
    lease_seconds: int,
    step_id: int | None,
    only_named: bool,
    after_some: bool = False,
) -> Claimed:
    """:func:`claim` by the decision here (``after_some``: this claim follows one that took
    steps already, so a rate holding the rest back is not rung for)."""
    with transaction.atomic():
        now = _serialize()
        # Few candidates first: while limits have room, the first of them are the claim.
        size = min(limit + FIRST_SCAN, SCAN)
        candidates = _candidates(queue, step_id, now, only_named, size, limit)
        if not candidates:
            return Claimed()
        alone = candidates[0].pk == step_id and candidates[0].error_class == LEASE_EXPIRED
        if alone:
            candidates, limit = candidates[:1], 1
        decision = _decide(candidates, limit, now)
        if len(decision.admitted) < limit and len(candidates) == size < SCAN:
            # Limits refused some: read further, past the keys at their limit.
            candidates = _candidates(queue, step_id, now, only_named, SCAN, limit)
            decision = _decide(candidates, limit, now)
        if decision.refused_by:
            counting.add({f"{counting.LIMIT_REFUSED}:{name}": 1 for name in decision.refused_by})
        taken = _take(decision.admitted, worker_id, lease_seconds, now)
        decision.book([step for step in decision.admitted if step.pk in taken.ids])
        retry_at = decision.retry_at if not taken.ids and not after_some else None
        if retry_at is not None:
            # Nothing could start for a rate: ring once for when it lets the first in.
            delay = max((retry_at - now).total_seconds(), 0.0)
            first = candidates[0]
            ring_on_commit([Doorbell(first.pk, first.queue, delay)])
    # The claimed rows are made into steps once the lock is let go.
    claims = [
        Claim.of(step, worker_id=worker_id, lease_seconds=lease_seconds, keep=True)
        for step in taken.steps()
    ]
    _count(claims)
    return Claimed(claims, retry_at, alone and bool(claims))


def _count(claims: Sequence[Claim]) -> None:
    if claims:
        counting.add(collections.Counter(f"{counting.CLAIMED}:{c.queue}" for c in claims))


class Candidate(NamedTuple):
    """A due step under limits as a claim weighs it: the columns it reads, no model row."""

    pk: int
    task_id: int
    queue: str
    limits: list[list[Any]] | None
    limit_turn: int | None
    error_class: str


def _candidates(
    queue: str | None,
    step_id: int | None,
    now: datetime,
    only_named: bool,
    size: int,
    limit: int,
) -> list[Candidate]:
    if fast_path_enabled():
        return _candidates_at_once(queue, step_id, now, only_named, size, limit)
    due = Step.objects.due(now).filter(limit_turn__isnull=False).exclude(paused_filter())
    named = _read(due.filter(pk=step_id)) if step_id is not None else []
    if only_named or (named and named[0].error_class == LEASE_EXPIRED):
        # The named step alone: a run of that step, or one whose last lease ran out.
        return named
    if queue is None:
        if not named:
            return []
        queue = named[0].queue
    # The named step takes its turn like the rest: a doorbell names a step for its queue,
    # not to let it ahead of another key's turn (fairness).
    rest = due.filter(queue=queue).order_by("-priority", "limit_turn", "available_at")
    if limit > 1:
        # A step whose last lease ran out is claimed only in a batch of one.
        rest = rest.exclude(error_class=LEASE_EXPIRED)
    return _read(rest[:size])


def _read(steps: QuerySet[Step]) -> list[Candidate]:
    return [Candidate(*row) for row in steps.values_list(*Candidate._fields)]


def _candidates_at_once(
    queue: str | None,
    step_id: int | None,
    now: datetime,
    only_named: bool,
    size: int,
    limit: int,
) -> list[Candidate]:
    """:func:`_candidates` by one statement (PostgreSQL's fast path)."""
    with hot_cursor() as cursor:
        cursor.execute(
            limited_candidates_sql(0 if only_named else size),
            {"step": step_id, "queue": queue, "now": now, "limit": limit},
            prepare=True,
        )
        rows = cursor.fetchall()
    named: list[Candidate] = []
    rest: list[Candidate] = []
    for pk, task_id, queue_name, limits, turn, error_class, rank in rows:
        entries = json.loads(limits) if limits is not None else None
        candidate = Candidate(pk, task_id, queue_name, entries, turn, error_class)
        (rest if rank else named).append(candidate)
    if only_named or (named and named[0].error_class == LEASE_EXPIRED):
        return named
    return rest


@dataclass
class _Decision:
    """The admission of candidates against the limits as they stand."""

    admitted: list[Candidate]
    windows: dict[tuple[str, str], Window]
    states: dict[str, LimitState]
    retry_at: datetime | None
    # The limits that refused a step (counted once the claim is decided).
    refused_by: set[str]

    def book(self, claimed: Sequence[Candidate]) -> None:
        """Spend the rates of the steps actually claimed, and move the turn clocks."""
        spent: dict[tuple[str, str], Window] = {}
        turns: dict[str, int] = {}
        for step in claimed:
            for name, key, weight in step.limits or ():
                window = self.windows.get((name, key))
                if window is not None:
                    window.spend(weight)
                    spent[(name, key)] = window
            owner = turn_owner(step.limits or ())
            if owner is not None and step.limit_turn is not None:
                turns[owner] = max(turns.get(owner, 0), step.limit_turn)
        if fast_path_enabled():
            _book_at_once(spent, turns)
            return
        # In key order, as enqueue locks them (limit_keys.assign_turns), so neither waits on
        # the other in a circle.
        for (name, key), window in sorted(spent.items()):
            LimitKey.objects.filter(limit=name, key=key).update(window=window.stored())
        for name, turn in turns.items():
            LimitState.objects.filter(name=name, turn__lt=turn).update(turn=turn)


def _book_at_once(spent: dict[tuple[str, str], Window], turns: dict[str, int]) -> None:
    """:meth:`_Decision.book`'s writes by one statement (PostgreSQL's fast path)."""
    if not spent and not turns:
        return
    pairs = sorted(spent)
    with hot_cursor() as cursor:
        cursor.execute(
            LIMITED_BOOK_SQL,
            {
                "names": [name for name, _ in pairs],
                "keys": [key for _, key in pairs],
                "windows": [json.dumps(spent[pair].stored()) for pair in pairs],
                "limits": sorted(turns),
                "turns": [turns[name] for name in sorted(turns)],
            },
            prepare=True,
        )


def turn_owner(entries: Iterable[Sequence[Any]]) -> str | None:
    """The limit a step's turn is counted in: its first partitioned limit, else its first
    (limits.place)."""
    entries = list(entries)
    for name, key, _weight in entries:
        if key:
            return str(name)
    return str(entries[0][0]) if entries else None


def _decide(candidates: Sequence[Candidate], limit: int, now: datetime) -> _Decision:
    pairs = {(name, key) for step in candidates for name, key, _ in step.limits or ()}
    standing = Standing.read(pairs, now)
    admitted: list[Candidate] = []
    retry_at: datetime | None = None
    refused_by: set[str] = set()
    for step in candidates:
        if len(admitted) == limit:
            break
        entries = step.limits or ()
        refused = standing.refusal(entries)
        if refused is None:
            admitted.append(step)
            standing.admit(entries)
            continue
        refused_by.add(refused.limit)
        if refused.until is not None and refused.why in (AT_RATE, HELD):
            retry_at = refused.until if retry_at is None else min(retry_at, refused.until)
    # The tentative spends are dropped: book() spends for the steps actually claimed.
    standing.reset_windows()
    return _Decision(admitted, standing.windows, standing.states, retry_at, refused_by)


@dataclass
class _Taken:
    """The steps a claim took, in the order admitted: as the claim statement returned
    their rows (PostgreSQL's fast path), or as model rows."""

    ids: set[int]
    rows: list[Sequence[Any]] = field(default_factory=list)
    models: list[Step] = field(default_factory=list)

    def steps(self) -> list[Step]:
        return self.models or claimed_steps(self.rows)


def _take(
    admitted: Sequence[Candidate], worker_id: str, lease_seconds: int, now: datetime
) -> _Taken:
    """Claim the admitted steps still pending whose task and step no other transaction
    holds (task rows first, as every writer locks them), in the order admitted; their
    leases start ``now``, the time the limits were judged at, so the attempts' records show
    what the rates counted."""
    if not admitted:
        return _Taken(set())
    if fast_path_enabled():
        with hot_cursor() as cursor:
            cursor.execute(
                CLAIM_IDS_SQL,
                {
                    "ids": [step.pk for step in admitted],
                    "at": now,
                    "lease": lease_seconds,
                    "worker": worker_id,
                },
                prepare=True,
            )
            rows = cursor.fetchall()
        return _Taken({row[0] for row in rows}, rows=rows)
    free_tasks = set(
        Task.objects.select_for_update(skip_locked=True)
        .filter(pk__in={step.task_id for step in admitted})
        .values_list("pk", flat=True)
    )
    ids = [step.pk for step in admitted if step.task_id in free_tasks]
    still = set(
        Step.objects.select_for_update(skip_locked=True)
        .filter(pk__in=ids, status=StepStatus.PENDING)
        .values_list("pk", flat=True)
    )
    ids = [pk for pk in ids if pk in still]
    start_attempts(ids, worker_id=worker_id, lease_seconds=lease_seconds, at=now)
    taken = Step.objects.select_related("task").in_bulk(ids)
    return _Taken(set(ids), models=[taken[pk] for pk in ids])
