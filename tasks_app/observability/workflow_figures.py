"""Per-workflow figures over the last hour, day or week, from a roll-up of the counters.

The metrics counters (``tasks_app.history.counting``) count, per workflow, the tasks enqueued,
the run-time histogram of the steps that succeeded (the completion's statement keys the histogram it
always kept by the task's workflow: no row more for a batch of one workflow; measured +0.3 B of WAL
per step, +5 B when batches mix two workflows), and the retries and dead letters (a second counter
row on those rare paths). Those counters only grow. So:

- **Writing** (``tasks_app.observability.workflow_samples``, a sweep job): about once a minute
  the sweeper writes one :class:`~tasks_app.models.WorkflowSample` per workflow with its
  totals, kept for fifteen days (after two, the hourly ones only).
- **Reading** (here): a figure over a window is the live counters (now) minus the sample at the
  window's start; a chart's bar is the difference between the samples at its two ends.
  Percentiles come from the histogram's bucket counts. What a page reads follows the
  number of workflows and bars, never the number of tasks.

Samples carry the database's clock; the callers' ``now`` is an injected clock for tests.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import F
from django.db.models import Window as Over
from django.db.models.functions import RowNumber

from tasks_app.db.clock import db_now
from tasks_app.history import counting
from tasks_app.history.counting import WorkflowTotals
from tasks_app.models import EventKind, WorkflowSample
from tasks_app.workflows import registry

# --- the samples --------------------------------------------------------------------------------


def latest_samples(
    *, before: datetime, since: datetime, workflow: str | None = None
) -> list[WorkflowSample]:
    """Each workflow's latest sample taken in ``[since, before)``: one read, ranked in the
    database."""
    samples = WorkflowSample.objects.filter(taken_at__gte=since, taken_at__lt=before)
    if workflow is not None:
        samples = samples.filter(workflow=workflow)
    ranked = samples.annotate(
        newest=Over(RowNumber(), partition_by=[F("workflow")], order_by=F("taken_at").desc())
    )
    return list(ranked.filter(newest=1))


# --- what a figure is ---------------------------------------------------------------------------


def _bound(label: str) -> float:
    return math.inf if label == "inf" else float(label)


def quantile(buckets: Mapping[str, int], q: float) -> float | None:
    """The ``q`` quantile of run times from non-cumulative bucket counts, interpolated
    linearly inside its bucket (as Prometheus's ``histogram_quantile``); ``inf`` when it
    falls past the last bound; None without runs."""
    total = sum(n for n in buckets.values() if n > 0)
    if total <= 0:
        return None
    rank = q * total
    lower, seen = 0.0, 0
    for label in sorted(buckets, key=_bound):
        n = max(buckets[label], 0)
        upper = _bound(label)
        if n and seen + n >= rank:
            if math.isinf(upper):
                return math.inf
            return lower + (upper - lower) * (rank - seen) / n
        seen += n
        lower = upper
    return lower


@dataclass(frozen=True)
class Point:
    """A workflow's totals at a moment: a sample, or the live counters."""

    at: datetime
    enqueued: int = 0
    succeeded: int = 0
    retried: int = 0
    dead_lettered: int = 0
    run_buckets: Mapping[str, int] | None = None
    run_ms: int = 0

    @classmethod
    def of(cls, row: WorkflowSample) -> Point:
        return cls(
            at=row.taken_at,
            enqueued=row.enqueued,
            succeeded=row.succeeded,
            retried=row.retried,
            dead_lettered=row.dead_lettered,
            run_buckets={str(k): int(v) for k, v in (row.run_buckets or {}).items()},
            run_ms=row.run_ms,
        )

    @classmethod
    def live(cls, totals: WorkflowTotals | None, at: datetime) -> Point:
        """The counters now (none yet: zeros)."""
        totals = totals or WorkflowTotals()
        return cls(
            at=at,
            enqueued=totals.enqueued,
            succeeded=totals.run_times.count,
            retried=totals.events.get(EventKind.RETRY_SCHEDULED, 0),
            dead_lettered=totals.events.get(EventKind.DEAD_LETTERED, 0),
            run_buckets=dict(totals.run_times.buckets),
            run_ms=totals.run_times.sum_ms,
        )

    def counts(self) -> tuple[object, ...]:
        buckets = {k: v for k, v in (self.run_buckets or {}).items() if v}
        return (self.enqueued, self.succeeded, self.retried, self.dead_lettered, buckets)


@dataclass(frozen=True)
class Figures:
    """What a workflow did between ``start`` and ``end``."""

    start: datetime
    end: datetime
    enqueued: int
    succeeded: int
    retried: int
    dead_lettered: int
    run_buckets: Mapping[str, int]
    run_ms: int

    @classmethod
    def between(cls, earlier: Point, later: Point) -> Figures:
        """The differences; a counter that went down (its rows were deleted) counts from
        zero again."""

        def grew(a: int, b: int) -> int:
            return b - a if b >= a else b

        before, after = earlier.run_buckets or {}, later.run_buckets or {}
        return cls(
            start=earlier.at,
            end=later.at,
            enqueued=grew(earlier.enqueued, later.enqueued),
            succeeded=grew(earlier.succeeded, later.succeeded),
            retried=grew(earlier.retried, later.retried),
            dead_lettered=grew(earlier.dead_lettered, later.dead_lettered),
            run_buckets={
                label: grew(before.get(label, 0), after.get(label, 0))
                for label in sorted(set(before) | set(after), key=_bound)
            },
            run_ms=grew(earlier.run_ms, later.run_ms),
        )

    @property
    def span(self) -> timedelta:
        return self.end - self.start

    @property
    def failure_rate(self) -> float | None:
        """Of the steps that ended (succeeded or dead-lettered), the share dead-lettered."""
        ended = self.succeeded + self.dead_lettered
        return self.dead_lettered / ended if ended else None

    @property
    def retry_rate(self) -> float | None:
        """Of the attempts that ended (a success, a retry or a dead letter), the share
        that ended in a retry."""
        ended = self.succeeded + self.retried + self.dead_lettered
        return self.retried / ended if ended else None

    @property
    def mean(self) -> float | None:
        return self.run_ms / 1000 / self.succeeded if self.succeeded else None

    @property
    def p50(self) -> float | None:
        return quantile(self.run_buckets, 0.5)

    @property
    def p95(self) -> float | None:
        return quantile(self.run_buckets, 0.95)

    @property
    def p99(self) -> float | None:
        return quantile(self.run_buckets, 0.99)


# --- windows ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    name: str
    label: str
    span: timedelta
    # A chart's bar, and the samples it reads: every one (a minute apart) or the hourly
    # ones (the others are thinned after FINE_KEPT).
    bar: timedelta
    bar_label: str
    hourly: bool

    @property
    def bars(self) -> int:
        return int(self.span / self.bar)

    @property
    def grain(self) -> timedelta:
        """How far apart the samples it reads are."""
        return timedelta(hours=1) if self.hourly else timedelta(minutes=1)


WINDOWS = {
    window.name: window
    for window in (
        Window("hour", "last hour", timedelta(hours=1), timedelta(minutes=5), "5 minutes", False),
        Window("day", "last day", timedelta(days=1), timedelta(hours=1), "hour", True),
        Window("week", "last week", timedelta(days=7), timedelta(hours=6), "6 hours", True),
    )
}
DEFAULT_WINDOW = "day"


def _at(samples: Sequence[WorkflowSample], moment: datetime, grain: timedelta) -> Point | None:
    """The workflow's totals at ``moment`` from its samples (sorted by time): the last
    sample taken before ``moment + grain``, so the hourly sample of an hour stands for its
    start; None when there is none."""
    i = bisect.bisect_left([row.taken_at for row in samples], moment + grain)
    return Point.of(samples[i - 1]) if i else None


def workflow_names() -> list[str]:
    """Every workflow the figures know: registered now, or counted once."""
    counted = counting.by_workflow(counting.totals())
    return sorted(set(registry.names()) | set(counted))


def is_known(name: str) -> bool:
    return name in registry.names() or name in counting.by_workflow(counting.totals())


@dataclass(frozen=True)
class Row:
    """One workflow's figures over a window; ``figures`` is None before its first sample."""

    workflow: str
    figures: Figures | None
    # The figures' span is not the window's: no sample near the window's start (the
    # sweeper was stopped, or the samples begin later), so they start earlier or later.
    off_window: bool = False
    # It has counters (something of it was enqueued or ran); without, it has no samples.
    counted: bool = True
    # The window's span, which the figures' own span may fall short of or exceed.
    window_span: timedelta | None = None

    @property
    def span_differs(self) -> bool:
        """The figures were measured over a span more than a tenth off the window's (the
        samples begin later, or the nearest is earlier): the page says over how long."""
        if self.figures is None or self.window_span is None:
            return False
        return abs(self.figures.span - self.window_span) > self.window_span / 10


def figures(window: Window, *, now: datetime | None = None) -> list[Row]:
    """Every workflow's figures over ``window``, up to now.

    Two reads, none per workflow: the counters, and each workflow's sample at the window's
    start (its latest before ``start + grain``; every counted workflow has one within the
    hour before, the hourly one). Only a counted workflow without one there (it is new, or
    the sweeper was stopped) costs a read of its own."""
    now = now or db_now()
    live = counting.by_workflow(counting.totals())
    start = now - window.span
    bases = _bases(start, window)
    rows = []
    for name in sorted(set(registry.names()) | set(live)):
        # Only a workflow with counters has samples.
        base = bases.get(name) or (_nearest(name, start, now) if name in live else None)
        rows.append(_figures_row(name, base, live.get(name), start, now))
    return rows


def _bases(start: datetime, window: Window, workflow: str | None = None) -> dict[str, Point]:
    latest = latest_samples(
        before=start + window.grain,
        since=start - timedelta(hours=1) - window.grain,
        workflow=workflow,
    )
    return {row.workflow: Point.of(row) for row in latest}


def _figures_row(
    name: str, base: Point | None, totals: WorkflowTotals | None, start: datetime, now: datetime
) -> Row:
    if base is None:
        return Row(name, None, counted=totals is not None)
    # Further from the window's start than an hourly sample can be.
    off_window = abs(base.at - start) > timedelta(hours=1, minutes=5)
    between = Figures.between(base, Point.live(totals, now))
    return Row(name, between, off_window=off_window, window_span=now - start)


def _nearest(name: str, start: datetime, now: datetime) -> Point | None:
    """The workflow's latest sample before ``start``, else its first after."""
    samples = WorkflowSample.objects.filter(workflow=name)
    before = samples.filter(taken_at__lte=start).order_by("-taken_at").first()
    if before is not None:
        return Point.of(before)
    after = samples.filter(taken_at__gt=start, taken_at__lte=now).order_by("taken_at").first()
    return Point.of(after) if after is not None else None


def workflow_figures(name: str, *, now: datetime | None = None) -> dict[str, Row]:
    """One workflow's figures over each window, by window name."""
    now = now or db_now()
    totals = counting.by_workflow(counting.totals()).get(name)
    out = {}
    for window in WINDOWS.values():
        start = now - window.span
        base = None
        if totals is not None:  # only a workflow with counters has samples
            base = _bases(start, window, workflow=name).get(name) or _nearest(name, start, now)
        out[window.name] = _figures_row(name, base, totals, start, now)
    return out


@dataclass(frozen=True)
class Bar:
    """One bar of a chart: the figures between two moments, None where no sample tells."""

    start: datetime
    end: datetime
    figures: Figures | None


def series(name: str, window: Window, *, now: datetime | None = None) -> list[Bar]:
    """``window.bars`` bars ending now, their edges on the clock's marks (every 5 minutes,
    hour, 6 hours), the last one still filling: one read of the workflow's samples."""
    now = now or db_now()
    step = window.bar.total_seconds()
    floor = datetime.fromtimestamp(now.timestamp() // step * step, tz=now.tzinfo)
    edges = [floor - window.bar * k for k in range(window.bars - 1, -1, -1)]
    samples = WorkflowSample.objects.filter(
        workflow=name, taken_at__gte=edges[0] - timedelta(hours=1) - window.grain
    )
    if window.hourly:
        samples = samples.filter(hourly=True)
    rows = list(samples.order_by("taken_at"))
    live = Point.live(counting.by_workflow(counting.totals()).get(name), now)
    points: list[Point | None] = [_at(rows, edge, window.grain) for edge in edges]
    # The last bar, still filling, ends with the counters now.
    points.append(live)
    moments = [*edges, now]
    bars = []
    for i in range(len(edges)):
        earlier, later = points[i], points[i + 1]
        between = None
        if earlier is not None and later is not None and earlier.at <= later.at:
            between = Figures.between(earlier, later)
        bars.append(Bar(moments[i], moments[i + 1], between))
    return bars
