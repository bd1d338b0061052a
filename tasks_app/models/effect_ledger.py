"""The table of the side-effects ledger, which ``tasks_app.engine.effects`` writes before and
after each external call a step makes."""

from __future__ import annotations

from django.db import models

from tasks_app.models.json_columns import TolerantJSONField
from tasks_app.models.work import Step


class Effect(models.Model):
    """The side-effects ledger: one row per external write, keyed by step key + name."""

    class Status(models.TextChoices):
        STARTED = "started"
        DONE = "done"

    key = models.CharField(max_length=500, unique=True)
    step = models.ForeignKey(Step, on_delete=models.CASCADE, related_name="effects")
    # The claim that started the call.
    token = models.PositiveBigIntegerField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.STARTED)
    result = TolerantJSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"effect {self.key} ({self.status})"
