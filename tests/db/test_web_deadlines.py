"""A web request's own database deadline: a page waiting on a locked (or hung) database
answers 503 within ``TASKS_WEB_STATEMENT_TIMEOUT_MS``, with a page built without the
database; outside a request the session's own timeout holds; a kept connection the server
dropped is replaced before a request uses it (``CONN_HEALTH_CHECKS``).

The database is made to "hang" for one request by a lock another session holds: the
request's statement waits on it as it would on a stopped server, and the session's own
lock timeout (10 s) is far longer than the web deadline under test.
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from config.wsgi import application
from tasks_app.db import deadlines
from tests.e2e_support import database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

WEB_MS = 300


@pytest.fixture
def short_web_deadline(settings: Any) -> None:
    settings.TASKS_WEB_STATEMENT_TIMEOUT_MS = WEB_MS


@contextmanager
def held(*tables: str) -> Iterator[None]:
    """Another session holds ``tables`` locked against every reader until the block ends."""
    with psycopg.connect(database_url(connection.settings_dict)) as other:
        other.execute(f"LOCK TABLE {', '.join(tables)} IN ACCESS EXCLUSIVE MODE NOWAIT")
        try:
            yield
        finally:
            other.rollback()


def show(name: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SHOW {name}")
        row = cursor.fetchone()
    assert row is not None
    return str(row[0])


def signed_in(user: User) -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


def test_a_page_waiting_on_a_held_table_answers_503_within_the_web_deadline(
    oncall: User, short_web_deadline: None
) -> None:
    client = signed_in(oncall)
    assert client.get(reverse("console:overview")).status_code == 200

    with held("tasks_app_task", "tasks_app_step"):
        started = time.monotonic()
        response = client.get(reverse("console:overview"))
        waited = time.monotonic() - started

    assert response.status_code == 503
    assert waited < 3, f"the request waited {waited:.1f} s"
    assert response["Retry-After"] == "5"
    assert b"The database is not answering" in response.content
    # The thread is free and the database answers again: so does the page.
    assert client.get(reverse("console:overview")).status_code == 200


def test_the_error_page_is_built_without_the_database(
    oncall: User, short_web_deadline: None
) -> None:
    client = signed_in(oncall)
    # The session's lock wait bounded, so a page that queried again would fail in time.
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '1s'")

    with held("django_session"), CaptureQueriesContext(connection) as queries:
        started = time.monotonic()
        response = client.get(reverse("console:overview"))
        waited = time.monotonic() - started

    assert response.status_code == 503, response.content[:300]
    assert waited < 2, f"the request waited {waited:.1f} s"
    # The session's load, which the lock held, and nothing after it: no second load for
    # the error page's user, no context processor's query.
    assert len(queries.captured_queries) == 1, queries.captured_queries
    assert "django_session" in queries.captured_queries[0]["sql"]


def test_an_htmx_request_gets_the_notice_alone(oncall: User, short_web_deadline: None) -> None:
    client = signed_in(oncall)
    with held("tasks_app_task", "tasks_app_step"):
        response = client.get(reverse("console:overview"), headers={"HX-Request": "true"})
    assert response.status_code == 503
    assert response["HX-Retarget"] == "#messages"
    assert response.content.startswith(b'<p class="notice error"')


def test_a_request_sets_its_deadline_on_the_server_and_the_session_gets_its_own_back(
    short_web_deadline: None, settings: Any
) -> None:
    own = f"{settings.TASKS_DB_STATEMENT_TIMEOUT_MS // 1000}s"
    assert show("statement_timeout") == own
    with deadlines.serving_web_request():
        assert show("statement_timeout") == f"{WEB_MS}ms"
        assert deadlines.limit_seconds() == WEB_MS / 1000 + settings.TASKS_DB_CLIENT_GRACE_SECONDS
    assert show("statement_timeout") == own


def test_a_rolled_back_transaction_does_not_leave_the_deadline_unknown(
    short_web_deadline: None, settings: Any
) -> None:
    from django.db import transaction

    with deadlines.serving_web_request():
        with pytest.raises(ZeroDivisionError), transaction.atomic():
            # The SET runs inside the transaction, and the rollback undoes it.
            assert show("statement_timeout") == f"{WEB_MS}ms"
            1 / 0  # noqa: B018
        assert show("statement_timeout") == f"{WEB_MS}ms"
    assert show("statement_timeout") == f"{settings.TASKS_DB_STATEMENT_TIMEOUT_MS // 1000}s"


def test_a_kept_connection_the_server_dropped_is_replaced_before_the_request_uses_it(
    oncall: User,
) -> None:
    """As after a PostgreSQL restart: the thread's kept connection is gone; the request
    that follows answers from a new one instead of failing."""
    cookie = signed_in(oncall).cookies
    assert wsgi_get(reverse("console:overview"), cookie) == 200
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        row = cursor.fetchone()
    assert row is not None
    with psycopg.connect(database_url(connection.settings_dict), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [row[0]])

    assert wsgi_get(reverse("console:overview"), cookie) == 200


def wsgi_get(path: str, cookies: Any) -> int:
    """A GET through the project's WSGI entry point, as a server calls it (with the
    request signals the test client leaves out)."""
    environ = RequestFactory().get(path).environ
    environ["HTTP_COOKIE"] = cookies.output(header="", sep=";").strip()
    environ["wsgi.input"] = io.BytesIO(b"")
    statuses: list[str] = []

    def start_response(status: str, headers: Any, *rest: Any) -> Any:
        statuses.append(status)

    response = application(environ, start_response)
    b"".join(response)
    response.close()
    return int(statuses[0].split()[0])


def test_the_database_settings_check_connections_before_use(settings: Any) -> None:
    assert settings.DATABASES["default"]["CONN_HEALTH_CHECKS"] is True
    # A few seconds, far shorter than every session's statement timeout.
    assert 0 < settings.TASKS_WEB_STATEMENT_TIMEOUT_MS <= 5_000
    assert settings.TASKS_WEB_STATEMENT_TIMEOUT_MS < settings.TASKS_DB_STATEMENT_TIMEOUT_MS


def test_a_savepoint_rolled_back_after_a_request_leaves_the_transaction_usable(
    short_web_deadline: None, settings: Any
) -> None:
    from django.db import DatabaseError, transaction

    with deadlines.serving_web_request():
        assert show("statement_timeout") == f"{WEB_MS}ms"
    with transaction.atomic():
        with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT 1 / 0")
        # The savepoint's rollback ran first; the session's own timeout is back after it.
        assert show("statement_timeout") == f"{settings.TASKS_DB_STATEMENT_TIMEOUT_MS // 1000}s"
