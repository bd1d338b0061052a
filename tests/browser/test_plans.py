"""A program's plan signed in a real browser: a script with an on-call person's token
proposes, over HTTP, a bulk redrive of one group of dead letters; the token may not apply
it itself; a person opens the Plans inbox, reads who proposed what and why, and signs it;
the tasks run again and the events name both. Another plan is declined with a reason."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.contrib.auth.models import Group, User
from playwright.sync_api import Page, expect

from tasks_app.models import Event, EventKind, PlanStatus, ProposedPlan, Step, Task, TaskStatus
from tests.api_support import token_for
from tests.browser.support import RECORD_CSP, SCREENSHOTS, accessibility_problems, log_in
from tests.factories import dead_task, unknown_outcome

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(120),
    pytest.mark.django_db(transaction=True),
]


def script_call(base: str, method: str, path: str, secret: str, body: Any = None) -> Any:
    """What a program does: an HTTP call with its token; (status, JSON)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        base + path,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


@pytest.fixture
def signer(oncall: User) -> User:
    person = User.objects.create_user(username="sigrid-signer", password="pw-sigrid-signer")
    person.groups.add(Group.objects.get(name="oncall"))
    return person


def test_a_person_signs_a_bulk_redrive_a_script_proposed(
    page: Page, live_server: Any, oncall: User, signer: User
) -> None:
    group = [dead_task({"error": "permanent", "fail_first": 1, "seed": n}) for n in range(3)]
    other = unknown_outcome()
    cause = Step.objects.get(task=group[0], status="dead").error_fingerprint
    secret = token_for(oncall, "oncall", name="triage-bot")

    status, groups = script_call(live_server.url, "GET", "/api/v1/dead/groups/", secret)
    assert status == 200
    assert cause in json.dumps(groups)
    status, plan = script_call(
        live_server.url,
        "POST",
        "/api/v1/plans/",
        secret,
        {"action": "redrive", "reason": "the publisher is back", "filters": {"fingerprint": cause}},
    )
    assert status == 201, plan
    status, refused = script_call(
        live_server.url, "POST", f"/api/v1/plans/{plan['id']}/apply", secret
    )
    assert (status, refused["error"]) == (403, "not_permitted")

    page.add_init_script(RECORD_CSP)
    log_in(page, signer)
    page.get_by_role("link", name="Plans").click()
    row = page.get_by_role("row").filter(has_text=plan["id"])
    expect(row).to_contain_text("olivia-oncall via triage-bot")
    expect(row).to_contain_text("the publisher is back")
    row.get_by_role("link", name=plan["id"]).click()
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Plan {plan['id']}: Redrive")
    expect(page.locator(".plan-tasks li")).to_have_count(3)
    page.screenshot(path=str(SCREENSHOTS / "plan.png"), full_page=True)
    assert accessibility_problems(page, Axe()) == []
    page.get_by_label("Note").fill("checked the publisher's status page")
    page.get_by_role("button", name="Apply: Redrive on 3 tasks").click()
    expect(page.locator("#plan .notice")).to_have_text("Plan applied: 3 tasks changed.")
    expect(page.locator("#plan dt", has_text="Applied by")).to_be_visible()
    expect(page.locator("#plan dd", has_text="sigrid-signer")).to_be_visible()
    expect(page.get_by_role("button", name="Apply: Redrive on 3 tasks")).to_have_count(0)
    assert page.evaluate("window.__csp") == []

    assert {t.status for t in Task.objects.filter(pk__in=[t.pk for t in group])} == {
        TaskStatus.PENDING
    }
    assert Task.objects.get(pk=other.pk).status == TaskStatus.DEAD
    applied = Event.objects.get(kind=EventKind.PLAN_APPLIED)
    assert applied.actor == "sigrid-signer"
    assert applied.data["proposed_by"] == "olivia-oncall via triage-bot"
    proposed = Event.objects.get(kind=EventKind.PLAN_PROPOSED)
    assert proposed.actor == "olivia-oncall via triage-bot"
    assert set(
        Event.objects.filter(kind=EventKind.REDRIVEN, data__plan=plan["id"]).values_list(
            "actor", flat=True
        )
    ) == {"sigrid-signer"}


def test_a_person_declines_a_plan_with_a_reason(
    page: Page, live_server: Any, oncall: User, signer: User
) -> None:
    task = dead_task()
    secret = token_for(oncall, "oncall", name="cleanup-bot")
    status, plan = script_call(
        live_server.url,
        "POST",
        "/api/v1/plans/",
        secret,
        {"action": "cancel", "reason": "stale work", "task_ids": [task.pk]},
    )
    assert status == 201, plan
    log_in(page, signer)
    page.goto(f"/plans/{plan['id']}/")
    page.get_by_role("button", name="Decline").click()
    # The browser asks for the required reason before anything is sent.
    expect(page.locator("#plan")).to_contain_text("Awaiting a signature")
    page.get_by_label("Reason").fill("this customer still needs it")
    page.get_by_role("button", name="Decline").click()
    expect(page.locator("#plan .notice")).to_have_text("Plan declined: nothing of it was applied.")
    expect(page.locator("#plan dt", has_text="Declined by")).to_be_visible()
    expect(page.locator("#plan dd", has_text="this customer still needs it")).to_be_visible()
    assert ProposedPlan.objects.get(pk=plan["id"]).status == PlanStatus.DECLINED
    assert Task.objects.get(pk=task.pk).status == TaskStatus.DEAD
    status, seen = script_call(live_server.url, "GET", f"/api/v1/plans/{plan['id']}", secret)
    assert (status, seen["status"], seen["decision_reason"]) == (
        200,
        "declined",
        "this customer still needs it",
    )
