"""Flow control's state (``tasks_app.engine.limits``): each limit as the database knows it,
and each partition key of a limit.

The claim of a step under limits locks every ``LimitState`` row first, so claims under
limits are decided one at a time across every worker on every host, and reads the
running steps and the rate windows after taking that lock.
"""

from __future__ import annotations

from django.db import models


class LimitState(models.Model):
    """A limit by name: an operator's live change of its numbers, and its turn clock (the
    latest turn a claim took, where a key that was idle starts again: fairness)."""

    name = models.CharField(max_length=64, primary_key=True)
    # When an operator changed the limit live, these numbers are the ones in effect (None:
    # no such cap), over the declaration and TASKS_LIMITS.
    overridden = models.BooleanField(default=False)
    concurrency = models.PositiveIntegerField(null=True, blank=True)
    rate = models.CharField(max_length=32, blank=True)
    turn = models.BigIntegerField(default=0)
    changed_by = models.CharField(max_length=200, blank=True)
    changed_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"limit {self.name}"


class LimitKey(models.Model):
    """One partition of a limit (key '' for an unpartitioned limit): the last turn given to
    its steps, its rate window, and whether an operator paused it."""

    limit = models.CharField(max_length=64)
    key = models.CharField(max_length=200, blank=True)
    last_turn = models.BigIntegerField(default=0)
    # The rate's spend, by slice of the period: {"slice": the newest slice's number,
    # "spent": [units per slice, oldest first]} (limit_standing.Window).
    window = models.JSONField(default=dict, blank=True)
    paused_at = models.DateTimeField(null=True, blank=True)
    paused_by = models.CharField(max_length=200, blank=True)
    paused_reason = models.TextField(blank=True)
    # A remote answered "too many requests, try after ...": no step under this key starts
    # before then (exceptions.RateLimited).
    held_until = models.DateTimeField(null=True, blank=True)
    held_reason = models.TextField(blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["limit", "key"], name="limitkey_limit_key"),
        ]

    def __str__(self) -> str:
        return f"limit {self.limit} key {self.key!r}" if self.key else f"limit {self.limit}"
