"""The admin: staff read everything, enqueue through ``services.enqueue`` and run the
operator actions through the services; nothing there changes a status or deletes history."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from approvals.models import ApprovalRequest, ApprovalStatus
from tasks_app import services
from tasks_app.engine import runner
from tasks_app.history import timeline
from tasks_app.integrations.admin import TaskAdmin
from tasks_app.models import Counter, Event, EventKind, Step, StepStatus, Task, TaskStatus
from tests.admin_support import ADD_URL, enqueue_form, form_errors, staff_client
from tests.approval_support import ARTICLE, advance, article, pending_request
from tests.conftest import only_step
from tests.factories import dead_task

if TYPE_CHECKING:
    # What the test client answers: a response with the context it rendered.
    from django.test.client import _MonkeyPatchedWSGIResponse as Response

CHANGELIST_URL = "admin:tasks_app_task_changelist"


@pytest.fixture
def admin_client_logged_in(superuser: User) -> Client:
    return staff_client(superuser)


def change_url(task: Task) -> str:
    return reverse("admin:tasks_app_task_change", args=[task.pk])


def page_messages(client: Client, response: Response) -> list[str]:
    """The messages the page a redirect leads to shows."""
    assert response.status_code == 302, response.status_code
    return [str(m) for m in client.get(response["Location"]).context["messages"]]


@pytest.mark.django_db
def test_a_task_page_shows_steps_leases_and_the_timeline_escaped(
    admin_client_logged_in: Client,
) -> None:
    task = services.enqueue("demo.flaky", {"note": "<script>alert(1)</script>"}).task
    runner.run_claimed(only_step(task).pk)
    response = admin_client_logged_in.get(reverse("admin:tasks_app_task_change", args=[task.pk]))
    body = response.content.decode()
    assert response.status_code == 200
    assert "flaky" in body
    assert "claimed" in body and "succeeded" in body  # the event timeline
    assert "worker:" in body  # the lease table names the worker
    assert "<script>alert(1)</script>" not in body
    assert "&lt;script&gt;" in body


@pytest.mark.django_db
def test_the_oncall_group_may_view_tasks_in_the_admin(oncall: User) -> None:
    oncall.is_staff = True
    oncall.save()
    task = services.enqueue("demo.noop", {}).task
    client = Client()
    client.force_login(oncall)
    assert client.get(reverse("admin:tasks_app_task_changelist")).status_code == 200
    assert client.get(reverse("admin:tasks_app_task_change", args=[task.pk])).status_code == 200


# --- enqueue through the add form --------------------------------------------------------------


@pytest.mark.django_db
def test_the_add_form_offers_each_workflow_with_its_description_and_payload_rules(
    admin_client_logged_in: Client,
) -> None:
    response = admin_client_logged_in.get(reverse(ADD_URL))
    body = response.content.decode()
    assert response.status_code == 200
    assert "publish_article — Draft an article, have an editor approve it" in body
    assert "payload.title: a non-empty string is required" in body
    assert "ticket_id" in body and "demo.flaky" in body
    assert 'value="Enqueue"' in body


@pytest.mark.django_db
def test_a_superuser_enqueues_a_task_through_the_add_form(
    admin_client_logged_in: Client, superuser: User
) -> None:
    response = admin_client_logged_in.post(
        reverse(ADD_URL),
        enqueue_form(
            idempotency_key="publish:a-1:v1",
            priority="7",
            run_after_0="2031-01-02",
            run_after_1="03:04:05",
            # Not a field of the form: a status is never written from the admin.
            status="succeeded",
        ),
    )
    task = Task.objects.get()
    assert response.status_code == 302
    assert response["Location"] == change_url(task)
    assert task.created_by_user == superuser
    assert task.created_by == superuser.username
    assert task.status == TaskStatus.PENDING
    assert (task.workflow, task.idempotency_key, task.priority) == (
        "publish_article",
        "publish:a-1:v1",
        7,
    )
    assert task.payload == {"article_id": "a-1", "title": "Launch", "brief": "Why."}
    first = task.steps.get(position=0)
    assert first.available_at == datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)
    [event] = timeline.history(task.pk)
    assert event.kind == EventKind.ENQUEUED
    assert (event.actor, event.actor_user_id) == (superuser.username, superuser.pk)
    assert any(f"task #{task.pk}" in m for m in page_messages(admin_client_logged_in, response))


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("payload", "words"),
    [
        ('{"article_id": "a-1", "brief": "Why."}', "payload.title"),
        ('{"article_id": "a-1", "title": "T", "brief": "B", "extra": 1}', "payload.extra"),
        ('{"article_id": ', "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"article_id": NaN}', "NaN"),
    ],
)
def test_a_broken_payload_rule_is_an_error_on_the_payload_and_nothing_is_stored(
    admin_client_logged_in: Client, payload: str, words: str
) -> None:
    response = admin_client_logged_in.post(reverse(ADD_URL), enqueue_form(payload=payload))
    assert response.status_code == 200
    errors = form_errors(response)
    assert list(errors) == ["payload"]
    assert words in errors["payload"][0]
    assert not Task.objects.exists()
    assert not Event.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"idempotency_key": "task-7"}, "idempotency_key"),
        ({"idempotency_key": "with space"}, "idempotency_key"),
        ({"priority": "101"}, "priority"),
        ({"queue": "nowhere"}, "queue"),
        ({"workflow": "no.such.workflow"}, "workflow"),
    ],
)
def test_a_broken_input_rule_is_an_error_on_its_field_and_nothing_is_stored(
    admin_client_logged_in: Client, fields: dict[str, str], field: str
) -> None:
    response = admin_client_logged_in.post(reverse(ADD_URL), enqueue_form(**fields))
    assert response.status_code == 200
    assert list(form_errors(response)) == [field]
    assert not Task.objects.exists()
    assert not Event.objects.exists()


@pytest.mark.django_db
def test_a_conflicting_key_is_an_error_on_the_key_naming_the_task_holding_it(
    admin_client_logged_in: Client,
) -> None:
    holder = article(key="publish:a-1:v1")
    events = Event.objects.count()
    response = admin_client_logged_in.post(
        reverse(ADD_URL),
        enqueue_form(idempotency_key="publish:a-1:v1"),  # the same key, another payload
    )
    assert response.status_code == 200
    errors = form_errors(response)
    assert list(errors) == ["idempotency_key"]
    assert f"task #{holder.pk}" in errors["idempotency_key"][0]
    assert f'href="{change_url(holder)}"' in response.content.decode()
    assert list(Task.objects.all()) == [holder]
    assert Event.objects.count() == events
    assert Counter.objects.get(name="idempotency_conflict").value == 1


@pytest.mark.django_db
def test_a_repeat_leads_to_the_existing_task_and_creates_nothing(
    admin_client_logged_in: Client,
) -> None:
    existing = services.enqueue(
        "publish_article", ARTICLE, idempotency_key="publish:article-001:v1"
    ).task
    events = Event.objects.count()
    response = admin_client_logged_in.post(
        reverse(ADD_URL),
        enqueue_form(
            idempotency_key="publish:article-001:v1",
            # The same payload written differently: its canonical form is the same.
            payload='{"title": "Launch day", "brief": "What ships and why.", '
            '"article_id": "article-001"}',
        ),
    )
    assert response["Location"] == change_url(existing)
    (message,) = page_messages(admin_client_logged_in, response)
    assert "existing" in message and f"task #{existing.pk}" in message
    assert f'href="{change_url(existing)}"' in message
    assert list(Task.objects.all()) == [existing]
    assert Event.objects.count() == events


@pytest.mark.django_db
def test_staff_without_the_add_permission_cannot_enqueue(oncall: User) -> None:
    client = staff_client(oncall)
    assert client.get(reverse(ADD_URL)).status_code == 403
    assert client.post(reverse(ADD_URL), enqueue_form()).status_code == 403
    assert not Task.objects.exists()


# --- operator actions --------------------------------------------------------------------------


def act(client: Client, action: str, tasks: list[Task], **confirm: str) -> Response:
    """Choose ``action`` for ``tasks`` on the changelist; with ``confirm`` fields (the
    reason), also submit the confirmation page."""
    selected = [str(task.pk) for task in tasks]
    data: dict[str, Any] = {"action": action, "_selected_action": selected}
    if confirm:
        data |= {"confirm": "yes", **confirm}
    else:
        data["index"] = "0"
    return client.post(reverse(CHANGELIST_URL), data)


def statuses(*tasks: Task) -> list[str]:
    return [Task.objects.get(pk=task.pk).status for task in tasks]


def operator_events(*tasks: Task) -> list[tuple[int | None, str, str, str]]:
    kinds = (EventKind.REDRIVEN, EventKind.RESOLVED, EventKind.CANCELLED)
    return list(
        Event.objects.filter(task_id__in=[t.pk for t in tasks], kind__in=kinds)
        .order_by("id")
        .values_list("task_id", "kind", "actor", "reason")
    )


@pytest.mark.django_db
def test_an_action_asks_for_a_reason_on_a_page_listing_the_selected_tasks(
    admin_client_logged_in: Client,
) -> None:
    dead = dead_task(key="dead:1")
    response = act(admin_client_logged_in, "redrive", [dead])
    body = response.content.decode()
    assert response.status_code == 200
    assert [t.pk for t in response.context["tasks"]] == [dead.pk]
    assert "dead:1" in body and 'name="reason"' in body
    assert 'name="confirm"' in body and 'value="redrive"' in body
    assert statuses(dead) == [TaskStatus.DEAD]


@pytest.mark.django_db
def test_the_confirmation_page_requires_a_reason(admin_client_logged_in: Client) -> None:
    dead = dead_task()
    response = act(admin_client_logged_in, "redrive", [dead], reason="   ")
    assert response.status_code == 200
    assert "reason" in response.context["form"].errors
    assert statuses(dead) == [TaskStatus.DEAD]
    assert operator_events(dead) == []


@pytest.mark.django_db
def test_a_superuser_redrives_a_dead_task_with_a_reason(
    admin_client_logged_in: Client, superuser: User
) -> None:
    dead = dead_task()
    response = act(admin_client_logged_in, "redrive", [dead], reason="fixed the remote")
    assert response.status_code == 302
    assert statuses(dead) == [TaskStatus.PENDING]
    assert operator_events(dead) == [
        (dead.pk, EventKind.REDRIVEN, superuser.username, "fixed the remote")
    ]
    (message,) = page_messages(admin_client_logged_in, response)
    assert f"#{dead.pk}" in message and "1 task(s) redriven" in message


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("action", "kind", "status"),
    [
        ("redrive", EventKind.REDRIVEN, TaskStatus.PENDING),
        ("resolve_done", EventKind.RESOLVED, TaskStatus.SUCCEEDED),
        ("resolve_retry", EventKind.RESOLVED, TaskStatus.PENDING),
        ("cancel", EventKind.CANCELLED, TaskStatus.CANCELLED),
    ],
)
def test_an_oncall_engineer_made_staff_runs_each_action(
    oncall: User, action: str, kind: str, status: str
) -> None:
    client = staff_client(oncall)
    # Resolving is for a step whose outcome is unknown; any other dead step is redriven.
    unknown = action.startswith("resolve")
    dead = dead_task({"error": "outcome_unknown", "fail_first": 1} if unknown else None)
    response = act(client, action, [dead], reason="incident 42")
    assert response.status_code == 302
    assert statuses(dead) == [status]
    assert operator_events(dead) == [(dead.pk, kind, oncall.username, "incident 42")]


@pytest.mark.django_db
def test_the_actions_offered_are_those_the_user_is_permitted(
    oncall: User, auditor: User, admin_client_logged_in: Client
) -> None:
    def offered(client: Client) -> set[str]:
        form = client.get(reverse(CHANGELIST_URL)).context["action_form"]
        return set() if form is None else {name for name, _ in form.fields["action"].choices}

    operator = {"redrive", "redrive_later", "resolve_done", "resolve_retry", "cancel", "rewind"}
    assert offered(admin_client_logged_in) == operator | {""}
    assert offered(staff_client(oncall)) == operator | {""}
    assert offered(staff_client(auditor)) == set()


@pytest.mark.django_db
def test_an_action_skips_and_reports_a_task_it_does_not_apply_to_and_does_the_others(
    admin_client_logged_in: Client,
) -> None:
    dead = dead_task()
    waiting = services.enqueue("demo.noop", {}).task
    response = act(admin_client_logged_in, "redrive", [dead, waiting], reason="retry all")
    assert statuses(dead, waiting) == [TaskStatus.PENDING, TaskStatus.PENDING]
    assert [e[0] for e in operator_events(dead, waiting)] == [dead.pk]
    summary, skipped = page_messages(admin_client_logged_in, response)
    assert "1 task(s) redriven" in summary and "1 skipped" in summary
    assert f"Task #{waiting.pk} not redriven" in skipped and "no dead step" in skipped


@pytest.mark.django_db
def test_an_action_on_more_tasks_than_the_bulk_limit_is_refused_whole(
    admin_client_logged_in: Client, settings: Any
) -> None:
    settings.TASKS_BULK_LIMIT = 1
    tasks = [dead_task(), dead_task()]
    response = act(admin_client_logged_in, "redrive", tasks, reason="all of them")
    (message,) = page_messages(admin_client_logged_in, response)
    assert "at most 1 task" in message
    assert statuses(*tasks) == [TaskStatus.DEAD, TaskStatus.DEAD]
    assert operator_events(*tasks) == []


@pytest.mark.django_db
def test_an_auditor_made_staff_is_refused_every_action_and_nothing_changes(
    auditor: User,
) -> None:
    client = staff_client(auditor)
    dead = dead_task()
    for action in ("redrive", "resolve_done", "resolve_retry", "cancel"):
        assert act(client, action, [dead]).status_code == 403
        assert act(client, action, [dead], reason="because").status_code == 403
    assert statuses(dead) == [TaskStatus.DEAD]
    assert operator_events(dead) == []


@pytest.mark.django_db
def test_the_services_refuse_an_action_the_admin_offered_by_mistake(
    auditor: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Hiding an action is decoration; the service checks the permission anyway.
    monkeypatch.setattr(TaskAdmin, "has_cancel_permission", lambda self, request: True)
    client = staff_client(auditor)
    dead = dead_task()
    response = act(client, "cancel", [dead], reason="because")
    (message,) = page_messages(client, response)
    assert "not permitted" in message and "nothing changed" in message
    assert statuses(dead) == [TaskStatus.DEAD]
    assert operator_events(dead) == []


# --- nothing is changed or deleted ------------------------------------------------------------


@pytest.mark.django_db
def test_nothing_can_be_changed_or_deleted_through_the_admin(
    admin_client_logged_in: Client,
) -> None:
    task = dead_task()
    step = only_step(task)
    events = list(Event.objects.values_list("id", "kind", "data"))
    response = admin_client_logged_in.post(change_url(task), {"status": "succeeded", "queue": "x"})
    assert response.status_code == 403
    delete_url = reverse("admin:tasks_app_task_delete", args=[task.pk])
    assert admin_client_logged_in.post(delete_url, {"post": "yes"}).status_code == 403
    # Bulk delete is not offered, so posting it does nothing.
    bulk = admin_client_logged_in.post(
        reverse(CHANGELIST_URL),
        {"action": "delete_selected", "_selected_action": [task.pk], "post": "yes"},
    )
    assert bulk.status_code in (200, 302)
    assert statuses(task) == [TaskStatus.DEAD]
    step.refresh_from_db()
    assert (step.status, step.fencing_token) == (StepStatus.DEAD, 1)
    assert Step.objects.filter(task=task).count() == 1
    assert list(Event.objects.values_list("id", "kind", "data")) == events


@pytest.mark.django_db
def test_the_task_page_in_the_admin_is_read_only(admin_client_logged_in: Client) -> None:
    task = dead_task()
    response = admin_client_logged_in.get(change_url(task))
    assert response.status_code == 200
    assert response.context["has_change_permission"] is False
    assert response.context["has_delete_permission"] is False
    assert not response.context["adminform"].form.fields  # every field is read-only
    for inline in response.context["inline_admin_formsets"]:
        assert not inline.has_add_permission
        assert not inline.has_change_permission
        assert not inline.has_delete_permission


@pytest.mark.django_db
def test_approval_requests_cannot_be_added_changed_or_deleted_in_the_admin(
    admin_client_logged_in: Client, editor: User
) -> None:
    request = pending_request(advance(article()))
    change = reverse("admin:approvals_approvalrequest_change", args=[request.pk])
    delete = reverse("admin:approvals_approvalrequest_delete", args=[request.pk])
    assert admin_client_logged_in.get(change).status_code == 200
    assert admin_client_logged_in.post(change, {"status": "approved"}).status_code == 403
    assert admin_client_logged_in.post(delete, {"post": "yes"}).status_code == 403
    add = reverse("admin:approvals_approvalrequest_add")
    assert admin_client_logged_in.get(add).status_code == 403
    request.refresh_from_db()
    assert request.status == ApprovalStatus.PENDING


# --- secrets -----------------------------------------------------------------------------------

SECRETS = {"password": "hunter2", "api_token": "abc123", "nested": [{"Client-Secret": "x-9"}]}
SECRET_VALUES = ("hunter2", "abc123", "x-9", "s3ss10n")


@pytest.mark.django_db
def test_the_task_page_and_the_list_show_no_secret_of_a_task(
    admin_client_logged_in: Client, oncall: User
) -> None:
    task = dead_task({"error": "permanent", "fail_first": 1, **SECRETS})
    Step.objects.filter(task=task).update(
        last_error="PermanentError: refused {'api_token': 'abc123'} session_id=s3ss10n"
    )
    services.redrive(
        task,
        actor=oncall,
        reason="fixed, password=hunter2",
        payload={"error": "permanent", "fail_first": 1, **SECRETS},
    )
    runner.run_task_steps(task)
    change = admin_client_logged_in.get(change_url(task))
    listed = admin_client_logged_in.get(reverse(CHANGELIST_URL))
    for response in (change, listed):
        assert response.status_code == 200
        page = response.content.decode()
        for secret in SECRET_VALUES:
            assert secret not in page, secret
    page = change.content.decode()
    assert "•••redacted•••" in page and "old_payload" in page  # the redrive's event
    # The lease tokens of the system's own events are shown.
    assert "&#x27;token&#x27;: 2" in page


@pytest.mark.django_db
def test_an_approval_request_page_shows_no_secret_of_its_draft_or_comment(
    admin_client_logged_in: Client,
) -> None:
    request = pending_request(advance(article()))
    ApprovalRequest.objects.filter(pk=request.pk).update(
        draft={"title": "Launch", **SECRETS}, comment="use password=hunter2"
    )
    change = reverse("admin:approvals_approvalrequest_change", args=[request.pk])
    page = admin_client_logged_in.get(change).content.decode()
    assert "Launch" in page
    for secret in SECRET_VALUES:
        assert secret not in page, secret


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("changelist", "lookup", "guess"),
    [
        (CHANGELIST_URL, "payload__api_token", "right"),
        (CHANGELIST_URL, "payload__api_token__startswith", "r"),
        (CHANGELIST_URL, "payload__icontains", 'api_token": "r'),
        ("admin:approvals_approvalrequest_changelist", "draft__password", "hunter2"),
        ("admin:approvals_approvalrequest_changelist", "comment__icontains", "password=hunt"),
        ("admin:approvals_approvalrequest_changelist", "task__payload__api_token", "right"),
    ],
)
def test_the_changelists_refuse_a_lookup_into_what_they_show_redacted(
    admin_client_logged_in: Client, changelist: str, lookup: str, guess: str
) -> None:
    task = services.enqueue("demo.noop", {"api_token": "right"}).task
    request = pending_request(advance(article()))
    ApprovalRequest.objects.filter(pk=request.pk).update(
        draft={"title": "Launch", "password": "hunter2"}, comment="use password=hunter2"
    )
    response = admin_client_logged_in.get(reverse(changelist), {lookup: guess})
    assert response.status_code == 400
    page = response.content.decode()
    assert f"{lookup}: the admin filters no field it shows redacted" in page
    assert f"/{task.pk}/change/" not in page and f"/{request.pk}/change/" not in page


# --- the changelist and the way to the console and back ---------------------------------------


@pytest.mark.django_db
def test_the_changelist_filters_by_status_workflow_and_queue(
    admin_client_logged_in: Client,
) -> None:
    noop = services.enqueue("demo.noop", {}).task
    dead = dead_task()

    def listed(**query: str) -> list[int]:
        response = admin_client_logged_in.get(reverse(CHANGELIST_URL), query)
        assert response.status_code == 200
        return [task.pk for task in response.context["cl"].result_list]

    assert listed(status="dead") == [dead.pk]
    assert listed(workflow="demo.noop") == [noop.pk]
    assert listed(queue="default") == [dead.pk, noop.pk]


@pytest.mark.django_db
def test_the_changelist_finds_a_task_by_its_key_exactly_or_by_its_beginning(
    admin_client_logged_in: Client,
) -> None:
    first = services.enqueue("demo.noop", {"n": 1}, idempotency_key="publish:a-1:v1").task
    second = services.enqueue("demo.noop", {"n": 2}, idempotency_key="publish:a-1:v2").task
    services.enqueue("demo.noop", {"n": 3}, idempotency_key="reply:T-1")

    def found(term: str) -> set[int]:
        response = admin_client_logged_in.get(reverse(CHANGELIST_URL), {"q": term})
        return {task.pk for task in response.context["cl"].result_list}

    assert found("publish:a-1:v1") == {first.pk}
    assert found("publish:a-1") == {first.pk, second.pk}
    assert found("a-1") == set()  # a beginning, not any part
    assert found(str(second.pk)) == {second.pk}


@pytest.mark.django_db
def test_the_admin_and_the_console_link_to_each_other(
    admin_client_logged_in: Client, oncall: User
) -> None:
    task = services.enqueue("demo.noop", {}).task
    console = reverse("console:task", args=[task.pk])
    changelist = admin_client_logged_in.get(reverse(CHANGELIST_URL)).content.decode()
    assert f'href="{console}"' in changelist
    assert f'href="{console}"' in admin_client_logged_in.get(change_url(task)).content.decode()
    assert f'href="{change_url(task)}"' in admin_client_logged_in.get(console).content.decode()
    # Only staff are shown the way into the admin.
    not_staff = Client()
    not_staff.force_login(oncall)
    assert f'href="{change_url(task)}"' not in not_staff.get(console).content.decode()
