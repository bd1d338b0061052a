"""On-call, in the browser, rewinds a dead newsletter task whose mail is in doubt: previews a
rewind from ``draft``, reads the plan (the steps that run again, the mail in doubt), is
refused for confirming without saying whether the mail went out, says it happened and
confirms; the task is pending again with the rewound rows kept as history. No
Content-Security-Policy violation, no serious accessibility problem, and a screenshot of
the preview for the docs.

The steps run in this process (``tests.graph_support``); no worker runs in this module.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from tasks_app.models import Event, EventKind, Step, StepStatus, Task, TaskStatus
from tests.browser.support import (
    OVERFLOW,
    PHONE,
    RECORD_CSP,
    SCREENSHOTS,
    accessibility_problems,
    log_in,
    status_badge,
)
from tests.graph_support import registered
from tests.rewind_support import Mailer, newsletter, sent_task

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(120),
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def task() -> Iterator[Task]:
    """A dead newsletter task: its mail went out and the answer was lost."""
    mailer = Mailer()
    with registered(newsletter(mailer)):
        made = sent_task(mailer, lose_answer=True)
        assert made.status == TaskStatus.DEAD
        yield made


def test_oncall_rewinds_a_task_whose_mail_is_in_doubt(page: Page, oncall: User, task: Task) -> None:
    page.add_init_script(RECORD_CSP)
    log_in(page, oncall)
    page.goto(f"/tasks/{task.pk}/")
    section = page.locator("#rewind")
    section.get_by_label("Rewind from step").select_option(label="1 · draft (succeeded)")
    with page.expect_response(f"**/tasks/{task.pk}/rewind/") as answer:
        section.get_by_role("button", name="Preview rewind").click()
    assert answer.value.status == 200

    # The plan, swapped in place: the steps that run again and the mail in doubt.
    section = page.locator("#rewind")
    expect(section.get_by_role("heading", level=2)).to_have_text("Rewind from draft: the plan")
    expect(page).to_have_url(f"/tasks/{task.pk}/")
    expect(section.locator("ol.rerun li strong")).to_have_text(["draft", "mail", "archive"])
    write = section.locator("li.write")
    expect(write).to_have_count(1)
    expect(write.locator(".state")).to_have_text("in doubt")
    expect(write).to_contain_text("started and never answered: say whether it happened")
    expect(section.locator(".unrecorded")).to_contain_text("any write they make will run")
    # The caret is left as it is: hiding it leaves an empty style attribute on each field,
    # which htmx copies onto the next answer's fields, and the policy refuses.
    section.screenshot(path=SCREENSHOTS / "rewind-preview.png", caret="initial")
    assert accessibility_problems(page, Axe()) == []

    # Confirming without saying whether the mail went out is refused, naming the decisions.
    section.get_by_label("Reason").fill("The subject line was wrong")
    confirm = section.get_by_role("button", name="Rewind from draft")
    with page.expect_response(f"**/tasks/{task.pk}/rewind/confirm/") as answer:
        confirm.click()
    assert answer.value.status == 400
    section = page.locator("#rewind")
    expect(section.get_by_role("alert")).to_contain_text(
        "decisions: say whether each write in doubt happened"
    )
    expect(section.get_by_label("Reason")).to_have_value("The subject line was wrong")
    assert Step.objects.filter(task=task, status=StepStatus.SUPERSEDED).count() == 0
    assert accessibility_problems(page, Axe()) == []

    # It happened: do not send again.
    section.get_by_label("It happened: do not send again").check()
    with page.expect_response(f"**/tasks/{task.pk}/rewind/confirm/") as answer:
        section.get_by_role("button", name="Rewind from draft").click()
    assert answer.value.status == 200
    expect(page.locator("#task .notice.success")).to_contain_text(
        f"Task #{task.pk}: rewound from draft; draft, mail, archive run again."
    )
    expect(status_badge(page)).to_have_text("pending")
    expect(page.locator("#rewind")).to_have_count(0)
    # The rewound rows stay in the steps table as history, beside the new ones.
    superseded = page.locator("tr.superseded")
    expect(superseded).to_have_count(3)
    expect(superseded.locator("td:nth-child(2)")).to_have_text(["draft", "mail", "archive"])
    event = Event.objects.get(task_id=task.pk, kind=EventKind.REWOUND)
    assert (event.actor, event.reason) == (oncall.username, "The subject line was wrong")
    assert page.evaluate("window.__csp") == []


def test_on_a_phone_the_preview_fits_the_screen(page: Page, oncall: User, task: Task) -> None:
    log_in(page, oncall)
    page.set_viewport_size(PHONE)
    page.goto(f"/tasks/{task.pk}/")
    section = page.locator("#rewind")
    section.get_by_label("Rewind from step").select_option(label="1 · draft (succeeded)")
    section.get_by_role("button", name="Preview rewind").click()
    expect(section.locator("li.write")).to_have_count(1)
    widths = page.evaluate(OVERFLOW)
    assert max(widths["document"], widths["body"]) <= widths["window"], widths


def test_oncall_rewinds_dead_letters_in_bulk_and_the_one_in_doubt_is_left_to_its_page(
    page: Page, oncall: User
) -> None:
    mailer = Mailer()
    with registered(newsletter(mailer)):
        refused = sent_task(mailer, refuse=True)
        in_doubt = sent_task(mailer, lose_answer=True)
        log_in(page, oncall)
        page.goto("/dead/")
        bulk = page.locator("#bulk")
        bulk.get_by_label("Action").select_option("rewind")
        bulk.get_by_label("From step (for Rewind)").fill("draft")
        bulk.get_by_label("Reason").fill("The subject line was wrong")
        bulk.get_by_role("button", name="Preview").click()

        confirm = bulk.get_by_role("button", name="Rewind 2 tasks", exact=True)
        expect(confirm).to_be_visible()
        assert not Event.objects.filter(kind=EventKind.REWOUND).exists()  # only previewed
        confirm.click()

        done = bulk.locator(".notice.success")
        expect(done).to_contain_text("Rewind: 1 task changed, 1 skipped.")
        expect(done).to_contain_text(f"#{in_doubt.pk}: task #{in_doubt.pk} has writes in doubt")
        rewound = Event.objects.get(kind=EventKind.REWOUND)
        assert (rewound.task_id, rewound.actor) == (refused.pk, oncall.username)
        in_doubt.refresh_from_db()
        assert in_doubt.status == TaskStatus.DEAD
