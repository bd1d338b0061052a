"""Who may see each console page and take each action, as two tables, and how a case is
tried (the page's address, the action's request, what it needs to find first): checked for
every role by ``tests/console/test_console_permissions.py``, and replayed on SQLite by the
embedded run (``tests/embedded_console.py``)."""

from __future__ import annotations

import re
from typing import Any

from django.test import Client
from django.utils import timezone

from approvals.models import ApprovalRequest
from tasks_app.models import (
    LimitKey,
    PlanStatus,
    ProposedPlan,
    QueueState,
    RunOutcome,
    ScheduleRun,
    Task,
)
from tasks_app.operations import proposals
from tests.limits_page_support import CUSTOMERS
from tests.schedules_page_support import HOURLY, iso, missed_for, paused_for, plan_of, store

# The limit the limit actions act on: the world registers its workflow
# (``tests.limits_page_support.limited_flow``).
LIMIT = CUSTOMERS.name
# The schedule the schedule actions act on, stored before each (``prepare``).
SCHEDULE = HOURLY.name

# Page by role: status. Reading needs ``view_task`` (every group has it); the approvals
# pages need ``view_approvalrequest`` (editors); the audit log and its export need the
# auditors' permissions; the tokens page, everyone signed in (each sees their own tokens).
# Superusers (admin) have all. An outsider is a logged-in user without any group.
PAGE_MATRIX = """
page          editor  oncall  auditor  admin  outsider
overview      200     200     200      200    403
tasks         200     200     200      200    403
task          200     200     200      200    403
dead          200     200     200      200    403
approvals     200     403     403      200    403
review        200     403     403      200    403
queues        200     200     200      200    403
limits        200     200     200      200    403
schedules     200     200     200      200    403
tokens        200     200     200      200    200
plans         200     200     200      200    403
plan          200     200     200      200    403
audit         403     403     200      200    403
audit_export  403     403     200      200    403
"""

# Action by role: "done" or 403.
ACTION_MATRIX = """
action             editor  oncall  auditor  admin  outsider
redrive            403     done    403      done   403
resolve            403     done    403      done   403
cancel             403     done    403      done   403
bulk               403     done    403      done   403
pause              403     done    403      done   403
resume             403     done    403      done   403
limit_change       403     done    403      done   403
limit_reset        403     done    403      done   403
limit_pause        403     done    403      done   403
limit_resume       403     done    403      done   403
schedule_pause     403     done    403      done   403
schedule_resume    403     done    403      done   403
schedule_backfill  403     done    403      done   403
schedule_run_now   403     done    403      done   403
decide             done    403     403      done   403
plan_apply         403     done    403      done   403
plan_decline       403     done    403      done   403
"""


def _table(text: str) -> list[tuple[str, str, str]]:
    lines = [line.split() for line in text.strip().splitlines()]
    roles = lines[0][1:]
    return [
        (row[0], role, cell) for row in lines[1:] for role, cell in zip(roles, row[1:], strict=True)
    ]


PAGE_CASES = _table(PAGE_MATRIX)
ACTION_CASES = _table(ACTION_MATRIX)


def page_url(page: str, world: dict[str, Any]) -> str:
    """Where a page of the table is, in the world of a dead task and a review."""
    if page == "plan":
        return f"/plans/{proposed(world).pk}/"
    return {
        "overview": "/",
        "tasks": "/tasks/",
        "task": f"/tasks/{world['dead'].pk}/",
        "dead": "/dead/",
        "approvals": "/approvals/",
        "review": f"/approvals/{world['review'].pk}/",
        "queues": "/queues/",
        "limits": "/limits/",
        "schedules": "/schedules/",
        "tokens": "/tokens/",
        "plans": "/plans/",
        "audit": "/audit/",
        "audit_export": "/audit/export.csv",
    }[page]


