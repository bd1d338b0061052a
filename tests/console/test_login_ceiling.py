"""A username's ceiling of failed logins from any addresses (console.logins.LoginBackend):
past it the username is slowed, never locked: one try every window / ceiling seconds from
anywhere, a try sooner refused with 429 and Retry-After and not counted; the real user gets
in at the next free try, the slowing ends once the failures leave the window, and /metrics
counts it for the alert. Time moves by back-dating axes' rows."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from axes.models import AccessAttempt
from django.contrib.auth.models import User
from django.db.models import F, Sum
from django.http.response import HttpResponseBase
from django.test import Client

from tests.console_support import body
from tests.metrics_support import scrape, value

pytestmark = pytest.mark.django_db(transaction=True)

PAIR_LIMIT = 3
CEILING = 6
SPACING = 150  # the window's 900 s / CEILING


@pytest.fixture(autouse=True)
def _limits(settings: Any) -> None:
    settings.AXES_FAILURE_LIMIT = PAIR_LIMIT
    settings.CONSOLE_LOGIN_USERNAME_CEILING = CEILING


def log_in(
    user: User, *, right: bool, address: str, url: str = "/accounts/login/"
) -> tuple[Client, HttpResponseBase]:
    client = Client(REMOTE_ADDR=address)
    given = "pw-" + user.username if right else "wrong"
    return client, client.post(url, {"username": user.username, "password": given})


def fail_from_many_addresses(user: User, failures: int) -> None:
    """``failures`` wrong passwords, two from each address: no pair is locked out."""
    for n in range(failures):
        _, response = log_in(user, right=False, address=f"10.1.0.{n // 2 + 1}")
        assert response.status_code == 200


def counted(user: User) -> int:
    found = AccessAttempt.objects.filter(username=user.username)
    return int(found.aggregate(n=Sum("failures_since_start"))["n"] or 0)


def backdate(seconds: int) -> None:
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - timedelta(seconds=seconds))


def test_failures_from_many_addresses_slow_the_username_even_with_the_right_password(
    oncall: User,
) -> None:
    fail_from_many_addresses(oncall, CEILING)
    client, response = log_in(oncall, right=True, address="10.2.0.1")
    assert response.status_code == 429
    assert 0 < int(response["Retry-After"]) <= SPACING
    page = body(response)
    assert "Too many failed logins for this username from many addresses" in page
    assert f"one try every {SPACING} seconds" in page
    assert client.session.get("_auth_user_id") is None
    assert counted(oncall) == CEILING  # the refused try is not counted


def test_below_the_ceiling_other_addresses_are_not_slowed(oncall: User) -> None:
    fail_from_many_addresses(oncall, CEILING - 1)
    _, response = log_in(oncall, right=True, address="10.2.0.1")
    assert response.status_code == 302


def test_the_real_user_gets_in_at_the_next_free_try_and_is_never_locked(oncall: User) -> None:
    fail_from_many_addresses(oncall, CEILING)
    backdate(SPACING + 1)
    client, response = log_in(oncall, right=True, address="10.2.0.1")
    assert response.status_code == 302
    assert client.session.get("_auth_user_id") == str(oncall.pk)


def test_a_wrong_try_after_the_spacing_is_counted_and_slows_the_next(oncall: User) -> None:
    fail_from_many_addresses(oncall, CEILING)
    backdate(SPACING + 1)
    _, wrong = log_in(oncall, right=False, address="10.3.0.1")
    assert wrong.status_code == 200 and counted(oncall) == CEILING + 1
    _, too_soon = log_in(oncall, right=True, address="10.3.0.2")
    assert too_soon.status_code == 429


def test_the_admin_login_is_slowed_too(superuser: User) -> None:
    fail_from_many_addresses(superuser, CEILING)
    _, response = log_in(superuser, right=True, address="10.2.0.1", url="/admin/login/")
    assert response.status_code == 429
    assert "from many addresses" in body(response)


def test_metrics_count_the_slowed_usernames_and_tries_and_the_slowing_ends_with_the_window(
    oncall: User, auditor: User
) -> None:
    fail_from_many_addresses(oncall, CEILING)
    fail_from_many_addresses(auditor, CEILING - 1)
    log_in(oncall, right=True, address="10.2.0.1")
    log_in(oncall, right=False, address="10.2.0.2")
    samples = scrape(Client())
    assert value(samples, "tasks_login_usernames_slowed") == 1
    assert value(samples, "tasks_logins_slowed_total") == 2
    backdate(901)
    assert value(scrape(Client()), "tasks_login_usernames_slowed") == 0
    _, response = log_in(oncall, right=True, address="10.2.0.3")
    assert response.status_code == 302
