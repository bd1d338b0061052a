"""The Limits page in a real browser, as on-call uses it: a limit's numbers changed with a
reason (the preview's words first, then the confirm, then the new numbers and the audit log's
entry), a key paused and resumed, and the figures refreshing by themselves without touching
a reason being typed; no Content-Security-Policy violation, nothing wider than a phone.

Steps run by claiming through the engine in this process (no worker runs in this module)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import ConsoleMessage, Locator, Page, expect

from tasks_app.models import Event, EventKind, LimitKey, LimitState, Step
from tests.browser.support import OVERFLOW, PHONE, RECORD_CSP, SCREENSHOTS, log_in
from tests.limit_support import finish
from tests.limits_page_support import CUSTOMERS, busy, limited_flow

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(120),
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def steps() -> Iterator[dict[str, list[Step]]]:
    """acme at its concurrency with two steps waiting behind it; globex running."""
    with limited_flow():
        yield busy()


@pytest.fixture
def watched(page: Page) -> Iterator[Page]:
    """The page, with every CSP violation and console message it meets checked at the end."""
    said: list[str] = []

    def record(message: ConsoleMessage) -> None:
        said.append(f"{page.url}: console {message.type}: {message.text}")

    page.on("console", record)
    page.on("pageerror", lambda error: said.append(f"{page.url}: page error: {error}"))
    page.add_init_script(RECORD_CSP)
    yield page
    assert not page.evaluate("window.__csp || []"), page.evaluate("window.__csp")
    assert not said, "\n".join(said)


def open_card(page: Page) -> Locator:
    page.goto(f"/limits/#limit-{CUSTOMERS.name}")
    card = page.locator(f"#limit-{CUSTOMERS.name}")
    expect(card).to_contain_text("2 running and 2 waiting across 2 keys")
    return card


def shoot(page: Page, name: str) -> None:
    """A screenshot for the docs. The caret is left as it is: hiding it would take a style
    Playwright adds inline, which the Content-Security-Policy refuses (and the page logs)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOTS / f"{name}.png", full_page=True, caret="initial")


def form_with(card: Locator, button: str) -> Locator:
    return card.locator("form").filter(has=card.page.get_by_role("button", name=button, exact=True))


def test_oncall_changes_a_limit_after_its_preview_and_an_auditor_finds_it_in_the_log(
    watched: Page, oncall: User, auditor: User, steps: dict[str, list[Step]]
) -> None:
    page = watched
    log_in(page, oncall)
    card = open_card(page)
    shoot(page, "limits-busy")

    card.get_by_text(f"Change {CUSTOMERS.name}, pause or resume a key").click()
    change = form_with(card, "Preview")
    change.get_by_label("At once").fill("3")
    change.get_by_label("Reason").fill("acme raised our quota")
    change.get_by_role("button", name="Preview").click()

    preview = card.locator(".preview")
    expect(preview).to_contain_text(
        "page_customers: 1 at once → 3 at once. It lets 2 waiting steps start now."
    )
    expect(preview).to_contain_text("Nothing has changed yet.")
    assert not LimitState.objects.filter(overridden=True).exists()
    shoot(page, "limits-preview")

    card.get_by_role("button", name="Apply 3 at once").click()

    expect(card).to_contain_text("Limit page_customers changed to 3 at once.")
    expect(card.locator(f"#use-{CUSTOMERS.name}")).to_contain_text("3 at once")
    expect(card).to_contain_text("Changed live by olivia-oncall")
    expect(card.get_by_role("button", name="Put back")).to_be_visible()
    state = LimitState.objects.get(name=CUSTOMERS.name)
    assert (state.overridden, state.concurrency) == (True, 3)

    # On-call reads the change on the card (the audit log is the auditors'); an auditor
    # finds it in the audit log.
    latest = card.locator("ul.changes li").first
    expect(latest).to_contain_text("olivia-oncall changed 1 at once → 3 at once,")
    expect(latest).to_contain_text("“acme raised our quota”")
    shoot(page, "limits-changed")
    page.get_by_role("button", name="Log out").click()
    log_in(page, auditor)
    page.goto("/audit/")
    entry = page.locator("#results tbody tr").first
    expect(entry).to_contain_text("Limit changed")
    expect(entry).to_contain_text(CUSTOMERS.name)
    expect(entry).to_contain_text("acme raised our quota")
    expect(entry).to_contain_text(oncall.username)


def test_oncall_pauses_a_key_and_resumes_it(
    watched: Page, oncall: User, steps: dict[str, list[Step]]
) -> None:
    page = watched
    log_in(page, oncall)
    card = open_card(page)
    card.get_by_text(f"Change {CUSTOMERS.name}, pause or resume a key").click()

    pause = form_with(card, "Pause")
    pause.get_by_label("Key").fill("acme")
    pause.get_by_label("Reason").fill("acme asked us to stop")
    pause.get_by_role("button", name="Pause").click()

    expect(card).to_contain_text("Key acme of page_customers paused.")
    acme = card.locator("tr").filter(has=page.locator("th", has_text="acme"))
    expect(acme).to_contain_text("paused by olivia-oncall")
    expect(acme).to_contain_text("“acme asked us to stop”")
    expect(acme).to_contain_text("when someone resumes it")
    assert LimitKey.objects.get(limit=CUSTOMERS.name, key="acme").paused_at is not None
    shoot(page, "limits-paused")

    resume = form_with(card, "Resume")
    expect(resume.get_by_label("Key")).to_have_value("acme")
    resume.get_by_label("Reason").fill("acme is ready again")
    resume.get_by_role("button", name="Resume").click()

    expect(card).to_contain_text("Key acme of page_customers resumed.")
    expect(card.get_by_role("button", name="Resume")).to_have_count(0)
    assert LimitKey.objects.get(limit=CUSTOMERS.name, key="acme").paused_at is None
    kinds = Event.objects.filter(kind__startswith="limit_key").order_by("pk")
    assert [(e.kind, e.actor, e.reason) for e in kinds] == [
        (EventKind.LIMIT_KEY_PAUSED, oncall.username, "acme asked us to stop"),
        (EventKind.LIMIT_KEY_RESUMED, oncall.username, "acme is ready again"),
    ]


def test_the_figures_refresh_by_themselves_and_leave_a_reason_being_typed(
    watched: Page, oncall: User, steps: dict[str, list[Step]]
) -> None:
    page = watched
    log_in(page, oncall)
    card = open_card(page)
    page.evaluate("window.__sameDocument = true")
    card.get_by_text(f"Change {CUSTOMERS.name}, pause or resume a key").click()
    reason = form_with(card, "Preview").get_by_label("Reason")
    reason.fill("half-typed")

    finish([steps["globex"][0].pk])

    # The poller asks every 5 s; globex's step has ended, so one key is at its limit.
    expect(card.locator(f"#use-{CUSTOMERS.name}")).to_contain_text(
        "1 running and 2 waiting across 1 key; 1 at its limit", timeout=20_000
    )
    expect(reason).to_have_value("half-typed")
    assert page.evaluate("window.__sameDocument") is True, "the page was reloaded"


def test_the_limits_page_reads_on_a_phone(
    watched: Page, oncall: User, steps: dict[str, list[Step]]
) -> None:
    page = watched
    page.set_viewport_size(PHONE)
    log_in(page, oncall)
    card = open_card(page)
    card.get_by_text(f"Change {CUSTOMERS.name}, pause or resume a key").click()
    widths = page.evaluate(OVERFLOW)
    assert max(widths["document"], widths["body"]) <= widths["window"], widths
    shoot(page, "narrow-limits-busy")
