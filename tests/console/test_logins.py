"""Logging in: failed logins lock one username out from one address (django-axes, counted
in the database), for the console's login and the admin's alike; the address is the
connecting one unless a trusted proxy forwarded it; on-call unlocks with a command; the
password-reset pages are not served."""

from __future__ import annotations

import ipaddress
from datetime import timedelta
from typing import Any

import pytest
from axes.models import AccessAttempt
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db.models import F
from django.http.response import HttpResponseBase
from django.test import Client

from console.logins import lockout_response
from tests.console_support import body

pytestmark = pytest.mark.django_db

LIMIT = 3
HOME = "10.0.0.1"
ELSEWHERE = "10.0.0.2"


@pytest.fixture(autouse=True)
def _small_limit(settings: Any) -> None:
    settings.AXES_FAILURE_LIMIT = LIMIT


def password(user: User) -> str:
    return "pw-" + user.username


def log_in(
    user: User,
    *,
    right: bool,
    address: str = HOME,
    url: str = "/accounts/login/",
    forwarded_for: str | None = None,
) -> tuple[Client, HttpResponseBase]:
    client = Client(REMOTE_ADDR=address)
    headers = {"X-Forwarded-For": forwarded_for} if forwarded_for is not None else {}
    given = password(user) if right else "wrong"
    response = client.post(url, {"username": user.username, "password": given}, headers=headers)
    return client, response


def fail(user: User, times: int = LIMIT, **where: Any) -> None:
    """``times`` wrong passwords for ``user``, from where ``log_in`` is told."""
    for _ in range(times):
        log_in(user, right=False, **where)


def logged_in(client: Client, user: User) -> bool:
    return client.session.get("_auth_user_id") == str(user.pk)


def assert_locked_out(client: Client, response: HttpResponseBase, user: User) -> None:
    assert response.status_code == 429
    page = body(response)
    assert "Too many failed logins for this username from your address" in page
    assert "locked for 15 minutes" in page
    assert not logged_in(client, user)


# --- the lockout ------------------------------------------------------------------------------


def test_a_wrong_password_is_refused_with_the_form_again(oncall: User) -> None:
    client, response = log_in(oncall, right=False)
    assert response.status_code == 200
    assert "Please enter a correct username and password" in body(response)
    assert not logged_in(client, oncall)


def test_failures_lock_the_username_out_from_that_address_even_with_the_right_password(
    oncall: User,
) -> None:
    fail(oncall, LIMIT - 1)
    client, last_wrong = log_in(oncall, right=False)
    assert_locked_out(client, last_wrong, oncall)  # the failure that locks says so
    client, right = log_in(oncall, right=True)
    assert_locked_out(client, right, oncall)
    page = body(right)
    # The console's own login page, its message styled as the page's errors are.
    assert '<div class="notice error" role="alert"><p>Too many failed logins' in page
    assert '<form method="post" action="/accounts/login/"' in page


def test_a_locked_out_username_still_logs_in_from_another_address(oncall: User) -> None:
    fail(oncall, address=HOME)
    client, response = log_in(oncall, right=True, address=ELSEWHERE)
    assert response.status_code == 302
    assert logged_in(client, oncall)


def test_failures_for_one_user_do_not_lock_out_another_from_the_same_address(
    oncall: User, auditor: User
) -> None:
    fail(oncall, address=HOME)
    client, response = log_in(auditor, right=True, address=HOME)
    assert response.status_code == 302
    assert logged_in(client, auditor)


def test_tries_while_locked_out_do_not_prolong_the_lockout(oncall: User) -> None:
    fail(oncall)
    locked_at = AccessAttempt.objects.get(username=oncall.username).attempt_time
    fail(oncall, 2)
    log_in(oncall, right=True)
    attempt = AccessAttempt.objects.get(username=oncall.username)
    assert (attempt.failures_since_start, attempt.attempt_time) == (LIMIT, locked_at)


def test_the_lockout_ends_after_the_window(oncall: User) -> None:
    fail(oncall)
    # Moved back past the window (15 minutes) instead of waiting it out.
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - timedelta(minutes=16))
    client, response = log_in(oncall, right=True)
    assert response.status_code == 302
    assert logged_in(client, oncall)


def test_a_successful_login_clears_the_count(oncall: User) -> None:
    fail(oncall, LIMIT - 1)
    log_in(oncall, right=True)
    fail(oncall, LIMIT - 1)
    client, response = log_in(oncall, right=True)
    assert response.status_code == 302
    assert logged_in(client, oncall)


def test_the_admin_login_is_locked_out_too(superuser: User) -> None:
    fail(superuser, url="/admin/login/")
    client, right = log_in(superuser, right=True, url="/admin/login/")
    assert_locked_out(client, right, superuser)
    assert 'id="login-form"' in body(right)  # the admin's own login page
    assert client.get("/admin/").status_code == 302  # still sent to log in


