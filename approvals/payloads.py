"""The payload rules of the workflows with an editor in the loop, and the same rules on the
text fields of a draft an editor edits in review. Each names every field that breaks a
rule at once (:func:`tasks_app.exceptions.all_of`)."""

from __future__ import annotations

from typing import Any

from tasks_app.exceptions import InvalidInput, InvalidPayload, refuse_all


def _fields(payload: dict[str, Any], limits: dict[str, int]) -> None:
    """Exactly the named fields, each a non-empty string within its length limit; every
    field that breaks a rule is named at once."""
    errors: list[InvalidInput] = [
        InvalidPayload(f"payload.{name}", "known_field", f"payload.{name}: not a field")
        for name in sorted(set(payload) - set(limits))
    ]
    errors.extend(_text_errors(payload, limits, "payload"))
    refuse_all(errors)


def _texts(values: dict[str, Any], limits: dict[str, int], prefix: str) -> None:
    """Each named field a non-empty string within its length limit (errors name
    ``<prefix>.<field>``, all at once)."""
    refuse_all(_text_errors(values, limits, prefix))


def _text_errors(values: dict[str, Any], limits: dict[str, int], prefix: str) -> list[InvalidInput]:
    errors: list[InvalidInput] = []
    for name, limit in limits.items():
        value = values.get(name)
        field = f"{prefix}.{name}"
        if not isinstance(value, str) or not value.strip():
            errors.append(
                InvalidPayload(field, "required", f"{field}: a non-empty string is required")
            )
        elif len(value) > limit:
            errors.append(
                InvalidPayload(field, "max_length", f"{field}: at most {limit} characters")
            )
    return errors


def validate_article(payload: dict[str, Any]) -> None:
    _fields(payload, {"article_id": 100, "title": 300, "brief": 10_000})


def validate_ticket(payload: dict[str, Any]) -> None:
    _fields(payload, {"ticket_id": 100, "customer_id": 100, "message": 10_000})


# --- drafts an editor edits in review: the same rules, on the draft's text fields ------------


def check_article_draft(draft: dict[str, Any]) -> None:
    _texts(draft, {"title": 300, "body": 20_000}, "draft")


def check_reply_draft(draft: dict[str, Any]) -> None:
    _texts(draft, {"subject": 300, "body": 20_000}, "draft")
