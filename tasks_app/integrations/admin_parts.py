"""The task admin's parts: changelist filters (and the lookups refused), the operator
actions it offers, and the escaped HTML its read-only pages show, with what producers and
people wrote redacted (``tasks_app.redaction``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib import admin
from django.core.exceptions import FieldDoesNotExist
from django.db.models import JSONField, QuerySet
from django.db.models.constants import LOOKUP_SEP
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from tasks_app.exceptions import IdempotencyConflict
from tasks_app.models import Event, Task
from tasks_app.operations.task_actions import ACTIONS, Action
from tasks_app.redaction import redact_event_data, redact_text, redacted_json
from tasks_app.workflows import registry

# --- changelist filters and search -----------------------------------------------------------


class WorkflowFilter(admin.SimpleListFilter):
    """Registered workflows, not a DISTINCT over every task ever enqueued."""

    title = "workflow"
    parameter_name = "workflow"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in registry.names()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Task]) -> QuerySet[Task]:
        return queryset.filter(workflow=self.value()) if self.value() else queryset


class QueueFilter(admin.SimpleListFilter):
    """The configured queues (``TASKS_QUEUES``)."""

    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in settings.TASKS_QUEUES]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Task]) -> QuerySet[Task]:
        return queryset.filter(queue=self.value()) if self.value() else queryset


if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[Any]
else:
    _ModelAdmin = object

# What a changelist's query string holds besides lookups (django.contrib.admin.views.main).
ADMIN_PARAMETERS = frozenset({"q", "o", "p", "e", "all", "_popup", "_to_field", "_facets"})


class RedactedLookupsRefused(_ModelAdmin):
    """A changelist refuses (400, naming the lookup and the rule) a query-string lookup into
    a field it shows redacted: a JSON field (``?payload__api_token=…``,
    ``?draft__icontains=…``) or one of ``redacted_text_fields``, here or through a relation.
    Django's admin takes any lookup on a field of the model from the query string; whether
    a row was listed would confirm a guess of a secret. The admin offers no such filter."""

    redacted_text_fields: tuple[str, ...] = ()

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        for lookup in request.GET:
            if lookup not in ADMIN_PARAMETERS and self._reads_redacted(lookup):
                return render(
                    request,
                    "admin/refused_filter.html",
                    {
                        **self.admin_site.each_context(request),
                        "title": "The filter cannot be used",
                        "message": f"{lookup}: {REDACTED_LOOKUP_RULE}.",
                    },
                    status=400,
                )
        return super().changelist_view(request, extra_context)

    def _reads_redacted(self, lookup: str) -> bool:
        model: Any = self.model
        for part in lookup.split(LOOKUP_SEP):
            try:
                field = model._meta.get_field(part)
            except FieldDoesNotExist:
                return False
            if isinstance(field, JSONField) or (
                model is self.model and field.name in self.redacted_text_fields
            ):
                return True
            if field.related_model is None:
                return False
            model = field.related_model
        return False


REDACTED_LOOKUP_RULE = (
    "the admin filters no field it shows redacted (REDACT_KEY_PATTERNS), since whether a "
    "row is listed would confirm a guess of a secret; the console's task list filters a "
    "payload field that is not a secret"
)


# --- operator actions --------------------------------------------------------------------------


@dataclass(frozen=True)
class OperatorAction:
    """An action of the changelist: ``name`` is its key in ``services.BULK_ACTIONS`` and
    its label the one every page uses (``task_actions.ACTIONS``)."""

    name: Action
    done: str
    explanation: str

    @property
    def label(self) -> str:
        return ACTIONS[self.name].label


OPERATOR_ACTIONS = {
    action.name: action
    for action in (
        OperatorAction(
            Action.REDRIVE,
            "redriven",
            "Each dead step runs again with a fresh attempt budget and the same step key "
            "(an approval step gets a new request). Tasks without a dead step, or whose "
            "step's outcome is unknown (resolve those), are skipped.",
        ),
        OperatorAction(
            Action.RESOLVE_DONE,
            "marked done",
            "It happened: each task's first dead step is marked succeeded, with the reason "
            "as its note, and the task continues. Approval steps cannot be marked done; "
            "tasks without a dead step are skipped.",
        ),
        OperatorAction(
            Action.RESOLVE_RETRY,
            "sent to run again",
            "It did not happen: each task's first dead step runs again, and its unfinished "
            "side effects are forgotten so the next attempt calls the remote again. Only for "
            "a step whose outcome is unknown; other tasks are skipped (redrive those).",
        ),
        OperatorAction(
            Action.CANCEL,
            "cancelled",
            "Pending, blocked, waiting and dead steps are cancelled; a running step is asked "
            "to stop. Completed side effects are not undone. Tasks that already succeeded or "
            "were cancelled are skipped.",
        ),
    )
}


def conflict_message(exc: IdempotencyConflict) -> SafeString | str:
    if exc.task_id is None:
        return str(exc)
    return format_html(
        'The key {} is taken by <a href="{}">task #{}</a> with a different workflow or '
        "payload; nothing was stored.",
        exc.idempotency_key,
        reverse("admin:tasks_app_task_change", args=[exc.task_id]),
        exc.task_id,
    )


def html_table(headers: tuple[str, ...], rows: Any) -> SafeString:
    """An escaped HTML table (payload and error values are never trusted)."""
    head = format_html_join("", "<th>{}</th>", ((h,) for h in headers))
    body = format_html_join(
        "",
        "<tr>{}</tr>",
        ((format_html_join("", "<td>{}</td>", ((cell,) for cell in row)),) for row in rows),
    )
    return format_html("<table><thead><tr>{}</tr></thead><tbody>{}</tbody></table>", head, body)


def json_block(value: Any) -> SafeString:
    """A payload, a result or a draft: redacted, indented JSON, escaped."""
    if value is None:
        return format_html("{}", "—")
    return format_html('<pre class="redacted-json">{}</pre>', redacted_json(value))


def text_block(text: str) -> SafeString:
    """Free text (an error, a comment) with the values of secret keys removed, escaped."""
    if not text:
        return format_html("{}", "")
    return format_html('<pre class="redacted-text">{}</pre>', redact_text(text))


def event_rows(events: Iterable[Event]) -> Iterator[tuple[Any, ...]]:
    """The rows of an event timeline: the reason and the data as they may leave."""
    return (
        (
            event.created_at,
            event.kind,
            event.step_id or "",
            event.actor,
            redact_text(event.reason),
            redact_event_data(event.data),
        )
        for event in events
    )
