"""The system's own state beside the work: the queues' pause switches, the metrics' counters,
the processes' heartbeats and the per-workflow samples of those counters.
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class QueueState(models.Model):
    """A queue's switch; a row exists once a queue was paused."""

    name = models.CharField(max_length=64, primary_key=True)
    paused = models.BooleanField(default=False)
    changed_by = models.CharField(max_length=150, blank=True)
    reason = models.TextField(blank=True)
    changed_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.name} ({'paused' if self.paused else 'running'})"


class Counter(models.Model):
    """Small monotonic counters for metrics (``tasks_app.history.counting``): duplicate
    enqueues, idempotency conflicts, and per process shard enqueues per workflow, claims per queue,
    successful runs' times, events pruned per kind."""

    # Room for "enqueued:<workflow>#<shard>" with the longest workflow name.
    name = models.CharField(max_length=200, primary_key=True)
    value = models.PositiveBigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name}={self.value}"


class Heartbeat(models.Model):
    """A process that reports it is alive: each Celery worker node, and the sweeper after
    every sweep. ``seen_at`` is the database's clock at the last report."""

    class Role(models.TextChoices):
        WORKER = "worker"
        SWEEPER = "sweeper"

    # A worker's Celery node name (``celery@host``); "sweeper" for the sweeper.
    name = models.CharField(max_length=200, primary_key=True)
    role = models.CharField(max_length=10, choices=Role.choices)
    hostname = models.CharField(max_length=200, blank=True)
    pid = models.PositiveIntegerField(null=True, blank=True)
    queues = models.JSONField(default=list, blank=True)
    concurrency = models.PositiveIntegerField(null=True, blank=True)
    # The pool's process ids: a lease's worker id is ``<hostname>:<pid>`` of one of them.
    processes = models.JSONField(default=list, blank=True)
    started_at = models.DateTimeField(db_default=Now())
    seen_at = models.DateTimeField(db_default=Now())
    # Set when the node shut down cleanly; a node that died just stops being seen.
    stopped_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.role} {self.name}"


class WorkflowSample(models.Model):
    """One workflow's counters (``tasks_app.history.counting``) as they stood at a moment: the
    roll-up the workflow figures read (``tasks_app.observability.workflow_figures``). The sweeper
    takes one per workflow a minute; a figure over a window is the difference between two samples,
    so what it costs to read follows the number of workflows, not the history."""

    id = models.BigAutoField(primary_key=True)
    workflow = models.CharField(max_length=100)
    # The database's clock when the counters were read.
    taken_at = models.DateTimeField()
    # The first sample of the workflow in its clock hour: kept once the others of that hour
    # are thinned away (the week reads these alone).
    hourly = models.BooleanField(default=False)
    # Since the start: tasks enqueued, steps that succeeded (the run-time histogram's
    # count), retries scheduled and dead letters.
    enqueued = models.PositiveBigIntegerField(default=0)
    succeeded = models.PositiveBigIntegerField(default=0)
    retried = models.PositiveBigIntegerField(default=0)
    dead_lettered = models.PositiveBigIntegerField(default=0)
    # The run-time histogram of the succeeded steps: non-cumulative counts by bucket label
    # (``counting.bucket_label``, "inf" past the last bound), and the times' sum.
    run_buckets = models.JSONField(default=dict, blank=True)
    run_ms = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["workflow", "taken_at"]
        indexes = [
            # The samples of a window, by workflow and time; the latest sample (when to
            # take the next) and thinning, by time.
            models.Index(fields=["workflow", "taken_at"], name="workflow_sample_idx"),
            models.Index(fields=["taken_at"], name="workflow_sample_time_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.workflow} at {self.taken_at:%Y-%m-%d %H:%M}"
