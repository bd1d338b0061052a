"""The sweeper's once-a-minute sample of the metrics counters per workflow: the rows
(:class:`~tasks_app.models.WorkflowSample`) the workflow figures
(``tasks_app.observability.workflow_figures``) read back as differences.

:func:`sample` is a sweep job: about once a minute the sweeper reads the counter table (a few
rows per workflow and process shard) and writes one sample per workflow with its totals; a
workflow whose totals did not change gets no row, except the first of each clock hour
(``hourly``). Samples older than two days are thinned to the hourly ones, and go after fifteen
days: at most about 1,800 rows per workflow.

Samples carry the database's clock; the callers' ``now`` is an injected clock for tests.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connection, transaction

from tasks_app.db.clock import db_now
from tasks_app.history import counting
from tasks_app.history.counting import WorkflowTotals
from tasks_app.models import WorkflowSample
from tasks_app.observability.workflow_figures import Point, latest_samples

# About one sample a minute: the sweeper runs every few seconds and takes one when the last
# is at least this old.
SAMPLE_SECONDS = 55
FINE_KEPT = timedelta(days=2)  # every sample; older, the hourly ones only
KEPT = timedelta(days=15)
# Whose sample it is to take: PostgreSQL's advisory lock id ("wfsample").
SAMPLE_LOCK = 0x7766_7361_6D70_6C65


def sample(limit: int = 0) -> int:
    """The sweep job: take a sample when one is due. It reports 0 whatever it wrote:
    sampling is upkeep, not work the sweep found to do, so an idle sweep still reads as
    idle."""
    take_sample()
    return 0


def take_sample(*, now: datetime | None = None, force: bool = False) -> int:
    """Write each workflow's totals as of ``now`` (the database's clock unless given),
    unless a sample was taken less than ``SAMPLE_SECONDS`` ago (``force`` takes one
    anyway); returns how many rows it wrote.

    1. Only one process samples at a time (an advisory lock on PostgreSQL; SQLite's
       writes are serialised anyway): another one skips.
    2. The counters are read once, their shards added up, and grouped by workflow.
    3. A workflow gets a row if its totals changed since its last sample, or if it has no
       hourly sample in this clock hour yet (that row is the hourly one). A workflow
       sampled for the first time had no counters at the previous sample (it would have
       got a row then): it gets a row of zeros at that moment too, so its first figures
       count from there rather than from when sampling began.
    4. At the first sample of a clock hour, samples past their keeping are deleted.
    """
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [SAMPLE_LOCK])
                if not cursor.fetchone()[0]:
                    return 0
        now = now or db_now()
        latest = WorkflowSample.objects.order_by("-taken_at").values_list("taken_at", flat=True)
        last_at = latest.first()
        if not force and last_at is not None and now - last_at < timedelta(seconds=SAMPLE_SECONDS):
            return 0
        hour = now.replace(minute=0, second=0, microsecond=0)
        hourly_done = set(
            WorkflowSample.objects.filter(hourly=True, taken_at__gte=hour, taken_at__lte=now)
            .values_list("workflow", flat=True)
            .distinct()
        )
        previous = _latest_before(now)
        rows = []
        for workflow, totals in sorted(counting.by_workflow(counting.totals()).items()):
            row = _row(workflow, totals, now, hourly=workflow not in hourly_done)
            last = previous.get(workflow)
            # Its first sample ever (none this hour, and none before).
            if (
                last is None
                and last_at is not None
                and last_at < now
                and not WorkflowSample.objects.filter(workflow=row.workflow).exists()
            ):
                rows.append(_row(row.workflow, WorkflowTotals(), last_at, hourly=True))
            if row.hourly or last is None or Point.of(last).counts() != Point.of(row).counts():
                rows.append(row)
        WorkflowSample.objects.bulk_create(rows)
        if not hourly_done and any(row.hourly for row in rows):
            thin(now)
        return len(rows)


def thin(now: datetime) -> int:
    """Delete the samples past their keeping; returns how many went."""
    fine, _ = WorkflowSample.objects.filter(taken_at__lt=now - FINE_KEPT, hourly=False).delete()
    old, _ = WorkflowSample.objects.filter(taken_at__lt=now - KEPT).delete()
    return fine + old


def _row(workflow: str, totals: WorkflowTotals, now: datetime, *, hourly: bool) -> WorkflowSample:
    point = Point.live(totals, now)
    return WorkflowSample(
        workflow=workflow[:100],
        taken_at=now,
        hourly=hourly,
        enqueued=point.enqueued,
        succeeded=point.succeeded,
        retried=point.retried,
        dead_lettered=point.dead_lettered,
        run_buckets=dict(sorted((point.run_buckets or {}).items())),
        run_ms=point.run_ms,
    )


def _latest_before(now: datetime) -> dict[str, WorkflowSample]:
    """Each workflow's latest sample in this clock hour (a workflow without one gets its
    hourly row whatever its totals)."""
    hour = now.replace(minute=0, second=0, microsecond=0)
    return {
        row.workflow: row
        for row in latest_samples(before=now + timedelta(microseconds=1), since=hour)
    }
