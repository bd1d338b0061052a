"""Tasks, their steps and each step's leases: the querysets that say which tasks run and which
steps are due and which rows stand, a step's idempotency key (``step_key``), and ``PayloadSearch``,
the copy of each payload the task list's filter searches.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from tasks_app.models.fingerprints import fingerprint
from tasks_app.models.json_columns import TolerantJSONField
from tasks_app.models.statuses import (
    ACTIVE_TASK_STATUSES,
    StepStatus,
    TaskStatus,
    live_task_status,
)
from tasks_app.validation import MAX_PRIORITY, MIN_PRIORITY


def _step_running() -> models.Exists:
    """Whether the task row of the outer query has a step running (few such rows)."""
    return models.Exists(Step.objects.filter(task=models.OuterRef("pk"), status=StepStatus.RUNNING))


def _running_task_ids() -> models.QuerySet[Any]:
    return Step.objects.filter(status=StepStatus.RUNNING).values("task_id")


def live_status_fields() -> dict[str, models.Exists]:
    """The annotation a task row needs for :attr:`Task.live_status` without a query."""
    return {"step_running": _step_running()}


class TaskQuerySet(models.QuerySet["Task"]):
    def active(self) -> TaskQuerySet:
        return self.filter(status__in=ACTIVE_TASK_STATUSES)

    def with_live_status(self) -> TaskQuerySet:
        """Tasks carrying what :attr:`Task.live_status` needs, in the same query."""
        return self.annotate(**live_status_fields())

    def in_status(self, status: str) -> TaskQuerySet:
        """Tasks whose :attr:`Task.live_status` is ``status``."""
        if status == TaskStatus.RUNNING:
            return self.running()
        if status == TaskStatus.PENDING:
            return self.filter(status=TaskStatus.PENDING).exclude(pk__in=_running_task_ids())
        return self.filter(status=status)

    def running(self) -> TaskQuerySet:
        """Tasks with a step running, found from the running steps (few, indexed)."""
        pending = [TaskStatus.PENDING, TaskStatus.RUNNING]
        return self.filter(status__in=pending, pk__in=_running_task_ids())

    def dead(self) -> TaskQuerySet:
        return self.filter(status=TaskStatus.DEAD)


class Task(models.Model):
    workflow = models.CharField(max_length=100)
    workflow_version = models.PositiveIntegerField()
    payload = TolerantJSONField()
    # SHA-256 of workflow name + canonical payload at enqueue: the task's identity. It does
    # not change when a redrive edits the payload (the ``redriven`` event keeps both).
    payload_hash = models.CharField(max_length=64)
    # Unique where set (task_key_unique); tasks without one hold NULL, not "" (which would
    # collide), and have no index entry for it.
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    queue = models.CharField(max_length=64, default="default")
    priority = models.SmallIntegerField(default=0)
    status = models.CharField(max_length=20, choices=TaskStatus.choices, default=TaskStatus.PENDING)
    created_by = models.CharField(max_length=150, blank=True)
    created_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,  # task_created_by_user_idx, where set
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Set by ``cancel`` while a step is still running; the heartbeat tells the handler.
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    # The task's trace (W3C ``traceparent`` of its enqueue's span), written with the row
    # when tracing is on (``tasks_app.observability.tracing``); every later span of the
    # task (attempts, effects, people's decisions) joins it. NULL with tracing off.
    traceparent = models.CharField(max_length=55, null=True, blank=True)  # noqa: DJ001

    objects: ClassVar[TaskQuerySet] = TaskQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["-id"]
        permissions = [
            ("redrive_task", "Can redrive a dead task"),
            ("resolve_task", "Can resolve a dead task by hand"),
            ("cancel_task", "Can cancel a task"),
            ("pause_queue", "Can pause and resume a queue"),
            ("change_limits", "Can change a limit and pause its keys"),
            ("manage_schedules", "Can pause, resume, backfill and run a schedule"),
            ("view_audit_log", "Can read the audit log"),
            ("export_audit_log", "Can export the audit log"),
        ]
        indexes = [
            # Overview counts and lists of active work per state; finished history
            # (succeeded, cancelled) stays out of the index as it grows.
            # It carries the workflow, so the metrics count them by workflow from it alone.
            models.Index(
                fields=["status", "created_at"],
                name="task_active_status_idx",
                condition=Q(status__in=["pending", "running", "waiting_approval", "dead"]),
                include=["workflow"],
            ),
            # The overview's "succeeded in the last hour / day" and its per-minute chart:
            # a range over recent finishes, however long the history. Retention reads it
            # too, for succeeded tasks finished before its cutoff, oldest first.
            models.Index(
                fields=["finished_at"],
                name="task_succeeded_idx",
                condition=Q(status="succeeded"),
            ),
            # Retention's other half: cancelled tasks finished before its cutoff, oldest
            # first. Partial, so it holds only the cancelled rows, few beside the rest.
            models.Index(
                fields=["finished_at"],
                name="task_cancelled_idx",
                condition=Q(status="cancelled"),
            ),
            # The admin's search by key prefix. Like the two below it leaves out the rows
            # whose column is empty: most tasks have no key and no user, and every update
            # of a task that is not a heap-only update writes into each of its indexes.
            models.Index(
                fields=["idempotency_key"],
                name="task_key_prefix_idx",
                opclasses=["varchar_pattern_ops"],
                condition=Q(idempotency_key__isnull=False),
            ),
            # Setting the user to NULL when the user is deleted.
            models.Index(
                fields=["created_by_user"],
                name="task_created_by_user_idx",
                condition=Q(created_by_user__isnull=False),
            ),
            # The task list's payload filter is served from PayloadSearch, not from here.
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["idempotency_key"],
                name="task_key_unique",
                condition=Q(idempotency_key__isnull=False),
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=MIN_PRIORITY, priority__lte=MAX_PRIORITY),
                name="task_priority_range",
            ),
            models.CheckConstraint(
                condition=Q(status__in=TaskStatus.values), name="task_status_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.workflow} ({self.status})"

    @property
    def key(self) -> str:
        """The business key steps derive their idempotency keys from."""
        return self.idempotency_key or f"task-{self.pk}"

    @property
    def live_status(self) -> str:
        """The status as people read it: ``running`` while one of its steps runs (read
        from ``with_live_status()``'s annotation when the row carries it)."""
        if self.status not in (TaskStatus.PENDING, TaskStatus.RUNNING):
            return self.status
        running = getattr(self, "step_running", None)
        if running is None:
            running = self.steps.filter(status=StepStatus.RUNNING).exists()
        return live_task_status(self.status, bool(running))


# A step handed back to wait for a worker that has its workflow version (a rolling deploy:
# runner._await_version) is pending with this error class (exceptions.AWAITING_VERSION).
AWAITING_VERSION_Q = Q(status="pending", error_class="awaiting_version")


class StepQuerySet(models.QuerySet["Step"]):
    def awaiting_version(self) -> StepQuerySet:
        """Steps waiting for a worker that has their task's workflow version."""
        return self.filter(AWAITING_VERSION_Q)

    def due(self, now: Any = None) -> StepQuerySet:
        """Pending steps whose time has come: by the database's clock unless ``now`` is
        given. The batch claim's SQL restates this as ``s.status = 'pending' AND
        s.available_at <= statement_timestamp()``."""
        return self.filter(status=StepStatus.PENDING, available_at__lte=now or Now())

    def current(self) -> StepQuerySet:
        """The rows that stand: a revision's rows supersede those of the positions it
        replaced, which stay as history."""
        return self.exclude(status=StepStatus.SUPERSEDED)

    def current_one(self, **where: Any) -> Step | None:
        """The standing row matching ``where`` (a ``position`` or a ``kind``): the one
        place that says which row is a task's current step, or the next one."""
        return self.current().filter(**where).order_by("-revision").first()


def step_key(task_key: str, position: int, kind: str, revision: int = 0) -> str:
    """A step's idempotency key (DESIGN rule 5): ``<task key>:<position>:<kind>``, and
    ``:r<n>`` on the rows of revision ``n``; a fan-out's later items add theirs
    (:func:`item_key`). Kept across retries, redrives and rewinds. The bulk insert's SQL
    (``sql.INSERT_SQL``) restates it for revision 0."""
    key = f"{task_key}:{position}:{kind}"
    return f"{key}:r{revision}" if revision else key


def item_key(first_key: str, item: int) -> str:
    """The step key of item ``item`` of a fan-out whose first row's key is ``first_key``:
    item 0 keeps it, the others add ``:i<n>``. From the first row's key, not the task's,
    so the items a rewind makes again keep their keys, and their ledger entries with them."""
    return f"{first_key}:i{item}" if item else first_key


class Step(models.Model):
    # No index of its own: the (task, position, revision) constraint leads with task.
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="steps", db_index=False)
    position = models.PositiveSmallIntegerField()
    revision = models.PositiveSmallIntegerField(default=0)
    kind = models.CharField(max_length=100)
    status = models.CharField(max_length=20, choices=StepStatus.choices, default=StepStatus.BLOCKED)
    # Copied from the task so the claim query reads one table.
    queue = models.CharField(max_length=64, default="default")
    priority = models.SmallIntegerField(default=0)
    # Claims since the last redrive; the budget counts from there.
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=3)
    available_at = models.DateTimeField(null=True, blank=True)
    # ``<task key>:<position>:<kind>`` (+ ``:r<n>`` for a revision); stable across retries.
    idempotency_key = models.CharField(max_length=400)
    # Counts every claim and never resets, not even on redrive: the fence.
    fencing_token = models.PositiveBigIntegerField(default=0)
    # The live lease sits on the step (DESIGN rule 2): its token, its holder and its expiry;
    # it began at ``started_at``. The attempt's Lease row is written when it ends.
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    lease_worker = models.CharField(max_length=200, blank=True, default="", db_default="")
    # When a doorbell was last sent for this step; throttles the sweeper's re-dispatch.
    dispatched_at = models.DateTimeField(null=True, blank=True)
    result = TolerantJSONField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    error_class = models.CharField(max_length=200, blank=True)
    # The cause of the step's death (``tasks_app.models.fingerprints``) and its task's workflow,
    # set by ``save`` whenever it is saved dead, so the dead letters group by cause and
    # workflow from one index; read only while the step is dead (a redrive leaves them
    # behind). The database's default serves inserts that do not name them (enqueue's
    # SQL, the code of the release before during a rolling deploy).
    error_fingerprint = models.CharField(max_length=16, blank=True, default="", db_default="")
    dead_workflow = models.CharField(max_length=100, blank=True, default="", db_default="")
    # Set on the first row of a revision: the reviewer's comment and the draft it replaces,
    # for the handler that writes the next draft.
    change_request = TolerantJSONField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Flow control (tasks_app.engine.limits): the limits the step runs under as
    # [[name, key, weight], ...], and its turn among them; both None for a step under none.
    limits = models.JSONField(null=True, blank=True)
    limit_turn = models.BigIntegerField(null=True, blank=True)
    # The positions this step waits for, as its task's graph was when it was enqueued
    # (tasks_app.models.graphs); None in a line, where it waits for the position before.
    after = models.JSONField(null=True, blank=True)
    # Which of a fan-out's rows this is (tasks_app.engine.fan_outs): the enqueue makes
    # item 0 of every step, and a fan-out adds items 1.. at the same position.
    item = models.PositiveSmallIntegerField(default=0, db_default=0)

    objects: ClassVar[StepQuerySet] = StepQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["task_id", "revision", "position", "item"]
        constraints = [
            models.UniqueConstraint(
                fields=["task", "position", "revision", "item"],
                name="step_task_position_revision_item",
            ),
            models.CheckConstraint(
                condition=Q(status__in=StepStatus.values), name="step_status_valid"
            ),
        ]
        indexes = [
            # The claim: due pending steps per queue, highest priority first, oldest first.
            models.Index(
                fields=["queue", "-priority", "available_at"],
                name="step_due_idx",
                condition=Q(status="pending"),
            ),
            # The claim of steps under limits (tasks_app.engine.limited_claims): their due
            # steps per queue, by priority, then turn (keys take turns), then age. Only
            # such steps have entries.
            models.Index(
                fields=["queue", "-priority", "limit_turn", "available_at"],
                name="step_limited_due_idx",
                condition=Q(status="pending", limit_turn__isnull=False),
            ),
            # The reaper: running steps whose lease ran out.
            models.Index(
                fields=["lease_expires_at"],
                name="step_lease_idx",
                condition=Q(status="running"),
            ),
            # The metrics' dead steps by queue and error class, from the index alone; only
            # dead rows have entries (step updates already change status, an indexed
            # column, so this costs no heap-only update).
            models.Index(
                fields=["queue", "error_class"],
                name="step_dead_idx",
                condition=Q(status="dead"),
            ),
            # The dead letters: their list, newest task first, a page at a time, and
            # grouped by cause and workflow (``/dead/groups/``), both from this index
            # alone; only dead rows have entries. (One index for both: with a second,
            # narrower one on the dead rows, the planner read the grouping through it and
            # fetched a heap page per dead step.)
            models.Index(
                fields=["-task"],
                name="step_dead_letters_idx",
                condition=Q(status="dead"),
                include=[
                    "error_fingerprint",
                    "dead_workflow",
                    "finished_at",
                    "queue",
                    "error_class",
                ],
            ),
            # The metrics' steps waiting for a worker that has their workflow version (a
            # rolling deploy: exceptions.AWAITING_VERSION); only those rows have entries.
            models.Index(
                fields=["queue"],
                name="step_awaiting_version_idx",
                condition=AWAITING_VERSION_Q,
            ),
        ]

    def __str__(self) -> str:
        return f"step {self.pk} {self.kind} ({self.status})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Saved dead, the step stores its cause's fingerprint and its task's workflow
        (with ``update_fields``, both are added to them): every path that kills a step
        saves it."""
        if self.status == StepStatus.DEAD:
            self.error_fingerprint = fingerprint(self.error_class, self.last_error)
            self.dead_workflow = self.task.workflow
            fields = kwargs.get("update_fields")
            if fields is not None:
                kwargs["update_fields"] = {*fields, "error_fingerprint", "dead_workflow"}
        super().save(*args, **kwargs)


class PayloadSearch(models.Model):
    """Each task's payload as the task list's payload filter searches it, on PostgreSQL.

    The filter is a JSON containment served by a GIN index. On the task row that index took
    a new entry at every transition (a status change is never a heap-only update); here
    the row is written once, when the task is created, and again only when a redrive
    changes the payload. PostgreSQL keeps it in step with the task by triggers (migration
    0014), whatever writes the task; the task row keeps the payload the handlers read.
    On SQLite the table stays empty: the filter reads the task's payload there.
    """

    # No constraint: checking one would lock the new task row at every enqueue. The delete
    # trigger removes the row with its task, however the task is deleted.
    task = models.OneToOneField(
        Task,
        primary_key=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    payload = models.JSONField()

    def __str__(self) -> str:
        return f"payload of task {self.task_id}"
