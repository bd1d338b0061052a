"""An auditor, in the browser, answers "who did what, when and why": the audit log filtered
by task, by an actor's name started in another case, by workflow and by bulk action, with
each action by its label and each moment with its zone; the CSV export with its added
columns and the audit chain's head; a bad filter refused naming its field.

The history is made in this process (``tests.console_support.dead_task``); no worker runs
in this module.
"""

from __future__ import annotations

import csv
import io
import re

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from tasks_app import services
from tasks_app.history import audit_chain
from tasks_app.models import Event
from tests.browser.support import SCREENSHOTS, log_in
from tests.factories import dead_task, noop, succeeded

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(120),
    pytest.mark.django_db(transaction=True),
]

PERMANENT = {"error": "permanent", "fail_first": 1}


def rows(page: Page) -> list[dict[str, str]]:
    """The audit table's rows as the auditor reads them, by column heading; ``Label``: the
    action's name alone (the Action cell may add its queue and its bulk action)."""
    table = page.locator("#results table")
    expect(table).to_be_visible()
    headings = table.locator("thead th").all_inner_texts()
    return [
        {
            **dict(zip(headings, row.locator("th, td").all_inner_texts(), strict=True)),
            "Label": row.locator("[data-kind]").inner_text(),
        }
        for row in table.locator("tbody tr").all()
        if not row.locator("td.empty").count()
    ]


def apply_filter(page: Page, **fields: str) -> None:
    """Clear the filter, fill ``fields`` (by label) and submit it."""
    page.get_by_role("link", name="Clear").click()
    expect(page).to_have_url(re.compile(r"/audit/$"))
    for label, value in fields.items():
        field = page.get_by_label(label, exact=True)
        if field.evaluate("e => e.tagName") == "SELECT":
            field.select_option(label=value)
        else:
            field.fill(value)
    with page.expect_response(re.compile(r"/audit/\?")):
        page.get_by_role("button", name="Filter").click()
    # The list is swapped in, then its address pushed.
    expect(page).to_have_url(re.compile(r"/audit/\?"))


