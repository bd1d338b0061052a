"""What programs hold and propose: each person's API tokens, and the plans programs
propose for a person to sign (``tasks_app.operations.tokens``, ``.proposals``).

A token's secret is shown once, when it is made, and stored only as its SHA-256: the
secret is 32 random bytes, so a slow hash would add nothing but time to every call. The
token is found by its prefix (which lists show), then its digest is compared in constant
time.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import models


class AutoApply(models.TextChoices):
    """Which of its own plans a token may apply without a person's signature."""

    NEVER = "never", "None: every plan waits for a person"
    ONE_TASK = "one_task", "A plan on one task with no write in doubt"
    ANY = "any", "Any plan its permissions allow"


class ApiToken(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    # The program's name, as events and the plans' inbox name it ("triage-bot").
    name = models.CharField(max_length=64)
    # The token's public part, shown in lists and logs; the secret follows it.
    prefix = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64)
    # The token may do what this group's permissions allow and its user may do, no more.
    group = models.ForeignKey(Group, on_delete=models.PROTECT, related_name="+")
    auto_apply = models.CharField(max_length=16, choices=AutoApply.choices, default=AutoApply.NEVER)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=200, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    last_used_address = models.GenericIPAddressField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            # A person names each live program once, so events and the inbox tell them apart.
            models.UniqueConstraint(
                fields=["user", "name"],
                name="api_token_name_per_user",
                condition=models.Q(revoked_at__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"token {self.name} ({self.prefix}) of {self.user}"


class PlanStatus(models.TextChoices):
    PROPOSED = "proposed", "Awaiting a signature"
    APPLIED = "applied", "Applied"
    DECLINED = "declined", "Declined"


class ProposedPlan(models.Model):
    """An operator action on tasks or a queue, as a program proposed it: what its preview
    chose (the tasks, or the queue) is fixed when it is proposed, and applying it touches
    that and nothing else. Its id is the plan id every event of its application carries."""

    id = models.CharField(max_length=32, primary_key=True)
    # A row of ``task_actions.ACTIONS``, or ``pause_queue`` / ``resume_queue``.
    action = models.CharField(max_length=40)
    # The dead letters' filter it was chosen by (``listings.DeadFilter`` fields), if any.
    filters = models.JSONField(default=dict, blank=True)
    task_ids = models.JSONField(default=list, blank=True)
    # How many tasks matched when proposed (more than ``task_ids`` when the limit cut them).
    matched = models.PositiveIntegerField(default=0)
    limit = models.PositiveIntegerField(default=0)
    queue = models.CharField(max_length=64, blank=True)
    params = models.JSONField(default=dict, blank=True)
    # Writes in doubt among the chosen tasks' dead steps when proposed.
    in_doubt = models.PositiveIntegerField(default=0)
    reason = models.TextField()
    token = models.ForeignKey(
        ApiToken, null=True, blank=True, on_delete=models.SET_NULL, related_name="plans"
    )
    proposed_by = models.CharField(max_length=200)
    proposed_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    proposed_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    status = models.CharField(max_length=16, choices=PlanStatus.choices, default="proposed")
    decided_by = models.CharField(max_length=200, blank=True)
    decided_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.TextField(blank=True)
    # What applying it did: {"changed": [...], "skipped": [[id, why], ...]}.
    outcome = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-proposed_at"]
        indexes = [
            # The inbox: plans awaiting a signature, oldest first.
            models.Index(
                fields=["proposed_at"],
                name="plan_awaiting_idx",
                condition=models.Q(status="proposed"),
            ),
        ]

    def __str__(self) -> str:
        return f"plan {self.id} ({self.action})"
