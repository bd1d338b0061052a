"""What a call may read: the permission each part of the API needs, checked against the
token's actor (``tokens.acting_user``), as the console's pages check the person."""

from __future__ import annotations

from django.http import HttpRequest

from tasks_app.exceptions import NotPermitted

VIEW_TASKS = "tasks_app.view_task"
VIEW_APPROVALS = "approvals.view_approvalrequest"
VIEW_AUDIT = "tasks_app.view_audit_log"
ADD_TASKS = "tasks_app.add_task"


def require(request: HttpRequest, permission: str) -> None:
    """Refuse the call (403, nothing of the object) unless the token may ``permission``."""
    if not request.user.has_perm(permission):
        raise NotPermitted(f"{permission.split('.', 1)[1]} is required")
