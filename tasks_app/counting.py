"""Metrics counters written beside the changes they count (``tasks_app.metrics`` reads them).

A counter row is ``<name>#<shard>``: each process adds to its own shard (its pid, or on
PostgreSQL's hot path its backend's pid, modulo ``SHARDS``), so concurrent writers rarely
wait on one row, and a reader adds the shards up.
"""

from __future__ import annotations

import collections
import math
import os
from collections.abc import Iterable, Mapping

from django.db import connection

from .models import OPERATOR_EVENT_KINDS, RARE_EVENT_KINDS
from .models import Counter as CounterRow

SHARDS = 16
# Counter names: tasks created per workflow, steps claimed per queue, and the histogram of
# successful steps' run times (one non-cumulative count per bucket, plus the sum in ms).
ENQUEUED = "enqueued"
CLAIMED = "claimed"
STEP_SECONDS = "step_seconds"
# Events of these kinds are counted as they are written ("event:<kind>"): the rare
# transitions and the operator actions. All of them go through transitions.record_event
# but one: the `cancelled` of a task whose cancel came while its step ran, which the hot
# path's completion writes and counts itself (batch.complete_many).
EVENT = "event"
COUNTED_EVENT_KINDS = (*RARE_EVENT_KINDS, *sorted(OPERATOR_EVENT_KINDS))
# Seconds from claim to success; the last bucket, past these, is +Inf.
STEP_SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300)


def bucket_label(bound: float) -> str:
    return "inf" if math.isinf(bound) else f"{bound:g}"


def bucket_of(seconds: float) -> str:
    """The counter name of the (non-cumulative) bucket a step's run time falls in."""
    bound = next((b for b in STEP_SECONDS_BUCKETS if seconds <= b), math.inf)
    return f"{STEP_SECONDS}:le={bucket_label(bound)}"


def add(counts: Mapping[str, int]) -> None:
    """Add ``counts`` to this process's shard of their counters inside the current
    transaction, so they commit or roll back with the change they count. The ORM path's
    twin of the counting CTEs of the hot path's statements (``sql.COUNT_INTO``)."""
    upsert({f"{name}#{os.getpid() % SHARDS}": n for name, n in counts.items()})


def upsert(counts: Mapping[str, int]) -> None:
    """Add to counter rows by their full names, in name order (so concurrent writers lock
    shared rows in one order)."""
    rows = sorted((name, n) for name, n in counts.items() if n)
    if not rows:
        return
    table = CounterRow._meta.db_table
    values = ", ".join(["(%s, %s)"] * len(rows))
    with connection.cursor() as cursor:
        # PostgreSQL and SQLite (3.24+) both speak ON CONFLICT ... DO UPDATE with excluded.
        cursor.execute(
            f"INSERT INTO {table} (name, value) VALUES {values} "  # noqa: S608
            f"ON CONFLICT (name) DO UPDATE SET value = {table}.value + excluded.value",
            [value for row in rows for value in row],
        )


def step_seconds(durations: Iterable[float]) -> dict[str, int]:
    """The counts a batch of successful runs adds to the step duration histogram."""
    times = list(durations)
    counts = collections.Counter(bucket_of(seconds) for seconds in times)
    counts[f"{STEP_SECONDS}:sum_ms"] = round(sum(times) * 1000)
    return dict(counts)
