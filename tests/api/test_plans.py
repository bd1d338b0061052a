"""Plans programs propose through the API and people sign in the console: what a
proposal chooses, who may apply it, the events naming both, and what a refusal shows."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from tasks_app.models import AutoApply, Event, EventKind, PlanStatus, ProposedPlan, TaskStatus
from tasks_app.operations import proposals, tokens
from tests.api_support import call, conforms, token_for
from tests.factories import dead_task, unknown_outcome

PLANS = "/api/v1/plans/"


def dead_group(count: int) -> list[int]:
    """``count`` dead letters of one cause, and one of another cause."""
    ids = [dead_task({"error": "permanent", "fail_first": 1, "seed": n}).pk for n in range(count)]
    unknown_outcome()
    return ids


def fingerprint_of(task_id: int) -> str:
    from tasks_app.models import Step

    step = Step.objects.get(task_id=task_id, status="dead")
    return str(step.error_fingerprint)


def propose_redrive(secret: str, fingerprint: str, **extra: Any) -> Any:
    body = {
        "action": "redrive",
        "reason": "the remote is back",
        "filters": {"fingerprint": fingerprint},
        **extra,
    }
    return call("POST", PLANS, secret, body=body)


@pytest.mark.django_db
def test_a_program_proposes_a_redrive_of_one_group_and_nothing_happens_yet(oncall: User) -> None:
    ids = dead_group(3)
    secret = token_for(oncall, "oncall", name="triage-bot")
    answer = propose_redrive(secret, fingerprint_of(ids[0]))
    assert answer.status_code == 201
    plan = conforms(answer, "POST", PLANS)
    assert plan["status"] == "proposed"
    assert plan["task_ids"] == ids
    assert plan["proposed_by"] == "olivia-oncall via triage-bot"
    assert plan["url"].endswith(f"/plans/{plan['id']}/")
    assert {t.status for t in _tasks(ids)} == {TaskStatus.DEAD}
    proposed = Event.objects.get(kind=EventKind.PLAN_PROPOSED)
    assert proposed.actor == "olivia-oncall via triage-bot"
    assert proposed.actor_user_id == oncall.pk
    assert proposed.data["plan"] == plan["id"]
    assert proposed.data["program"] == "triage-bot"
    assert proposed.chain_hash


@pytest.mark.django_db
def test_a_person_signs_it_and_the_events_name_both(oncall: User) -> None:
    ids = dead_group(2)
    secret = token_for(oncall, "oncall", name="triage-bot")
    plan_id = propose_redrive(secret, fingerprint_of(ids[0])).json()["id"]
    signer = User.objects.create_user("sigrid-signer")
    signer.groups.add(*oncall.groups.all())
    plan = proposals.apply(ProposedPlan.objects.get(pk=plan_id), actor=signer, note="checked")
    assert plan.status == PlanStatus.APPLIED
    assert plan.outcome == {"changed": ids, "skipped": []}
    applied = Event.objects.get(kind=EventKind.PLAN_APPLIED)
    assert (applied.actor, applied.reason) == ("sigrid-signer", "checked")
    assert applied.data["proposed_by"] == "olivia-oncall via triage-bot"
    redriven = Event.objects.filter(kind=EventKind.REDRIVEN).order_by("task_id")
    assert [e.task_id for e in redriven] == ids
    assert {(e.actor, e.reason, e.data["plan"]) for e in redriven} == {
        ("sigrid-signer", "the remote is back", plan_id)
    }


@pytest.mark.django_db
def test_a_token_without_the_right_cannot_apply_its_own_plan(oncall: User) -> None:
    ids = dead_group(1)
    secret = token_for(oncall, "oncall", auto_apply=AutoApply.NEVER)
    plan_id = propose_redrive(secret, fingerprint_of(ids[0])).json()["id"]
    answer = call("POST", f"{PLANS}{plan_id}/apply", secret)
    assert answer.status_code == 403
    body = conforms(answer, "POST", "/api/v1/plans/{plan_id}/apply")
    assert str(ids[0]) not in answer.content.decode()
    assert body["error"] == "not_permitted"
    assert ProposedPlan.objects.get(pk=plan_id).status == PlanStatus.PROPOSED
    assert _tasks(ids)[0].status == TaskStatus.DEAD


@pytest.mark.django_db
def test_a_one_task_token_applies_a_plan_on_one_task_itself(oncall: User) -> None:
    task = dead_task()
    secret = token_for(oncall, "oncall", auto_apply=AutoApply.ONE_TASK)
    body = {"action": "redrive", "reason": "retry it", "task_ids": [task.pk]}
    answer = call("POST", PLANS, secret, body=body)
    plan = conforms(answer, "POST", PLANS)
    assert plan["status"] == "applied"
    assert plan["decided_by"] == "olivia-oncall via script"
    task.refresh_from_db()
    assert task.status == TaskStatus.PENDING


@pytest.mark.django_db
def test_a_one_task_token_leaves_a_write_in_doubt_to_a_person(oncall: User) -> None:
    task = unknown_outcome()
    secret = token_for(oncall, "oncall", auto_apply=AutoApply.ONE_TASK)
    body = {"action": "resolve_retry", "reason": "it did not happen", "task_ids": [task.pk]}
    plan = call("POST", PLANS, secret, body=body).json()
    assert (plan["status"], plan["in_doubt"]) == ("proposed", 1)


@pytest.mark.django_db
def test_a_one_task_token_does_not_apply_a_plan_on_many(oncall: User) -> None:
    ids = dead_group(2)
    secret = token_for(oncall, "oncall", auto_apply=AutoApply.ONE_TASK)
    plan = propose_redrive(secret, fingerprint_of(ids[0])).json()
    assert plan["status"] == "proposed"


@pytest.mark.django_db
def test_a_token_cut_to_a_group_without_the_action_cannot_propose_it(oncall: User) -> None:
    ids = dead_group(1)
    oncall.groups.add(Group.objects.get(name="auditors"))
    secret = token_for(oncall, "auditors")
    answer = propose_redrive(secret, fingerprint_of(ids[0]))
    assert answer.status_code == 403
    assert not ProposedPlan.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"action": "explode", "reason": "x", "task_ids": [1]}, "action"),
        ({"action": "redrive", "reason": " ", "task_ids": [1]}, "reason"),
        ({"action": "redrive", "reason": "x"}, "task_ids"),
        ({"action": "redrive", "reason": "x", "task_ids": [999999]}, "task_ids"),
        ({"action": "redrive", "reason": "x", "filters": {"workflow": "nope"}}, "filters.workflow"),
        ({"action": "redrive", "reason": "x", "filters": {}, "limit": 0}, "limit"),
        ({"action": "redrive", "reason": "x", "task_ids": ["a"]}, "task_ids.0"),
        ({"action": "pause_queue", "reason": "x", "queue": "nope"}, "queue"),
        ({"action": "redrive_later", "reason": "x", "filters": {}}, "delay"),
    ],
)
def test_bad_input_is_named_and_nothing_is_proposed(
    oncall: User, body: dict[str, Any], field: str
) -> None:
    dead_task()
    secret = token_for(oncall, "oncall")
    answer = call("POST", PLANS, secret, body=body)
    assert answer.status_code == 400, answer.content
    problem = conforms(answer, "POST", PLANS)
    assert problem["field"] == field
    assert problem["detail"].startswith(f"{field}:") or field in problem["detail"]
    assert not ProposedPlan.objects.exists()


@pytest.mark.django_db
def test_a_filter_matching_nothing_proposes_nothing(oncall: User) -> None:
    secret = token_for(oncall, "oncall")
    answer = call("POST", PLANS, secret, body={"action": "redrive", "reason": "x", "filters": {}})
    assert answer.status_code == 409
    assert not ProposedPlan.objects.exists()


@pytest.mark.django_db
def test_a_queue_pause_is_proposed_and_signed(oncall: User) -> None:
    secret = token_for(oncall, "oncall", name="incident-bot")
    body = {"action": "pause_queue", "reason": "the remote is down", "queue": "default"}
    plan = call("POST", PLANS, secret, body=body).json()
    from tasks_app.models import QueueState

    assert not QueueState.objects.filter(name="default", paused=True).exists()
    proposals.apply(ProposedPlan.objects.get(pk=plan["id"]), actor=oncall)
    assert QueueState.objects.get(name="default").paused


@pytest.mark.django_db
def test_a_plan_is_applied_once_and_an_expired_one_never(oncall: User) -> None:
    ids = dead_group(1)
    secret = token_for(oncall, "oncall")
    plan_id = propose_redrive(secret, fingerprint_of(ids[0])).json()["id"]
    plan = ProposedPlan.objects.get(pk=plan_id)
    proposals.apply(plan, actor=oncall)
    from tasks_app.exceptions import InvalidTransition

    with pytest.raises(InvalidTransition, match="applied by olivia-oncall"):
        proposals.apply(plan, actor=oncall)
    ids = dead_group(1)
    late = ProposedPlan.objects.get(pk=propose_redrive(secret, fingerprint_of(ids[0])).json()["id"])
    ProposedPlan.objects.filter(pk=late.pk).update(expires_at=late.proposed_at)
    with pytest.raises(InvalidTransition, match="expired"):
        proposals.apply(late, actor=oncall)
    assert call("GET", f"{PLANS}{late.pk}", secret).json()["status"] == "expired"


@pytest.mark.django_db
def test_only_the_tasks_it_chose_that_still_qualify_are_touched(oncall: User) -> None:
    ids = dead_group(2)
    secret = token_for(oncall, "oncall")
    plan_id = propose_redrive(secret, fingerprint_of(ids[0])).json()["id"]
    from tasks_app import services

    services.cancel(_tasks(ids)[0], actor="cli:carol", reason="not needed")
    later = dead_task({"error": "permanent", "fail_first": 1, "seed": 99})
    plan = proposals.apply(ProposedPlan.objects.get(pk=plan_id), actor=oncall)
    assert plan.outcome["changed"] == [ids[1]]
    assert plan.outcome["skipped"][0][0] == ids[0]
    later.refresh_from_db()
    assert later.status == TaskStatus.DEAD


@pytest.mark.django_db
def test_the_console_signs_a_plan_and_a_reader_without_the_right_is_refused(
    oncall: User, auditor: User
) -> None:
    ids = dead_group(1)
    secret = token_for(oncall, "oncall", name="triage-bot")
    plan_id = propose_redrive(secret, fingerprint_of(ids[0])).json()["id"]
    reader = Client()
    reader.force_login(auditor)
    inbox = reader.get("/plans/")
    assert inbox.status_code == 200
    assert plan_id in inbox.content.decode()
    refused = reader.post(f"/plans/{plan_id}/apply/", {"note": ""})
    assert refused.status_code == 403
    assert ProposedPlan.objects.get(pk=plan_id).status == PlanStatus.PROPOSED
    person = Client()
    person.force_login(oncall)
    page = person.get(f"/plans/{plan_id}/").content.decode()
    assert "olivia-oncall via triage-bot" in page
    assert "the remote is back" in page
    answer = person.post(f"/plans/{plan_id}/apply/", {"note": "ok"}, headers={"HX-Request": "true"})
    assert answer.status_code == 200
    assert "Plan applied: 1 task changed." in answer.content.decode()
    assert _tasks(ids)[0].status == TaskStatus.PENDING


@pytest.mark.django_db
def test_a_person_declines_a_plan_with_a_reason(oncall: User) -> None:
    ids = dead_group(1)
    secret = token_for(oncall, "oncall")
    plan_id = propose_redrive(secret, fingerprint_of(ids[0])).json()["id"]
    person = Client()
    person.force_login(oncall)
    missing = person.post(f"/plans/{plan_id}/decline/", {"reason": ""})
    assert missing.status_code == 400
    answer = person.post(f"/plans/{plan_id}/decline/", {"reason": "not this one"})
    assert answer.status_code == 302
    plan = ProposedPlan.objects.get(pk=plan_id)
    assert (plan.status, plan.decided_by, plan.decision_reason) == (
        PlanStatus.DECLINED,
        "olivia-oncall",
        "not this one",
    )
    assert Event.objects.filter(kind=EventKind.PLAN_DECLINED, actor="olivia-oncall").exists()
    assert _tasks(ids)[0].status == TaskStatus.DEAD
    with pytest.raises(Exception, match="person declines"):
        proposals.decline(plan, actor=tokens.acting_user(tokens.find(secret)), reason="x")  # type: ignore[arg-type]


def _tasks(ids: list[int]) -> list[Any]:
    from tasks_app.models import Task

    return list(Task.objects.filter(pk__in=ids).order_by("id"))


@pytest.mark.django_db
def test_the_nav_counts_the_plans_awaiting_a_signature(oncall: User) -> None:
    ids = dead_group(1)
    person = Client()
    person.force_login(oncall)
    assert 'data-waiting="1"' not in person.get("/tasks/").content.decode()
    propose_redrive(token_for(oncall, "oncall"), fingerprint_of(ids[0]))
    assert 'data-waiting="1"' in person.get("/tasks/").content.decode()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("action", "params", "status"),
    [
        ("rewind", {"from_step": "flaky"}, TaskStatus.PENDING),
        ("resolve_done", {}, TaskStatus.SUCCEEDED),
        ("cancel", {}, TaskStatus.CANCELLED),
        ("redrive_later", {"delay": "1h"}, TaskStatus.PENDING),
    ],
)
def test_every_action_of_the_table_is_proposed_and_signed_with_its_parameters(
    oncall: User, action: str, params: dict[str, Any], status: str
) -> None:
    task = dead_task()
    secret = token_for(oncall, "oncall")
    body = {"action": action, "reason": "as planned", "task_ids": [task.pk], "params": params}
    answer = call("POST", PLANS, secret, body=body)
    assert answer.status_code == 201, answer.content
    assert answer.json()["params"] == params
    plan = proposals.apply(ProposedPlan.objects.get(pk=answer.json()["id"]), actor=oncall)
    assert plan.outcome["changed"] == [task.pk], plan.outcome
    task.refresh_from_db()
    assert task.status == status
