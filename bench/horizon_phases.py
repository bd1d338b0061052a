"""The arithmetic of the horizon and faults cells, apart from any server: what a phase's
samples and the producer's records say (completion rate, pickup percentiles, queue depth,
dead tuples) and when a system recovered from a fault.

A sample is a dict with ``t`` (seconds since the producer's clock started), ``done`` (jobs
finished so far, the system's progress query), ``depth`` (enqueued and not finished),
``dead`` (dead tuples of its hot tables) and, after a fault, ``backlog`` (how many of the
jobs unfinished at the fault are still unfinished); a sample taken while the database was
unreachable has ``error`` instead of the numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.report import percentile

# Recovered: the completion rate over the trailing window is at least this share of the
# producer's rate.
RATE_SHARE = 0.9
# ... and the depth at most steady's highest plus this many seconds of the producer's work
# (a sample of steady's depth is noisy: a claim in a batch holds several jobs at once).
DEPTH_SLACK_SECONDS = 0.1


@dataclass(frozen=True)
class Window:
    """A phase as run: its name, its place on the producer's clock and its rate."""

    name: str
    start: float
    end: float
    rate: float


def segments(windows: Sequence[Window]) -> list[tuple[float, float]]:
    """The producer's schedule, (rate, seconds), neighbours of one rate merged."""
    out: list[tuple[float, float]] = []
    for window in windows:
        seconds = window.end - window.start
        if out and out[-1][0] == window.rate:
            out[-1] = (window.rate, out[-1][1] + seconds)
        else:
            out.append((window.rate, seconds))
    return out


def measured(samples: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The samples that read the database (not those taken while it was away)."""
    return [s for s in samples if "error" not in s]


def within(
    samples: Sequence[Mapping[str, Any]], start: float, end: float
) -> list[Mapping[str, Any]]:
    return [s for s in measured(samples) if start <= s["t"] <= end]


def completion_rate(samples: Sequence[Mapping[str, Any]], start: float, end: float) -> float | None:
    """Jobs finished a second between the last sample at or before ``start`` (else the
    first after it) and the last at or before ``end``."""
    good = measured(samples)
    before = [s for s in good if s["t"] <= start] or [s for s in good if s["t"] > start][:1]
    upto = [s for s in good if s["t"] <= end]
    if not before or not upto or upto[-1]["t"] <= before[-1]["t"]:
        return None
    first, last = before[-1], upto[-1]
    return float(last["done"] - first["done"]) / float(last["t"] - first["t"])


def pickup(
    records: Sequence[Sequence[float]], starts: Mapping[int, float], start: float, end: float
) -> dict[str, Any]:
    """Enqueue→start of the jobs due in [start, end) (``records``: id, due and sent as
    seconds since the producer's clock started; ``starts``: id -> start on that clock),
    in milliseconds, with how many never started."""
    latencies = []
    lags = []
    never = 0
    for ident, due, sent in records:
        if start <= due < end:
            lags.append((sent - due) * 1000)
            began = starts.get(int(ident))
            if began is None:
                never += 1
            else:
                latencies.append((began - due) * 1000)
    out: dict[str, Any] = {"sent": len(lags), "started": len(latencies), "never_started": never}
    for pct in (50, 95, 99):
        out[f"p{pct}_ms"] = percentile(latencies, pct) if latencies else None
    # Of which the producer's own delay: from the due time to the enqueue call's return.
    out["send_lag_p99_ms"] = percentile(lags, 99) if lags else None
    return out


def highest(samples: Sequence[Mapping[str, Any]], key: str) -> int | None:
    values = [int(s[key]) for s in samples if s.get(key) is not None]
    return max(values) if values else None


def depth_level(steady_max_depth: int, rate: float) -> float:
    """The depth a recovered system is back to: steady's highest, plus a tenth of a second
    of the producer's work."""
    return steady_max_depth + math.ceil(rate * DEPTH_SLACK_SECONDS)


def trailing_rate(
    samples: Sequence[Mapping[str, Any]], index: int, window: float, since: float | None = None
) -> float | None:
    """Jobs finished a second over the ``window`` seconds up to ``samples[index]`` (from
    the latest sample at least that far back, and not before ``since``)."""
    now = samples[index]
    for earlier in reversed(samples[:index]):
        if since is not None and earlier["t"] < since:
            return None
        if now["t"] - earlier["t"] >= window:
            return float(now["done"] - earlier["done"]) / float(now["t"] - earlier["t"])
    return None


def recovery_seconds(
    samples: Sequence[Mapping[str, Any]],
    since: float,
    until: float,
    *,
    rate: float,
    level: float,
    window: float,
    after: float | None = None,
) -> float | None:
    """Seconds from ``since`` (the fault) to the first sample up to ``until`` at which
    the system is back: every job unfinished at the fault finished (``backlog`` 0, where
    counted), the depth at most ``level`` and the completion rate over the trailing
    ``window`` at least ``RATE_SHARE`` of the producer's ``rate``, that window lying
    wholly after the fault (or ``after``, when the fault lasted: the server back up);
    None when it was not back by ``until``."""
    good = measured(samples)
    begins = max(since, after if after is not None else since)
    for index, sample in enumerate(good):
        if not begins <= sample["t"] <= until:
            continue
        if sample.get("backlog") or sample["depth"] > level:
            continue
        recent = trailing_rate(good, index, window, begins)
        if recent is not None and recent >= RATE_SHARE * rate:
            return float(sample["t"] - since)
    return None


def summarize(
    window: Window,
    samples: Sequence[Mapping[str, Any]],
    records: Sequence[Sequence[float]],
    starts: Mapping[int, float],
    send_errors: Sequence[float],
) -> dict[str, Any]:
    """One phase's figures: completion rate, pickup percentiles, the highest depth and
    dead tuples its samples saw, the producer's failed sends in it."""
    inside = within(samples, window.start, window.end)
    return {
        "name": window.name,
        "start": window.start,
        "seconds": window.end - window.start,
        "rate": window.rate,
        "completion_rate": completion_rate(samples, window.start, window.end),
        **pickup(records, starts, window.start, window.end),
        "max_depth": highest(inside, "depth"),
        "max_dead": highest(inside, "dead"),
        "samples": len(inside),
        "unmeasured_samples": sum(
            1 for s in samples if "error" in s and window.start <= s["t"] <= window.end
        ),
        "send_errors": sum(1 for t in send_errors if window.start <= t < window.end),
    }
