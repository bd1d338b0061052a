"""Demo data for `make run`: users, and tasks that give every console page something to show.

Everything goes through the services a producer, a worker and an editor use: tasks are
enqueued, their steps run in this process (:func:`runner.run_task_steps`) and the
review is decided by a trusted string actor. The only rows written directly are
timestamps: a retry that is not yet due is made due by moving its ``available_at`` back,
as the tests move time, and the finished history is spread over the last hour so the
overview's throughput chart has an hour to draw. Status fields are never written here.

The users and the fixed scenarios are made once: keys make their enqueue idempotent, and
each scenario goes on only from where the seed left it, never past what a person did in the
console. Every run also adds a small fresh batch (:data:`FRESH_BATCH`, keys stamped with the
run's time): one finished here, one dead-lettered here, the rest left for the worker, so
each `make run` opens on something happening.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import transaction
from django.db.models import F

from tasks_app import services
from tasks_app.demo import schedules as demo_schedules
from tasks_app.demo import seeding
from tasks_app.demo.workflows import DEMO_CUSTOMER, DEMO_LLM
from tasks_app.engine import runner
from tasks_app.management.commands.demo_users import DEMO_USERS, create_demo_user, password_file
from tasks_app.models import Event, EventKind, Lease, Step, StepStatus, Task, TaskStatus

ACTOR = "cli:seed_demo"

# A dozen summaries for three customers under the demo's limits (demo.llm_summary): six
# calls a minute, one summary per customer at a time. The worker takes about two minutes
# over them, so the Limits page shows steps waiting for the rate and for their customer's
# running summary; globex's first meets a 429 once and holds the model's limit for 30 s.
SUMMARY_CUSTOMERS = ("acme-corp", "globex", "initech")
SUMMARIES: list[dict[str, Any]] = [
    {
        "workflow": "demo.llm_summary",
        "payload": {
            "customer_id": customer,
            "document": f"{customer} support digest, week {week}",
            "pages": 2 + (week * 3 + index) % 7,
            **({"throttled_first": 1} if (customer, week) == ("globex", 1) else {}),
        },
        "idempotency_key": f"demo:summary:{customer}:{week}",
    }
    for week in range(1, 5)
    for index, customer in enumerate(SUMMARY_CUSTOMERS)
]

# Left for the worker of `make run`, so the queue has depth when the console opens.
DEMO_TASKS: list[dict[str, Any]] = [
    {"workflow": "demo.noop", "payload": {"hello": "world"}, "idempotency_key": "demo:noop:1"},
    {"workflow": "demo.noop", "payload": {"hello": "again"}, "idempotency_key": "demo:noop:2"},
    {
        "workflow": "demo.flaky",
        "payload": {"fail_first": 2},
        "idempotency_key": "demo:flaky:retries-then-succeeds",
    },
    {
        "workflow": "demo.flaky",
        "payload": {"fail_first": 5},
        "idempotency_key": "demo:flaky:dead-letter",
    },
    {
        "workflow": "publish_article",
        "payload": {
            "article_id": "article-001",
            "title": "Durable tasks, explained",
            "brief": "Why every step is claimed in the database before it runs.",
        },
        "idempotency_key": "demo:publish:article-001:v1",
    },
    {
        "workflow": "press_release",
        "payload": {
            "article_id": "release-2026-12",
            "title": "Task console 2.0 ships with quorum reviews",
            "brief": "Two editors approve every press release before it goes out.",
        },
        "idempotency_key": "demo:press:release-2026-12",
    },
    {
        "workflow": "ticket_reply",
        "payload": {
            "ticket_id": "T-1001",
            "customer_id": "acme-corp",
            "message": "Our invoice for November lists the wrong plan.",
        },
        "idempotency_key": "demo:reply:T-1001",
    },
    # A graph: the worker translates into three languages while the post waits for an
    # editor; publishing joins them.
    {
        "workflow": "release_notes",
        "payload": {
            "version": "2.1",
            "changes": ["Workflows as graphs, with fan-outs", "Rewind from any step"],
            "languages": ["de", "fr", "ja"],
        },
        "idempotency_key": "demo:release-notes:2.1",
    },
    *SUMMARIES,
]

# Brought to its review, sent back once, and redrafted when the approvals app is installed
# (its scenario, tasks_app.demo.seeding): the editor finds revision 1 waiting.
REVISED_ARTICLE = "demo:publish:article-001:v1"

# One dead letter per error class, run here until dead. Each fails only on its first
# claims (``fail_first`` counts claims over the step's life), so a redrive, or "Run
# again" for the unknown outcome, succeeds from the console.
DEAD_LETTERS: list[dict[str, Any]] = [
    {
        "workflow": "demo.flaky",
        "payload": {"error": error, "fail_first": fail_first},
        "idempotency_key": f"demo:dead:{error.replace('_', '-')}",
    }
    for error, fail_first in (("retryable", 3), ("permanent", 1), ("outcome_unknown", 1))
]

# An hour of finished work for the overview's throughput chart.
HISTORY_SIZE = 120
HISTORY: list[dict[str, Any]] = [
    {"workflow": "demo.noop", "payload": {"n": n}, "idempotency_key": f"demo:history:{n:03d}"}
    for n in range(1, HISTORY_SIZE + 1)
]
HISTORY_MINUTES = 60

# Added again on every run, under keys of that run: ``run_here`` runs it here until it is no
# longer pending; the others wait for the worker (the flaky one retries, then succeeds).
FRESH_BATCH: list[dict[str, Any]] = [
    {"name": "noop-a", "workflow": "demo.noop", "payload": {"fresh": "a"}},
    {"name": "noop-b", "workflow": "demo.noop", "payload": {"fresh": "b"}},
    {"name": "flaky", "workflow": "demo.flaky", "payload": {"fail_first": 1}},
    {"name": "done", "workflow": "demo.noop", "payload": {"fresh": "done"}, "run_here": True},
    {
        "name": "dead",
        "workflow": "demo.flaky",
        "payload": {"error": "permanent", "fail_first": 1},
        "run_here": True,
    },
]
FRESH_PREFIX = "demo:fresh:"


class Command(BaseCommand):
    help = (
        "Create the demo users (passwords kept in VAR_DIR/demo-users.txt outside production "
        "mode; manage.py demo_users shows them) and demo tasks in every state."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write("Demo users:")
        for username in DEMO_USERS:
            password = create_demo_user(username)
            if password is None:
                self.stdout.write(f"  {username:8} exists (password unchanged)")
            else:
                self.stdout.write(f"  {username:8} password: {password}")
        if not settings.PRODUCTION:
            self.stdout.write(f"  (kept in {password_file()}; manage.py demo_users shows them)")

        results = services.enqueue_many([*DEMO_TASKS, *DEAD_LETTERS, *HISTORY], actor=ACTOR)
        created = sum(result.created for result in results)
        self.stdout.write(f"Demo tasks: {created} new, {len(results) - created} already there.")
        tasks = {result.task.idempotency_key: result.task for result in results}

        for item in DEAD_LETTERS:
            task = tasks[item["idempotency_key"]]
            self._run_until_settled(task)
            error = item["payload"]["error"]
            self.stdout.write(f"  task #{task.pk} {task.workflow} ({error}): {task.status}")
        article = tasks[REVISED_ARTICLE]
        revision = seeding.run_scenario(seeding.REVISED_ARTICLE, article)
        article.refresh_from_db()
        waiting = f" (revision {revision})" if revision is not None else ""
        self.stdout.write(f"  task #{article.pk} {article.workflow}: {article.status}{waiting}")
        finished = self._history([tasks[item["idempotency_key"]] for item in HISTORY])
        self.stdout.write(
            f"  {finished} demo.noop tasks finished over the last {HISTORY_MINUTES} minutes"
        )
        fresh = self._fresh_batch()
        states = ", ".join(f"#{task.pk} {task.status}" for task in fresh)
        self.stdout.write(f"  fresh this run: {states}")
        summaries = Task.objects.filter(
            idempotency_key__in=[item["idempotency_key"] for item in SUMMARIES],
            status=TaskStatus.PENDING,
        ).count()
        self.stdout.write(
            f"  {summaries} demo.llm_summary tasks wait under limits {DEMO_LLM.name} "
            f"({DEMO_LLM.rate}) and {DEMO_CUSTOMER.name} ({DEMO_CUSTOMER.concurrency} at a time "
            "per customer), for the worker"
        )
        pending = Task.objects.filter(status=TaskStatus.PENDING).count()
        self.stdout.write(f"  {pending} tasks pending for the worker")
        if settings.TASKS_DEMO_SCHEDULES:
            self.stdout.write(f"Demo schedules: {demo_schedules.seed(ACTOR)}")

    # --- this run's fresh batch ------------------------------------------------------------

    def _fresh_batch(self) -> list[Task]:
        """Enqueue :data:`FRESH_BATCH` under keys of this run, run here the ones marked so,
        and return the batch's tasks."""
        stamp = services.db_now().strftime("%Y%m%dT%H%M%S.%f")
        items = [
            {
                "workflow": item["workflow"],
                "payload": item["payload"],
                "idempotency_key": f"{FRESH_PREFIX}{stamp}:{item['name']}",
            }
            for item in FRESH_BATCH
        ]
        tasks = [result.task for result in services.enqueue_many(items, actor=ACTOR)]
        for item, task in zip(FRESH_BATCH, tasks, strict=True):
            if item.get("run_here"):
                self._run_until_settled(task)
        return tasks

    # --- dead letters ---------------------------------------------------------------------

    def _run_until_settled(self, task: Task) -> None:
        """Run ``task`` until it is no longer pending, making each scheduled retry due at
        once. Stops short of work an operator took over (a redrive or a resolve)."""
        if Event.objects.filter(
            task_id=task.pk, kind__in=[EventKind.REDRIVEN, EventKind.RESOLVED]
        ).exists():
            return
        # A bound, not a budget: the flaky step dies within its 3 attempts.
        for _ in range(10):
            runner.run_task_steps(task)
            task.refresh_from_db()
            if task.status != TaskStatus.PENDING:
                return
            # A retry waits its backoff; move its due time back (timestamps only, as the
            # tests move time) rather than sleep through it.
            Step.objects.filter(task=task, status=StepStatus.PENDING).update(
                available_at=F("available_at") - timedelta(minutes=1)
            )

    # --- an hour of history ---------------------------------------------------------------

    def _history(self, tasks: list[Task]) -> int:
        """Run the history tasks, then spread their times over the last hour; returns how
        many finished.

        Every run spreads them again, so the chart shows an hour whenever `make run`
        starts. Only timestamps move; events keep the times they were written.
        """
        for task in tasks:
            if task.status == TaskStatus.PENDING:
                runner.run_task_steps(task)
        ids = list(
            Task.objects.filter(
                pk__in=[task.pk for task in tasks], status=TaskStatus.SUCCEEDED
            ).values_list("pk", flat=True)
        )
        now = services.db_now()
        # Seeded, so each run draws the same hour; busier and quieter stretches, as a
        # real hour has.
        rng = random.Random(HISTORY_SIZE)
        weights = [
            (5 if minute % 20 < 7 else 2) + rng.random() for minute in range(HISTORY_MINUTES)
        ]
        with transaction.atomic():
            for pk in ids:
                minute = rng.choices(range(HISTORY_MINUTES), weights)[0]
                finished = now - timedelta(minutes=minute, seconds=rng.uniform(5, 55))
                self._backdate(
                    pk, finished, waited=rng.uniform(0.05, 3), ran=rng.uniform(0.01, 0.2)
                )
        return len(ids)

    @staticmethod
    def _backdate(pk: int, finished: datetime, *, waited: float, ran: float) -> None:
        """Set the clocks of task ``pk`` and of its step and its ended attempts' leases as if
        it was enqueued ``waited + ran`` seconds before ``finished``."""
        started = finished - timedelta(seconds=ran)
        created = started - timedelta(seconds=waited)
        Task.objects.filter(pk=pk).update(created_at=created, finished_at=finished)
        Step.objects.filter(task_id=pk).update(
            available_at=created, started_at=started, finished_at=finished
        )
        Lease.objects.filter(step__task_id=pk).update(
            acquired_at=started,
            expires_at=started + timedelta(seconds=settings.TASKS_LEASE_SECONDS),
            released_at=finished,
        )
