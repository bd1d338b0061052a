"""The console's pages: what they show, their filters and pages, partials for htmx, the
security headers, and every value from a payload, a draft or an error shown inert."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db.models import F
from django.http.response import HttpResponseBase
from django.test import Client
from django.utils import timezone

from approvals import services as approvals
from approvals.models import ApprovalRequest
from tasks_app import runner, services
from tasks_app.models import Event, Step, StepStatus, Task, TaskStatus

from .approval_support import advance, article, pending_request
from .console_support import HTMX, dead_task, login, noop

pytestmark = pytest.mark.django_db

HOSTILE = '<script>alert(1)</script><img src=x onerror=alert(2) hx-get="/evil" hx-on:click="x()">'
HOSTILE_URL = "javascript:alert(3)"


def body(response: HttpResponseBase) -> str:
    content: bytes = response.content  # type: ignore[attr-defined]
    return content.decode()


# --- htmx partials and full pages -------------------------------------------------------------

PARTIALS = {
    "/": 'id="overview"',
    "/tasks/": 'id="results"',
    # The filter swaps the list and the bulk form together.
    "/dead/": 'id="dead"',
    "/approvals/": 'id="results"',
    "/queues/": 'id="queues"',
    "/audit/": 'id="results"',
}


@pytest.mark.parametrize(("url", "region"), PARTIALS.items())
def test_htmx_requests_get_the_region_and_plain_ones_the_whole_page(
    url: str, region: str, superuser: User
) -> None:
    client = login(superuser)
    full, partial = client.get(url), client.get(url, headers=HTMX)
    assert full.status_code == partial.status_code == 200
    assert "<html" in body(full) and region in body(full)
    assert "<html" not in body(partial) and region in body(partial)
    assert body(partial).lstrip().startswith("<section")


def test_a_task_page_answers_htmx_with_its_task_region(superuser: User) -> None:
    task = dead_task()
    partial = login(superuser).get(f"/tasks/{task.pk}/", headers=HTMX)
    assert "<html" not in body(partial)
    assert body(partial).lstrip().startswith('<div id="task"')


def test_every_page_sends_a_strict_content_security_policy_with_a_nonce(superuser: User) -> None:
    response = login(superuser).get("/")
    policy = response["Content-Security-Policy"]
    assert "script-src 'self' 'nonce-" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    nonce = re.search(r"'nonce-([^']+)'", policy)
    assert nonce is not None
    # Every script tag carries this response's nonce.
    scripts = re.findall(r"<script[^>]*>", body(response))
    assert scripts and all(f'nonce="{nonce.group(1)}"' in tag for tag in scripts)
    assert "style=" not in body(response)


def test_htmx_sends_the_csrf_token_from_the_body_and_is_served_locally(superuser: User) -> None:
    page = body(login(superuser).get("/"))
    assert re.search(r"""<body hx-headers='\{"X-CSRFToken": "[A-Za-z0-9]{32,}"\}'>""", page)
    assert "/static/django_htmx/htmx-2" in page and "https://" not in page


# --- escaping --------------------------------------------------------------------------------


def test_hostile_payloads_errors_and_keys_are_shown_as_text(superuser: User) -> None:
    task = dead_task(
        {"error": "permanent", "fail_first": 1, "note": HOSTILE, "link": HOSTILE_URL},
        key="hostile:<b>key</b>",
    )
    Step.objects.filter(task=task).update(last_error=HOSTILE, error_class=HOSTILE)
    client = login(superuser)
    for url in (f"/tasks/{task.pk}/", "/dead/", "/tasks/", "/audit/"):
        page = body(client.get(url))
        assert "<script>alert(1)" not in page, url
        assert 'hx-get="/evil"' not in page and "onerror=alert" not in page.replace(
            "onerror=alert(2)", ""
        ).replace("&lt;img src=x onerror=alert(2)", ""), url
        assert 'href="javascript:' not in page, url
    detail = body(client.get(f"/tasks/{task.pk}/"))
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in detail
    assert "hostile:&lt;b&gt;key&lt;/b&gt;" in detail


def test_a_hostile_draft_is_shown_as_text_on_its_review(editor: User, author: User) -> None:
    task = services.enqueue(
        "publish_article",
        {"article_id": "a-1", "title": HOSTILE, "brief": HOSTILE_URL},
        actor=author,
    ).task
    request = pending_request(advance(task))
    page = body(login(editor).get(f"/approvals/{request.pk}/"))
    assert "<script>alert(1)" not in page and 'hx-get="/evil"' not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert 'href="javascript:' not in page


def test_secret_keys_are_redacted_at_any_depth(superuser: User) -> None:
    task = dead_task(
        {
            "error": "permanent",
            "fail_first": 1,
            "password": "hunter2",
            "nested": {"API-Key": "k-123", "list": [{"Authorization": "Bearer abc"}]},
        }
    )
    page = body(login(superuser).get(f"/tasks/{task.pk}/"))
    for secret in ("hunter2", "k-123", "Bearer abc"):
        assert secret not in page
    assert page.count("•••redacted•••") >= 3


def test_errors_and_reasons_quoting_secrets_are_shown_without_them(
    superuser: User, oncall: User
) -> None:
    payload = {"api_token": "tok-5ecret", "nested": [{"Client-Secret": "cs-5ecret"}]}
    task = dead_task({"error": "permanent", "fail_first": 1, **payload})
    quoted = f"tasks_app.exceptions.PermanentError: remote refused {payload!r}"
    Step.objects.filter(task=task).update(
        last_error=f"Traceback (most recent call last):\n{quoted}"
    )
    cancelled = dead_task()
    services.cancel(cancelled, actor=oncall, reason="leaked session_id=sess-5ecret, giving up")
    client = login(superuser)
    for url in (f"/tasks/{task.pk}/", f"/tasks/{cancelled.pk}/", "/dead/", "/audit/"):
        page = body(client.get(url))
        for secret in ("tok-5ecret", "cs-5ecret", "sess-5ecret"):
            assert secret not in page, (url, secret)
    detail = body(client.get(f"/tasks/{task.pk}/"))
    assert "&#x27;api_token&#x27;: •••redacted•••" in detail
    assert "session_id=•••redacted•••, giving up" in body(client.get(f"/tasks/{cancelled.pk}/"))


def test_a_draft_under_review_shows_no_secret(editor: User, author: User) -> None:
    request = pending_request(advance(article(actor=author)))
    ApprovalRequest.objects.filter(pk=request.pk).update(
        draft={"title": "Launch day", "api_token": "tok-5ecret"}
    )
    page = body(login(editor).get(f"/approvals/{request.pk}/"))
    assert "Launch day" in page and "tok-5ecret" not in page
    assert "•••redacted•••" in page


# --- the overview ---------------------------------------------------------------------------


def _stat(page: str, name: str) -> int:
    found = re.search(rf'data-stat="{name}">(\d+)<', page)
    assert found, name
    return int(found.group(1))


def test_the_overview_counts_work_by_state_and_recent_successes(superuser: User) -> None:
    services.enqueue("demo.noop", {"n": 1})
    services.enqueue("demo.noop", {"n": 2})
    dead_task()
    retrying = services.enqueue("demo.flaky", {"fail_first": 1}).task
    runner.run_claimed(retrying.steps.get().pk)  # one claim: it fails, a retry is scheduled
    Step.objects.filter(task=retrying).update(available_at=timezone.now() + timedelta(hours=1))
    done = services.enqueue("demo.noop", {"n": 3}).task
    old = services.enqueue("demo.noop", {"n": 4}).task
    runner.run_task_steps(done)
    runner.run_task_steps(old)
    Task.objects.filter(pk=old.pk).update(finished_at=F("finished_at") - timedelta(hours=3))

    page = body(login(superuser).get("/"))

    assert _stat(page, "pending") == 2
    assert _stat(page, "retry_scheduled") == 1
    assert _stat(page, "dead") == 1
    assert _stat(page, "waiting_approval") == 0
    assert _stat(page, "succeeded_last_hour") == 1
    assert _stat(page, "succeeded_last_day") == 2
    assert "Tasks succeeded per minute, last hour: 1 in all" in page


def test_the_overview_lists_paused_queues_with_who_and_why(superuser: User) -> None:
    services.pause_queue("default", actor=superuser, reason="database failover")
    page = body(login(superuser).get("/"))
    assert "database failover" in page and superuser.username in page


# --- the task list --------------------------------------------------------------------------


def test_the_task_list_filters_by_status_workflow_key_and_payload_field(superuser: User) -> None:
    keep = services.enqueue("demo.noop", {"customer": {"id": 42}}, idempotency_key="k-1").task
    other = services.enqueue("demo.noop", {"customer": {"id": 7}}, idempotency_key="k-2").task
    dead = dead_task()
    client = login(superuser)

    def ids(query: str) -> set[int]:
        page = body(client.get("/tasks/?" + query))
        return {int(pk) for pk in re.findall(r'href="/tasks/(\d+)/"', page)}

    assert ids("status=dead") == {dead.pk}
    assert ids("workflow=demo.flaky") == {dead.pk}
    assert ids("key=k-2") == {other.pk}
    assert ids("payload=customer.id%3D42") == {keep.pk}
    assert ids("payload=customer.id%3D%2242%22") == set()  # the text "42" is not 42
    assert ids("payload=error%3Dpermanent") == {dead.pk}


def test_the_task_list_filters_by_time_and_explains_a_bad_value(superuser: User) -> None:
    old = services.enqueue("demo.noop", {"n": 1}).task
    new = services.enqueue("demo.noop", {"n": 2}).task
    Task.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=2))
    client = login(superuser)
    since = (timezone.now() - timedelta(days=1)).strftime("%Y-%m-%d %H:%M")
    page = body(client.get("/tasks/", {"since": since}))
    assert f'href="/tasks/{new.pk}/"' in page and f'href="/tasks/{old.pk}/"' not in page
    bad = body(client.get("/tasks/", {"since": "yesterday-ish"}))
    assert "Enter a valid date/time" in bad


def test_the_task_list_pages_by_keyset_without_repeating_rows(
    superuser: User, settings: object
) -> None:
    settings.CONSOLE_PAGE_SIZE = 2  # type: ignore[attr-defined]
    tasks = [services.enqueue("demo.noop", {"n": i}).task for i in range(5)]
    client = login(superuser)
    seen: list[int] = []
    url = "/tasks/"
    while url:
        page = body(client.get(url))
        seen += [int(pk) for pk in re.findall(r'<th scope="row"><a href="/tasks/(\d+)/"', page)]
        older = re.search(r'href="(\?after=\d+)" hx-get', page)
        url = "/tasks/" + older.group(1) if older else ""
    assert seen == sorted((task.pk for task in tasks), reverse=True)


# --- task detail ----------------------------------------------------------------------------


def test_a_task_page_shows_steps_leases_lanes_and_the_timeline(oncall: User) -> None:
    task = dead_task()
    page = body(login(oncall).get(f"/tasks/{task.pk}/"))
    assert "tasks_app.exceptions.PermanentError" in page
    assert 'class="seg seg-failed"' in page  # the attempt drawn in its lane
    for kind in ("enqueued", "claimed", "dead lettered"):
        assert f"<strong>{kind}</strong>" in page
    # On-call sees the actions a dead letter allows.
    assert ">Redrive</button>" in page and ">Redrive with changes</button>" in page
    assert ">Cancel task</button>" in page
    # Done by hand, yes; run again without its started calls is for an unknown outcome.
    assert ">Mark done</button>" in page
    assert ">Run again</button>" not in page


def test_an_unknown_outcome_offers_mark_done_and_run_again(oncall: User, auditor: User) -> None:
    task = dead_task({"error": "outcome_unknown", "fail_first": 1})
    page = body(login(oncall).get(f"/tasks/{task.pk}/"))
    assert ">Mark done</button>" in page and ">Run again</button>" in page
    # Not a redrive: it would find the call's started effect and die again without calling.
    assert ">Redrive</button>" not in page
    # Someone without the permissions sees the task and no action.
    assert '<form method="post" action="/tasks/' not in body(
        login(auditor).get(f"/tasks/{task.pk}/")
    )


def test_mark_done_resolves_the_step_with_the_reason(oncall: User) -> None:
    task = dead_task({"error": "outcome_unknown", "fail_first": 1})
    response = login(oncall).post(
        f"/tasks/{task.pk}/resolve/", {"reason": "the mail went out", "outcome": "done"}
    )
    assert response.status_code == 302
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    event = task_events(task)[-1]
    assert (event.kind, event.actor, event.reason) == (
        "resolved",
        oncall.username,
        "the mail went out",
    )


def task_events(task: Task) -> list[Event]:
    return list(Event.objects.for_task(task.pk))


def test_an_action_without_a_reason_is_refused_on_its_field(oncall: User) -> None:
    task = dead_task()
    response = login(oncall).post(f"/tasks/{task.pk}/redrive/", {"reason": "  "}, headers=HTMX)
    assert response.status_code == 400
    assert "reason: " in body(response) and 'class="field invalid"' in body(response)
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD


def test_redrive_with_changes_checks_the_payload_by_the_input_rules(oncall: User) -> None:
    task = dead_task()
    client = login(oncall)
    for bad, message in (
        ("[1]", "payload: must be a JSON object"),
        ("{not json", "payload: not valid JSON"),
        ('{"error": "permanent", "sleep": NaN}', "payload"),
        ('{"a": "\\u0000"}', "payload: $.a contains \\u0000"),
    ):
        response = client.post(
            f"/tasks/{task.pk}/redrive/", {"reason": "try", "payload": bad}, headers=HTMX
        )
        assert response.status_code == 400, bad
        assert message in body(response), bad
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD
    assert task.payload == {"error": "permanent", "fail_first": 1}


def test_redrive_with_changes_keeps_the_secrets_the_editor_never_saw(oncall: User) -> None:
    task = dead_task({"error": "permanent", "fail_first": 1, "token": "t-secret"})
    edited = '{"error": "permanent", "fail_first": 0, "token": "•••redacted•••"}'
    response = login(oncall).post(
        f"/tasks/{task.pk}/redrive/", {"reason": "input fixed", "payload": edited}
    )
    assert response.status_code == 302
    task.refresh_from_db()
    assert task.payload == {"error": "permanent", "fail_first": 0, "token": "t-secret"}


def test_an_action_that_no_longer_applies_answers_409_with_the_reason(oncall: User) -> None:
    task = services.enqueue("demo.noop", {}).task
    response = login(oncall).post(f"/tasks/{task.pk}/redrive/", {"reason": "x"}, headers=HTMX)
    assert response.status_code == 409
    assert "no dead step to redrive" in body(response)


def test_a_plain_post_redirects_to_the_task_with_a_message(oncall: User) -> None:
    task = dead_task()
    client = login(oncall)
    response = client.post(f"/tasks/{task.pk}/cancel/", {"reason": "not needed"}, follow=True)
    assert response.redirect_chain == [(f"/tasks/{task.pk}/", 302)]
    assert f"Task #{task.pk}: cancel requested." in body(response)


# --- CSRF -----------------------------------------------------------------------------------


def test_a_post_without_the_csrf_token_is_refused_and_changes_nothing(oncall: User) -> None:
    task = dead_task()
    client = login(oncall, enforce_csrf_checks=True)
    response = client.post(f"/tasks/{task.pk}/cancel/", {"reason": "x"})
    assert response.status_code == 403
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD

    page = body(client.get(f"/tasks/{task.pk}/"))
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token is not None
    response = client.post(
        f"/tasks/{task.pk}/cancel/", {"reason": "x", "csrfmiddlewaretoken": token.group(1)}
    )
    assert response.status_code == 302
    task.refresh_from_db()
    assert task.status == TaskStatus.CANCELLED


def test_htmx_posts_carry_the_token_in_a_header(oncall: User) -> None:
    task = dead_task()
    client = login(oncall, enforce_csrf_checks=True)
    client.get(f"/tasks/{task.pk}/")
    response = client.post(
        f"/tasks/{task.pk}/cancel/",
        {"reason": "x"},
        headers={**HTMX, "X-CSRFToken": client.cookies["csrftoken"].value},
    )
    assert response.status_code == 200
    assert "cancel requested" in body(response)


# --- dead letters and bulk actions ------------------------------------------------------------


def test_dead_letters_show_class_message_attempts_and_filter_by_error_class(oncall: User) -> None:
    permanent = dead_task()
    unknown = dead_task({"error": "outcome_unknown", "fail_first": 1})
    client = login(oncall)
    page = body(client.get("/dead/"))
    assert "tasks_app.exceptions.PermanentError" in page
    assert "tasks_app.exceptions.OutcomeUnknown" in page
    assert "1 / 3" in page
    only = body(client.get("/dead/", {"error_class": "tasks_app.exceptions.OutcomeUnknown"}))
    assert f'href="/tasks/{unknown.pk}/"' in only
    assert f'href="/tasks/{permanent.pk}/"' not in only


def _bulk(client: Client, **fields: str) -> HttpResponseBase:
    data = {"action": "redrive", "reason": "remote fixed", **fields}
    return client.post("/dead/bulk/", data, headers=HTMX)


PLAN = re.compile(r'name="plan" value="([^"]+)"')


def _plan(response: HttpResponseBase) -> str:
    found = PLAN.search(body(response))
    assert found, body(response)[:2000]
    return found.group(1)


def _confirm(client: Client, **fields: str) -> HttpResponseBase:
    """Preview, then confirm the plan the preview made, as the page's two buttons do."""
    preview = _bulk(client, **fields)
    assert preview.status_code == 200, body(preview)[:2000]
    return _bulk(client, **fields, confirm="1", plan=_plan(preview))


