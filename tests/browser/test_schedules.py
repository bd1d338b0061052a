"""The Schedules pages in a real browser whose time zone is Europe/Berlin, as on-call uses
them: a schedule paused with a reason; a paused schedule resumed, its preview listing the
slots that came due meanwhile, then confirmed, the runs appearing with their tasks; a range
of missed slots backfilled; a run started now, with the link to its task. Times read in
Berlin and in UTC; no Content-Security-Policy violation, no serious accessibility
violation, nothing wider than a phone.

No worker runs in this module: the tasks the page starts stay pending, which is all it
shows of them."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.contrib.auth.models import User
from playwright.sync_api import Browser, ConsoleMessage, Locator, Page, expect

from tasks_app.db.clock import db_now
from tasks_app.engine.schedules import Timing, slot_text
from tasks_app.models import Event, EventKind, RunOutcome, ScheduleRun, StoredSchedule, Task
from tasks_app.operations import schedules as schedule_actions
from tests.browser.support import (
    OVERFLOW,
    PHONE,
    RECORD_CSP,
    SCREENSHOTS,
    TIMEOUT_MS,
    VIEWPORT,
    accessibility_problems,
    log_in,
)
from tests.schedules_page_support import (
    HOURLY,
    NIGHTLY,
    QUARTERLY,
    backdate,
    declared,
    missed_for,
    paused_for,
    store,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(120),
    pytest.mark.django_db(transaction=True),
]

BERLIN = ZoneInfo("Europe/Berlin")
NAME = HOURLY.name
PAGE = f"/schedules/{NAME}/"


@pytest.fixture
def schedules_stored(db: None) -> Iterator[None]:
    with declared(HOURLY, NIGHTLY, QUARTERLY):
        yield


@pytest.fixture
def watched(browser: Browser, live_server: Any) -> Iterator[Page]:
    """A page of a browser in Berlin, with every CSP violation and console message it meets
    checked at the end."""
    context = browser.new_context(
        base_url=live_server.url, viewport=VIEWPORT, timezone_id="Europe/Berlin"
    )
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    said: list[str] = []

    def record(message: ConsoleMessage) -> None:
        refusal = REFUSAL_LOG.search(message.text)
        if refusal and int(refusal[1]) in EXPECTED_REFUSALS.get(id(page), ()):
            return  # the browser's own line for a refusal the test asked for
        said.append(f"{page.url}: console {message.type}: {message.text}")

    page.on("console", record)
    page.on("pageerror", lambda error: said.append(f"{page.url}: page error: {error}"))
    page.add_init_script(RECORD_CSP)
    try:
        yield page
        assert not page.evaluate("window.__csp || []"), page.evaluate("window.__csp")
        assert not said, "\n".join(said)
    finally:
        EXPECTED_REFUSALS.pop(id(page), None)
        context.close()


# The browser logs every answer of 4xx; a test that provokes one says so (expect_refusal).
REFUSAL_LOG = re.compile(r"the server responded with a status of (\d{3})")
EXPECTED_REFUSALS: dict[int, set[int]] = {}


def expect_refusal(page: Page, status: int) -> None:
    EXPECTED_REFUSALS.setdefault(id(page), set()).add(status)


def shoot(page: Page, name: str) -> None:
    """A screenshot for the docs (the caret as it is: hiding it takes an inline style the
    Content-Security-Policy refuses)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOTS / f"{name}.png", full_page=True, caret="initial")


def waiting_slots(row: StoredSchedule) -> list[datetime]:
    """The slots a paused schedule's resume decides (from its next slot up to now)."""
    return Timing.of(row.spec).between(row.next_slot, db_now())


def in_berlin(slot: datetime) -> str:
    """A slot as the page shows it in Berlin: ``Mon 2026-12-07 03:00 CET``."""
    return slot.astimezone(BERLIN).strftime("%a %Y-%m-%d %H:%M %Z")


def form_with(scope: Locator, button: str) -> Locator:
    return scope.locator("form").filter(
        has=scope.page.get_by_role("button", name=button, exact=True)
    )


def open_schedule(page: Page) -> Locator:
    """From the list, the schedule's own page, where its actions are."""
    page.goto("/schedules/")
    expect(page.locator(".zone-note")).to_contain_text("Times on this page are in Europe/Berlin")
    page.locator(f'[id="schedule-{NAME}"]').get_by_role("link", name=NAME, exact=True).click()
    expect(page.locator("h1")).to_have_text(NAME)
    return page.locator("#schedule-card")


