"""The console's comforts in a real browser: every page fits a phone held upright with long
keys and error classes on it, a dark scheme when the system asks for one, times with their
zone and how long ago, the header's "go to task" box, the key filter by prefix, and the
task list and the queues refreshing themselves without losing the filter, the page, the
scroll position or what someone is typing (and not at all while the tab is hidden).

The tasks here run in this process (``tests.console_support``), so no worker is needed."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pprint import pformat

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import Page, Request, expect

from approvals import services as approvals
from approvals.models import ApprovalRequest
from tasks_app import services
from tasks_app.engine import presence
from tasks_app.models import Step, Task
from tests.approval_support import advance, article, pending_request, ticket
from tests.browser.support import LINES, OVERFLOW, PHONE, SCREENSHOTS, log_in
from tests.e2e_support import wait_for
from tests.factories import dead_task, noop, succeeded

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(120),
    pytest.mark.django_db(transaction=True),
]

# A dotted class name much longer than a phone is wide, and keys without a place to break.
LONG_ERROR_CLASS = (
    "integrations.publishing.remote_content_delivery_network.UpstreamCertificateRevokedError"
)
LONG_KEY = "publish:narrow:" + "0123456789" * 20
# Whether the tab is hidden is a property this script can set (Playwright's tab never is).
HIDEABLE_TAB = """
window.__hidden = false;
Object.defineProperty(document, "hidden", { configurable: true, get: () => window.__hidden });
Object.defineProperty(document, "visibilityState", {
  configurable: true, get: () => (window.__hidden ? "hidden" : "visible"),
});
"""
SET_HIDDEN = """
(hidden) => {
  window.__hidden = hidden;
  document.dispatchEvent(new Event("visibilitychange"));
}
"""


@pytest.fixture
def page_errors(page: Page) -> Iterator[list[str]]:
    """Every script error on the page; none is expected."""
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(f"{page.url}: {error}"))
    yield errors
    assert not errors, "script errors:\n" + "\n".join(errors)


# --- a phone held upright ---------------------------------------------------------------------


@dataclass(frozen=True)
class Seeded:
    dead: Task
    review: ApprovalRequest

    @property
    def pages(self) -> list[str]:
        return [
            "/",
            "/tasks/",
            f"/tasks/{self.dead.pk}/",
            "/dead/",
            "/dead/groups/",
            "/queues/",
            "/approvals/",
            f"/approvals/{self.review.pk}/",
            "/audit/",
        ]


def seed(*, oncall: User, editor: User, author: User) -> Seeded:
    """Something long on every page: a dead letter with a long key and a long error class,
    finished tasks with long keys, a draft sent back once, a paused-and-resumed queue with a
    long reason and a worker with a long name."""
    for n in range(3):
        succeeded(f"{LONG_KEY}:{n}")
    dead = dead_task(key=LONG_KEY)
    Step.objects.filter(task=dead).update(error_class=LONG_ERROR_CLASS)
    first = pending_request(advance(article(actor=author, key="publish:narrow-article:v1")))
    approvals.request_changes(
        first, actor=editor, comment="Say which day the launch is.", draft_hash=first.draft_hash
    )
    advance(ticket(actor=author, key="reply:" + "T-42-" * 30))
    reason = "Failover drill: " + "the-primary-database-in-region-one " * 3
    services.pause_queue("default", actor=oncall, reason=reason)
    services.resume_queue("default", actor=oncall, reason="Drill over")
    presence.worker_started(
        presence.NodeInfo(
            name="celery-step-worker-with-a-long-name@" + "host" * 12,
            hostname="host",
            pid=100,
            queues=["default", "maintenance"],
            concurrency=4,
            processes=[101, 102],
        )
    )
    return Seeded(dead=dead, review=pending_request(advance(Task.objects.get(pk=first.task_id))))


def test_every_page_fits_a_phone_without_scrolling_sideways(
    page: Page, page_errors: list[str], superuser: User, oncall: User, editor: User, author: User
) -> None:
    seeded = seed(oncall=oncall, editor=editor, author=author)
    page.set_viewport_size(PHONE)
    page.goto("/accounts/login/")
    wide: dict[str, dict[str, int]] = {}
    if (widths := page.evaluate(OVERFLOW))["document"] > PHONE["width"]:
        wide["login"] = widths
    log_in(page, superuser)
    for url in seeded.pages:
        page.goto(url)
        expect(page.locator("h1")).to_be_visible()
        if (widths := page.evaluate(OVERFLOW))["document"] > PHONE["width"]:
            wide[url] = widths

    assert not wide, "pages wider than a 390 px window:\n" + pformat(wide)


def test_on_a_phone_a_table_row_is_a_card_and_long_values_wrap_whole(
    page: Page, page_errors: list[str], superuser: User, oncall: User, editor: User, author: User
) -> None:
    seeded = seed(oncall=oncall, editor=editor, author=author)
    page.set_viewport_size(PHONE)
    log_in(page, superuser)

    page.goto("/dead/")
    row = page.locator("#results tbody tr").filter(has_text=f"#{seeded.dead.pk}")
    error_class = row.locator("td.error-class")
    expect(error_class).to_have_attribute("data-label", "Error class")
    # The whole card's width: the class breaks two or three times, not a letter a line.
    assert 2 <= error_class.evaluate(LINES) <= 4
    card, cell = row.bounding_box(), error_class.bounding_box()
    assert card is not None and cell is not None
    assert cell["width"] > card["width"] * 0.8

    page.goto("/tasks/")
    key = page.locator("#results td.mono").filter(has_text=LONG_KEY).first
    expect(key).to_have_attribute("data-label", "Key")
    assert key.evaluate(LINES) <= 6  # 215 characters, about 40 a line
    created = page.locator("#results tbody tr").first.locator("time")
    expect(created.first).to_be_visible()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOTS / "phone-width.png", full_page=True)

    # A row the list's own refresh brings is a card too.
    later = noop("publish:narrow:later")
    later_key = page.locator("#results tbody tr").filter(has_text=f"#{later.pk}").locator("td.mono")
    expect(later_key).to_have_attribute("data-label", "Key", timeout=15_000)


# --- dark mode --------------------------------------------------------------------------------

COLOURS = """
() => {
  const badge = document.createElement("span");
  badge.className = "badge status-dead";
  document.body.append(badge);
  const of = (element, property) => getComputedStyle(element)[property];
  const colours = {
    background: of(document.documentElement, "backgroundColor"),
    ink: of(document.body, "color"),
    badge: of(badge, "backgroundColor"),
    bar: of(document.querySelector("svg .bar"), "fill"),
  };
  badge.remove();
  return colours;
}
"""


def brightness(colour: str) -> float:
    red, green, blue = (int(part) for part in re.findall(r"\d+", colour)[:3])
    return (0.2126 * red + 0.7152 * green + 0.0722 * blue) / 255


def busy_hour(oncall: User) -> None:
    """An overview with something in every part: tasks that finished over the last hour, a
    dead letter, a draft waiting for review, a paused queue and a live worker."""
    now = timezone.now()
    for n in range(24):
        task = succeeded(f"dark:{n}")
        minutes = (n * n) % 37  # a few minutes with two
        Task.objects.filter(pk=task.pk).update(finished_at=now - timedelta(minutes=minutes))
    dead_task(key="dark:dead")
    advance(article(key="publish:dark-article:v1"))
    services.pause_queue("default", actor=oncall, reason="Database failover drill")
    presence.worker_started(
        presence.NodeInfo(
            name="worker-4242@box-1",
            hostname="box-1",
            pid=4242,
            queues=["default", "maintenance"],
            concurrency=4,
            processes=[4243, 4244],
        )
    )


def test_the_console_is_dark_when_the_system_is(
    page: Page, page_errors: list[str], oncall: User
) -> None:
    busy_hour(oncall)
    log_in(page, oncall)
    page.goto("/")
    light = page.evaluate(COLOURS)

    page.emulate_media(color_scheme="dark")
    dark = page.evaluate(COLOURS)

    assert brightness(light["background"]) > 0.9 and brightness(dark["background"]) < 0.15
    assert brightness(dark["ink"]) > 0.8
    assert dark["badge"] != light["badge"] and dark["bar"] != light["bar"]
    expect(page.locator("#workers")).to_contain_text("worker-4242@box-1")
    page.screenshot(path=SCREENSHOTS / "dark-mode.png", full_page=True)


# --- times ------------------------------------------------------------------------------------


def test_a_time_says_how_long_ago_and_its_zone_on_hover_and_keeps_current(
    page: Page, page_errors: list[str], oncall: User
) -> None:
    task = noop("times:1")
    log_in(page, oncall)
    page.goto("/tasks/")
    created = page.locator("#results tbody tr").filter(has_text=f"#{task.pk}").locator("time")
    expect(created.first).to_have_text(re.compile(r"^(just now|\d+ s ago)$"))
    expect(created.first).to_have_attribute(
        "title", re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$")
    )
    expect(created.first).to_have_attribute("datetime", task.created_at.isoformat())

    # Left open, the text follows the clock: here the moment is moved back 5 minutes and
    # the tab shown again, which rewrites the texts at once (read before the list's own
    # refresh replaces them with the server's).
    assert page.evaluate(MOVED_BACK_AND_SHOWN, task.pk) == "5 min ago"


MOVED_BACK_AND_SHOWN = """
(pk) => {
  const row = [...document.querySelectorAll("#results tbody tr")]
    .find((tr) => tr.textContent.includes(`#${pk}`));
  const time = row.querySelector("time[data-when]");
  time.setAttribute("datetime", new Date(Date.now() - 5 * 60 * 1000 - 500).toISOString());
  document.dispatchEvent(new Event("visibilitychange"));
  return time.textContent;
}
"""


# --- go to task #id ---------------------------------------------------------------------------


def test_the_go_to_box_jumps_to_a_task_and_refuses_a_missing_one(
    page: Page, page_errors: list[str], oncall: User
) -> None:
    task = noop("go:1")
    log_in(page, oncall)
    page.goto("/queues/")

    # "/" outside a field goes to the box.
    page.keyboard.press("/")
    box = page.get_by_label("Go to task")
    expect(box).to_be_focused()
    box.fill(f"#{task.pk}")
    box.press("Enter")
    expect(page).to_have_url(re.compile(rf"/tasks/{task.pk}/$"))
    expect(page.locator("h1")).to_contain_text(f"#{task.pk}")

    missing = task.pk + 1000
    with page.expect_response(re.compile(r"/tasks/go/")) as answer:
        page.get_by_label("Go to task").fill(str(missing))
        page.get_by_role("button", name="Go", exact=True).click()
    assert answer.value.status == 404
    expect(page.get_by_role("alert")).to_contain_text(f"There is no task #{missing}.")
    expect(page.locator("h1")).to_have_text("Not found")

    with page.expect_response(re.compile(r"/tasks/go/")) as answer:
        page.get_by_label("Go to task").fill("latest")
        page.get_by_label("Go to task").press("Enter")
    assert answer.value.status == 400
    expect(page.get_by_role("alert")).to_contain_text("id: write a task number")


# --- the key filter ---------------------------------------------------------------------------


def test_the_key_filter_finds_a_task_by_the_start_of_its_key(
    page: Page, page_errors: list[str], oncall: User
) -> None:
    wanted = noop("publish:article-042:v3")
    other = noop("publish:article-043:v1")
    log_in(page, oncall)
    page.goto("/tasks/")
    results = page.locator("#results")

    page.get_by_label("Idempotency key").fill("publish:article-042")
    page.get_by_role("button", name="Filter").click()

    expect(page).to_have_url(re.compile(r"key=publish%3Aarticle-042"))
    expect(results.get_by_role("link", name=f"#{wanted.pk}", exact=True)).to_be_visible()
    expect(results.get_by_role("link", name=f"#{other.pk}", exact=True)).to_have_count(0)


# --- live lists -------------------------------------------------------------------------------


def polls(page: Page, path: str) -> list[Request]:
    """The htmx requests the page sends for ``path`` (recorded from now on)."""
    seen: list[Request] = []

    def record(request: Request) -> None:
        if request.headers.get("hx-request") and request.url.split("?")[0].endswith(path):
            seen.append(request)

    page.on("request", record)
    return seen


def test_the_task_list_shows_new_tasks_by_itself_keeping_filter_page_and_scroll(
    page: Page, page_errors: list[str], oncall: User
) -> None:
    for n in range(40):
        noop(f"live:{n:02d}")
    noop("elsewhere:1")
    log_in(page, oncall)
    page.set_viewport_size({"width": 1280, "height": 600})
    page.goto("/tasks/?key=live%3A")
    results = page.locator("#results")
    expect(results.locator("tbody tr")).to_have_count(40)
    page.evaluate("window.__sameDocument = true")
    # Someone starts typing another filter; it is not sent yet.
    page.get_by_label("Payload field").fill("customer.id=4")
    page.get_by_label("Payload field").blur()
    page.mouse.wheel(0, 400)
    # Polled from here: the page's CSP refuses the eval a wait_for_function would poll with.
    scrolled = wait_for(
        lambda: page.evaluate("window.scrollY") >= 400 and page.evaluate("window.scrollY"),
        timeout=10,
        what="the page to scroll",
    )
    refreshes = polls(page, "/tasks/")

    created = noop("live:new")
    noop("elsewhere:2")

    expect(results.get_by_role("link", name=f"#{created.pk}", exact=True)).to_be_visible(
        timeout=15_000
    )
    expect(results.locator("tbody tr")).to_have_count(41)
    assert refreshes and all("key=live%3A" in request.url for request in refreshes)
    assert page.evaluate("window.__sameDocument") is True, "the page was reloaded"
    assert page.evaluate("window.scrollY") == scrolled
    expect(page.get_by_label("Payload field")).to_have_value("customer.id=4")
    expect(page.get_by_label("Idempotency key")).to_have_value("live:")
    expect(page).to_have_url(re.compile(r"/tasks/\?key=live%3A$"))


def test_a_refresh_stays_on_the_page_being_read(
    page: Page, page_errors: list[str], oncall: User
) -> None:
    tasks = [noop(f"paged:{n:02d}") for n in range(60)]  # more than one page of 50
    log_in(page, oncall)
    page.goto("/tasks/")
    page.get_by_role("link", name="Older →").click()
    expect(page).to_have_url(re.compile(r"after=\d+"))
    oldest = page.locator("#results").get_by_role("link", name=f"#{tasks[0].pk}", exact=True)
    expect(oldest).to_be_visible()
    refreshes = polls(page, "/tasks/")

    noop("paged:new")

    page.wait_for_timeout(6_000)
    assert refreshes and all("after=" in request.url for request in refreshes)
    expect(oldest).to_be_visible()
    newest = page.locator("#results").get_by_role("link", name=f"#{tasks[-1].pk}", exact=True)
    expect(newest).to_have_count(0)


def test_a_hidden_tab_does_not_refresh_and_refreshes_once_shown(
    page: Page, page_errors: list[str], oncall: User
) -> None:
    page.add_init_script(HIDEABLE_TAB)
    log_in(page, oncall)
    page.goto("/tasks/")
    expect(page.locator("#results")).to_be_visible()
    page.evaluate(SET_HIDDEN, True)
    refreshes = polls(page, "/tasks/")
    created = noop("hidden:1")

    page.wait_for_timeout(6_500)  # longer than the 5 s between refreshes
    assert refreshes == []
    expect(page.locator("#results").get_by_role("link", name=f"#{created.pk}")).to_have_count(0)

    page.evaluate(SET_HIDDEN, False)
    expect(page.locator("#results").get_by_role("link", name=f"#{created.pk}")).to_be_visible(
        timeout=2_000
    )
    assert len(refreshes) >= 1


def test_the_queues_refresh_but_not_over_a_reason_being_typed(
    page: Page, page_errors: list[str], oncall: User
) -> None:
    log_in(page, oncall)
    page.goto("/queues/")
    row = page.locator("#queue-tables tbody tr").filter(has_text="default").first
    expect(row.locator(".badge")).to_have_text("running")
    reason = row.get_by_label("Reason")
    reason.fill("Half-typed reas")
    refreshes = polls(page, "/queues/")

    services.pause_queue("default", actor="cli:oncall", reason="Paused elsewhere")

    page.wait_for_timeout(6_500)
    assert refreshes == []
    expect(reason).to_have_value("Half-typed reas")
    expect(row.locator(".badge")).to_have_text("running")

    reason.fill("")
    reason.blur()
    expect(row.locator(".badge")).to_have_text("paused", timeout=12_000)
    expect(page.locator("#queue-tables")).to_contain_text("Paused elsewhere")