def test_a_bulk_action_without_confirm_previews_the_count_and_changes_nothing(
    oncall: User,
) -> None:
    permanent = [dead_task() for _ in range(3)]
    unknown = dead_task({"error": "outcome_unknown", "fail_first": 1})
    client = login(oncall)
    response = _bulk(client, error_class="tasks_app.exceptions.PermanentError")
    assert response.status_code == 200
    page = body(response)
    assert "<strong>Plan: Redrive 3 tasks</strong>" in page
    assert all(f">#{task.pk}</a>" in page for task in permanent)
    assert f">#{unknown.pk}</a>" not in page
    assert ">Redrive 3 tasks</button>" in page
    assert Task.objects.filter(status=TaskStatus.DEAD).count() == 4
    assert not task_events_of_kind("redriven")


@pytest.mark.parametrize("value", ["0", "no", "off", "n", "null", "true", "yes", "on", " 1"])
def test_only_confirm_1_applies_a_bulk_action(oncall: User, value: str) -> None:
    task = dead_task()
    client = login(oncall)
    plan = _plan(_bulk(client, action="cancel"))

    response = _bulk(client, action="cancel", confirm=value, plan=plan)

    assert response.status_code == 200
    assert "Nothing has changed yet" in body(response)
    assert Task.objects.get(pk=task.pk).status == TaskStatus.DEAD
    assert not task_events_of_kind("cancelled")


