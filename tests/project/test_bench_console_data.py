"""The console cells' data (``bench/dataset.py``) is the rows the product writes (no event
for what the task row and the attempts' Lease rows record, a running step's lease on the
step), passes the product's invariant checks, and carries the metrics counters of its
history and the workflow figures' samples of them, as the sweeper would have taken them;
and the console cells time the workflow pages."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
from django.db import connection

from bench import dataset, pages, report
from tasks_app.history import audit_verify, timeline
from tasks_app.models import Event, Lease, Step, Task
from tasks_app.observability import invariants
from tests.e2e_support import database_url

# Each kind of task's history as the product reads it: (kind, read from the rows that
# record it rather than from an Event row).
ENQUEUED, CLAIMED, DONE = ("enqueued", True), ("claimed", True), ("succeeded", True)
RETRIED = ("retry_scheduled", False)
HISTORIES = {
    "succeeded": [ENQUEUED, CLAIMED, DONE],
    "succeeded twice claimed": [ENQUEUED, CLAIMED, RETRIED, CLAIMED, DONE],
    "cancelled": [ENQUEUED, ("cancelled", False)],
    "dead": [ENQUEUED, CLAIMED, RETRIED, CLAIMED, RETRIED, CLAIMED, ("dead_lettered", False)],
    "pending": [ENQUEUED],
    "running": [ENQUEUED, CLAIMED],
    "waiting_approval": [ENQUEUED, ("approval_requested", False)],
}


@pytest.mark.django_db(transaction=True)
def test_the_data_is_what_the_product_writes_and_passes_its_checks() -> None:
    info = dataset.load(database_url(connection.settings_dict), 2_000)
    statuses = info["by_status"]

    checked = invariants.check(since=None)
    assert checked.findings == [] and checked.tasks_checked == 2_000
    # The people's cancels are on the audit chain, which holds.
    chain = audit_verify.verify()
    assert chain.ok and chain.outside is None and chain.checked == statuses["cancelled"]

    # DESIGN rule 11: no event for the enqueue, a claim or a worker's success; a running
    # step's task is stored pending and reads as running, its live lease on the step.
    assert not Event.objects.filter(kind__in=["enqueued", "claimed", "succeeded"]).exists()
    assert not Task.objects.filter(status="running").exists()
    assert Task.objects.in_status("running").count() == statuses["running"]
    assert Task.objects.in_status("pending").count() == statuses["pending"]
    running = Step.objects.filter(status="running")
    assert not running.filter(lease_worker="").exists()
    assert not Lease.objects.filter(step__in=running).exists()
    assert not Step.objects.exclude(status="running").exclude(lease_worker="").exists()
    # A Lease row per attempt that ended, with its attempt.
    ended = sum(Step.objects.exclude(status="running").values_list("attempts", flat=True))
    assert Lease.objects.count() == ended
    assert not Lease.objects.filter(attempt__lt=1).exists()

    first: dict[str, int] = {}
    for pk, status, attempts in Step.objects.order_by("pk").values_list(
        "task_id", "status", "attempts"
    ):
        first.setdefault(f"{status} twice claimed" if attempts == 2 else status, pk)
    assert set(first) == set(HISTORIES)
    for kind, pk in first.items():
        read = [(str(entry.kind), entry.pk is None) for entry in timeline.history(pk)]
        assert read == HISTORIES[kind], kind


def test_the_counters_and_samples_add_up_to_the_history() -> None:
    plan = dataset.plan(2_000, 1, time.time())
    generator = dataset.Generator(plan)
    for _ in generator.chunks():
        pass
    counters = {
        name.removesuffix("#0"): int(value)
        for name, value in (line.split("\t") for line in generator.tally.counter_lines())
    }
    statuses = plan.counts()

    def total(prefix: str, suffix: str = "") -> int:
        return sum(
            n for name, n in counters.items() if name.startswith(prefix) and name.endswith(suffix)
        )

    assert total("enqueued:") == 2_000
    runs = [
        n for name, n in counters.items() if name.startswith("step_seconds@") and ":le=" in name
    ]
    assert sum(runs) == statuses["succeeded"]
    assert total("event@", ":dead_lettered") == statuses["dead"]
    # A dead task retried twice before it died; a tenth of the flaky successes once.
    assert total("event@", ":retry_scheduled") >= 2 * statuses["dead"]

    samples = [line.split("\t") for line in generator.tally.sample_lines(plan.now)]
    hourly = Counter(row[1] for row in samples if row[3] == "t")
    assert set(hourly) == {"demo.noop", "demo.flaky", "publish_article", "ticket_reply"}
    assert all(359 <= n <= 361 for n in hourly.values()), hourly  # fifteen days of hours
    for workflow in hourly:
        last = [row for row in samples if row[1] == workflow][-1]
        assert int(last[4]) <= counters[f"enqueued:{workflow}"]
        buckets = json.loads(last[8])
        assert sum(buckets.values()) == int(last[5])


def test_the_console_cells_time_the_workflow_pages_and_the_dead_letters_by_cause() -> None:
    assert {"/workflows/", "/workflows/demo.flaky/", "/dead/groups/"} <= set(pages.PAGES.values())
    assert set(pages.PAGES) == set(report.CONSOLE_PAGES)
    targets = {target.metric: target.bound for target in report.TARGETS}
    for page in ("workflows", "workflow", "dead_groups"):
        assert targets[f"console_{page}_ratio"] == report.CONSOLE_BOUND == 1.5


def test_the_dead_steps_carry_the_cause_their_traceback_gives() -> None:
    from tasks_app.models.fingerprints import fingerprint

    last_claim = dataset.TRACEBACK.replace("{token}", "3")
    assert fingerprint(dataset.ERROR_CLASS, last_claim) == dataset.CAUSE
    # Every claim's traceback is the same cause: the claim number is masked.
    assert fingerprint(dataset.ERROR_CLASS, last_claim.replace("3", "1")) == dataset.CAUSE
