"""The dead letters: their list and filters, and bulk actions previewed as a plan that
only its previewer may confirm, applied to the plan's tasks and no others."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User

from tasks_app import services
from tasks_app.engine import runner
from tasks_app.models import Event, Step, StepStatus, Task, TaskStatus
from tests.console_support import HTMX, body, confirm_bulk, login, plan_of, post_bulk
from tests.factories import dead_task, unknown_outcome

pytestmark = pytest.mark.django_db


def test_dead_letters_show_class_message_attempts_and_filter_by_error_class(oncall: User) -> None:
    permanent = dead_task()
    unknown = unknown_outcome()
    client = login(oncall)
    page = body(client.get("/dead/"))
    assert "tasks_app.exceptions.PermanentError" in page
    assert "tasks_app.exceptions.OutcomeUnknown" in page
    assert "1 / 3" in page
    only = body(client.get("/dead/", {"error_class": "tasks_app.exceptions.OutcomeUnknown"}))
    assert f'href="/tasks/{unknown.pk}/"' in only
    assert f'href="/tasks/{permanent.pk}/"' not in only


def test_a_bulk_action_without_confirm_previews_the_count_and_changes_nothing(
    oncall: User,
) -> None:
    permanent = [dead_task() for _ in range(3)]
    unknown = unknown_outcome()
    client = login(oncall)
    response = post_bulk(client, error_class="tasks_app.exceptions.PermanentError")
    assert response.status_code == 200
    page = body(response)
    assert "<strong>Plan: Redrive 3 tasks</strong>" in page
    assert all(f">#{task.pk}</a>" in page for task in permanent)
    assert f">#{unknown.pk}</a>" not in page
    assert ">Redrive 3 tasks</button>" in page
    assert Task.objects.filter(status=TaskStatus.DEAD).count() == 4
    assert not task_events_of_kind("redriven")


def test_the_bulk_form_states_its_filter_once(oncall: User) -> None:
    dead_task()
    client = login(oncall)
    sentence = "Filter: workflow any, queue any, error class tasks_app.exceptions.PermanentError."

    before = body(client.get("/dead/", {"error_class": "tasks_app.exceptions.PermanentError"}))
    previewed = body(post_bulk(client, error_class="tasks_app.exceptions.PermanentError"))

    assert before.count(sentence) == 1  # under the form, before a preview
    plan = previewed.split('class="notice warning plan"', 1)[1].split("</div>", 1)[0]
    assert previewed.count(sentence) == 1 and sentence in plan  # in the plan, once previewed


@pytest.mark.parametrize("value", ["0", "no", "off", "n", "null", "true", "yes", "on", " 1"])
def test_only_confirm_1_applies_a_bulk_action(oncall: User, value: str) -> None:
    task = dead_task()
    client = login(oncall)
    plan = plan_of(post_bulk(client, action="cancel"))

    response = post_bulk(client, action="cancel", confirm=value, plan=plan)

    assert response.status_code == 200
    assert "Nothing has changed yet" in body(response)
    assert Task.objects.get(pk=task.pk).status == TaskStatus.DEAD
    assert not task_events_of_kind("cancelled")


def test_a_confirm_without_a_preview_changes_nothing(oncall: User) -> None:
    task = dead_task()

    response = post_bulk(login(oncall), action="cancel", confirm="1")

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
    plan = plan_of(post_bulk(client))

    response = post_bulk(client, **change, confirm="1", plan=plan)

    assert response.status_code == 409
    assert f"Nothing changed: {reason} since the preview. Preview again." in body(response)
    assert ">Preview</button>" in body(response)
    assert {Task.objects.get(pk=t.pk).status for t in tasks} == {TaskStatus.DEAD}
    assert not Event.objects.filter(kind__in=["redriven", "cancelled"]).exists()


def test_a_plan_is_its_previewers_and_cannot_be_forged(oncall: User, superuser: User) -> None:
    task = dead_task()
    plan = plan_of(post_bulk(login(oncall), action="cancel"))
    other = post_bulk(login(superuser), action="cancel", confirm="1", plan=plan)
    assert other.status_code == 409
    assert "made by someone else" in body(other)
    forged = post_bulk(login(oncall), action="cancel", confirm="1", plan=plan[:-2] + "xx")
    assert forged.status_code == 409
    assert Task.objects.get(pk=task.pk).status == TaskStatus.DEAD


def test_a_confirm_applies_the_plan_and_nothing_else(oncall: User) -> None:
    planned = [dead_task() for _ in range(3)]
    client = login(oncall)
    plan = plan_of(post_bulk(client, action="cancel"))
    # Meanwhile one planned task is redriven by someone else, and a new one dies.
    services.redrive(planned[1], actor="cli:someone", reason="fixed")
    newcomer = dead_task()

    response = post_bulk(client, action="cancel", confirm="1", plan=plan)

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
    # The plan's id, not a link to the audit log, which on-call may not open.
    assert f'Plan <span class="mono">{cancelled[0].data["plan"]}</span>' in page
    assert "/audit/" not in page


def test_a_bulk_redrive_skips_a_step_whose_outcome_is_unknown(oncall: User) -> None:
    unknown = unknown_outcome()

    response = confirm_bulk(login(oncall), action="redrive")

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
    response = confirm_bulk(login(oncall), limit="2")
    assert response.status_code == 200
    assert "2 tasks changed" in body(response)
    assert "More tasks matched than the limit" in body(response)
    redriven = task_events_of_kind("redriven")
    assert sorted(event.task_id or 0 for event in redriven) == [tasks[0].pk, tasks[1].pk]
    assert {(event.actor, event.reason) for event in redriven} == {
        (oncall.username, "remote fixed")
    }
    assert Step.objects.get(task=tasks[2]).status == StepStatus.DEAD
    # The list the action changed comes in the same answer, swapped out of band.
    assert re.search(r'<section id="results"[^>]* hx-swap-oob="true">', body(response))


def test_a_bulk_action_needs_a_reason_and_a_limit_within_the_setting(
    oncall: User, settings: object
) -> None:
    settings.TASKS_BULK_LIMIT = 5  # type: ignore[attr-defined]
    dead_task()
    client = login(oncall)
    # Refused at the preview already, on its field, before anything is planned.
    no_reason = post_bulk(client, reason="")
    assert no_reason.status_code == 400 and "reason: is required" in body(no_reason)
    assert 'name="plan"' not in body(no_reason)
    too_many = post_bulk(client, limit="6")
    assert too_many.status_code == 400 and "limit: at most 5 tasks" in body(too_many)
    assert not task_events_of_kind("redriven")


def test_bulk_actions_each_apply_their_service(oncall: User) -> None:
    unknown = [unknown_outcome() for _ in range(2)]
    client = login(oncall)
    confirm_bulk(client, action="resolve_done", reason="checked: sent")
    assert {t.status for t in Task.objects.filter(pk__in=[t.pk for t in unknown])} == {
        TaskStatus.SUCCEEDED
    }
    cancel = dead_task()
    confirm_bulk(client, action="cancel", reason="obsolete")
    cancel.refresh_from_db()
    assert cancel.status == TaskStatus.CANCELLED


def test_a_plain_bulk_post_redirects_to_the_filtered_list_with_a_summary(oncall: User) -> None:
    dead_task()
    client = login(oncall)
    data = {"action": "cancel", "reason": "x", "workflow": "demo.flaky"}
    preview = client.post("/dead/bulk/", data)
    assert "<html" in body(preview)  # the whole page, with the plan
    response = client.post(
        "/dead/bulk/", {**data, "confirm": "1", "plan": plan_of(preview)}, follow=True
    )
    assert response.redirect_chain == [("/dead/?workflow=demo.flaky", 302)]
    assert "Cancel task: 1 task changed." in body(response)


def test_a_confirmed_plan_is_applied_once_and_a_second_confirm_changes_nothing(
    oncall: User,
) -> None:
    tasks = [dead_task({"error": "permanent", "fail_first": 9}) for _ in range(2)]
    client = login(oncall)
    plan = plan_of(post_bulk(client))
    assert post_bulk(client, confirm="1", plan=plan).status_code == 200
    # Within the plan's fifteen minutes the tasks die again; the same confirm is refused.
    for task in tasks:
        runner.run_task_steps(task)
        task.refresh_from_db()
        assert task.status == TaskStatus.DEAD
    redriven = Event.objects.filter(kind="redriven").count()
    again = post_bulk(client, confirm="1", plan=plan)
    assert again.status_code == 409
    assert "Nothing changed: this preview was already confirmed and applied." in body(again)
    assert Event.objects.filter(kind="redriven").count() == redriven
    assert {Task.objects.get(pk=t.pk).status for t in tasks} == {TaskStatus.DEAD}


def test_a_plan_that_changed_nothing_is_spent_too_and_a_refused_reason_spends_none(
    oncall: User,
) -> None:
    task = dead_task({"error": "permanent", "fail_first": 9})
    client = login(oncall)
    plan = plan_of(post_bulk(client, action="cancel"))
    no_reason = post_bulk(client, action="cancel", reason="", confirm="1", plan=plan)
    assert no_reason.status_code == 400  # fixing the reason needs no new preview
    services.redrive(task, actor="cli:someone", reason="fixed")
    assert post_bulk(client, action="cancel", confirm="1", plan=plan).status_code == 200
    runner.run_task_steps(task)
    again = post_bulk(client, action="cancel", confirm="1", plan=plan)
    assert again.status_code == 409
    assert Task.objects.get(pk=task.pk).status == TaskStatus.DEAD
