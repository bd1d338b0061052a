"""``/api/v1/dead``: the dead letters as the console's ``/dead/`` lists them (its filters,
newest task first, keyset ``after``), and grouped by cause as ``/dead/groups/`` shows them,
each group linking to its list. Reading them needs ``tasks_app.view_task``, as the pages do."""

from __future__ import annotations

from dataclasses import asdict, replace
from datetime import datetime
from typing import Any

from django.http import HttpRequest
from ninja import Query, Router, Schema

from api import access, filters, links
from api.errors import problems
from api.schemas import Page, console_url
from console.forms import DeadFilterForm
from console.presenters import error_summary
from tasks_app.models import Step
from tasks_app.operations import listings
from tasks_app.operations.listings import DeadFilter, DeadGroup
from tasks_app.redaction import redact_text

router = Router(tags=["dead letters"])


class GroupQuery(Schema):
    """The console's dead-letter filters (``/dead/``), by the same names and rules."""

    workflow: str | None = None
    queue: str | None = None
    error_class: str | None = None
    # A cause, as a group's ``api_url`` gives it.
    fingerprint: str | None = None


class DeadQuery(GroupQuery):
    after: int | None = None


class DeadLetterOut(Schema):
    """One dead step of a dead task."""

    task_id: int
    workflow: str
    queue: str
    step_id: int
    position: int
    kind: str
    attempts: int
    max_attempts: int
    error_class: str
    # The error's last line, as the console's list shows it; and the whole error (a
    # traceback), both with the values of secret keys removed.
    message: str
    last_error: str
    # The cause it shares with others (``/api/v1/dead/groups/``).
    fingerprint: str
    died_at: datetime | None
    # The task's page in the console, where it is redriven, resolved or cancelled.
    url: str

    @classmethod
    def of(cls, step: Step) -> DeadLetterOut:
        return cls(
            task_id=step.task_id,
            workflow=step.task.workflow,
            queue=step.queue,
            step_id=step.pk,
            position=step.position,
            kind=step.kind,
            attempts=step.attempts,
            max_attempts=step.max_attempts,
            error_class=step.error_class,
            message=error_summary(step.last_error or ""),
            last_error=redact_text(step.last_error or ""),
            fingerprint=step.error_fingerprint,
            died_at=step.finished_at,
            url=console_url("task", step.task_id),
        )


class DeadLetterPage(Page):
    items: list[DeadLetterOut]


class DeadGroupOut(Schema):
    """The dead letters of one cause."""

    fingerprint: str
    error_class: str
    # The cause's message, what varies in it masked and secret values removed.
    message: str
    count: int
    workflows: list[str]
    first_seen: datetime | None
    last_seen: datetime | None
    # The newest of them, as an example.
    example_task_id: int
    # Its dead letters (this list's filter narrowed to the cause): the console's page, where
    # they are acted on, and the API's list.
    url: str
    api_url: str

    @classmethod
    def of(cls, group: DeadGroup, filters: DeadFilter) -> DeadGroupOut:
        narrowed = asdict(replace(filters, fingerprint=group.fingerprint))
        return cls(
            fingerprint=group.fingerprint,
            error_class=group.error_class,
            message=redact_text(group.message),
            count=group.count,
            workflows=group.workflows,
            first_seen=group.first_seen,
            last_seen=group.last_seen,
            example_task_id=group.example.task_id,
            url=links.with_query(console_url("dead"), narrowed),
            api_url=links.api_url("dead_letters", query=narrowed),
        )


class DeadGroupList(Schema):
    # Every dead letter the groups hold.
    total: int
    items: list[DeadGroupOut]


@router.get(
    "/",
    response={200: DeadLetterPage, **problems()},
    summary="List dead letters, newest task first",
)
def dead_letters(request: HttpRequest, query: Query[DeadQuery]) -> dict[str, Any]:
    access.require(request, access.VIEW_TASKS)
    filters.known(request, set(DeadQuery.model_fields))
    form = filters.read(request, DeadFilterForm)
    page = listings.dead_letter_page(form.filters(), after=filters.cursor(form))
    return {"items": [DeadLetterOut.of(step) for step in page.rows], "next_after": page.next_after}


@router.get(
    "/groups/",
    response={200: DeadGroupList, **problems()},
    summary="Dead letters grouped by cause, the largest group first",
)
def dead_groups(request: HttpRequest, query: Query[GroupQuery]) -> DeadGroupList:
    access.require(request, access.VIEW_TASKS)
    # The groups are not paged: every cause is one row.
    filters.known(request, set(GroupQuery.model_fields))
    form = filters.read(request, DeadFilterForm)
    chosen = form.filters()
    groups = listings.dead_groups(chosen)
    return DeadGroupList(
        total=sum(group.count for group in groups),
        items=[DeadGroupOut.of(group, chosen) for group in groups],
    )
