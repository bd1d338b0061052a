"""Prometheus metrics, read from the database so any web process reports the whole system.

Four kinds of figures:

- **Now** (gauges): active tasks and dead steps, queue depth and lag, paused queues,
  workers, the sweeper's last run. Each is read from a partial index of active rows or a
  small table, so the cost follows the work in flight, not the finished history.
- **Limits** (``tasks_app.observability.limit_metrics``): per limit, its steps running and
  waiting, its numbers in effect, its keys at their limit, its refusals, and whether it
  is saturated.
- **Schedules** (``tasks_app.observability.schedule_metrics``): per schedule, how late its
  oldest undecided slot is, whether it is paused, its next and its newest enqueued slot,
  its missed slots and its runs by outcome.
- **Since the start** (counters, histograms): rows of the ``Counter`` table
  (``tasks_app.history.counting``), added to in the transaction of the change they count
  (enqueues, claims, the run time of steps that succeeded, the rare and operator events;
  on PostgreSQL's hot path inside the same statement), sharded by process so concurrent
  writers rarely wait on one row. Pruning history takes nothing from them; what it
  deleted is counted too (``events_pruned:<kind>``).

Apps add their own figures with :func:`register_part` (approvals does for its requests).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Iterable, Iterator, Mapping

from django.db.models import Count
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from tasks_app.engine import presence
from tasks_app.history import counting
from tasks_app.history.counting import (
    CLAIMED,
    COUNTED_EVENT_KINDS,
    ENQUEUED,
    EVENT,
    STEP_SECONDS_BUCKETS,
    bucket_label,
    step_seconds_histogram,
)
from tasks_app.models import Step, StepStatus, Task, TaskStatus
from tasks_app.observability.limit_metrics import limit_metrics
from tasks_app.observability.schedule_metrics import schedule_metrics
from tasks_app.operations import selectors
from tasks_app.operations.retention import PRUNED_COUNTER_PREFIX

# --- reading ------------------------------------------------------------------------------------

Part = Callable[[], Iterable[Metric]]
_parts: dict[str, Part] = {}


def register_part(name: str, part: Part) -> None:
    """Have ``/metrics`` also report what ``part()`` yields (an app's own figures)."""
    _parts[name] = part


def _labelled(totals: Mapping[str, int], prefix: str) -> dict[str, int]:
    return {name[len(prefix) :]: n for name, n in totals.items() if name.startswith(prefix)}


def _gauge(name: str, documentation: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=labels)


def work_now() -> Iterator[Metric]:
    tasks = _gauge(
        "tasks_tasks", "Tasks by status (active ones only) and workflow.", ["status", "workflow"]
    )
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for status, workflow, n in (
        Task.objects.active().values_list("status", "workflow").annotate(n=Count("*")).order_by()
    ):
        counts[(status, workflow)] += n
    # Running is read from the steps (Task.objects.running), out of the stored pending ones.
    for workflow, n in (
        Task.objects.running().values_list("workflow").annotate(n=Count("*")).order_by()
    ):
        counts[(TaskStatus.RUNNING, workflow)] += n
        counts[(TaskStatus.PENDING, workflow)] -= n
    for (status, workflow), n in sorted(counts.items()):
        if n > 0:
            tasks.add_metric([status, workflow], n)
    yield tasks

    dead = _gauge(
        "tasks_dead_steps", "Dead steps by queue and error class.", ["queue", "error_class"]
    )
    # Answered from the dead steps' own index alone (step_dead_idx).
    for queue, error_class, n in (
        Step.objects.filter(status=StepStatus.DEAD)
        .values_list("queue", "error_class")
        .annotate(n=Count("*"))
        .order_by()
    ):
        dead.add_metric([queue, error_class or "unknown"], n)
    yield dead

    awaiting = _gauge(
        "tasks_steps_awaiting_version",
        "Steps handed back to wait for a worker that has their workflow version (a deploy).",
        ["queue", "workflow"],
    )
    # Answered from its own small index (step_awaiting_version_idx).
    for queue, workflow, n in (
        Step.objects.awaiting_version()
        .values_list("queue", "task__workflow")
        .annotate(n=Count("*"))
        .order_by()
    ):
        awaiting.add_metric([queue, workflow], n)
    yield awaiting

    due = _gauge("tasks_queue_due_steps", "Steps due now.", ["queue"])
    lag = _gauge("tasks_queue_lag_seconds", "Age of the oldest due step (0 when none).", ["queue"])
    paused = _gauge("tasks_queue_paused", "1 while the queue is paused.", ["queue"])
    running = _gauge("tasks_running_steps", "Steps running now.", ["queue"])
    for queue in selectors.queues():
        due.add_metric([queue.name], queue.due)
        age = queue.oldest_due_age
        lag.add_metric([queue.name], 0.0 if age is None else age.total_seconds())
        paused.add_metric([queue.name], 1.0 if queue.paused else 0.0)
        running.add_metric([queue.name], queue.running)
    yield from (due, lag, paused, running)

    workers = _gauge("tasks_workers", "Worker nodes seen in the last day, by state.", ["state"])
    states = presence.by_state(presence.workers())
    for state in ("live", "silent", "stopped"):
        workers.add_metric([state], states[state])
    yield workers

    sweep = presence.last_sweep_age()
    yield GaugeMetricFamily(
        "tasks_sweeper_last_run_age_seconds",
        "Seconds since the sweeper last finished a sweep (+Inf if it never did).",
        value=math.inf if sweep is None else sweep.total_seconds(),
    )


def history(totals: Mapping[str, int]) -> Iterator[Metric]:
    """The counters' figures; ``totals`` as :func:`counting.totals` reads them."""
    enqueued = CounterMetricFamily(
        "tasks_enqueued", "Tasks created by enqueue.", labels=["workflow"]
    )
    for workflow, n in sorted(_labelled(totals, f"{ENQUEUED}:").items()):
        enqueued.add_metric([workflow], n)
    yield enqueued
    yield CounterMetricFamily(
        "tasks_enqueue_duplicates",
        "Enqueues that found their key's task and returned it.",
        value=totals.get("enqueue_duplicate", 0),
    )
    yield CounterMetricFamily(
        "tasks_idempotency_conflicts",
        "Enqueues refused: the key's task has another workflow or payload.",
        value=totals.get("idempotency_conflict", 0),
    )
    claims = CounterMetricFamily("tasks_claims", "Steps claimed by workers.", labels=["queue"])
    for queue, n in sorted(_labelled(totals, f"{CLAIMED}:").items()):
        claims.add_metric([queue], n)
    yield claims

    counted = _labelled(totals, f"{EVENT}:")
    events = CounterMetricFamily(
        "tasks_events", "Rare transitions and operator actions, by event kind.", labels=["kind"]
    )
    pruned = _labelled(totals, PRUNED_COUNTER_PREFIX)
    events_pruned = CounterMetricFamily(
        "tasks_events_pruned", "Events retention deleted, by event kind.", labels=["kind"]
    )
    for counted_kind in COUNTED_EVENT_KINDS:
        events.add_metric([str(counted_kind)], counted.get(str(counted_kind), 0))
    for pruned_kind, n in sorted(pruned.items()):
        events_pruned.add_metric([pruned_kind], n)
    yield from (events, events_pruned)

    # Kept per workflow (for the workflow figures), reported for all workflows together.
    run_times = step_seconds_histogram(totals)
    cumulative, upto = [], 0
    for bound in (*STEP_SECONDS_BUCKETS, math.inf):
        upto += run_times.buckets.get(bucket_label(bound), 0)
        cumulative.append(("+Inf" if math.isinf(bound) else f"{bound:g}", upto))
    yield HistogramMetricFamily(
        "tasks_step_duration_seconds",
        "Seconds from claim to success of the steps that succeeded.",
        buckets=cumulative,
        sum_value=run_times.sum_ms / 1000,
    )


class DatabaseCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        # The counters are read once per scrape, for the history, the limits and the
        # schedules alike.
        totals = counting.totals()
        yield from work_now()
        yield from history(totals)
        yield from limit_metrics(totals)
        yield from schedule_metrics(totals)
        for part in list(_parts.values()):
            yield from part()


registry = CollectorRegistry(auto_describe=False)
registry.register(DatabaseCollector())
