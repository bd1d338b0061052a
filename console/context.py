"""What every console page's template gets: its nav section, the approvals waiting for the
reader, the programs' plans awaiting a signature, and whether the demo's mail is shown."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest

from approvals import selectors as approval_selectors
from console import mailbox
from console.views import VIEW_APPROVALS
from tasks_app.operations import proposals

# The nav entry each page belongs to, by URL name.
SECTIONS = {
    "overview": "overview",
    "tasks": "tasks",
    "task": "tasks",
    "task_go": "tasks",
    "dead": "dead",
    "dead_bulk": "dead",
    "dead_groups": "dead",
    "plans": "plans",
    "plan": "plans",
    "plan_apply": "plans",
    "plan_decline": "plans",
    "approvals": "approvals",
    "review": "approvals",
    "decide": "approvals",
    "edit_draft": "approvals",
    "queues": "queues",
    "limits": "limits",
    "limit_change": "limits",
    "limit_reset": "limits",
    "limit_pause": "limits",
    "limit_resume": "limits",
    "schedules": "schedules",
    "schedule": "schedules",
    "schedule_pause": "schedules",
    "schedule_resume": "schedules",
    "schedule_backfill": "schedules",
    "schedule_run_now": "schedules",
    "audit": "audit",
    "workflows": "workflows",
    "workflow": "workflows",
    "workflow_causes": "workflows",
    "mail": "mail",
    "tokens": "tokens",
    "token_create": "tokens",
    "token_revoke": "tokens",
}


def section(request: HttpRequest) -> dict[str, str]:
    match = request.resolver_match
    name = match.url_name if match and match.namespace == "console" else ""
    return {"section": SECTIONS.get(name or "", "")}


def approvals_waiting(request: HttpRequest) -> dict[str, Callable[[], int]]:
    """How many approval requests wait for the person reading: the nav shows it. A
    callable, so only a page that shows the nav entry counts them."""
    user: Any = getattr(request, "user", None)

    def count() -> int:
        if user is None or not user.has_perm(VIEW_APPROVALS):
            return 0
        return len(approval_selectors.decidable_by(user))

    return {"approvals_waiting": count}


def plans_waiting(request: HttpRequest) -> dict[str, Callable[[], int]]:
    """How many programs' plans await a signature: the nav shows it beside Plans. A
    callable, so only a page that shows the nav entry counts them (the inbox's partial
    index)."""

    def count() -> int:
        return proposals.awaiting().count()

    return {"plans_waiting": count}


def demo_mail(request: HttpRequest) -> dict[str, bool]:
    """Whether mail is written to files here (the demo): the nav then offers the Mail page."""
    return {"demo_mail": mailbox.folder() is not None}
