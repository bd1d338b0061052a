"""The console for programs: ``/api/v1/``, served by django-ninja with its OpenAPI
document at ``/api/v1/openapi.json`` (and a page to read it, for a signed-in person, at
``/api/v1/docs``). Every call needs a token (``api.auth``); what it may read or do is what
the token's actor may (``api.access``), through the same services and selectors the
console and ``manage.py`` use."""

from __future__ import annotations

from ninja import NinjaAPI

from api import errors
from api.auth import TokenAuth, TokenThrottle

api = NinjaAPI(
    title="Task console API",
    version="1",
    description=(
        "Read tasks, dead letters, queues, approvals, the audit log and per-workflow figures; "
        "enqueue; propose plans that a person signs in the console."
    ),
    auth=TokenAuth(),
    throttle=TokenThrottle(),
    urls_namespace="api",
)
errors.install(api)


def _routes() -> None:
    from api import (
        approval_routes,
        audit_routes,
        dead_routes,
        plans_routes,
        queue_routes,
        tasks_routes,
        workflow_routes,
    )

    api.add_router("/tasks", tasks_routes.router)
    api.add_router("/plans", plans_routes.router)
    api.add_router("/dead", dead_routes.router)
    api.add_router("/queues", queue_routes.router)
    api.add_router("/approvals", approval_routes.router)
    api.add_router("/audit", audit_routes.router)
    api.add_router("/workflows", workflow_routes.router)


_routes()