def test_an_auditor_filters_the_audit_log_reads_its_labels_and_exports_it(
    page: Page, oncall: User, auditor: User
) -> None:
    redriven = dead_task(PERMANENT)
    services.redrive(redriven, actor=oncall, reason="The remote is fixed")
    bulk = [dead_task(PERMANENT) for _ in range(2)]
    report = services.act_on_tasks(
        bulk, action="cancel", actor=oncall, reason="Incident 7: not worth it", limit=10
    )
    services.cancel(noop(), actor="cli:alice", reason="Sent by mistake")
    services.pause_queue("default", actor=oncall, reason="Database failover drill")
    services.resume_queue("default", actor="cli:alice", reason="Drill over")

    # An auditor's login lands on the audit log.
    log_in(page, auditor)
    expect(page).to_have_url("/audit/")
    expect(page.locator("h1")).to_have_text("Audit log")

    # One task: every event of its history, each action by its label.
    apply_filter(page, **{"Task id": str(redriven.pk)})
    expect(page).to_have_url(re.compile(rf"[?&]task={redriven.pk}\b"))
    shown = rows(page)
    assert {row["Task"] for row in shown} == {f"#{redriven.pk}"}
    assert [row["Label"] for row in shown] == ["Redriven", "Dead-lettered", "Claimed", "Enqueued"]
    assert shown[0]["Reason"] == "The remote is fixed"
    # Moments are relative, with the absolute time and its zone on hover.
    when = page.locator("#results tbody tr").first.locator("time")
    expect(when).to_have_attribute("title", re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$"))

    # An actor's name started in another case: their operator actions.
    apply_filter(page, Actor=oncall.username[:6].upper())
    shown = rows(page)
    assert {row["Actor"] for row in shown} == {oncall.username}
    assert [row["Action"] for row in shown] == [
        "Queue paused default",
        *["Cancelled bulk " + report.plan[:8] + "…"] * 2,
        "Redriven",
    ]
    page.screenshot(path=SCREENSHOTS / "audit.png", full_page=True)

    # A workflow.
    apply_filter(page, Workflow="demo.noop")
    shown = rows(page)
    assert {row["Workflow"] for row in shown} == {"demo.noop"}
    assert "Cancelled" in [row["Label"] for row in shown]
    assert "Sent by mistake" in [row["Reason"] for row in shown]

    # One bulk action, reached from one of its rows.
    apply_filter(page, Action="Cancelled")
    page.locator("#results").get_by_title("Every task of this bulk action").first.click()
    expect(page).to_have_url(re.compile(rf"[?&]plan={report.plan}\b"))
    shown = rows(page)
    assert sorted(row["Task"] for row in shown) == sorted(f"#{task.pk}" for task in bulk)
    assert {row["Reason"] for row in shown} == {"Incident 7: not worth it"}
    # The action select names the kinds by their labels.
    options = page.get_by_label("Action", exact=True).locator("option").all_inner_texts()
    assert {"Marked resolved", "Cancel requested", "Queue paused", "Redriven"} <= set(options)

    # The export of what the filter shows: the columns outside code reads, then the added
    # ones, and the chain's head last.
    with page.expect_download() as download_info:
        page.get_by_role("link", name="Export CSV").click()
    text = download_info.value.path().read_text(encoding="utf-8")
    header, *exported, head = csv.reader(io.StringIO(text, newline=""))
    assert header == [
        "id", "created_at", "kind", "actor", "task_id", "step_id", "reason", "data",
        "label", "workflow", "bulk_plan_id", "chain_hash",
    ]  # fmt: skip
    assert sorted(row[4] for row in exported) == sorted(str(task.pk) for task in bulk)
    for row in exported:
        event = Event.objects.get(pk=row[0])
        assert row[8:] == ["Cancelled", "demo.flaky", report.plan, event.chain_hash]
    chain_head = audit_chain.head()
    assert chain_head is not None
    assert head == [f"# chain head: event {chain_head.event_id} {chain_head.hash}"] + [""] * 11
    expect(page.locator(".chain-head")).to_contain_text(
        f"Audit chain head: event {chain_head.event_id}"
    )

    # A bad value is refused, naming the field and the rule, and nothing is listed.
    apply_filter(page, **{"Task id": "seven"})
    notice = page.locator("#results .notice.error")
    expect(notice).to_contain_text("The filter was not applied")
    expect(notice).to_contain_text("task: a task id, a whole number")
    expect(page.locator("#results table")).to_have_count(0)


def test_an_auditor_lists_the_enqueues_claims_and_successes_and_exports_the_claims(
    page: Page, auditor: User
) -> None:
    # Claims and successes are read from the attempts' records: the running claim, whose
    # lease is still on its step, leads the claims; only the ended attempt succeeded.
    done = succeeded()
    running = noop()
    claim = services.claim_step(running.steps.get().pk, worker_id="w-browser")
    assert claim is not None
    done_step, running_step = done.steps.get().pk, running.steps.get().pk

    log_in(page, auditor)
    apply_filter(page, Action="Claimed")
    shown = rows(page)
    assert [(row["Task"], row["Label"]) for row in shown] == [
        (f"#{running.pk}", "Claimed"),
        (f"#{done.pk}", "Claimed"),
    ]
    assert shown[0]["Actor"] == "worker:w-browser"

    # The worker's name, started in another case, narrows the claims to its own.
    apply_filter(page, Action="Claimed", Actor="WORKER:W-BROW")
    assert [row["Task"] for row in rows(page)] == [f"#{running.pk}"]

    apply_filter(page, Action="Succeeded")
    assert [(row["Task"], row["Label"]) for row in rows(page)] == [(f"#{done.pk}", "Succeeded")]

    # Enqueues are read from the task rows: each task's, newest first, by its producer.
    apply_filter(page, Action="Enqueued")
    assert [(row["Task"], row["Label"], row["Actor"]) for row in rows(page)] == [
        (f"#{running.pk}", "Enqueued", "cli:producer"),
        (f"#{done.pk}", "Enqueued", "cli:producer"),
    ]

    # The claims' export names each by its step and attempt token, not an event id.
    apply_filter(page, Action="Claimed")
    with page.expect_download() as download_info:
        page.get_by_role("link", name="Export CSV").click()
    text = download_info.value.path().read_text(encoding="utf-8")
    _, *exported, _ = csv.reader(io.StringIO(text, newline=""))
    assert [(row[0], row[2], row[3], row[8]) for row in exported] == [
        (f"claimed:{running_step}:1", "claimed", "worker:w-browser", "Claimed"),
        (f"claimed:{done_step}:1", "claimed", exported[1][3], "Claimed"),
    ]
    assert exported[1][3].startswith("worker:")
