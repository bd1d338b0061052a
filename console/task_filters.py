"""The task list's filter: the fields ``/tasks/`` reads from its query string."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings

from console.forms import _Filter, _set_choices, parse_json
from tasks_app.exceptions import InvalidInput
from tasks_app.models import TaskStatus
from tasks_app.operations import listings
from tasks_app.operations.listings import RETRY_SCHEDULED, TaskFilter, workflow_names

# The statuses as the overview's cards count them: a pending task waiting for a scheduled
# retry is listed under "Retry scheduled", not under "Pending".
STATUS_CHOICES = [
    ("", "any"),
    (TaskStatus.PENDING, "Pending (no retry scheduled)"),
    (RETRY_SCHEDULED, "Retry scheduled"),
    *((value, label) for value, label in TaskStatus.choices if value != TaskStatus.PENDING),
]


class TaskFilterForm(_Filter):
    status = forms.ChoiceField(required=False, choices=STATUS_CHOICES)
    workflow = forms.ChoiceField(required=False)
    queue = forms.ChoiceField(required=False)
    key = forms.CharField(
        required=False,
        max_length=255,
        label="Idempotency key",
        help_text="Its start is enough, e.g. publish:article-001",
    )
    payload = forms.CharField(
        required=False,
        max_length=500,
        label="Payload field",
        help_text="FIELD=VALUE, e.g. article_id=article-001 or customer.id=42",
    )
    since = forms.DateTimeField(required=False, help_text="Created at or after (UTC)")
    until = forms.DateTimeField(required=False, help_text="Created before (UTC)")
    finished_since = forms.DateTimeField(
        required=False, label="Finished since", help_text="Finished at or after (UTC)"
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _set_choices(self, workflow=workflow_names(), queue=list(settings.TASKS_QUEUES))

    def clean_payload(self) -> tuple[str, Any] | None:
        raw: str = self.cleaned_data["payload"].strip()
        if not raw:
            return None
        path, sep, text = raw.partition("=")
        path = path.strip()
        if not sep or not path or any(not part for part in path.split(".")):
            raise forms.ValidationError("payload: write FIELD=VALUE (a dotted path for nesting)")
        try:
            value = parse_json(text, "payload")
        except forms.ValidationError:
            value = text
        try:
            # The rules of a payload (what PostgreSQL can compare), and no secret compared.
            listings.check_payload_filter(path, value)
        except InvalidInput as exc:
            raise forms.ValidationError(str(exc)) from None
        return path, value

    def filters(self) -> TaskFilter:
        data = self.cleaned_data if self.is_valid() else {}
        return TaskFilter(
            status=data.get("status", ""),
            workflow=data.get("workflow", ""),
            queue=data.get("queue", ""),
            key=data.get("key", ""),
            payload=data.get("payload"),
            since=data.get("since"),
            until=data.get("until"),
            finished_since=data.get("finished_since"),
        )