def test_a_confirm_without_a_preview_changes_nothing(oncall: User) -> None:
    task = dead_task()

    response = _bulk(login(oncall), action="cancel", confirm="1")

    assert response.status_code == 409
    assert "Nothing changed: confirm a preview" in body(response)
    assert Task.objects.get(pk=task.pk).status == TaskStatus.DEAD


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"action": "cancel"}, "the action changed from Redrive to Cancel task"),
        ({"workflow": "demo.noop"}, "the filter changed"),
        ({"error_class": "tasks_app.exceptions.OutcomeUnknown"}, "the filter changed"),
        ({"limit": "2"}, "the limit changed from 1000 to 2"),
    ],
)
def test_a_change_after_the_preview_needs_a_new_preview(
    oncall: User, change: dict[str, str], reason: str
) -> None:
    tasks = [dead_task() for _ in range(3)]
    client = login(oncall)
    plan = _plan(_bulk(client))

    response = _bulk(client, **change, confirm="1", plan=plan)

    assert response.status_code == 409
    assert f"Nothing changed: {reason} since the preview. Preview again." in body(response)
    assert ">Preview</button>" in body(response)
    assert {Task.objects.get(pk=t.pk).status for t in tasks} == {TaskStatus.DEAD}
    assert not Event.objects.filter(kind__in=["redriven", "cancelled"]).exists()


