"""Approval requests: a draft waiting for a person's decision (DESIGN rule 9)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from tasks_app.models import Step, Task


class ApprovalStatus(models.TextChoices):
    PENDING = "pending", "Waiting for a decision"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    CHANGES_REQUESTED = "changes_requested", "Sent back for changes"
    EXPIRED = "expired", "Expired"
    CANCELLED = "cancelled", "Cancelled"
    # An editor revised the draft: a request for the edited revision replaced this one.
    EDITED = "edited", "Replaced by an edit"


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
    # How many distinct people must approve (any rejection ends the request at once).
    quorum = models.PositiveSmallIntegerField(default=1, db_default=1)
    # Who wrote the draft under review when not the workflow: the editor who edited it.
    draft_author = models.CharField(max_length=150, blank=True, default="", db_default="")
    # The reminder before expiry, due at ``remind_at`` and sent once (``reminded_at``).
    remind_at = models.DateTimeField(null=True, blank=True)
    reminded_at = models.DateTimeField(null=True, blank=True)
    # Undecided at ``escalates_at``, the request opens to ``escalate_to`` too.
    escalate_to = models.CharField(max_length=150, blank=True, default="", db_default="")
    escalates_at = models.DateTimeField(null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True)

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

    @property
    def groups(self) -> list[str]:
        """The groups whose members may decide: the request's, and once escalated, the
        second group."""
        named = [self.approver_group, self.escalate_to if self.escalated_at else ""]
        return [group for group in named if group]


class ApprovalVote(models.Model):
    """One person's approval of one request (its draft: the request's hash). A request with
    a quorum of N is approved by its N-th distinct voter; a person counts once."""

    request = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="votes")
    voter = models.CharField(max_length=150)
    voter_user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    draft_hash = models.CharField(max_length=64)
    comment = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["request", "voter"], name="approval_vote_once"),
        ]

    def __str__(self) -> str:
        return f"{self.voter} approved approval #{self.request_id}"


def decision_text(request: ApprovalRequest) -> str:
    """What became of a request, in a plain sentence without its time ("Rejected by mara",
    "mara asked for changes"): the one wording of a request's state, for pages, mail and
    refusals."""
    who = request.decided_by or "someone"
    texts: dict[str, str] = {
        ApprovalStatus.PENDING: "Waiting for a decision",
        ApprovalStatus.APPROVED: f"Approved by {who}",
        ApprovalStatus.REJECTED: f"Rejected by {who}",
        ApprovalStatus.CHANGES_REQUESTED: f"{who} asked for changes",
        ApprovalStatus.EXPIRED: "Expired: nobody decided in time",
        ApprovalStatus.CANCELLED: f"Cancelled with its task by {who}",
        ApprovalStatus.EDITED: f"{who} edited the draft: a new revision replaced it",
    }
    return texts.get(request.status, request.status)
