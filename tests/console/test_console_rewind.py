"""Rewind on the task page: on-call chooses a step, previews the plan (the steps that run
again and each external write with its state), decides each write in doubt, gives a reason
and confirms; the plan travels signed and is applied once. Refusals change nothing: bad
input answers 400 naming the field, a changed task or a spent plan 409, and someone without
the permission 403 with nothing of the task.

The newsletter's mail service is an in-process fake (``tests.rewind_support``); its steps
run here (``tests.graph_support.run``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.http.response import HttpResponseBase
from django.test import Client

from tasks_app import services
from tasks_app.models import Effect, Event, EventKind, Step, Task, TaskStatus
from tests.console_support import HTMX, body, login, plan_of
from tests.graph_support import registered, run, step_of
from tests.rewind_support import Mailer, newsletter, sent_task
from tests.rows import action_rows

pytestmark = pytest.mark.django_db

IN_DOUBT = "in doubt</strong> — started and never answered: say whether it happened."
APPLIED = (
    "applied</strong> — the rerun finds it by its key and skips it; the remote will not see "
    "it again"
)


@pytest.fixture
def mailer(db: None) -> Iterator[Mailer]:
    made = Mailer()
    with registered(newsletter(made)):
        yield made


@pytest.fixture
def in_doubt(mailer: Mailer) -> Task:
    """A dead newsletter task whose mail went out and whose answer was lost."""
    return sent_task(mailer, lose_answer=True)


def rows() -> tuple[Any, ...]:
    """Every row a rewind could change: the actions' rows and the effects ledger."""
    effects = list(Effect.objects.order_by("pk").values_list("key", "status"))
    return (*action_rows(), effects)


def preview(
    client: Client, task: Task, kind: str, *, htmx: bool = True, **fields: str
) -> HttpResponseBase:
    data = {"step": str(step_of(task, kind).pk), **fields}
    return client.post(f"/tasks/{task.pk}/rewind/", data, headers=HTMX if htmx else {})


def mail_key(task: Task) -> str:
    return Effect.objects.get(step__task=task).key


def confirm(
    client: Client,
    task: Task,
    token: str,
    *,
    decided: dict[str, str] | None = None,
    reason: str = "the subject was wrong",
    htmx: bool = False,
) -> HttpResponseBase:
    """Confirm the plan ``token`` as its form does: the reason, and the decisions posted as
    the radio buttons name them."""
    data = {"plan": token, "reason": reason, **(decided or {})}
    return client.post(f"/tasks/{task.pk}/rewind/confirm/", data, headers=HTMX if htmx else {})


def happened(task: Task) -> dict[str, str]:
    return {f"decision:{mail_key(task)}": "happened"}


# --- the form --------------------------------------------------------------------------------


def test_oncall_sees_the_rewind_form_on_a_dead_task_with_its_steps(
    oncall: User, in_doubt: Task
) -> None:
    page = body(login(oncall).get(f"/tasks/{in_doubt.pk}/"))
    assert f'action="/tasks/{in_doubt.pk}/rewind/"' in page
    assert ">Preview rewind</button>" in page
    options = re.findall(r'<option value="(\d+)"( selected)?>([^<]+)</option>', page)
    assert [label for _, _, label in options] == [
        "0 · fetch (succeeded)",
        "1 · draft (succeeded)",
        "2 · mail (dead)",
        "3 · archive (blocked)",
    ]
    # A dead task starts on its dead step.
    assert [int(pk) for pk, chosen, _ in options if chosen] == [step_of(in_doubt, "mail").pk]


def test_the_form_is_offered_on_a_succeeded_or_cancelled_task_and_no_other(
    oncall: User, mailer: Mailer
) -> None:
    client = login(oncall)
    done = sent_task(mailer)
    assert ">Preview rewind</button>" in body(client.get(f"/tasks/{done.pk}/"))

    pending = services.enqueue("test.rewind.newsletter", {"topic": "x"}).task
    assert ">Preview rewind</button>" not in body(client.get(f"/tasks/{pending.pk}/"))
    services.cancel(pending, actor="cli:oncall", reason="not now")
    assert ">Preview rewind</button>" in body(client.get(f"/tasks/{pending.pk}/"))


