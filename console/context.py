from __future__ import annotations

from django.http import HttpRequest

# The nav entry each page belongs to, by URL name.
SECTIONS = {
    "overview": "overview",
    "tasks": "tasks",
    "task": "tasks",
    "task_go": "tasks",
    "dead": "dead",
    "dead_bulk": "dead",
    "dead_groups": "dead",
    "approvals": "approvals",
    "review": "approvals",
    "decide": "approvals",
    "queues": "queues",
    "audit": "audit",
    "workflows": "workflows",
    "workflow": "workflows",
    "workflow_causes": "workflows",
}


def section(request: HttpRequest) -> dict[str, str]:
    match = request.resolver_match
    name = match.url_name if match and match.namespace == "console" else ""
    return {"section": SECTIONS.get(name or "", "")}
