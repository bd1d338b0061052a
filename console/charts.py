"""Server-rendered SVG charts: coordinates computed here, drawn by the templates.

No chart library and no inline style: shapes carry classes the stylesheet colours.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from console.presenters import moment, seconds
from tasks_app.observability import workflow_figures as figures
from tasks_app.operations.selectors import MinuteCount, StepRow

WIDTH = 720
BAR_AREA_HEIGHT = 120
LANE_HEIGHT = 22
LABEL_WIDTH = 150


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    label: str
    # Which series it draws (a class the stylesheet colours), in a chart of several.
    series: str = ""


@dataclass(frozen=True)
class BarChart:
    width: int
    height: int
    bars: list[Bar]
    peak: int
    total: int
    first: datetime | None
    last: datetime | None


def throughput_chart(minutes: list[MinuteCount]) -> BarChart:
    """One bar per minute, scaled to the busiest minute."""
    slots = [
        Slot(
            minute.minute,
            {"": minute.count},
            f"{minute.minute:%H:%M} UTC: {minute.count} succeeded",
        )
        for minute in minutes
    ]
    return bar_chart(slots, series=[""])


@dataclass(frozen=True)
class Slot:
    """One place on a bar chart's time axis: a count per series (None: nothing known),
    and what hovering it says."""

    start: datetime
    counts: dict[str, int | None]
    label: str


def bar_chart(slots: Sequence[Slot], *, series: Sequence[str]) -> BarChart:
    """One group of bars per slot, a bar per series side by side, all scaled to the
    largest count; a slot with nothing known gets no bar."""
    values = [n for slot in slots for n in slot.counts.values() if n is not None]
    peak = max(values, default=0)
    step = WIDTH / max(len(slots), 1)
    width = max((step - 2) / max(len(series), 1), 1)
    bars = []
    for i, slot in enumerate(slots):
        for j, name in enumerate(series):
            count = slot.counts.get(name)
            if count is None:
                continue
            height = BAR_AREA_HEIGHT * count / peak if peak else 0
            bars.append(
                Bar(
                    x=round(i * step + 1 + j * width, 1),
                    y=round(BAR_AREA_HEIGHT - height, 1),
                    width=round(width, 1),
                    height=round(height, 1),
                    label=slot.label,
                    series=name,
                )
            )
    return BarChart(
        width=WIDTH,
        height=BAR_AREA_HEIGHT,
        bars=bars,
        peak=peak,
        total=sum(values),
        first=slots[0].start if slots else None,
        last=slots[-1].start if slots else None,
    )


# --- a line per percentile, on a log scale ------------------------------------------------------


@dataclass(frozen=True)
class Line:
    series: str
    # SVG polyline points, "x,y x,y"; a line breaks where a value is missing.
    runs: list[str]


@dataclass(frozen=True)
class Column:
    """A slot's hover target: the full height of the chart, over its x range."""

    x: float
    width: float
    label: str


@dataclass(frozen=True)
class LineChart:
    width: int
    height: int
    lines: list[Line]
    # Horizontal grid lines at each power of ten, top to bottom, with their labels.
    grid: list[tuple[float, str]]
    columns: list[Column]
    first: datetime | None
    last: datetime | None

    @property
    def empty(self) -> bool:
        return not any(line.runs for line in self.lines)


def log_lines(
    starts: Sequence[datetime], values: Mapping[str, Sequence[float | None]], labels: Sequence[str]
) -> LineChart:
    """A line per series over the slots ``starts``, on a scale of powers of ten from below
    the smallest value to above the largest (two decades at least). A value past the last
    histogram bound (infinite) is drawn at the top."""
    finite = [v for vs in values.values() for v in vs if v is not None and 0 < v < math.inf]
    low = math.floor(math.log10(min(finite))) if finite else -2
    high = math.ceil(math.log10(max(finite))) if finite else 0
    if any(v == math.inf for vs in values.values() for v in vs):
        high = max(high, math.ceil(math.log10(300)))
    high = max(high, low + 2)
    step = WIDTH / max(len(starts), 1)

    def y_of(value: float) -> float:
        if value == math.inf:
            return 0.0
        scaled = (math.log10(max(value, 10.0**low)) - low) / (high - low)
        return round(BAR_AREA_HEIGHT * (1 - scaled), 1)

    lines = []
    for name, series in values.items():
        runs: list[str] = []
        run: list[str] = []
        for i, value in enumerate(series):
            if value is None:
                if run:
                    runs.append(" ".join(run))
                run = []
                continue
            run.append(f"{round(i * step + step / 2, 1)},{y_of(value)}")
        if run:
            runs.append(" ".join(run))
        # A lone point is drawn as a short flat stroke around it.
        lines.append(Line(name, [_widen(r, step / 4) for r in runs]))
    grid = [
        (round(BAR_AREA_HEIGHT * (high - power) / (high - low), 1), _power_label(power))
        for power in range(high, low - 1, -1)
    ]
    columns = [Column(round(i * step, 1), round(step, 1), label) for i, label in enumerate(labels)]
    return LineChart(
        width=WIDTH,
        height=BAR_AREA_HEIGHT,
        lines=lines,
        grid=grid,
        columns=columns,
        first=starts[0] if starts else None,
        last=starts[-1] if starts else None,
    )