def test_a_plan_is_its_previewers_and_cannot_be_forged(oncall: User, superuser: User) -> None:
    task = dead_task()
    plan = _plan(_bulk(login(oncall), action="cancel"))
    other = _bulk(login(superuser), action="cancel", confirm="1", plan=plan)
    assert other.status_code == 409
    assert "made by someone else" in body(other)
    forged = _bulk(login(oncall), action="cancel", confirm="1", plan=plan[:-2] + "xx")
    assert forged.status_code == 409
    assert Task.objects.get(pk=task.pk).status == TaskStatus.DEAD


def test_a_confirm_applies_the_plan_and_nothing_else(oncall: User) -> None:
    planned = [dead_task() for _ in range(3)]
    client = login(oncall)
    plan = _plan(_bulk(client, action="cancel"))
    # Meanwhile one planned task is redriven by someone else, and a new one dies.
    services.redrive(planned[1], actor="cli:someone", reason="fixed")
    newcomer = dead_task()

    response = _bulk(client, action="cancel", confirm="1", plan=plan)

    assert response.status_code == 200
    page = body(response)
    assert "2 tasks changed, 1 skipped" in page
    assert f"#{planned[1].pk}</a>: task #{planned[1].pk} is no longer a dead letter" in page
    statuses = {t.pk: Task.objects.get(pk=t.pk).status for t in [*planned, newcomer]}
    assert statuses == {
        planned[0].pk: TaskStatus.CANCELLED,
        planned[1].pk: TaskStatus.PENDING,
        planned[2].pk: TaskStatus.CANCELLED,
        newcomer.pk: TaskStatus.DEAD,
    }
    cancelled = task_events_of_kind("cancelled")
    assert len({event.data["plan"] for event in cancelled}) == 1
    assert f"?plan={cancelled[0].data['plan']}" in page


