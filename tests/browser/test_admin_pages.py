"""The Django admin in the browser: each page of the project's models (a changelist, a
change page, the add page where adding is allowed) has no accessibility violation axe
finds, of any impact, no ARIA reference to a missing id and nothing the CSP refused; the
add form shows the payload rules of the workflow chosen.

The tasks reach their states in this process (no worker runs in this module)."""

from __future__ import annotations

from pathlib import Path
from pprint import pformat
from typing import Any

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.contrib.auth.models import User
from django.urls import reverse
from playwright.sync_api import Page, expect

from tasks_app.workflows import registry
from tests.approval_support import advance, article, pending_request
from tests.browser.support import RECORD_CSP, accessibility_problems, log_in
from tests.factories import dead_task

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(180),
    pytest.mark.django_db(transaction=True),
]


def admin_pages() -> list[tuple[str, str]]:
    """Each admin page of the project's models, named, with a row on each change page: a
    dead task (steps, leases, events) and a pending approval request."""
    dead = dead_task(key="admin:dead")
    request = pending_request(advance(article(key="admin:article")))
    return [
        ("index", reverse("admin:index")),
        ("task-changelist", reverse("admin:tasks_app_task_changelist")),
        ("task-changelist-filtered", reverse("admin:tasks_app_task_changelist") + "?q=admin"),
        ("task-change", reverse("admin:tasks_app_task_change", args=[dead.pk])),
        ("task-add", reverse("admin:tasks_app_task_add")),
        ("request-changelist", reverse("admin:approvals_approvalrequest_changelist")),
        ("request-change", reverse("admin:approvals_approvalrequest_change", args=[request.pk])),
    ]


def test_the_admin_pages_have_no_accessibility_violations(
    page: Page, superuser: User, tmp_path: Path
) -> None:
    superuser.is_staff = True
    superuser.save()
    pages = admin_pages()
    page.add_init_script(RECORD_CSP)
    log_in(page, superuser)
    axe = Axe()
    found: dict[str, list[Any]] = {}
    for name, url in pages:
        response = page.goto(url)
        assert response is not None and response.status == 200, (name, url)
        expect(page.locator("#content")).to_be_visible()
        problems = accessibility_problems(page, axe, impacts=None)
        # The admin's own scripts and this project's run under the site's CSP.
        problems.extend(f"CSP: {refusal}" for refusal in page.evaluate("window.__csp"))
        if problems:
            found[name] = problems
        page.screenshot(path=tmp_path / f"admin-{name}.png", full_page=True)
    print(f"screenshots in {tmp_path}")
    assert not found, "accessibility problems:\n" + pformat(found, width=100)


def test_the_add_form_shows_the_payload_rules_of_the_workflow_chosen(
    page: Page, superuser: User, tmp_path: Path
) -> None:
    superuser.is_staff = True
    superuser.save()
    log_in(page, superuser)
    page.goto(reverse("admin:tasks_app_task_add"))
    rules = page.locator(".workflow-rules > li[data-workflow]")
    shown = rules.filter(visible=True)
    # None chosen: every public workflow's rules, and no internal workflow's.
    expect(shown).to_have_count(len(registry.public_names()))
    expect(page.locator('.workflow-rules > li[data-workflow="approvals.notify"]')).to_have_count(0)

    page.get_by_label("Workflow").select_option("publish_article")

    expect(shown).to_have_count(1)
    expect(shown).to_contain_text("payload.title: a non-empty string is required")
    page.screenshot(path=tmp_path / "admin-add-chosen.png", full_page=True)
    print(f"screenshot in {tmp_path}")