def test_a_page_shown_in_another_zone_is_shown_again_in_the_browsers(
    watched: Page, oncall: User, schedules_stored: None
) -> None:
    page = watched
    log_in(page, oncall)
    # The cookie names another zone (the browser moved): the page comes in UTC, and its
    # script names Berlin and loads it again, once.
    page.context.add_cookies([{"name": "tz", "value": "UTC", "url": page.url}])
    page.goto("/schedules/")

    expect(page.locator(".zone-note")).to_contain_text("Times on this page are in Europe/Berlin")
    expect(page.locator(f'[id="schedule-{NIGHTLY.name}"] thead th').first).to_have_text(
        "Europe/Berlin"
    )
    assert page.evaluate('performance.getEntriesByType("navigation")[0].type') == "reload"
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    assert cookies["tz"] == "Europe/Berlin"


def test_oncall_pauses_a_schedule_with_a_reason(
    watched: Page, oncall: User, schedules_stored: None
) -> None:
    page = watched
    log_in(page, oncall)
    card = open_schedule(page)

    pause = form_with(card, "Pause")
    pause.get_by_label("Reason").fill("The warehouse is migrating")
    pause.get_by_role("button", name="Pause").click()

    expect(card).to_contain_text(f"Schedule {NAME} paused: none of its slots is enqueued now.")
    expect(card.locator(".state-line .badge")).to_have_text("paused")
    expect(card.locator(".state-note")).to_contain_text(f"Paused by {oncall.username}")
    expect(card.locator(".state-note")).to_contain_text("“The warehouse is migrating”")
    expect(card.get_by_role("button", name="Preview the resume")).to_be_visible()
    row = StoredSchedule.objects.get(name=NAME)
    assert (row.paused_by, row.paused_reason) == (
        oncall.username,
        "The warehouse is migrating",
    )


def test_oncall_resumes_a_paused_schedule_after_its_preview_lists_the_missed_slots(
    watched: Page, oncall: User, schedules_stored: None
) -> None:
    paused = paused_for(NAME, 3, reason="Warehouse migration")
    page = watched
    log_in(page, oncall)
    card = open_schedule(page)
    waiting = card.locator("section.waiting li")
    expect(waiting).to_have_count(3)

    resume = form_with(card, "Preview the resume")
    resume.get_by_label("Slots missed while paused").select_option("each")
    resume.get_by_label("Reason").fill("The warehouse is back")
    resume.get_by_role("button", name="Preview the resume").click()

    preview = card.locator(".preview")
    expect(preview).to_contain_text("Resuming enqueues 3 runs (UTC):")
    expect(preview).to_contain_text("Nothing has changed yet.")
    slots = waiting_slots(paused)
    expect(preview.locator('[data-plan="enqueue"] li')).to_have_count(3)
    for item, slot in zip(preview.locator('[data-plan="enqueue"] li').all(), slots, strict=True):
        expect(item).to_contain_text(in_berlin(slot))
        expect(item).to_contain_text(slot_text(slot)[11:16] + " UTC")
    assert StoredSchedule.objects.get(name=NAME).paused_at is not None
    shoot(page, "schedule-resume-preview")

    card.get_by_role("button", name="Resume and enqueue 3 runs").click()

    expect(card).to_contain_text(f"Schedule {NAME} resumed: 3 run(s) enqueued.")
    expect(card.locator(".state-line .badge")).to_have_text("active")
    runs = card.locator(".last-runs tbody tr")
    expect(runs).to_have_count(3)
    made = ScheduleRun.objects.filter(schedule=NAME).order_by("-slot")
    assert [run.slot for run in made] == slots[::-1]
    for row, run in zip(runs.all(), made, strict=True):
        expect(row).to_contain_text(in_berlin(run.slot))
        expect(row.get_by_role("link", name=f"#{run.task_id}")).to_have_attribute(
            "href", f"/tasks/{run.task_id}/"
        )
        expect(row).to_contain_text("pending")
    assert StoredSchedule.objects.get(name=NAME).paused_at is None

    runs.first.get_by_role("link", name=f"#{made[0].task_id}").click()
    expect(page.locator("h1")).to_contain_text(f"#{made[0].task_id}")


def test_a_resume_confirmed_after_someone_else_resumed_says_nothing_changed(
    watched: Page, oncall: User, schedules_stored: None
) -> None:
    paused_for(NAME, 2, reason="Warehouse migration")
    page = watched
    log_in(page, oncall)
    card = open_schedule(page)
    resume = form_with(card, "Preview the resume")
    resume.get_by_label("Reason").fill("The warehouse is back")
    resume.get_by_role("button", name="Preview the resume").click()
    expect(card.locator(".preview")).to_contain_text("Nothing has changed yet.")

    # Meanwhile a colleague resumes it from a shell, skipping the missed slots.
    plan = schedule_actions.plan_resume(NAME, mode="skip")
    schedule_actions.resume(NAME, actor="cli:colleague", reason="back", plan=plan)
    tasks_before = Task.objects.count()

    expect_refusal(page, 409)
    card.get_by_role("button", name=re.compile(r"^Resume")).click()

    expect(card).to_contain_text("Nothing changed:")
    expect(card).to_contain_text("preview again")
    expect(card.locator(".state-line .badge")).to_have_text("active")
    assert Task.objects.count() == tasks_before
    assert Event.objects.filter(kind=EventKind.SCHEDULE_RESUMED).count() == 1