def test_an_auditor_sees_the_task_and_no_rewind_form(auditor: User, in_doubt: Task) -> None:
    page = body(login(auditor).get(f"/tasks/{in_doubt.pk}/"))
    assert "&quot;spring&quot;" in page  # the task is shown, its payload with it
    assert "/rewind/" not in page and "Preview rewind" not in page


# --- the preview -----------------------------------------------------------------------------


def test_a_preview_lists_the_steps_that_run_again_and_the_mail_in_doubt(
    oncall: User, in_doubt: Task
) -> None:
    before = rows()
    response = preview(login(oncall), in_doubt, "draft")
    assert response.status_code == 200
    page = body(response)
    assert "Rewind from draft: the plan" in page
    rerun = page.split('<ol class="rerun">', 1)[1].split("</ol>", 1)[0]
    assert re.findall(r"<strong>(\w+)</strong>", rerun) == ["draft", "mail", "archive"]
    assert mail_key(in_doubt) in page
    assert IN_DOUBT in page
    for value in ("happened", "not_happened"):
        assert f'name="decision:{mail_key(in_doubt)}" value="{value}"' in page
    assert "It happened: do not send again" in page
    assert "It did not happen: send again" in page
    assert "No recorded writes: <strong>archive</strong>, <strong>draft</strong>" in page
    assert "any write they make will run" in page
    assert "The payload stays as it is." in page
    assert ">Rewind from draft</button>" in page
    assert plan_of(response)
    # A preview changes nothing.
    assert rows() == before


def test_a_preview_with_an_edited_payload_shows_the_applied_mail_and_the_change(
    oncall: User, mailer: Mailer
) -> None:
    task = sent_task(mailer)
    page = body(preview(login(oncall), task, "draft", payload='{"topic": "summer"}'))
    assert APPLIED + ", nor the edited input." in page
    assert IN_DOUBT not in page and 'type="radio"' not in page
    diff = page.split('<table class="grid diff">', 1)[1].split("</table>", 1)[0]
    assert '<th scope="row" class="mono">topic</th>' in diff
    assert "<del>&quot;spring&quot;</del>" in diff and "<ins>&quot;summer&quot;</ins>" in diff


def test_without_htmx_the_preview_is_the_whole_task_page(oncall: User, in_doubt: Task) -> None:
    response = preview(login(oncall), in_doubt, "draft", htmx=False)
    assert response.status_code == 200
    page = body(response)
    assert page.lstrip().lower().startswith("<!doctype html>")
    assert ">Rewind from draft</button>" in page and IN_DOUBT in page
    # The page does not refresh itself under a preview: that would take the plan away.
    assert "data-poll" not in page


def test_every_value_of_the_plan_is_escaped(oncall: User, mailer: Mailer) -> None:
    task = services.enqueue(
        "test.rewind.newsletter", {"topic": "x"}, idempotency_key='news<b>"1"</b>'
    ).task
    mailer.lose_answer = True
    for kind in ("fetch", "draft", "mail"):
        run(task, kind)
    response = preview(login(oncall), task, "draft", payload='{"topic": "<script>x</script>"}')
    assert response.status_code == 200
    page = body(response)
    assert "<b>" not in page and "<script>x" not in page
    assert "news&lt;b&gt;&quot;1&quot;&lt;/b&gt;:2:mail:mail" in page
    assert "&lt;script&gt;x&lt;/script&gt;" in page
    # The decision's field name, escaped in the page, is the key again once posted.
    client = login(oncall)
    token = plan_of(preview(client, task, "draft"))
    response = confirm(client, task, token, decided={f"decision:{mail_key(task)}": "happened"})
    assert response.status_code == 302


def test_a_payload_that_is_not_json_is_refused_naming_payload(oncall: User, in_doubt: Task) -> None:
    before = rows()
    client = login(oncall)
    response = preview(client, in_doubt, "draft", payload="{not json")
    assert response.status_code == 400
    assert "payload: not valid JSON" in body(response)
    assert 'id="rewind_payload"' in body(response)  # the form, to fix it
    response = preview(client, in_doubt, "draft", payload="[1]")
    assert response.status_code == 400
    assert "payload: must be a JSON object" in body(response)
    assert rows() == before


