"""The console cells' data (``bench/dataset.py``) carries the metrics counters of its
history and the workflow figures' samples of them, as the sweeper would have taken them,
and the console cells time the workflow pages."""

from __future__ import annotations

import json
import time
from collections import Counter

from bench import dataset, pages, report


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