def test_a_bulk_redrive_skips_a_step_whose_outcome_is_unknown(oncall: User) -> None:
    unknown = dead_task({"error": "outcome_unknown", "fail_first": 1})

    response = _confirm(login(oncall), action="redrive")

    assert "0 tasks changed, 1 skipped" in body(response)
    assert "unknown outcome" in body(response)
    assert Task.objects.get(pk=unknown.pk).status == TaskStatus.DEAD


def test_filtering_dead_letters_swaps_the_bulk_form_with_the_list(oncall: User) -> None:
    dead_task()
    error_class = "tasks_app.exceptions.PermanentError"

    response = login(oncall).get("/dead/", {"error_class": error_class}, headers=HTMX)

    page = body(response)
    assert page.lstrip().startswith('<section id="dead">')
    assert f'<input type="hidden" name="error_class" value="{error_class}">' in page
    assert f"error class {error_class}." in page


@pytest.mark.parametrize(
    "query",
    [
        {"workflow": "no.such"},
        {"queue": "nowhere"},
        {"after": "-3"},
    ],
)
def test_a_bad_dead_letter_filter_is_refused_not_widened(
    oncall: User, query: dict[str, str]
) -> None:
    dead_task()
    response = login(oncall).get("/dead/", query)
    assert response.status_code == 400
    assert "The filter cannot be used" in body(response)
    assert "<table" not in body(response)


def task_events_of_kind(kind: str) -> list[Event]:
    return list(Event.objects.filter(kind=kind))


def test_a_confirmed_bulk_action_changes_up_to_the_limit_with_one_event_each(
    oncall: User,
) -> None:
    tasks = [dead_task() for _ in range(3)]
    response = _confirm(login(oncall), limit="2")
    assert response.status_code == 200
    assert "2 tasks changed" in body(response)
    assert "More tasks matched than the limit" in body(response)
    redriven = task_events_of_kind("redriven")
    assert sorted(event.task_id or 0 for event in redriven) == [tasks[0].pk, tasks[1].pk]
    assert {(event.actor, event.reason) for event in redriven} == {
        (oncall.username, "remote fixed")
    }
    assert Step.objects.get(task=tasks[2]).status == StepStatus.DEAD
    assert json.loads(response["HX-Trigger"]) == {"deadChanged": {}}


def test_a_bulk_action_needs_a_reason_and_a_limit_within_the_setting(
    oncall: User, settings: object
) -> None:
    settings.CONSOLE_BULK_LIMIT = 5  # type: ignore[attr-defined]
    dead_task()
    client = login(oncall)
    no_reason = _confirm(client, reason="")
    assert no_reason.status_code == 400 and "reason: " in body(no_reason)
    too_many = _bulk(client, limit="6")
    assert too_many.status_code == 400 and "limit: at most 5 tasks" in body(too_many)
    assert not task_events_of_kind("redriven")


def test_bulk_actions_each_apply_their_service(oncall: User) -> None:
    unknown = [dead_task({"error": "outcome_unknown", "fail_first": 1}) for _ in range(2)]
    client = login(oncall)
    _confirm(client, action="resolve_done", reason="checked: sent")
    assert {t.status for t in Task.objects.filter(pk__in=[t.pk for t in unknown])} == {
        TaskStatus.SUCCEEDED
    }
    cancel = dead_task()
    _confirm(client, action="cancel", reason="obsolete")
    cancel.refresh_from_db()
    assert cancel.status == TaskStatus.CANCELLED


def test_a_plain_bulk_post_redirects_to_the_filtered_list_with_a_summary(oncall: User) -> None:
    dead_task()
    client = login(oncall)
    data = {"action": "cancel", "reason": "x", "workflow": "demo.flaky"}
    preview = client.post("/dead/bulk/", data)
    assert "<html" in body(preview)  # the whole page, with the plan
    response = client.post(
        "/dead/bulk/", {**data, "confirm": "1", "plan": _plan(preview)}, follow=True
    )
    assert response.redirect_chain == [("/dead/?workflow=demo.flaky", 302)]
    assert "Cancel task: 1 task(s) changed." in body(response)


# --- approvals ------------------------------------------------------------------------------


def test_the_approvals_list_shows_what_the_viewer_may_decide_oldest_first(
    editor: User, author: User
) -> None:
    first = pending_request(advance(article(actor=author, key="publish:a:1")))
    second = pending_request(advance(article(actor=author, key="publish:a:2")))
    page = body(login(editor).get("/approvals/"))
    assert page.index(f"Review #{first.pk}") < page.index(f"Review #{second.pk}")
    # The author may not decide their own tasks: nothing waits for them.
    assert "Nothing is waiting for you." in body(login(author).get("/approvals/"))


def test_a_decision_with_a_stale_draft_hash_is_refused_and_says_so(
    editor: User, author: User
) -> None:
    request = pending_request(advance(article(actor=author)))
    response = login(editor).post(
        f"/approvals/{request.pk}/decide/",
        {"decision": "approve", "comment": "", "draft_hash": "0" * 64},
        headers=HTMX,
    )
    assert response.status_code == 409
    assert "is not the draft under review" in body(response)
    request.refresh_from_db()
    assert request.status == "pending"