def test_a_payload_the_input_rules_refuse_is_answered_on_the_field(
    oncall: User, in_doubt: Task
) -> None:
    response = preview(login(oncall), in_doubt, "draft", payload='{"topic": "a\\u0000b"}')
    assert response.status_code == 400
    page = body(response)
    assert re.search(r'<p class="field-error" role="alert">payload[^<]*</p>', page), page[-3000:]


def test_a_task_that_may_not_be_rewound_is_refused_with_the_rule(
    oncall: User, mailer: Mailer
) -> None:
    task = services.enqueue("test.rewind.newsletter", {"topic": "x"}).task
    response = preview(login(oncall), task, "fetch")
    assert response.status_code == 409
    assert "is pending: a rewind starts again a task that succeeded, died or was" in body(response)


# --- confirming ------------------------------------------------------------------------------


def test_confirming_rewinds_the_task_and_records_who_and_why(
    oncall: User, in_doubt: Task, mailer: Mailer
) -> None:
    client = login(oncall)
    token = plan_of(preview(client, in_doubt, "draft"))
    response = confirm(client, in_doubt, token, decided=happened(in_doubt))
    assert response.status_code == 302 and response["Location"] == f"/tasks/{in_doubt.pk}/"

    in_doubt.refresh_from_db()
    assert in_doubt.status == TaskStatus.PENDING
    event = Event.objects.get(task_id=in_doubt.pk, kind=EventKind.REWOUND)
    assert (event.actor, event.actor_user_id) == (oncall.username, oncall.pk)
    assert event.reason == "the subject was wrong"
    assert event.data["decisions"] == {mail_key(in_doubt): "happened"}
    assert event.data["rerun"] == ["draft", "mail", "archive"]
    assert event.data["plan"]
    superseded = Step.objects.filter(task=in_doubt, status="superseded")
    assert sorted(superseded.values_list("kind", flat=True)) == ["archive", "draft", "mail"]

    page = body(client.get(f"/tasks/{in_doubt.pk}/"))
    assert "rewound from draft; draft, mail, archive run again." in page
    assert page.count('class="superseded"') == 3  # the rewound rows, kept as history
    # The mail is not sent again: it happened, and its key says so.
    for kind in ("draft", "mail", "archive"):
        run(in_doubt, kind)
    assert mailer.sent == ["News: spring"]


def test_an_htmx_confirm_answers_with_the_task_region_and_its_notice(
    oncall: User, in_doubt: Task
) -> None:
    client = login(oncall)
    token = plan_of(preview(client, in_doubt, "mail"))
    decision = {f"decision:{mail_key(in_doubt)}": "not_happened"}
    response = confirm(client, in_doubt, token, htmx=True, decided=decision)
    assert response.status_code == 200
    page = body(response)
    assert page.lstrip().startswith('<div id="task"')
    assert "rewound from mail; mail, archive run again." in page
    assert response["HX-Reswap"] == "outerHTML show:#task:top"
    # The started mail was forgotten: the rerun sends it again.
    assert not Effect.objects.filter(step__task=in_doubt).exists()


def test_a_confirm_without_a_decision_is_refused_naming_decisions(
    oncall: User, in_doubt: Task
) -> None:
    client = login(oncall)
    token = plan_of(preview(client, in_doubt, "draft"))
    before = rows()
    response = confirm(client, in_doubt, token, htmx=True)
    assert response.status_code == 400
    page = body(response)
    assert "decisions: say whether each write in doubt happened" in page
    # The preview again, with the reason as typed and the same plan to confirm.
    assert ">Rewind from draft</button>" in page
    assert "the subject was wrong</textarea>" in page
    assert plan_of(response) == token
    assert 'aria-describedby="rewind_decisions_error"' in page
    assert rows() == before

    response = confirm(client, in_doubt, token, decided=happened(in_doubt))
    assert response.status_code == 302


def test_a_confirm_without_a_reason_is_refused_naming_reason(oncall: User, in_doubt: Task) -> None:
    client = login(oncall)
    token = plan_of(preview(client, in_doubt, "draft"))
    before = rows()
    response = confirm(client, in_doubt, token, reason="  ", decided=happened(in_doubt))
    assert response.status_code == 400
    page = body(response)
    assert re.search(r'<p class="field-error" role="alert">reason[^<]*</p>', page)
    # The decision made is kept.
    assert 'value="happened" checked' in page
    assert rows() == before


