"""The API's documentation page (``/api/v1/docs``) in a real browser, for a signed-in
person: Swagger's page served from here (no CDN), every operation listed, no
Content-Security-Policy violation or console error; the anonymous visitor goes to the
login."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import ConsoleMessage, Page, expect

from tests.browser.support import RECORD_CSP, log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_signed_in_person_reads_the_api_document(page: Page, oncall: User) -> None:
    said: list[str] = []

    def record(message: ConsoleMessage) -> None:
        if message.type == "error":
            said.append(message.text)

    page.on("console", record)
    page.add_init_script(RECORD_CSP)
    page.goto("/api/v1/docs")
    expect(page).to_have_url("/accounts/login/?next=/api/v1/docs", ignore_case=True)
    log_in(page, oncall)
    page.goto("/api/v1/docs")
    expect(page.get_by_role("heading", name="Task console API")).to_be_visible()
    expect(page.get_by_text("/api/v1/plans/{plan_id}/apply")).to_be_visible()
    expect(page.get_by_text("/api/v1/dead/groups/")).to_be_visible()
    assert page.evaluate("window.__csp") == []
    assert said == []


def test_the_document_itself_needs_no_sign_in(page: Page, live_server: Any) -> None:
    answer = page.request.get(f"{live_server.url}/api/v1/openapi.json")
    assert answer.status == 200
    assert answer.json()["info"]["title"] == "Task console API"
