"""Each user's reads of the console, limited per minute (console.throttle): past the limit
429 with Retry-After until the minute ends, counted per user in the cache, never for the
probes, the metrics or a visitor who has not logged in, and not at all while the cache is
unreachable."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from console import throttle
from tests.console_support import HTMX, body, login

pytestmark = pytest.mark.django_db

# Ten seconds into a minute.
MINUTE_START = 29_000_000 * 60.0


@pytest.fixture
def limit(settings: Any, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """A limit of 3 reads a minute, and the limiter's clock, moved by setting ``[0]``."""
    settings.CONSOLE_READS_PER_MINUTE = 3
    now = [MINUTE_START + 10]
    monkeypatch.setattr(throttle, "clock", lambda: now[0])
    return now


def test_reads_past_the_limit_answer_429_with_retry_after_until_the_minute_ends(
    limit: list[float], oncall: User
) -> None:
    client = login(oncall)
    assert [client.get("/tasks/").status_code for _ in range(3)] == [200, 200, 200]
    refused = client.get("/tasks/")
    assert refused.status_code == 429
    assert refused["Retry-After"] == "50"
    page = body(refused)
    assert "<h1>Too many requests</h1>" in page
    assert "more than 3 pages a minute (CONSOLE_READS_PER_MINUTE)" in page
    assert "Try again in 50 seconds" in page and "<table" not in page
    limit[0] = MINUTE_START + 60
    assert client.get("/tasks/").status_code == 200


def test_the_limit_is_each_users_own(limit: list[float], oncall: User, auditor: User) -> None:
    busy = login(oncall)
    for _ in range(4):
        busy.get("/")
    assert busy.get("/").status_code == 429
    assert login(auditor).get("/audit/").status_code == 200


def test_an_htmx_read_past_the_limit_gets_the_notice_in_the_message_region(
    limit: list[float], oncall: User
) -> None:
    client = login(oncall)
    for _ in range(3):
        client.get("/tasks/", headers=HTMX)
    refused = client.get("/tasks/", headers=HTMX)
    assert refused.status_code == 429
    assert refused["HX-Retarget"] == "#messages" and refused["Retry-After"] == "50"
    assert body(refused).startswith('<p class="notice error" role="alert"><strong>Too many')


def test_probes_metrics_and_the_login_page_are_never_counted(
    limit: list[float], oncall: User
) -> None:
    client = login(oncall)
    for _ in range(3):
        client.get("/tasks/")
    assert client.get("/tasks/").status_code == 429
    for path in ("/healthz", "/readyz", "/metrics"):
        assert client.get(path).status_code != 429, path
    visitor = login(oncall)
    visitor.logout()
    assert {visitor.get("/accounts/login/").status_code for _ in range(5)} == {200}


def test_writes_are_not_reads(limit: list[float], oncall: User) -> None:
    client = login(oncall)
    for _ in range(3):
        client.get("/tasks/")
    assert client.post("/dead/bulk/", {"action": "redrive"}).status_code != 429


def test_reads_go_on_uncounted_while_the_cache_cannot_be_reached(
    limit: list[float], settings: Any, oncall: User
) -> None:
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
        }
    }
    client = login(oncall)
    assert {client.get("/tasks/").status_code for _ in range(5)} == {200}


def test_no_limit_when_the_setting_is_zero(limit: list[float], settings: Any, oncall: User) -> None:
    settings.CONSOLE_READS_PER_MINUTE = 0
    client = login(oncall)
    assert {client.get("/tasks/").status_code for _ in range(5)} == {200}