def test_console_and_admin_failures_count_together(superuser: User) -> None:
    fail(superuser, LIMIT - 1, url="/admin/login/")
    log_in(superuser, right=False, url="/accounts/login/")
    client, right = log_in(superuser, right=True, url="/admin/login/")
    assert_locked_out(client, right, superuser)


def test_a_lockout_without_a_page_to_keep_answers_with_the_console_login(rf: Any) -> None:
    """Axes' asynchronous middleware hands over no response: the console's login page."""
    response = lockout_response(rf.post("/accounts/login/"), None)
    assert response.status_code == 429
    page = body(response)
    assert '<div class="notice error" role="alert"><p>Too many failed logins' in page
    assert '<form method="post" action="/accounts/login/"' in page


def test_logins_work_and_lock_out_while_redis_is_unreachable(oncall: User, settings: Any) -> None:
    """Failed logins are counted in the database: with the cache (Redis) unreachable, the
    one on-call logs in to look at, the login works and the lockout still holds."""
    settings.CACHES = {  # nothing listens on port 1
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
        }
    }
    client, wrong = log_in(oncall, right=False)
    assert wrong.status_code == 200  # the form again, with its error
    assert not logged_in(client, oncall)

    client, right = log_in(oncall, right=True)
    assert right.status_code == 302
    assert logged_in(client, oncall)

    fail(oncall)
    client, locked = log_in(oncall, right=True)
    assert_locked_out(client, locked, oncall)


# --- unlocking --------------------------------------------------------------------------------


def test_the_unlock_command_lets_a_locked_out_user_log_in_again(
    oncall: User, auditor: User, capsys: pytest.CaptureFixture[str]
) -> None:
    fail(oncall, address=HOME)
    fail(oncall, address=ELSEWHERE)
    fail(auditor, address=HOME)
    call_command("axes_reset_username", oncall.username)
    assert "2 attempts removed." in capsys.readouterr().out
    client, response = log_in(oncall, right=True, address=HOME)
    assert response.status_code == 302
    assert logged_in(client, oncall)
    # Only that username: the other stays locked out.
    client, other = log_in(auditor, right=True, address=HOME)
    assert_locked_out(client, other, auditor)


# --- the client's address ---------------------------------------------------------------------

PROXY = "10.9.0.5"
TRUSTED = [ipaddress.ip_network("10.9.0.0/16")]


def test_a_client_cannot_dodge_the_lockout_with_a_forwarded_for_header(oncall: User) -> None:
    for n in range(LIMIT):
        log_in(oncall, right=False, forwarded_for=f"203.0.113.{n}")
    client, response = log_in(oncall, right=True, forwarded_for="203.0.113.99")
    assert_locked_out(client, response, oncall)
    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {HOME}


def test_a_client_cannot_lock_out_a_user_elsewhere_by_naming_their_address(
    oncall: User,
) -> None:
    fail(oncall, address=HOME, forwarded_for=ELSEWHERE)
    client, response = log_in(oncall, right=True, address=ELSEWHERE)
    assert response.status_code == 302
    assert logged_in(client, oncall)


def test_behind_a_trusted_proxy_each_client_is_locked_out_on_its_own(
    oncall: User, settings: Any
) -> None:
    settings.TRUSTED_PROXY_NETWORKS = TRUSTED
    fail(oncall, address=PROXY, forwarded_for="198.51.100.7")
    client, locked = log_in(oncall, right=True, address=PROXY, forwarded_for="198.51.100.7")
    assert_locked_out(client, locked, oncall)
    client, other = log_in(oncall, right=True, address=PROXY, forwarded_for="198.51.100.8")
    assert other.status_code == 302
    assert logged_in(client, oncall)


# --- pages not served -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "/accounts/password_reset/",
        "/accounts/password_reset/done/",
        "/accounts/reset/MQ/set-password/",
        "/accounts/reset/done/",
        "/accounts/password_change/",
        "/accounts/password_change/done/",
    ],
)
def test_the_password_reset_and_change_pages_are_not_served(url: str, oncall: User) -> None:
    anonymous = Client()
    assert anonymous.get(url).status_code == 404
    assert anonymous.post(url, {"email": "olivia@example.com"}).status_code == 404
    signed_in = Client()
    signed_in.force_login(oncall)
    assert signed_in.get(url).status_code == 404


def test_logging_out_still_works(oncall: User) -> None:
    client = Client()
    client.force_login(oncall)
    response = client.post("/accounts/logout/")
    assert response.status_code == 302
    assert response["Location"] == "/accounts/login/"
    assert not logged_in(client, oncall)
