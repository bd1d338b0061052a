"""The task admin's parts: changelist filters (and the lookups refused), the operator
actions it offers, and the escaped HTML its read-only pages show, with what producers and
people wrote redacted (``tasks_app.redaction``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
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
from tasks_app.history.timeline import HistoryEntry
from tasks_app.models import Task, TaskStatus
from tasks_app.operations.task_actions import ACTIONS, ActionSpec
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


class StatusFilter(admin.SimpleListFilter):
    """A task's status as people read it: running while a step runs (``Task.live_status``)."""

    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(str(value), str(label)) for value, label in TaskStatus.choices]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Task]) -> QuerySet[Task]:
        value = self.value()
        return queryset & Task.objects.in_status(value) if value else queryset


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


# The changelist's operator actions: one per row of ``task_actions.ACTIONS``, by its name.
OperatorAction = ActionSpec
OPERATOR_ACTIONS = ACTIONS


def permission_name(spec: ActionSpec) -> str:
    """The short name of an action's permission, as the admin's ``has_<name>_permission``
    says it: ``redrive`` for ``redrive_task``."""
    return spec.permission.removesuffix("_task")


def with_operator_actions[AdminT: type[admin.ModelAdmin[Any]]](cls: AdminT) -> AdminT:
    """Give a task admin one changelist action per row of the table (a method named as the
    action, calling ``cls._operator_action``) and a ``has_<name>_permission`` check per
    permission the rows need (unless the class has its own)."""
    for spec in ACTIONS.values():
        short = permission_name(spec)
        if not hasattr(cls, f"has_{short}_permission"):
            setattr(cls, f"has_{short}_permission", _permission_check(spec.permission))
        setattr(cls, spec.name, _admin_action(spec, short))
    setattr(cls, "actions", tuple(ACTIONS))  # noqa: B010 (a generic class attribute)
    return cls


def _permission_check(permission: str) -> Any:
    def check(self: Any, request: HttpRequest) -> bool:
        return request.user.has_perm(f"tasks_app.{permission}")

    return check


def _admin_action(spec: ActionSpec, permission: str) -> Any:
    def act(self: Any, request: HttpRequest, queryset: QuerySet[Task]) -> HttpResponse | None:
        result: HttpResponse | None = self._operator_action(request, queryset, spec)
        return result

    act.__name__ = spec.name
    return admin.action(description=f"{spec.label}: the selected tasks", permissions=[permission])(
        act
    )


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


def event_rows(events: Iterable[HistoryEntry]) -> Iterator[tuple[Any, ...]]:
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
