"""Server-rendered SVG charts: coordinates computed here, drawn by the templates.

No chart library and no inline style: shapes carry classes the stylesheet colours.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from tasks_app.selectors import MinuteCount, StepRow

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
    peak = max((m.count for m in minutes), default=0)
    step = WIDTH / max(len(minutes), 1)
    bars = []
    for i, minute in enumerate(minutes):
        height = BAR_AREA_HEIGHT * minute.count / peak if peak else 0
        bars.append(
            Bar(
                x=round(i * step + 1, 1),
                y=round(BAR_AREA_HEIGHT - height, 1),
                width=round(max(step - 2, 1), 1),
                height=round(height, 1),
                label=f"{minute.minute:%H:%M} UTC: {minute.count} succeeded",
            )
        )
    return BarChart(
        width=WIDTH,
        height=BAR_AREA_HEIGHT,
        bars=bars,
        peak=peak,
        total=sum(m.count for m in minutes),
        first=minutes[0].minute if minutes else None,
        last=minutes[-1].minute if minutes else None,
    )


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