def test_reject_needs_a_comment(editor: User, author: User) -> None:
    request = pending_request(advance(article(actor=author)))
    response = login(editor).post(
        f"/approvals/{request.pk}/decide/",
        {"decision": "reject", "comment": "", "draft_hash": request.draft_hash},
        headers=HTMX,
    )
    assert response.status_code == 400
    assert "comment: " in body(response)


def test_the_review_shows_the_new_revision_with_its_word_diff_and_earlier_comments(
    editor: User, author: User
) -> None:
    task = advance(article(actor=author))
    first = pending_request(task)
    response = login(editor).post(
        f"/approvals/{first.pk}/decide/",
        {
            "decision": "request_changes",
            "comment": "mention the date",
            "draft_hash": first.draft_hash,
        },
    )
    assert response.status_code == 302
    second = pending_request(advance(task))
    assert second.revision == 1
    page = body(login(editor).get(f"/approvals/{second.pk}/"))
    assert "What changed since revision 0" in page
    assert re.search(r"<ins>[^<]*mention the date[^<]*</ins>", page)
    assert f"Revision 0: {editor.username} asked for changes" in page and "mention the date" in page
    assert "Publishes article article-001" in page  # what an approval lets happen
    assert "next step: publish" in page


def test_approving_in_the_browser_form_lets_the_task_go_on(editor: User, author: User) -> None:
    task = advance(article(actor=author))
    request = pending_request(task)
    response = login(editor).post(
        f"/approvals/{request.pk}/decide/",
        {"decision": "approve", "comment": "", "draft_hash": request.draft_hash},
        headers=HTMX,
    )
    assert response.status_code == 200
    assert f"Approval #{request.pk} approved." in body(response)
    request.refresh_from_db()
    assert (request.status, request.decided_by) == ("approved", editor.username)


def test_a_decided_request_shows_who_decided_instead_of_the_form(
    editor: User, other_editor: User, author: User
) -> None:
    request = pending_request(advance(article(actor=author)))
    approvals.approve(request, actor=other_editor, draft_hash=request.draft_hash)
    page = body(login(editor).get(f"/approvals/{request.pk}/"))
    assert f"by {other_editor.username}" in page
    assert ">Approve</button>" not in page


# --- queues ---------------------------------------------------------------------------------


def test_queues_show_depth_and_pause_and_resume_with_a_reason(oncall: User) -> None:
    services.enqueue("demo.noop", {})
    client = login(oncall)
    page = body(client.get("/queues/"))
    assert re.search(r"<th scope=\"row\"><a [^>]+>default</a></th>\s*<td>.*running", page)
    response = client.post("/queues/default/pause/", {"reason": "failover"}, headers=HTMX)
    assert response.status_code == 200 and "paused" in body(response)
    assert "failover" in body(response)
    assert ">Resume</button>" in body(response)
    unknown = client.post("/queues/nope/pause/", {"reason": "x"}, headers=HTMX)
    assert unknown.status_code == 400 and "Queue nope" in body(unknown)


# --- the audit log --------------------------------------------------------------------------


def test_the_audit_log_filters_and_exports_the_same_rows_as_csv(
    auditor: User, oncall: User
) -> None:
    task = dead_task()
    services.redrive(task, actor=oncall, reason="remote fixed")
    services.pause_queue("default", actor=oncall, reason="incident 7")
    client = login(auditor)
    page = body(client.get("/audit/", {"actor": oncall.username}))
    assert "remote fixed" in page and "incident 7" in page
    assert "cli:producer" not in page
    only_pauses = body(client.get("/audit/", {"kind": "queue_paused"}))
    assert "incident 7" in only_pauses and "remote fixed" not in only_pauses

    rows = export_rows(client, actor=oncall.username)
    assert rows[0][:4] == ["id", "created_at", "kind", "actor"]
    assert [row[2] for row in rows[1:]] == ["queue_paused", "redriven"]
    assert all(row[3] == oncall.username for row in rows[1:])


def export_rows(client: Client, **filters: str) -> list[list[str]]:
    """The export's header and event rows; its last row, the audit chain's head, is
    checked and left out."""
    export = client.get("/audit/export.csv", filters)
    assert export.status_code == 200 and export["Content-Type"].startswith("text/csv")
    content = b"".join(export.streaming_content)  # type: ignore[attr-defined]
    *rows, head = csv.reader(io.StringIO(content.decode()))
    assert head[0].startswith("# chain head: ") and len(head) == len(rows[0])
    return rows


SECRETS = {"password": "hunter2", "api_token": "abc", "nested": [{"Client-Secret": "x"}]}


def test_the_audit_export_keeps_the_secrets_of_a_redrive_with_changes_hidden(
    auditor: User, oncall: User
) -> None:
    task = dead_task({"error": "permanent", "fail_first": 1, **SECRETS})
    services.redrive(
        task,
        actor=oncall,
        reason="input fixed, password=hunter2",
        payload={"error": "permanent", "fail_first": 0, **SECRETS, "api_token": "abc-new"},
    )
    rows = export_rows(login(auditor))
    [redriven] = [row for row in rows if row[2] == "redriven"]
    data = json.loads(redriven[7])
    assert data["old_payload"]["password"] == "•••redacted•••"
    assert data["new_payload"]["nested"] == [{"Client-Secret": "•••redacted•••"}]
    assert redriven[6] == "input fixed, password=•••redacted•••"
    # Every cell but the chain hash, whose hex digits may spell "abc" by chance.
    exported = "\n".join(",".join(row[: rows[0].index("chain_hash")]) for row in rows)
    for secret in ("hunter2", "abc", "abc-new", '"x"'):
        assert secret not in exported, secret