def test_oncall_backfills_a_range_of_missed_slots_typed_in_local_time(
    watched: Page, oncall: User, schedules_stored: None
) -> None:
    missed = missed_for(NAME, 3)
    page = watched
    log_in(page, oncall)
    card = open_schedule(page)
    expect(card.locator("section.missed li")).to_have_count(3)

    backfill = form_with(card, "Preview the backfill")
    # Offered from the oldest missed slot to the newest, in Berlin time.
    local = [slot.astimezone(BERLIN).strftime("%Y-%m-%dT%H:%M") for slot in missed]
    expect(backfill.get_by_label("From")).to_have_value(local[0])
    expect(backfill.get_by_label("Until")).to_have_value(local[-1])
    backfill.get_by_label("From").fill(local[1])
    backfill.get_by_label("Reason").fill("The missed syncs are needed")
    backfill.get_by_role("button", name="Preview the backfill").click()

    preview = card.locator(".preview")
    expect(preview).to_contain_text("Backfilling enqueues 2 runs (UTC):")
    items = preview.locator('[data-plan="enqueue"] li')
    expect(items).to_have_count(2)
    expect(items.first).to_contain_text(in_berlin(missed[1]))
    assert not Task.objects.exists()

    card.get_by_role("button", name="Backfill 2 runs").click()

    expect(card).to_contain_text(f"Schedule {NAME} backfilled: 2 run(s) enqueued.")
    runs = ScheduleRun.objects.filter(schedule=NAME, outcome=RunOutcome.ENQUEUED)
    assert sorted(run.slot for run in runs) == missed[1:]
    for run in runs:
        expect(card.get_by_role("link", name=f"#{run.task_id}")).to_be_visible()
    # The oldest stays missed.
    expect(card.locator("section.missed li")).to_have_count(1)
    event = Event.objects.get(kind=EventKind.SCHEDULE_BACKFILLED)
    assert (event.actor, event.reason) == (oncall.username, "The missed syncs are needed")


def test_oncall_runs_a_schedule_now_and_follows_the_link_to_its_task(
    watched: Page, oncall: User, schedules_stored: None
) -> None:
    page = watched
    log_in(page, oncall)
    card = open_schedule(page)

    run = form_with(card, "Run now")
    run.get_by_label("Reason").fill("The report is needed before the meeting")
    run.get_by_role("button", name="Run now").click()

    notice = card.locator(".notice.success")
    expect(notice).to_contain_text(f"Schedule {NAME} run now: task #")
    task = Task.objects.get()
    assert (task.idempotency_key or "").startswith(f"schedule:{NAME}:now:")
    expect(card.locator(".last-runs tbody tr")).to_have_count(1)
    notice.get_by_role("link", name=f"#{task.pk}").click()
    expect(page).to_have_url(re.compile(rf"/tasks/{task.pk}/$"))
    expect(page.locator("h1")).to_contain_text(f"Task #{task.pk}")


def test_the_schedules_page_reads_well_and_passes_its_checks(
    watched: Page, oncall: User, db: None
) -> None:
    """Each state on one page (active, late, paused with slots waiting, removed with its
    history), as a screenshot for the docs; no serious accessibility violation on it or on a
    schedule's page with a preview, and nothing wider than a phone."""
    store(HOURLY, NIGHTLY, QUARTERLY, replace(HOURLY, name="page.retired", description=""))
    schedule_actions.run_now("page.retired", actor="cli:deploy", reason="last run")
    with declared(HOURLY, NIGHTLY, QUARTERLY):
        missed_for(QUARTERLY.name, 1)
        schedule_actions.run_now(QUARTERLY.name, actor=oncall, reason="check the feed")
        paused_for(NAME, 2, reason="Warehouse migration", actor=oncall)
        # The nightly one's slot came a day ago and no tick decided it: late.
        backdate(NIGHTLY.name, timedelta(days=1))
        page = watched
        log_in(page, oncall)
        page.goto("/schedules/")
        expect(page.locator('[id="schedule-page.retired"] .badge').first).to_have_text("removed")
        shoot(page, "schedules")
        axe = Axe()
        assert accessibility_problems(page, axe) == []

        page.goto(PAGE)
        form_with(page.locator("#schedule-card"), "Preview the resume").get_by_label("Reason").fill(
            "Back"
        )
        page.get_by_role("button", name="Preview the resume").click()
        expect(page.locator(".preview")).to_contain_text("Nothing has changed yet.")
        assert accessibility_problems(page, axe) == []

        page.set_viewport_size(PHONE)
        for url in ("/schedules/", PAGE):
            page.goto(url)
            widths = page.evaluate(OVERFLOW)
            assert max(widths["document"], widths["body"]) <= widths["window"], (url, widths)
        shoot(page, "narrow-schedule")
