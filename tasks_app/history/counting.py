"""Metrics counters (``tasks_app.observability.metrics`` reads them, and
``tasks_app.observability.workflow_figures`` samples them per workflow).

What a change counts is added, once its transaction commits, to its process's memory, and
a background thread writes what gathered every ``TASKS_COUNTER_FLUSH_MS`` in one statement
of its own: an execution writes no counter row (DESIGN rule 11), and a process killed
outright loses at most its last interval's counts. Reading flushes the reader's own counts
first. Counts that must move with their change (the pruned events' tally) are written in
its transaction by :func:`upsert`.

A counter row is ``<name>#<shard>``: each process adds to its own shard (its pid modulo
``SHARDS``), so concurrent writers rarely wait on one row, and a reader adds the shards up.
"""

from __future__ import annotations

import atexit
import collections
import logging
import math
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection, transaction

from tasks_app.models import OPERATOR_EVENT_KINDS, RARE_EVENT_KINDS, EventKind
from tasks_app.models import Counter as CounterRow

SHARDS = 16
# Counter names: tasks created per workflow, steps claimed per queue, and the histogram of
# successful steps' run times per workflow (one non-cumulative count per bucket, plus the
# sum in ms: "step_seconds@<workflow>:le=<bound>", "step_seconds@<workflow>:sum_ms").
# Rows named "step_seconds:le=<bound>" and "step_seconds:sum_ms", with no workflow, were
# written before the histogram was kept per workflow; the metrics add them in.
ENQUEUED = "enqueued"
CLAIMED = "claimed"
# Claims in which a limit held back a due step, per limit: "limit_refused:<limit>".
LIMIT_REFUSED = "limit_refused"
STEP_SECONDS = "step_seconds"
# Slots each schedule decided, and its runs now, by outcome (models.RunOutcome):
# "schedule_run:<schedule>:<outcome>". A backfilled slot counts again, as enqueued.
SCHEDULE_RUN = "schedule_run"
# Events of these kinds are counted as they are written ("event:<kind>"): the rare
# transitions and the operator actions. All of them go through history.events.record_event
# but one: the `cancelled` of a task whose cancel came while its step ran, which the hot
# path's completion writes and counts itself (fastpath.complete_many).
EVENT = "event"
COUNTED_EVENT_KINDS = (*RARE_EVENT_KINDS, *sorted(OPERATOR_EVENT_KINDS))
# These are counted per workflow as well ("event@<workflow>:<kind>"), for the workflow
# figures: rare, so the second counter row costs next to nothing.
WORKFLOW_EVENT_KINDS = (EventKind.RETRY_SCHEDULED, EventKind.DEAD_LETTERED)
# Seconds from claim to success; the last bucket, past these, is +Inf.
STEP_SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300)


def bucket_label(bound: float) -> str:
    return "inf" if math.isinf(bound) else f"{bound:g}"


def step_seconds_name(workflow: str, tail: str) -> str:
    """A counter of the run-time histogram of ``workflow``'s steps: ``tail`` is
    ``le=<bound>`` or ``sum_ms``. The completion's SQL restates it (``sql.COMPLETE_SQL``)."""
    return f"{STEP_SECONDS}@{workflow}:{tail}"


def workflow_event_name(workflow: str, kind: str) -> str:
    return f"{EVENT}@{workflow}:{kind}"


def bucket_of(seconds: float, workflow: str) -> str:
    """The counter name of the (non-cumulative) bucket a step's run time falls in."""
    bound = next((b for b in STEP_SECONDS_BUCKETS if seconds <= b), math.inf)
    return step_seconds_name(workflow, f"le={bucket_label(bound)}")


def add(counts: Mapping[str, int]) -> None:
    """Count ``counts`` once the current transaction commits (at once outside one); a
    rollback counts nothing."""
    counted = {name: n for name, n in counts.items() if n}
    if counted:
        transaction.on_commit(lambda: _pending.remember(counted))


def flush() -> None:
    """Write this process's counts now (each write is one statement of its own)."""
    _pending.flush()


def flush_at_exit() -> None:
    """:func:`flush` for a process ending: a database that does not answer loses the counts,
    with a warning."""
    try:
        flush()
    except DatabaseError:
        log.warning("metrics counts of this process lost: not written at exit", exc_info=True)


def discard_unwritten() -> None:
    """Drop this process's counts not yet written (a test starting afresh)."""
    _pending.discard()


