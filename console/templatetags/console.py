"""The console's template filters and tags: times, labels, redaction, diffs and the wording
of decisions."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django import template
from django.utils.html import conditional_escape, format_html
from django.utils.safestring import mark_safe

from approvals import models as approval_models
from approvals.models import ApprovalRequest
from console import presenters
from tasks_app.operations.task_actions import ACTIONS, ActionSpec

register = template.Library()


@register.filter
def duration(value: timedelta | None) -> str:
    return presenters.short_duration(value)


@register.filter
def seconds_duration(value: Any) -> str:
    """A number of seconds as a duration (``delay_seconds`` of 900 as ``15 min``)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return "—"
    return presenters.short_duration(timedelta(seconds=value))


@register.filter
def percent(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


@register.filter
def seconds(value: float | None) -> str:
    """A run time: ``8 ms``, ``1.4 s``, ``3.5 min``; "—" for none (or a missing value)."""
    return presenters.seconds(value if isinstance(value, int | float) else None)


@register.filter
def pretty_json(value: Any) -> str:
    """Indented JSON with secrets redacted (escaped by the template like any text)."""
    return presenters.pretty_json(value)


@register.filter
def since(value: Any, now: Any) -> str:
    """How long before ``now`` the moment ``value`` was."""
    if value is None or now is None:
        return "—"
    return presenters.short_duration(max(now - value, timedelta(0)))


@register.filter
def label(value: str | None) -> str:
    """``waiting_approval`` as ``waiting approval``."""
    return (value or "").replace("_", " ")


@register.filter
def action_label(value: str) -> str:
    """An operator action by the name its buttons give it: ``resolve_done`` as ``Mark done``."""
    return ACTIONS[value].label


@register.filter
def action_spec(value: str) -> ActionSpec:
    """An operator action's row of the table (``task_actions.ACTIONS``)."""
    return ACTIONS[value]


@register.filter
def error_summary(text: str | None) -> str:
    """An error's last line, with the values of secret keys removed."""
    return presenters.error_summary(text or "")


@register.filter
def redact_text(text: str | None) -> str:
    """Free text (an error, a reason) with the values of secret keys removed."""
    return presenters.redact_text(text or "")


@register.simple_tag
def when(value: datetime | None, style: str = "relative") -> str:
    """A moment in a ``<time>`` element. ``relative`` (the default, for tables) shows "3 min
    ago" with the absolute time and its zone on hover; ``full`` shows the absolute time
    with its zone, then the relative one; "—" for no moment. ``data-when`` tells
    console.js which text to keep current."""
    if value is None:
        return "—"
    absolute, relative = presenters.moment(value)
    if style == "full":
        return format_html(
            '<time datetime="{}" title="{}" data-when="full">'
            '{} <span class="muted">({})</span></time>',
            value.isoformat(),
            relative,
            absolute,
            relative,
        )
    return format_html(
        '<time datetime="{}" title="{}" data-when="relative">{}</time>',
        value.isoformat(),
        absolute,
        relative,
    )


@register.filter
def payload_changes(data: dict[str, Any]) -> list[presenters.Change]:
    """The payload fields a ``redriven`` event's edit changed (none without an edit)."""
    if "new_payload" not in data:
        return []
    return presenters.payload_changes(data.get("old_payload"), data["new_payload"])


@register.filter
def dotted(value: str | None) -> str:
    """A dotted name (an error class) that may break after each dot on a narrow screen,
    never inside a word."""
    return mark_safe(".<wbr>".join(conditional_escape(part) for part in (value or "").split(".")))  # noqa: S308 (each part is escaped)


@register.filter
def decision_text(request: ApprovalRequest) -> str:
    """What became of an approval request, as a plain sentence ("mara asked for changes")."""
    return approval_models.decision_text(request)


@register.filter
def plan_label(action: str) -> str:
    """A program's plan's action as people read it ("Redrive", "Pause queue")."""
    from tasks_app.operations.proposals import action_label

    return action_label(action)


@register.filter
def urlencode_dict(values: dict[str, Any]) -> str:
    """A filter's fields as a query string, the empty ones left out."""
    from urllib.parse import urlencode

    return urlencode({key: value for key, value in values.items() if value})
