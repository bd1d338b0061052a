"""The approvals' figures on ``/metrics``: requests waiting and for how long, and how long
decisions took (``tasks_app.observability.metrics.register_part``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from datetime import timedelta
from typing import Any

from django.db.models import Count, DurationField, ExpressionWrapper, F, Min, Q, Sum
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from approvals.models import ApprovalRequest, ApprovalStatus
from tasks_app.db.clock import db_now

# Seconds from request to decision: a minute up to two days (the longest shipped expiry).
DECISION_BUCKETS = (60, 300, 900, 3600, 14400, 43200, 86400, 172800)


def approval_metrics() -> Iterator[Metric]:
    now = db_now()
    pending = GaugeMetricFamily(
        "tasks_approvals_pending", "Approval requests waiting for a decision.", labels=["workflow"]
    )
    oldest = GaugeMetricFamily(
        "tasks_approval_oldest_pending_age_seconds",
        "Age of the oldest request waiting for a decision.",
        labels=["workflow"],
    )
    for workflow, n, first in (
        ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING)
        .values_list("task__workflow")
        .annotate(n=Count("*"), first=Min("created_at"))
        .order_by()
    ):
        pending.add_metric([workflow], n)
        oldest.add_metric([workflow], max((now - first).total_seconds(), 0.0))
    yield from (pending, oldest)

    # Decided requests still in the history (retention prunes them with their task).
    took = ExpressionWrapper(F("decided_at") - F("created_at"), output_field=DurationField())
    within = {
        f"le_{bound}": Count(
            "id", filter=Q(decided_at__lte=F("created_at") + timedelta(seconds=bound))
        )
        for bound in DECISION_BUCKETS
    }
    histogram = HistogramMetricFamily(
        "tasks_approval_decision_seconds",
        "Seconds from an approval request to its decision, for the decided requests kept.",
        labels=["workflow"],
    )
    rows: Iterable[Mapping[str, Any]] = (
        ApprovalRequest.objects.filter(decided_at__isnull=False)
        .values("task__workflow")
        .annotate(total=Count("*"), took=Sum(took), **within)
        .order_by()
    )
    for row in rows:
        buckets = [(f"{bound:g}", row[f"le_{bound}"]) for bound in DECISION_BUCKETS]
        buckets.append(("+Inf", row["total"]))
        histogram.add_metric([row["task__workflow"]], buckets, row["took"].total_seconds())
    yield histogram