class _Pending:
    """This process's counts not yet written, and the thread that writes them."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)
        atexit.register(flush_at_exit)

    def _reset(self) -> None:
        # Also run in a forked child: its parent's counts are its parent's to write.
        self._lock = threading.Lock()
        self._counts: collections.Counter[str] = collections.Counter()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def remember(self, counts: Mapping[str, int]) -> None:
        with self._lock:
            self._counts.update(counts)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="counters", daemon=True)
                self._thread.start()

    def discard(self) -> None:
        with self._lock:
            self._counts.clear()

    def flush(self) -> None:
        with self._lock:
            counts, self._counts = self._counts, collections.Counter()
        if not counts:
            return
        try:
            with transaction.atomic():
                upsert({f"{name}#{os.getpid() % SHARDS}": n for name, n in counts.items()})
        except DatabaseError:
            with self._lock:
                self._counts.update(counts)  # kept for the next flush
            raise

    def _run(self) -> None:
        while True:
            self._wake.wait(settings.TASKS_COUNTER_FLUSH_MS / 1000)
            close_old_connections()
            try:
                self.flush()
            except DatabaseError:
                log.warning("metrics counters not written; trying again", exc_info=True)


log = logging.getLogger(__name__)
_pending = _Pending()


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


def step_seconds(durations: Iterable[float], workflow: str) -> dict[str, int]:
    """The counts a batch of ``workflow``'s successful runs adds to the step duration
    histogram."""
    times = list(durations)
    counts = collections.Counter(bucket_of(seconds, workflow) for seconds in times)
    counts[step_seconds_name(workflow, "sum_ms")] = round(sum(times) * 1000)
    return dict(counts)


# --- reading ------------------------------------------------------------------------------------


def totals() -> dict[str, int]:
    """Every counter, its shards added up (this process's own counts written first)."""
    flush()
    summed: collections.Counter[str] = collections.Counter()
    for name, value in CounterRow.objects.values_list("name", "value"):
        summed[name.split("#", 1)[0]] += value
    return dict(summed)


@dataclass
class Histogram:
    """Run times: non-cumulative counts by bucket label (``bucket_label``) and their sum."""

    buckets: dict[str, int] = field(default_factory=dict)
    sum_ms: int = 0

    def add(self, tail: str, n: int) -> None:
        if tail == "sum_ms":
            self.sum_ms += n
        elif tail.startswith("le="):
            label = tail[3:]
            self.buckets[label] = self.buckets.get(label, 0) + n

    @property
    def count(self) -> int:
        return sum(self.buckets.values())


@dataclass
class WorkflowTotals:
    """One workflow's counters since the start."""

    enqueued: int = 0
    run_times: Histogram = field(default_factory=Histogram)
    events: dict[str, int] = field(default_factory=dict)  # per WORKFLOW_EVENT_KINDS


def step_seconds_histogram(summed: Mapping[str, int]) -> Histogram:
    """The run-time histogram of every workflow's steps together (with the rows written
    before it was kept per workflow)."""
    histogram = Histogram()
    for name, n in summed.items():
        if name.startswith(f"{STEP_SECONDS}:"):
            histogram.add(name[len(STEP_SECONDS) + 1 :], n)
        elif name.startswith(f"{STEP_SECONDS}@"):
            histogram.add(name.rsplit(":", 1)[1], n)
    return histogram


def by_workflow(summed: Mapping[str, int]) -> dict[str, WorkflowTotals]:
    """The counters kept per workflow, by workflow (a workflow name may hold ``:``; the
    part after the last one is the counter's own)."""
    workflows: dict[str, WorkflowTotals] = {}
    for name, n in summed.items():
        if name.startswith(f"{ENQUEUED}:"):
            workflows.setdefault(name[len(ENQUEUED) + 1 :], WorkflowTotals()).enqueued += n
        elif name.startswith(f"{STEP_SECONDS}@"):
            workflow, tail = name[len(STEP_SECONDS) + 1 :].rsplit(":", 1)
            workflows.setdefault(workflow, WorkflowTotals()).run_times.add(tail, n)
        elif name.startswith(f"{EVENT}@"):
            workflow, kind = name[len(EVENT) + 1 :].rsplit(":", 1)
            events = workflows.setdefault(workflow, WorkflowTotals()).events
            events[kind] = events.get(kind, 0) + n
    return workflows