def _power_label(power: int) -> str:
    """A grid line's label: ``10 ms``, ``1 s``, ``1000 s``."""
    return f"{10.0 ** (power + 3):g} ms" if power < 0 else f"{10.0**power:g} s"


def _widen(run: str, half: float) -> str:
    if " " in run:
        return run
    x, y = run.split(",")
    return f"{round(float(x) - half, 1)},{y} {round(float(x) + half, 1)},{y}"


def slot_label(start: datetime, end: datetime) -> str:
    """A slot's span as hovering it shows it, the times with their zone."""
    return f"{moment(start)[0]} to {moment(end)[0]}"


@dataclass(frozen=True)
class Segment:
    x: float
    width: float
    outcome: str
    label: str


@dataclass(frozen=True)
class Lane:
    y: float
    label: str
    segments: list[Segment]


@dataclass(frozen=True)
class LaneChart:
    width: int
    height: int
    label_width: int
    lanes: list[Lane]
    start: datetime
    end: datetime


def attempt_lanes(steps: list[StepRow], *, start: datetime, end: datetime) -> LaneChart:
    """One lane per step row, one bar per lease from its claim to its release (or its
    expiry, or now while held), coloured by outcome."""
    span = max((end - start).total_seconds(), 1.0)
    plot = WIDTH - LABEL_WIDTH

    def x_of(moment: datetime) -> float:
        offset = min(max((moment - start).total_seconds(), 0.0), span)
        return LABEL_WIDTH + plot * offset / span

    lanes = []
    for i, row in enumerate(steps):
        segments = []
        for lease in row.leases:
            until = lease.released_at or min(lease.expires_at, end)
            left, right = x_of(lease.acquired_at), x_of(until)
            outcome = lease.outcome or "held"
            segments.append(
                Segment(
                    x=round(left, 1),
                    width=round(max(right - left, 2.0), 1),
                    outcome=outcome,
                    label=f"attempt {lease.token} by {lease.worker_id}: {outcome}",
                )
            )
        step = row.step
        label = f"{step.position}. {step.kind}" + (f" r{step.revision}" if step.revision else "")
        lanes.append(Lane(y=i * LANE_HEIGHT, label=label, segments=segments))
    return LaneChart(
        width=WIDTH,
        height=max(len(lanes), 1) * LANE_HEIGHT,
        label_width=LABEL_WIDTH,
        lanes=lanes,
        start=start,
        end=end,
    )


# --- a workflow's page ----------------------------------------------------------------------

PERCENTILES = ("p50", "p95", "p99")


def workflow_charts(bars: list[figures.Bar]) -> dict[str, Any]:
    """The three charts of a window: steps succeeded, dead letters and retries, and the
    run-time percentiles, a slot per bar."""
    done, trouble, starts, labels = [], [], [], []
    runs: dict[str, list[float | None]] = {p: [] for p in PERCENTILES}
    for bar in bars:
        f = bar.figures
        span = slot_label(bar.start, bar.end)
        done.append(
            Slot(
                bar.start,
                {"succeeded": f.succeeded if f else None},
                f"{span}: {f.succeeded} steps succeeded" if f else f"{span}: no samples",
            )
        )
        trouble.append(
            Slot(
                bar.start,
                {"dead": f.dead_lettered if f else None, "retry": f.retried if f else None},
                f"{span}: {f.dead_lettered} dead letters, {f.retried} retries"
                if f
                else f"{span}: no samples",
            )
        )
        starts.append(bar.start)
        for p in PERCENTILES:
            runs[p].append(getattr(f, p) if f else None)
        labels.append(
            f"{span}: " + ", ".join(f"{p} {seconds(getattr(f, p))}" for p in PERCENTILES)
            if f and f.succeeded
            else f"{span}: no runs"
        )
    return {
        "done_chart": bar_chart(done, series=["succeeded"]),
        "trouble_chart": bar_chart(trouble, series=["dead", "retry"]),
        "duration_chart": log_lines(starts, runs, labels),
    }