def test_the_audit_export_shows_the_lease_tokens_of_the_systems_own_events(
    auditor: User,
) -> None:
    task = dead_task({"error": "permanent", "fail_first": 1, "token": "producer-token"})
    rows = export_rows(login(auditor), kind="claimed")
    [claimed] = [json.loads(row[7]) for row in rows if row[4] == str(task.pk)]
    assert claimed["token"] == Step.objects.get(task=task).fencing_token == 1
    assert "producer-token" not in str(rows)


FORMULAS = ['=HYPERLINK("http://x")', "+1", "-1", "@SUM(A1)", "\t=1", "\r=1"]


def test_no_cell_of_the_audit_export_is_a_formula(auditor: User) -> None:
    mallory = User.objects.create_user("@mallory", password="pw")
    mallory.groups.add(Group.objects.get(name="oncall"))
    services.pause_queue("default", actor=mallory, reason=FORMULAS[0])
    for reason in FORMULAS[1:]:  # written as they are: the services strip a reason
        Event.objects.create(kind="queue_resumed", actor="-cli:x", reason=reason, data={})
    rows = export_rows(login(auditor))[1:]
    assert sorted(row[6] for row in rows) == sorted("'" + reason for reason in FORMULAS)
    assert {row[3] for row in rows} == {"'@mallory", "'-cli:x"}
    assert not [cell for row in rows for cell in row if cell[:1] in ("=", "+", "-", "@")]


BAD_AUDIT_FILTERS = [
    ({"since": "not-a-date"}, "since: a date and time, such as 2026-11-30"),
    ({"until": "2026-13-45"}, "until: a date and time"),
    ({"since": "2026-11-30", "until": "2026-11-29"}, "until: must be later than since"),
    ({"kind": "bogus"}, "kind: 'bogus' is not an event kind"),
    ({"workflow": "no.such"}, "workflow: 'no.such' is not a registered workflow"),
    ({"actor": "a" * 151}, "actor: at most 150 characters"),
    ({"after": "0"}, "after: a whole number from 1"),
    ({"task": "seven"}, "task: a task id, a whole number"),
    ({"task": "0"}, "task: a task id, a whole number from 1"),
]


@pytest.mark.parametrize(("query", "message"), BAD_AUDIT_FILTERS)
def test_a_bad_audit_filter_is_refused_naming_the_field_and_never_widens_the_export(
    auditor: User, oncall: User, query: dict[str, str], message: str
) -> None:
    services.pause_queue("default", actor=oncall, reason="incident 9")
    client = login(auditor)
    export = client.get("/audit/export.csv", query)
    assert export.status_code == 400
    assert export["Content-Type"].startswith("text/plain")
    assert message in export.content.decode() and "incident 9" not in export.content.decode()

    page = client.get("/audit/", query)
    assert page.status_code == 400
    assert message in body(page).replace("&#x27;", "'")
    assert 'class="notice error"' in body(page) and "incident 9" not in body(page)
    partial = client.get("/audit/", query, headers=HTMX)
    assert partial.status_code == 400
    assert message in body(partial).replace("&#x27;", "'")
    assert body(partial).lstrip().startswith('<section id="results"')


def test_a_bad_date_on_the_audit_page_is_shown_on_its_field(auditor: User) -> None:
    page = body(login(auditor).get("/audit/", {"since": "not-a-date"}))
    field = page.split('<label for="id_since">')[0].rsplit('<div class="field', 1)[1]
    assert field.startswith(" invalid")
    assert 'class="field-error" role="alert">since: a date and time' in page


def test_the_audit_log_filters_by_workflow(auditor: User) -> None:
    dead = dead_task()
    services.enqueue("demo.noop", {})
    page = body(login(auditor).get("/audit/", {"workflow": "demo.flaky"}))
    assert f'href="/tasks/{dead.pk}/"' in page
    assert "demo.noop" not in page.split('id="results"')[1]


def test_the_audit_log_filters_by_task_and_by_an_actor_prefix_in_any_case(
    auditor: User, oncall: User
) -> None:
    redriven, cancelled = dead_task(), noop()
    services.redrive(redriven, actor=oncall, reason="remote fixed")
    services.cancel(cancelled, actor="cli:alice", reason="not needed")
    client = login(auditor)

    one_task = body(client.get("/audit/", {"task": str(redriven.pk)})).split('id="results"')[1]
    assert "remote fixed" in one_task and "not needed" not in one_task
    assert "cli:producer" in one_task  # the task's own events too: enqueued, claimed, …

    prefix = body(client.get("/audit/", {"actor": oncall.username[:4].upper()}))
    results = prefix.split('id="results"')[1]
    assert "remote fixed" in results and "not needed" not in results
    # Operator actions only, unless an action is chosen: the workers' events are found by
    # theirs.
    assert "cli:producer" not in results
    by_cli = body(client.get("/audit/", {"actor": "CLI:", "kind": "enqueued"}))
    assert f">#{redriven.pk}</a>" in by_cli and f">#{cancelled.pk}</a>" in by_cli
    assert "not needed" not in by_cli.split('id="results"')[1]


def test_the_audit_log_names_each_action_by_its_label(auditor: User, oncall: User) -> None:
    task = dead_task()
    services.resolve(task, actor=oncall, reason="sent by hand", outcome="done")
    services.pause_queue("default", actor=oncall, reason="incident 7")
    page = body(login(auditor).get("/audit/"))

    assert '<option value="resolved">Marked resolved</option>' in page
    assert '<option value="queue_paused">Queue paused</option>' in page
    results = page.split('id="results"')[1]
    assert '<span data-kind="resolved">Marked resolved</span>' in results
    assert '<span data-kind="queue_paused">Queue paused</span>' in results
    assert '<span data-kind="dead_lettered">Dead-lettered</span>' in results