def action_request(action: str, world: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """Where an action of the table posts, and what."""
    dead: Task = world["dead"]
    review: ApprovalRequest = world["review"]
    if action == "plan_apply":
        return f"/plans/{proposed(world).pk}/apply/", {"note": "checked"}
    if action == "plan_decline":
        return f"/plans/{proposed(world).pk}/decline/", {"reason": "not now"}
    return {
        "redrive": (f"/tasks/{dead.pk}/redrive/", {"reason": "fixed the remote"}),
        "resolve": (f"/tasks/{dead.pk}/resolve/", {"reason": "checked", "outcome": "done"}),
        "cancel": (f"/tasks/{dead.pk}/cancel/", {"reason": "not needed"}),
        "bulk": ("/dead/bulk/", {"action": "cancel", "reason": "incident", "confirm": "1"}),
        "pause": ("/queues/default/pause/", {"reason": "incident"}),
        "resume": ("/queues/default/resume/", {"reason": "over"}),
        "limit_change": (
            f"/limits/{LIMIT}/change/",
            {"concurrency": "3", "rate": "", "reason": "quota raised", "confirm": "1"},
        ),
        "limit_reset": (f"/limits/{LIMIT}/reset/", {"reason": "quota back"}),
        "limit_pause": (f"/limits/{LIMIT}/pause/", {"key": "acme", "reason": "acme asked"}),
        "limit_resume": (f"/limits/{LIMIT}/resume/", {"key": "acme", "reason": "acme is ready"}),
        "schedule_pause": (f"/schedules/{SCHEDULE}/pause/", {"reason": "warehouse down"}),
        "schedule_resume": (f"/schedules/{SCHEDULE}/resume/", {"reason": "warehouse back"}),
        "schedule_backfill": (
            f"/schedules/{SCHEDULE}/backfill/",
            {"reason": "catch up", **missed_range()},
        ),
        "schedule_run_now": (
            f"/schedules/{SCHEDULE}/run-now/",
            {"reason": "needed now", "request_id": "permission-table"},
        ),
        "decide": (
            f"/approvals/{review.pk}/decide/",
            {"decision": "approve", "comment": "", "draft_hash": review.draft_hash},
        ),
    }[action]


def proposed(world: dict[str, Any] | None = None) -> ProposedPlan:
    """A program's plan to redrive the world's dead task, awaiting a signature (proposed
    once, by a trusted caller, before the case's rows are counted)."""
    found = ProposedPlan.objects.filter(status=PlanStatus.PROPOSED).first()
    if found is not None:
        return found
    dead = world["dead"] if world else Task.objects.filter(status="dead").earliest("pk")
    return proposals.propose(
        actor="cli:triage-bot", action="redrive", reason="remote back", task_ids=[dead.pk]
    )


def missed_range() -> dict[str, str]:
    """The range of the schedule's missed slots, for its backfill (none before ``prepare``)."""
    missed = list(
        ScheduleRun.objects.filter(schedule=SCHEDULE, outcome=RunOutcome.MISSED)
        .order_by("slot")
        .values_list("slot", flat=True)
    )
    return {"since": iso(missed[0]), "until": iso(missed[-1])} if missed else {}


def prepare(action: str) -> None:
    """What an action needs to find before it is taken: a paused queue or key to resume; a
    stored schedule, paused with slots waiting to resume it, or with missed slots to
    backfill."""
    if action.startswith("schedule_"):
        store(HOURLY)
    if action.startswith("plan_"):
        proposed()
    if action == "schedule_resume":
        paused_for(SCHEDULE, 2)
    if action == "schedule_backfill":
        missed_for(SCHEDULE, 2)
    if action == "resume":
        QueueState.objects.create(name="default", paused=True, changed_by="cli:x", reason="x")
    if action == "limit_resume":
        LimitKey.objects.create(
            limit=LIMIT, key="acme", paused_at=timezone.now(), paused_by="cli:x", paused_reason="x"
        )


def post_action(client: Client, action: str, world: dict[str, Any]) -> Any:
    """Take the action as its page does: a bulk action, a schedule's resume or backfill
    confirms the plan its preview made, a limit's change the numbers its preview saw (a
    role refused the preview confirms without them, and is refused again; a schedule's
    refused preview is the answer)."""
    url, data = action_request(action, world)
    if action in ("schedule_resume", "schedule_backfill"):
        previewed = client.post(url, data)
        if previewed.status_code != 200:
            return previewed
        return client.post(url, {**data, "plan": plan_of(previewed), "confirm": "1"})
    if action in ("bulk", "limit_change"):
        preview = client.post(url, {**data, "confirm": ""}).content.decode()
        field = "plan" if action == "bulk" else "seen"
        found = re.search(rf'name="{field}" value="([^"]+)"', preview)
        if found:
            data[field] = found.group(1)
    return client.post(url, data)
