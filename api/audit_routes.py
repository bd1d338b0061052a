"""``/api/v1/audit``: the audit log with the console's filters (``/audit/``), newest first,
each entry as the audit export writes it (``EventOut``). Reading it needs
``tasks_app.view_audit_log``. As on the page, a bad filter is refused, never left out: a
reader of the log gets what they asked for or an error, not everything."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Query, Router, Schema

from api import access, filters
from api.errors import problems
from api.schemas import EventOut, Page
from console.forms import AuditFilterForm
from tasks_app.operations import audit_log

router = Router(tags=["audit log"])


class AuditQuery(Schema):
    """The console's audit filters, by the same names and rules. One task chosen and no
    action, actor or plan: its whole history, where ``after`` counts the entries earlier
    pages held."""

    # The start of the actor's name, in any case.
    actor: str | None = None
    # An event kind (``redriven``, ``enqueued``).
    kind: str | None = None
    workflow: str | None = None
    task: int | None = None
    # At or after, and before (UTC).
    since: str | None = None
    until: str | None = None
    # The id a bulk action or a program's plan wrote on each of its events.
    plan: str | None = None
    after: int | None = None


class AuditPage(Page):
    items: list[EventOut]


@router.get("/", response={200: AuditPage, **problems()}, summary="The audit log, newest first")
def audit_entries(request: HttpRequest, query: Query[AuditQuery]) -> dict[str, Any]:
    access.require(request, access.VIEW_AUDIT)
    filters.known(request, set(AuditQuery.model_fields))
    form = filters.read(request, AuditFilterForm)
    page = audit_log.audit_page(form.filters(), after=filters.cursor(form))
    return {"items": [EventOut.of(entry) for entry in page.rows], "next_after": page.next_after}