def test_the_audit_export_adds_label_workflow_plan_and_chain_hash_at_the_end(
    auditor: User, oncall: User
) -> None:
    bulk = [dead_task() for _ in range(2)]
    _confirm(login(oncall), action="cancel", reason="incident 7", workflow="demo.flaky")
    plan = Event.objects.filter(task_id=bulk[0].pk, kind="cancelled").get().data["plan"]

    header, *rows = export_rows(login(auditor), plan=plan)

    assert header == [
        "id", "created_at", "kind", "actor", "task_id", "step_id", "reason", "data",
        "label", "workflow", "bulk_plan_id", "chain_hash",
    ]  # fmt: skip
    assert {row[4] for row in rows} == {str(task.pk) for task in bulk}
    for row in rows:
        event = Event.objects.get(pk=row[0])
        assert row[8:] == ["Cancelled", "demo.flaky", plan, event.chain_hash]


# --- login ----------------------------------------------------------------------------------


def test_the_login_page_logs_in_and_goes_to_the_overview(oncall: User) -> None:
    client = Client()
    response = client.post(
        "/accounts/login/",
        {"username": oncall.username, "password": "pw-" + oncall.username},
        follow=True,
    )
    assert response.redirect_chain[-1] == ("/", 302)
    assert 'data-stat="pending"' in body(response)


def test_a_refused_page_says_so_in_the_console_and_offers_a_logout(outsider: User) -> None:
    response = login(outsider).get("/")
    assert response.status_code == 403
    page = body(response)
    assert "<h1>Not permitted</h1>" in page
    assert 'action="/accounts/logout/"' in page
    assert ">Overview</a>" not in page  # the nav shows only what the viewer may use


def test_the_audit_log_shows_one_bulk_action_by_its_plan(oncall: User, auditor: User) -> None:
    bulk = [dead_task() for _ in range(2)]
    alone = dead_task()
    services.cancel(alone, actor=oncall, reason="by hand")
    _confirm(login(oncall), action="cancel", reason="incident 7", workflow="demo.flaky")
    plan = Event.objects.filter(task_id=bulk[0].pk, kind="cancelled").get().data["plan"]

    page = body(login(auditor).get("/audit/", {"plan": plan}))

    assert all(f">#{task.pk}</a>" in page for task in bulk)
    assert f">#{alone.pk}</a>" not in page
    assert page.count(f'href="/audit/?plan={plan}"') == 2  # each row links to its bulk action
    refused = login(auditor).get("/audit/", {"plan": "not-hex"})
    assert refused.status_code == 400


@pytest.mark.parametrize(("status", "live"), [("pending", True), ("dead", False)])
def test_a_task_page_refreshes_itself_while_its_task_is_at_work(
    oncall: User, status: str, live: bool
) -> None:
    task = noop() if status == "pending" else dead_task()
    page = body(login(oncall).get(f"/tasks/{task.pk}/"))
    polls = f'hx-get="/tasks/{task.pk}/" hx-trigger="every 3s, refresh"' in page
    assert polls == live


def test_pages_load_htmx_without_the_debug_script_that_replaces_the_document(
    oncall: User, settings: Any
) -> None:
    settings.DEBUG = True
    page = body(login(oncall).get("/dead/"))
    assert "htmx-2.min.js" in page
    assert "django-htmx.js" not in page


@pytest.mark.parametrize(
    "payload",
    [
        'a="\\u0000"',
        'a="\\ud800"',
        "a=NaN",
        "a=Infinity",
        "a=-Infinity",
        "a=1e400",
        "a=" + "[" * 10_000,
    ],
)
def test_a_task_filter_postgresql_cannot_compare_is_refused_with_400(
    oncall: User, payload: str
) -> None:
    noop()
    response = login(oncall).get("/tasks/", {"payload": payload})
    assert response.status_code == 400
    assert "The filter cannot be used: payload: " in body(response)
    assert "<table" not in body(response)


@pytest.mark.parametrize("query", [{"since": "not-a-date"}, {"status": "lost"}, {"after": "x"}])
def test_a_bad_task_filter_is_refused_not_widened(oncall: User, query: dict[str, str]) -> None:
    noop()
    response = login(oncall).get("/tasks/", query)
    assert response.status_code == 400
    assert "<table" not in body(response)


def test_a_payload_nested_ten_thousand_deep_is_a_form_error(oncall: User) -> None:
    task = dead_task()
    response = login(oncall).post(
        f"/tasks/{task.pk}/redrive/",
        {"reason": "try", "payload": '{"a": ' * 10_000 + "1" + "}" * 10_000},
        headers=HTMX,
    )
    assert response.status_code == 400
    assert "payload: nesting deeper than 32 levels" in body(response)
    assert Task.objects.get(pk=task.pk).status == TaskStatus.DEAD


def test_a_refused_write_is_logged_with_who_what_and_why(
    editor: User, caplog: pytest.LogCaptureFixture
) -> None:
    task = dead_task()
    with caplog.at_level("WARNING", logger="tasks_app.events"):
        response = login(editor).post(f"/tasks/{task.pk}/cancel/", {"reason": "mine"})
    assert response.status_code == 403
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("action_")]
    assert line.startswith("action_refused ")
    assert f"user={editor.username}" in line
    assert "action=console:task_cancel" in line
    assert f"object=/tasks/{task.pk}/cancel/" in line
