"""Approval requests in the admin, read-only: decisions go through approvals.services."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin

from tasks_app.admin import ReadOnlyMixin

from .models import ApprovalRequest

if TYPE_CHECKING:
    RequestModelAdmin = admin.ModelAdmin[ApprovalRequest]
else:
    RequestModelAdmin = admin.ModelAdmin


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnlyMixin, RequestModelAdmin):
    list_display = (
        "id",
        "task",
        "revision",
        "status",
        "action",
        "approver_group",
        "requested_by",
        "decided_by",
        "expires_at",
    )
    list_filter = ("status", "action", "approver_group")
    search_fields = ("task__idempotency_key", "requested_by", "decided_by")
    list_select_related = ("task",)
    readonly_fields = [field.name for field in ApprovalRequest._meta.fields]
