"""Approval requests: a draft waiting for a person's decision (DESIGN rule 9)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from tasks_app.models import Step, Task


class ApprovalStatus(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    CHANGES_REQUESTED = "changes_requested"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


class ExpiryPolicy(models.TextChoices):
    CANCEL = "cancel"
    DEAD_LETTER = "dead_letter"


class ApprovalRequest(models.Model):
    """What will happen, on which data, the draft under review and who may decide.

    Written when its task reaches the approval step and changed only by
    ``approvals.services``: a request is decided once (pending -> one other status).
    """

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="approval_requests")
    step = models.ForeignKey(
        Step, on_delete=models.CASCADE, related_name="approval_requests", db_index=False
    )
    revision = models.PositiveSmallIntegerField(default=0)
    status = models.CharField(
        max_length=20, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING
    )
    # What follows an approval ("publish", "send") and a line on what it affects.
    action = models.CharField(max_length=100)
    summary = models.TextField()
    # The draft to review (the drafting step's result) and the hash a decision must carry.
    draft = models.JSONField()
    draft_hash = models.CharField(max_length=64)
    # The drafting step's kind: the latest draft is its current row's result.
    draft_step = models.CharField(max_length=100)
    # The step "request changes" sends the task back to.
    send_back_to = models.CharField(max_length=100)
    # Who may decide: members of the group and/or these usernames (superusers always).
    approver_group = models.CharField(max_length=150, blank=True)
    approver_users = models.JSONField(default=list, blank=True)
    on_expiry = models.CharField(max_length=20, choices=ExpiryPolicy.choices)
    # Whoever enqueued the task: they may not decide on it.
    requested_by = models.CharField(max_length=150)
    requested_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    decided_by = models.CharField(max_length=150, blank=True)
    decided_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    comment = models.TextField(blank=True)

    class Meta:
        ordering = ["-id"]
        permissions = [("decide_approvalrequest", "Can approve, reject or send back a draft")]
        constraints = [
            # A step waits on one request at a time (a redrive after expiry opens another).
            models.UniqueConstraint(
                fields=["step"],
                condition=Q(status="pending"),
                name="approval_one_pending_per_step",
            ),
            models.CheckConstraint(
                condition=Q(status__in=ApprovalStatus.values), name="approval_status_valid"
            ),
        ]
        indexes = [
            # The sweeper's expiry scan and the Approvals page: pending requests by expiry.
            models.Index(
                fields=["expires_at"],
                name="approval_pending_idx",
                condition=Q(status="pending"),
            ),
            # A step's requests (its history across redrives).
            models.Index(fields=["step", "id"], name="approval_step_idx"),
        ]

    def __str__(self) -> str:
        return f"approval #{self.pk} of task #{self.task_id} r{self.revision} ({self.status})"
