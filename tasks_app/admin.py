"""A read-only admin: it shows everything and changes nothing (services own all writes)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from .models import Event, Lease, Step, Task


class ReadOnlyMixin:
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class StepInline(ReadOnlyMixin, admin.TabularInline):
    model = Step
    extra = 0
    can_delete = False
    # A revision's rows beside the rows they replaced.
    ordering = ("position", "revision")
    fields = (
        "position",
        "revision",
        "kind",
        "status",
        "attempts",
        "max_attempts",
        "fencing_token",
        "available_at",
        "lease_expires_at",
        "idempotency_key",
        "error_class",
        "last_error",
        "result",
    )
    readonly_fields = fields


@admin.register(Task)
class TaskAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = (
        "id",
        "workflow",
        "status",
        "queue",
        "priority",
        "idempotency_key",
        "created_at",
    )
    list_filter = ("status", "workflow", "queue")
    search_fields = ("=id", "idempotency_key", "workflow")
    date_hierarchy = "created_at"
    list_per_page = 50
    show_full_result_count = False
    inlines = (StepInline,)
    fields = (
        "workflow",
        "workflow_version",
        "status",
        "queue",
        "priority",
        "idempotency_key",
        "payload",
        "payload_hash",
        "created_by",
        "created_by_user",
        "created_at",
        "finished_at",
        "cancel_requested_at",
        "leases",
        "timeline",
    )
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[Task]:
        return super().get_queryset(request).select_related("created_by_user")

    @admin.display(description="Leases")
    def leases(self, task: Task) -> SafeString:
        rows = Lease.objects.filter(step__task=task).order_by("acquired_at", "id")
        return _table(
            ("step", "token", "worker", "acquired", "expires", "released", "outcome"),
            (
                (
                    lease.step_id,
                    lease.token,
                    lease.worker_id,
                    lease.acquired_at,
                    lease.expires_at,
                    lease.released_at or "",
                    lease.outcome,
                )
                for lease in rows
            ),
        )

    @admin.display(description="Event timeline")
    def timeline(self, task: Task) -> SafeString:
        events = Event.objects.for_task(task.pk)
        return _table(
            ("at", "event", "step", "actor", "reason", "data"),
            ((e.created_at, e.kind, e.step_id or "", e.actor, e.reason, e.data) for e in events),
        )


def _table(headers: tuple[str, ...], rows: Any) -> SafeString:
    """An escaped HTML table (payload and error values are never trusted)."""
    head = format_html_join("", "<th>{}</th>", ((h,) for h in headers))
    body = format_html_join(
        "",
        "<tr>{}</tr>",
        ((format_html_join("", "<td>{}</td>", ((cell,) for cell in row)),) for row in rows),
    )
    return format_html("<table><thead><tr>{}</tr></thead><tbody>{}</tbody></table>", head, body)