def test_a_task_changed_since_the_preview_is_refused_with_a_way_to_preview_again(
    oncall: User, in_doubt: Task
) -> None:
    client = login(oncall)
    token = plan_of(preview(client, in_doubt, "draft"))
    # Meanwhile someone resolves the mail and the task finishes: still rewindable, not the
    # task the plan was made of.
    services.resolve(in_doubt, actor="cli:oncall", reason="it went out", outcome="done")
    run(in_doubt, "archive")
    before = rows()
    response = confirm(client, in_doubt, token, htmx=True, decided=happened(in_doubt))
    assert response.status_code == 409
    page = body(response)
    assert "changed since the rewind was previewed: preview it again" in page
    assert ">Preview rewind</button>" in page
    assert rows() == before


def test_a_second_confirm_of_the_same_plan_is_refused_and_changes_nothing(
    oncall: User, in_doubt: Task
) -> None:
    client = login(oncall)
    token = plan_of(preview(client, in_doubt, "draft"))
    assert confirm(client, in_doubt, token, decided=happened(in_doubt)).status_code == 302
    before = rows()
    response = confirm(client, in_doubt, token, htmx=True, decided=happened(in_doubt))
    assert response.status_code == 409
    assert "this rewind was already confirmed and applied" in body(response)
    assert rows() == before
    assert Event.objects.filter(task_id=in_doubt.pk, kind=EventKind.REWOUND).count() == 1


def test_a_forged_expired_or_borrowed_plan_is_refused(
    oncall: User, in_doubt: Task, superuser: User, settings: Any
) -> None:
    client = login(oncall)
    token = plan_of(preview(client, in_doubt, "draft"))
    before = rows()

    forged = confirm(client, in_doubt, token[:-2] + "xx", decided=happened(in_doubt))
    assert forged.status_code == 409
    assert "this form carries no preview of a rewind: preview it" in body(forged)

    borrowed = confirm(login(superuser), in_doubt, token, decided=happened(in_doubt))
    assert borrowed.status_code == 409
    assert "this preview was made by someone else" in body(borrowed)

    settings.CONSOLE_BULK_PLAN_SECONDS = -1
    expired = confirm(client, in_doubt, token, decided=happened(in_doubt))
    assert expired.status_code == 409
    assert "the preview is too old: preview the rewind again" in body(expired)
    assert rows() == before


# --- who may -------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["auditor", "outsider"])
def test_someone_without_the_permission_is_refused_with_nothing_of_the_task(
    request: pytest.FixtureRequest, role: str, oncall: User, in_doubt: Task
) -> None:
    token = plan_of(preview(login(oncall), in_doubt, "draft"))
    client = login(request.getfixturevalue(role))
    before = rows()
    for response in (
        preview(client, in_doubt, "draft"),
        confirm(client, in_doubt, token, decided=happened(in_doubt)),
        confirm(client, in_doubt, token, htmx=True, decided=happened(in_doubt)),
    ):
        assert response.status_code == 403
        page = body(response)
        assert "Not permitted" in page
        shown = ("spring", "test.rewind.newsletter", "<table", "Rewind from", mail_key(in_doubt))
        for content in shown:
            assert content not in page, f"{content!r} shown behind a refusal"
    assert rows() == before


def test_the_timeline_says_what_a_rewind_ran_again_and_what_was_decided(
    db: None, oncall: User, mailer: Mailer
) -> None:
    task = sent_task(mailer, lose_answer=True)
    plan = services.plan_rewind(task, step_of(task, "draft").pk)
    [write] = plan.in_doubt
    services.rewind(
        task, step_id=plan.step_id, actor="cli:oncall", reason="wrong subject",
        fingerprint=plan.fingerprint, decisions={write.key: "happened"},
    )  # fmt: skip
    page = body(login(oncall).get(f"/tasks/{task.pk}/"))
    assert f"runs again: draft, mail, archive; {write.key}: it happened (not sent again)" in page
