"""The Tokens page in a real browser, as a person making a token for their program uses it:
signed in, they open Tokens from the nav, make a token and see its secret once, with a curl
line to try it; reloaded, the page no longer shows it; they revoke the token (a blank reason
refused on its field first) and see it revoked, by them. No Content-Security-Policy
violation, no serious accessibility violation, nothing wider than a phone.

No worker runs in this module: the page makes and revokes tokens, nothing else."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.contrib.auth.models import User
from playwright.sync_api import ConsoleMessage, Page, expect

from tasks_app.models import ApiToken, Event, EventKind
from tasks_app.operations import tokens
from tests.browser.support import (
    OVERFLOW,
    PHONE,
    RECORD_CSP,
    SCREENSHOTS,
    VIEWPORT,
    accessibility_problems,
    log_in,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(120),
    pytest.mark.django_db(transaction=True),
]

# The browser logs every answer of 4xx; a test that provokes one says so (expect_refusal).
REFUSAL_LOG = re.compile(r"the server responded with a status of (\d{3})")


@pytest.fixture
def watched(page: Page) -> Iterator[tuple[Page, set[int]]]:
    """The page, with every CSP violation and console message it meets checked at the end,
    and the statuses of the refusals the test provokes (the browser logs each one)."""
    said: list[str] = []
    expected: set[int] = set()

    def record(message: ConsoleMessage) -> None:
        refusal = REFUSAL_LOG.search(message.text)
        if refusal and int(refusal[1]) in expected:
            return
        said.append(f"{page.url}: console {message.type}: {message.text}")

    page.on("console", record)
    page.on("pageerror", lambda error: said.append(f"{page.url}: page error: {error}"))
    page.add_init_script(RECORD_CSP)
    yield page, expected
    assert not page.evaluate("window.__csp || []"), page.evaluate("window.__csp")
    assert not said, "\n".join(said)


def shoot(page: Page, name: str) -> None:
    """A screenshot for the docs (the caret as it is: hiding it takes an inline style the
    Content-Security-Policy refuses)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOTS / f"{name}.png", full_page=True, caret="initial")


def test_a_person_makes_a_token_sees_its_secret_once_and_revokes_it(
    watched: tuple[Page, set[int]], oncall: User
) -> None:
    page, refusals = watched
    # Tokens made earlier: one a program used, one revoked.
    used = tokens.issue(oncall, name="nightly-report", group="oncall", days=90, actor=oncall)
    tokens.record_use(used.token, "198.51.100.23")
    old = tokens.issue(oncall, name="old-script", group="oncall", days=30, actor=oncall).token
    tokens.revoke(old, actor=oncall, reason="replaced by nightly-report")

    log_in(page, oncall)
    page.get_by_role("navigation", name="Sections").get_by_role("link", name="Tokens").click()
    expect(page.locator("h1")).to_have_text("Tokens")
    expect(page.get_by_role("link", name="Tokens")).to_have_attribute("aria-current", "page")

    form = page.locator("form").filter(
        has=page.get_by_role("button", name="Make the token", exact=True)
    )
    form.get_by_label("Name").fill("triage-bot")
    form.get_by_label("Permissions of").select_option("oncall")
    expect(form.get_by_label("Valid for (days)")).to_have_value("90")
    form.get_by_label("Valid for (days)").fill("30")
    form.get_by_label("Plans it may apply itself").select_option("one_task")
    form.get_by_role("button", name="Make the token").click()

    box = page.locator(".secret-box")
    expect(box).to_contain_text("Copy it now: it is not shown again.")
    secret = page.locator("#token-secret").inner_text()
    token = ApiToken.objects.get(name="triage-bot")
    assert secret.startswith(f"tc_{token.prefix}_")
    assert token.digest == hashlib.sha256(secret.encode()).hexdigest()
    assert (token.group.name, token.auto_apply) == ("oncall", "one_task")
    expect(page.locator("#token-curl")).to_have_text(
        re.compile(rf'^curl -H "Authorization: Bearer {re.escape(secret)}" http\S+/api/v1/tasks/$')
    )
    row = page.locator(f"#token-{token.pk}")
    expect(row).to_contain_text(f"tc_{token.prefix}_…")
    expect(row).to_contain_text("A plan on one task with no write in doubt")
    expect(row.locator(".badge")).to_have_text("live")
    # The form is ready for another token.
    expect(form.get_by_label("Name")).to_have_value("")
    assert accessibility_problems(page, Axe()) == []
    shoot(page, "tokens")

    page.reload()
    expect(page.locator("h1")).to_have_text("Tokens")
    expect(page.locator(f"#token-{token.pk}")).to_be_visible()
    expect(page.locator(".secret-box")).to_have_count(0)
    assert secret not in page.content()
    assert secret.split("_", 2)[2] not in page.content()

    row = page.locator(f"#token-{token.pk}")
    reason = row.get_by_label("Reason")
    # Spaces pass the browser's check; the server refuses them on the field.
    refusals.add(400)
    reason.fill("   ")
    row.get_by_role("button", name="Revoke triage-bot").click()
    expect(row.locator(".field-error")).to_have_text("reason: is required and may not be empty")
    assert ApiToken.objects.get(pk=token.pk).revoked_at is None

    row.get_by_label("Reason").fill("The bot moves to a token of its own")
    row.get_by_role("button", name="Revoke triage-bot").click()

    expect(page.locator("#tokens .notice.success")).to_contain_text(
        f"Token triage-bot (tc_{token.prefix}_…) of {oncall.username} revoked"
    )
    expect(row.locator(".badge")).to_have_text("revoked")
    expect(row).to_contain_text(f"by {oncall.username}")
    expect(row.get_by_role("button")).to_have_count(0)
    token.refresh_from_db()
    assert token.revoked_at is not None and token.revoked_by == oncall.username
    event = Event.objects.filter(kind=EventKind.TOKEN_REVOKED).latest("pk")
    assert (event.actor, event.reason) == (oncall.username, "The bot moves to a token of its own")

    page.set_viewport_size(PHONE)
    page.reload()
    widths = page.evaluate(OVERFLOW)
    assert max(widths["document"], widths["body"]) <= widths["window"], widths
    page.set_viewport_size(VIEWPORT)
