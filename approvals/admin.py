"""Approval requests in the admin, read-only: decisions go through approvals.services. The
draft and the comment are shown redacted, as everywhere else."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin
from django.utils.safestring import SafeString

from approvals.models import ApprovalRequest
from tasks_app.integrations.admin import ReadOnlyMixin
from tasks_app.integrations.admin_parts import RedactedLookupsRefused, json_block, text_block

if TYPE_CHECKING:
    RequestModelAdmin = admin.ModelAdmin[ApprovalRequest]
else:
    RequestModelAdmin = admin.ModelAdmin


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(RedactedLookupsRefused, ReadOnlyMixin, RequestModelAdmin):
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
    # Shown redacted (free text): no lookup of the query string compares it.
    redacted_text_fields = ("comment",)
    # The draft and the comment came from handlers and people: shown redacted.
    readonly_fields = tuple(
        {"draft": "draft_shown", "comment": "comment_shown"}.get(field.name, field.name)
        for field in ApprovalRequest._meta.fields
    )
    fields = readonly_fields

    @admin.display(description="Draft")
    def draft_shown(self, request: ApprovalRequest) -> SafeString:
        return json_block(request.draft)

    @admin.display(description="Comment")
    def comment_shown(self, request: ApprovalRequest) -> SafeString:
        return text_block(request.comment)
