"""A week of a workflow's history as the workflow figures see it: the samples the sweeper
would have taken and the counters they were taken of, written directly (no tasks), for
pages and screenshots that need a full chart."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from tasks_app.history import counting
from tasks_app.models import WorkflowSample

# Shares of the successful runs per run-time bucket (counting.STEP_SECONDS_BUCKETS), as a
# quick step with a slow tail; in an incident the tail grows.
CALM = {"0.01": 4, "0.05": 20, "0.1": 31, "0.5": 30, "1": 10, "5": 4, "10": 1}
SLOW = {"0.01": 1, "0.05": 6, "0.1": 13, "0.5": 30, "1": 25, "5": 17, "10": 6, "30": 2}


def _minute(at: datetime, incident: tuple[datetime, datetime]) -> dict[str, int]:
    """What one minute adds: successes with a daily wave, a few retries, and in the
    incident more retries, dead letters and slower runs."""
    hour = at.hour + at.minute / 60
    wave = 2.2 + 1.6 * math.sin(2 * math.pi * (hour - 9) / 24)
    jitter = ((at.day * 1440 + at.hour * 60 + at.minute) * 2654435761 % 97) / 97
    succeeded = max(int(wave + jitter * 1.5), 0)
    in_incident = incident[0] <= at < incident[1]
    shares = SLOW if in_incident else CALM
    out = {"succeeded": succeeded, "enqueued": succeeded + (1 if in_incident else 0)}
    out["retried"] = 1 if in_incident or jitter > 0.92 else 0
    out["dead_lettered"] = 1 if in_incident and jitter > 0.55 else 0
    whole = sum(shares.values())
    placed = 0
    for label, share in shares.items():
        n = succeeded * share // whole
        out[f"le={label}"] = n
        placed += n
    out["le=0.1"] = out.get("le=0.1", 0) + succeeded - placed
    out["sum_ms"] = round(succeeded * (900 if in_incident else 240))
    return out


def fabricate_history(workflow: str, *, now: datetime, days: int = 8) -> None:
    """Samples of ``workflow`` over ``days`` up to ``now`` (hourly ones, and one a minute
    over the last two hours), with an incident three to four hours back, and its counters
    raised by the totals at ``now``. Write it before the workflow runs anything else."""
    start = (now - timedelta(days=days)).replace(second=30, microsecond=0)
    incident = (now - timedelta(hours=4), now - timedelta(hours=3))
    totals: dict[str, int] = {}
    rows = []
    at = start
    while at <= now:
        for name, n in _minute(at, incident).items():
            totals[name] = totals.get(name, 0) + n
        hourly = at.minute == 0
        if hourly or now - at <= timedelta(hours=2):
            rows.append(
                WorkflowSample(
                    workflow=workflow,
                    taken_at=at,
                    hourly=hourly,
                    enqueued=totals["enqueued"],
                    succeeded=totals["succeeded"],
                    retried=totals["retried"],
                    dead_lettered=totals["dead_lettered"],
                    run_buckets={k[3:]: v for k, v in totals.items() if k.startswith("le=") and v},
                    run_ms=totals["sum_ms"],
                )
            )
        at += timedelta(minutes=1)
    WorkflowSample.objects.bulk_create(rows)
    counting.upsert(
        {
            f"{counting.ENQUEUED}:{workflow}#0": totals["enqueued"],
            counting.workflow_event_name(workflow, "retry_scheduled") + "#0": totals["retried"],
            counting.workflow_event_name(workflow, "dead_lettered") + "#0": totals["dead_lettered"],
            counting.step_seconds_name(workflow, "sum_ms") + "#0": totals["sum_ms"],
            **{
                counting.step_seconds_name(workflow, name) + "#0": n
                for name, n in totals.items()
                if name.startswith("le=")
            },
        }
    )
