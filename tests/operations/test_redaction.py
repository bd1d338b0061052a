"""The redaction rule (tasks_app.redaction): which keys are secrets, how structures, free
text and event data are redacted, and the setting that names the patterns."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from approvals import services as approvals
from tasks_app import services
from tasks_app.engine import runner
from tasks_app.history import timeline
from tasks_app.models import Event
from tasks_app.redaction import (
    REDACTED,
    SYSTEM_EVENT_KEYS,
    is_secret_key,
    redact,
    redact_event_data,
    redact_text,
)
from tests.approval_support import advance, article, pending_request
from tests.conftest import only_step
from tests.factories import dead_task
from tests.lease_support import claim, expire_lease
from tests.settings_support import load_settings

SECRETS = {"password": "hunter2", "api_token": "abc", "nested": [{"Client-Secret": "x"}]}


@pytest.mark.parametrize(
    "key",
    [
        "password",
        "PASSWORD",
        "api_token",
        "Client-Secret",
        "X-API-KEY",
        "apiKey",
        "privateKey",
        "private-key",
        "db_passwd",
        "Authorization",
        "Set-Cookie",
        "SESSION_ID",
        "aws_credentials",
        "refresh token",
    ],
)
def test_a_key_is_a_secret_when_its_name_contains_a_pattern_in_any_spelling(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["title", "ticket_id", "note", "api", "key", "private", "pass"])
def test_other_keys_are_not_secrets(key: str) -> None:
    assert not is_secret_key(key)


def test_secrets_are_redacted_at_any_depth_and_in_lists_leaving_the_original_alone() -> None:
    value = {**SECRETS, "title": "kept", "deep": {"list": [[{"Session": "s1"}], "plain"]}}
    assert redact(value) == {
        "password": REDACTED,
        "api_token": REDACTED,
        "nested": [{"Client-Secret": REDACTED}],
        "title": "kept",
        "deep": {"list": [[{"Session": REDACTED}], "plain"]},
    }
    assert value["password"] == "hunter2"


def test_a_secret_key_hides_its_whole_value_whatever_it_holds() -> None:
    assert redact({"credentials": {"user": "u", "pw": "p"}, "tokens": [1, 2]}) == {
        "credentials": REDACTED,
        "tokens": REDACTED,
    }


def test_free_text_loses_the_value_after_each_secret_key() -> None:
    text = (
        "remote refused {'api_token': 'abc'} and {\"Client-Secret\": \"x\"} with "
        "Authorization: Bearer abc at /hook?session_id=s1&retry=1 (password=hunter2)"
    )
    assert redact_text(text) == (
        f"remote refused {{'api_token': {REDACTED}}} and {{\"Client-Secret\": {REDACTED}}} "
        f"with Authorization: {REDACTED} at /hook?session_id={REDACTED}&retry=1 "
        f"(password={REDACTED})"
    )


def test_free_text_finds_a_secret_inside_another_value_and_keeps_the_rest() -> None:
    text = "GET url=https://h.example/x?api_key=k-1&page=2 failed: status=500"
    assert redact_text(text) == (
        f"GET url=https://h.example/x?api_key={REDACTED}&page=2 failed: status=500"
    )


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        # JSON inside a message, and JSON inside a string (its quotes escaped)
        ('remote said {"token": "t-1"}', f'remote said {{"token": {REDACTED}}}'),
        ('body={\\"token\\": \\"t-1\\"}', f'body={{\\"token\\": {REDACTED}}}'),
        ("{\\'password\\': \\'pw\\'}", f"{{\\'password\\': {REDACTED}}}"),
        ('token="a\\"b" next', f"token={REDACTED} next"),
        # URL-encoded keys, separators and quotes
        ("GET /x?api%5Fkey=k-1&page=2", f"GET /x?api%5Fkey={REDACTED}&page=2"),
        ("api%5fkey%3Dk-1", f"api%5fkey%3D{REDACTED}"),
        (
            "next=%2Fx%3Fq%3D1%26token%3Ds-1%26page%3D2",
            f"next=%2Fx%3Fq%3D1%26token%3D{REDACTED}%26page%3D2",
        ),
        ("%22api_key%22%3A%20%22k%201%22, ok", f"%22api_key%22%3A%20{REDACTED}, ok"),
        ("Api%2DKey: k-1", f"Api%2DKey: {REDACTED}"),
        # a value that starts with a delimiter
        ("password=,hunter2 retry=1", f"password={REDACTED} retry=1"),
        ("password=;pw&x=1", f"password={REDACTED}&x=1"),
    ],
)
def test_free_text_finds_secrets_quoted_escaped_or_url_encoded(text: str, shown: str) -> None:
    assert redact_text(text) == shown


def test_event_data_keeps_the_systems_own_keys_and_redacts_the_producers() -> None:
    data = {
        "token": 7,
        "current_token": 8,
        "steps": {"12": ["pending", 0, 7]},
        "task_status": "pending",
        "draft_hash": "ab" * 32,
        "old_payload": SECRETS,
        "new_payload": {**SECRETS, "title": "t"},
        "error": "PermanentError: bad input {'password': 'hunter2'}",
    }
    shown = redact_event_data(data)
    assert {key: shown[key] for key in SYSTEM_EVENT_KEYS & data.keys()} == {
        key: data[key] for key in SYSTEM_EVENT_KEYS & data.keys()
    }
    assert shown["old_payload"] == redact(SECRETS)
    assert shown["new_payload"]["title"] == "t"
    assert shown["error"] == f"PermanentError: bad input {{'password': {REDACTED}}}"
    assert "hunter2" not in repr(shown) and "'abc'" not in repr(shown)


def test_an_event_key_the_system_does_not_name_is_treated_as_producer_data() -> None:
    shown = redact_event_data({"password": "p", "extra": {"api_key": "k"}, "note": "token=t"})
    assert shown == {
        "password": REDACTED,
        "extra": {"api_key": REDACTED},
        "note": f"token={REDACTED}",
    }


def test_the_patterns_are_a_setting(settings: Any) -> None:
    settings.REDACT_KEY_PATTERNS = ["ticket-id"]
    assert redact({"Ticket_ID": "T-1", "password": "visible"}) == {
        "Ticket_ID": REDACTED,
        "password": "visible",
    }


def test_the_patterns_come_from_the_environment_and_the_old_key_lists_add_to_them() -> None:
    code = "from django.conf import settings; print(','.join(settings.REDACT_KEY_PATTERNS))"
    assert load_settings(code, REDACT_KEY_PATTERNS="pin, otp").stdout.strip() == "pin,otp"
    old = load_settings(code, CONSOLE_REDACT_KEYS="ssn", TASKS_LOG_REDACT_KEYS="pin,token")
    patterns = old.stdout.strip().split(",")
    assert patterns[-2:] == ["ssn", "pin"] and "password" in patterns


# What producers and people put in an event's data; everything else there is the system's.
PRODUCER_EVENT_KEYS = {"old_payload", "new_payload", "error"}


@pytest.mark.django_db
def test_every_key_the_system_writes_in_event_data_is_named_as_its_own(
    oncall: User, editor: User
) -> None:
    """A key missing from SYSTEM_EVENT_KEYS would be redacted as producer data: this runs
    the transitions that write event data and checks none is left unnamed."""
    task = dead_task({"error": "permanent", "fail_first": 1})
    services.redrive(task, actor=oncall, reason="r", payload={"fail_first": 0})
    advance(task)
    advance(services.enqueue("demo.flaky", {"error": "retryable", "fail_first": 1}).task)
    unknown = dead_task({"error": "outcome_unknown", "fail_first": 1})
    services.resolve(unknown, actor=oncall, reason="r", outcome="done")
    services.cancel(dead_task(), actor=oncall, reason="r")
    services.pause_queue("default", actor=oncall, reason="r")
    services.resume_queue("default", actor=oncall, reason="r")
    expired = services.enqueue("demo.noop", {}).task
    stale = claim(only_step(expired))
    expire_lease(only_step(expired))
    services.complete_step(stale, result={})
    review = advance(article(key="publish:redaction:1"))
    approvals.request_changes(pending_request(review), actor=editor, comment="shorter")
    approvals.approve(pending_request(advance(review)), actor=editor)

    written = {key for data in Event.objects.values_list("data", flat=True) for key in data}
    assert {"token", "old_payload", "error", "retry_in", "current_token", "back_to"} <= written
    assert written - SYSTEM_EVENT_KEYS <= PRODUCER_EVENT_KEYS


def test_a_results_token_is_redacted_as_documented_and_an_events_token_is_not(
    oncall: User,
) -> None:
    """The README's rule: every key of a result follows the patterns; only the event keys
    the system writes (``SYSTEM_EVENT_KEYS``) are exempt."""
    task = services.enqueue("demo.flaky", {}).task
    runner.run_task_steps(task)
    step = only_step(task)
    step.refresh_from_db()
    assert step.result == {"token": step.fencing_token, "attempt": 1}
    assert redact(step.result) == {"token": REDACTED, "attempt": 1}
    claimed = next(entry for entry in timeline.history(task.pk) if entry.kind == "succeeded")
    assert "token" in claimed.data
    assert redact_event_data(claimed.data)["token"] == claimed.data["token"]
    assert "token" in SYSTEM_EVENT_KEYS
