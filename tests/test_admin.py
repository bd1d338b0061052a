from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from approvals import services as approvals
from approvals.models import ApprovalRequest, ApprovalStatus
from tasks_app import runner, services
from tasks_app.management.commands import seed_demo
from tasks_app.models import StepStatus, Task, TaskStatus

from .conftest import ensure_groups, only_step


@pytest.fixture
def admin_client_logged_in(superuser: User) -> Client:
    client = Client()
    assert client.login(username=superuser.username, password="pw-" + superuser.username)
    return client


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
def test_nothing_can_be_added_changed_or_deleted_through_the_admin(
    admin_client_logged_in: Client,
) -> None:
    task = services.enqueue("demo.noop", {}).task
    change_url = reverse("admin:tasks_app_task_change", args=[task.pk])
    assert admin_client_logged_in.get(reverse("admin:tasks_app_task_add")).status_code == 403
    response = admin_client_logged_in.post(change_url, {"status": "succeeded", "queue": "x"})
    assert response.status_code == 403
    delete_url = reverse("admin:tasks_app_task_delete", args=[task.pk])
    assert admin_client_logged_in.post(delete_url, {"post": "yes"}).status_code == 403
    bulk = admin_client_logged_in.post(
        reverse("admin:tasks_app_task_changelist"),
        {"action": "delete_selected", "_selected_action": [task.pk], "post": "yes"},
    )
    assert bulk.status_code in (200, 302)
    task.refresh_from_db()
    assert task.status == "pending"
    assert Task.objects.filter(pk=task.pk).exists()


@pytest.mark.django_db
def test_the_oncall_group_may_view_tasks_in_the_admin(oncall: User) -> None:
    oncall.is_staff = True
    oncall.save()
    task = services.enqueue("demo.noop", {}).task
    client = Client()
    client.force_login(oncall)
    assert client.get(reverse("admin:tasks_app_task_changelist")).status_code == 200
    assert client.get(reverse("admin:tasks_app_task_change", args=[task.pk])).status_code == 200


@pytest.mark.django_db
def test_the_demo_seed_creates_users_in_their_groups_and_tasks_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ensure_groups()  # a transactional test before this one may have flushed them
    call_command("seed_demo")
    first = capsys.readouterr().out
    call_command("seed_demo")
    second = capsys.readouterr().out
    assert first.count("password:") == 4
    assert "password:" not in second
    assert User.objects.get(username="oncall").groups.filter(name="oncall").exists()
    assert User.objects.get(username="auditor").groups.filter(name="auditors").exists()
    assert User.objects.get(username="admin").is_superuser
    seeded = len(seed_demo.DEMO_TASKS) + len(seed_demo.DEAD_LETTERS) + len(seed_demo.HISTORY)
    assert Task.objects.filter(idempotency_key__startswith="demo:").count() == seeded
    # An article waits for the demo editor, who is allowed to decide on it.
    editor = User.objects.get(username="editor")
    assert editor.groups.filter(name="editors").exists()
    waiting = Task.objects.get(idempotency_key="demo:publish:article-001:v1")
    assert waiting.status == TaskStatus.WAITING_APPROVAL
    request = ApprovalRequest.objects.get(task=waiting, status=ApprovalStatus.PENDING)
    approvals.approve(request, actor=editor, draft_hash=request.draft_hash)
    assert waiting.steps.get(kind="publish").status == StepStatus.PENDING
    client = Client()
    password = first.split("admin")[1].split("password:")[1].split()[0]
    assert client.login(username="admin", password=password)


@pytest.mark.django_db
def test_the_enqueue_command_refuses_a_bad_run_after_naming_it() -> None:
    with pytest.raises(CommandError, match="run_after"):
        call_command("enqueue", "demo.noop", "--run-after", "next tuesday")
    assert not Task.objects.exists()
