"""How a program is known: only a live token is answered (anything else is 401 with
``WWW-Authenticate: Bearer``, saying nothing of the token), each use is recorded, calls are
limited per token and minute, and a refused write leaves its log line."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from console import throttle
from tasks_app.models import ApiToken, Task
from tasks_app.operations import tokens
from tests.api_support import call, conforms, token_for

pytestmark = pytest.mark.django_db

TASKS = "/api/v1/tasks/"


def _token(secret: str) -> ApiToken:
    return ApiToken.objects.get(prefix=secret.split("_")[1])


def wrong_secret(secret: str, user: User) -> str:
    return secret[:-4] + ("AAAA" if not secret.endswith("AAAA") else "BBBB")


def unknown_prefix(secret: str, user: User) -> str:
    return "tc_00000000_" + secret.split("_", 2)[2]


def expired(secret: str, user: User) -> str:
    ApiToken.objects.filter(pk=_token(secret).pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    return secret


def revoked(secret: str, user: User) -> str:
    tokens.revoke(_token(secret), actor=user, reason="it leaked into a log")
    return secret


def of_an_inactive_user(secret: str, user: User) -> str:
    user.is_active = False
    user.save(update_fields=["is_active"])
    return secret


def not_a_token_at_all(secret: str, user: User) -> str:
    return "hunter2"


SPOILED: list[Callable[[str, User], str]] = [
    wrong_secret,
    unknown_prefix,
    expired,
    revoked,
    of_an_inactive_user,
    not_a_token_at_all,
]


@pytest.mark.parametrize("spoil", SPOILED, ids=lambda spoil: spoil.__name__)
def test_a_call_without_a_live_token_is_401_saying_bearer(
    spoil: Callable[[str, User], str], oncall: User
) -> None:
    secret = spoil(token_for(oncall, "oncall"), oncall)
    answer = call("GET", TASKS, secret)
    assert answer.status_code == 401
    assert answer["WWW-Authenticate"] == "Bearer"
    assert conforms(answer, "GET", TASKS)["error"] == "not_authenticated"


@pytest.mark.parametrize(
    "authorization", [None, "Basic b2xpdmlhOnB3", "Bearer"], ids=["none", "basic", "empty"]
)
def test_a_call_with_no_bearer_token_is_401(authorization: str | None) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    answer = Client().get(TASKS, headers=headers)
    assert answer.status_code == 401
    assert answer["WWW-Authenticate"] == "Bearer"


def test_an_unknown_or_dead_token_is_refused_in_the_same_words(oncall: User) -> None:
    secret = token_for(oncall, "oncall")
    live_but_wrong = call("GET", TASKS, wrong_secret(secret, oncall)).json()
    nobody = call("GET", TASKS, unknown_prefix(secret, oncall)).json()
    assert live_but_wrong == nobody


def test_a_use_records_when_and_from_where(oncall: User) -> None:
    secret = token_for(oncall, "oncall")
    assert _token(secret).last_used_at is None
    answer = Client().get(
        TASKS, headers={"Authorization": f"Bearer {secret}"}, REMOTE_ADDR="203.0.113.7"
    )
    assert answer.status_code == 200
    used = _token(secret)
    assert used.last_used_address == "203.0.113.7"
    assert used.last_used_at is not None
    assert abs(timezone.now() - used.last_used_at) < timedelta(minutes=1)


def test_a_refused_call_was_a_use_too(oncall: User) -> None:
    secret = token_for(oncall, "oncall")
    assert call("GET", "/api/v1/audit/", secret).status_code == 403
    assert _token(secret).last_used_at is not None


def test_the_third_call_in_a_minute_waits_and_another_token_is_still_answered(
    oncall: User, auditor: User, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.API_REQUESTS_PER_MINUTE = 2
    # 20 seconds before a minute ends.
    monkeypatch.setattr(throttle, "clock", lambda: 60 * 1_000_000 + 40.0)
    busy, other = token_for(oncall, "oncall"), token_for(auditor, "auditors")
    assert [call("GET", TASKS, busy).status_code for _ in range(2)] == [200, 200]
    refused = call("GET", TASKS, busy)
    assert refused.status_code == 429
    assert refused["Retry-After"] == "20"
    body = conforms(refused, "GET", TASKS)
    assert body["error"] == "too_many_requests"
    assert "try again in 20 s" in body["detail"]
    assert call("GET", TASKS, other).status_code == 200
    # The next minute counts afresh.
    monkeypatch.setattr(throttle, "clock", lambda: 60 * 1_000_001 + 1.0)
    assert call("GET", TASKS, busy).status_code == 200


def test_a_refused_write_logs_who_tried_what_and_changes_nothing(
    oncall: User, caplog: pytest.LogCaptureFixture
) -> None:
    secret = token_for(oncall, "oncall", name="nightly-import")
    tasks = Task.objects.count()
    with caplog.at_level("WARNING", logger="tasks_app.events"):
        answer = call("POST", TASKS, secret, body={"workflow": "demo.noop", "payload": {}})
    assert answer.status_code == 403
    assert Task.objects.count() == tasks
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("action_")]
    assert line.startswith("action_refused ")
    assert 'user="olivia-oncall via nightly-import"' in line
    # The URL's name and the method: ninja serves one pattern per path, named for its
    # first operation (the list), so the method tells the enqueue apart.
    assert 'action="api:task_list POST"' in line
    assert f"object={TASKS}" in line
    assert "add_task is required" in line


def test_a_refused_read_leaves_no_log_line(oncall: User, caplog: pytest.LogCaptureFixture) -> None:
    secret = token_for(oncall, "oncall")
    with caplog.at_level("WARNING", logger="tasks_app.events"):
        assert call("GET", "/api/v1/audit/", secret).status_code == 403
    assert not [r for r in caplog.records if r.getMessage().startswith("action_refused")]
