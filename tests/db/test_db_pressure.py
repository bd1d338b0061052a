"""The database slow, hung, refusing or out of slots: every session has its timeouts; a
statement the server does not end is cut by the client; ``/readyz`` answers within its
bound; the lease keeper renews over one kept connection, backs off after a failure and
logs one line per failure streak; an idle worker process gives its connections back.

A hang is made with the server's own means (``pg_sleep``, a lock held by another
session, a database that refuses connections); each wait on the code under test has a
deadline, so a version that hung fails instead of hanging the run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import OperationalError, close_old_connections, connection, connections
from django.db.backends.signals import connection_created
from django.test import Client

from tasks_app import services
from tasks_app.db import deadlines
from tasks_app.db.idle_connections import IdleCloser
from tasks_app.engine.lease_keeper import lease_keeper
from tests.conftest import only_step, worker_thread
from tests.e2e_support import database_url, wait_for
from tests.lease_support import claim

pytestmark = pytest.mark.django_db(transaction=True)


def show(name: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SHOW {name}")
        row = cursor.fetchone()
    assert row is not None
    return str(row[0])


def in_thread_within(seconds: float, work: Any) -> list[BaseException]:
    """Run ``work`` on a connection of its own; fail if it is still running after
    ``seconds``. Returns what it raised."""
    errors: list[BaseException] = []
    thread = worker_thread(work, errors)
    thread.start()
    thread.join(timeout=seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    return errors


@pytest.fixture
def sleepers() -> Iterator[None]:
    """Ends the sessions a test left sleeping on its database after their client cut them
    (those of other databases, such as another test process's, are not its own)."""
    yield
    with psycopg.connect(database_url(connection.settings_dict), autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE query LIKE 'SELECT pg_sleep%%' AND pid <> pg_backend_pid() "
            "AND datname = current_database()"
        )


# --- timeouts on every session --------------------------------------------------------------


def test_every_session_carries_the_configured_timeouts_and_names_its_process(
    settings: Any,
) -> None:
    assert show("statement_timeout") == f"{settings.TASKS_DB_STATEMENT_TIMEOUT_MS // 1000}s"
    assert show("lock_timeout") == f"{settings.TASKS_DB_LOCK_TIMEOUT_MS // 1000}s"
    assert show("idle_in_transaction_session_timeout") == "1min"
    assert connection.settings_dict["OPTIONS"]["connect_timeout"] == 2
    import os

    assert show("application_name").endswith(f":{os.getpid()}")


def test_a_statement_the_server_does_not_end_is_cut_by_the_client(
    settings: Any, sleepers: None
) -> None:
    settings.TASKS_DB_STATEMENT_TIMEOUT_MS = 500
    settings.TASKS_DB_CLIENT_GRACE_SECONDS = 1
    outcome: list[float] = []

    def sleep_on_the_server() -> None:
        with connection.cursor() as cursor:
            # The server would end it; with its limit off, only the client can.
            cursor.execute("SET statement_timeout = 0")
            started = time.monotonic()
            try:
                cursor.execute("SELECT pg_sleep(20)")
            finally:
                outcome.append(time.monotonic() - started)

    errors = in_thread_within(10, sleep_on_the_server)
    assert len(errors) == 1 and isinstance(errors[0], OperationalError), errors
    assert 1.4 <= outcome[0] < 10
    assert deadlines.watchdog.cut >= 1


def test_a_connection_cut_by_the_client_is_replaced_for_the_next_statement(
    settings: Any, sleepers: None
) -> None:
    settings.TASKS_DB_STATEMENT_TIMEOUT_MS = 300
    settings.TASKS_DB_CLIENT_GRACE_SECONDS = 1
    results: list[int] = []

    def cut_then_enqueue() -> None:
        with pytest.raises(OperationalError), connection.cursor() as cursor:
            cursor.execute("SET statement_timeout = 0")
            cursor.execute("SELECT pg_sleep(20)")
        close_old_connections()  # what the next request or task does first
        results.append(services.enqueue("demo.noop", {"after": "cut"}).task.pk)

    assert in_thread_within(15, cut_then_enqueue) == []
    assert len(results) == 1


def test_with_the_statement_timeout_off_nothing_is_cut(settings: Any) -> None:
    settings.TASKS_DB_STATEMENT_TIMEOUT_MS = 0
    assert deadlines.limit_seconds() is None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(0.1)")


# --- /readyz within its bound ---------------------------------------------------------------


def test_readyz_answers_503_within_its_bound_while_a_check_waits_on_the_database(
    settings: Any, sleepers: None
) -> None:
    settings.TASKS_READY_TIMEOUT_SECONDS = 1
    services.sweep()  # the sweeper ran: only the held table makes readiness fail
    answers: list[tuple[int, dict[str, Any], float]] = []

    def probe() -> None:
        started = time.monotonic()
        response = Client().get("/readyz")
        answers.append((response.status_code, response.json(), time.monotonic() - started))

    with psycopg.connect(database_url(connection.settings_dict)) as other:
        # Readiness reads when the sweeper last ran: hold that table, as a hung server
        # or a migration would.
        other.execute("LOCK TABLE tasks_app_heartbeat IN ACCESS EXCLUSIVE MODE")
        assert in_thread_within(8, probe) == []
        other.rollback()

    status, body, took = answers[0]
    assert status == 503
    assert body["checks"]["database"]["ok"] is True
    assert body["checks"]["sweeper"] == {
        "ok": False,
        "detail": "failed: OperationalError",
        "ms": body["checks"]["sweeper"]["ms"],
    }
    assert took < 4


def test_readyz_does_not_try_the_checks_that_need_a_database_it_could_not_reach(
    settings: Any,
) -> None:
    from tasks_app.observability import health

    def unreachable() -> tuple[bool, str]:
        raise OperationalError("connection refused")

    checks = dict(health.READINESS)
    health.READINESS["database"] = unreachable
    try:
        body, status = health.ready()
    finally:
        health.READINESS.clear()
        health.READINESS.update(checks)
    assert status == 503
    assert body["checks"]["migrations"]["detail"] == "not checked: no database"
    assert body["checks"]["sweeper"]["detail"] == "not checked: no database"


# --- the lease keeper under pressure --------------------------------------------------------


@pytest.fixture
def keeper_connections() -> Iterator[list[str]]:
    """The connections the lease keeper's thread opens, as they are opened."""
    opened: list[str] = []

    def count(sender: Any, connection: Any, **kwargs: Any) -> None:
        if threading.current_thread().name == "lease-keeper":
            opened.append(connection.alias)

    connection_created.connect(count)
    yield opened
    connection_created.disconnect(count)


def test_the_lease_keeper_renews_over_one_kept_connection(keeper_connections: list[str]) -> None:
    from tasks_app.models import Step

    step = only_step(services.enqueue("demo.noop", {}).task)
    held = claim(step, lease_seconds=1)  # renewed every third of a second
    expiries: set[Any] = set()

    def renewed_three_times() -> bool:
        expiries.add(Step.objects.get(pk=step.pk).lease_expires_at)
        return len(expiries) >= 4  # the claim's own, and three renewals

    lease_keeper.give_back_connection()  # whatever an earlier test left open
    lease_keeper.watch([held])
    try:
        wait_for(renewed_three_times, timeout=15, interval=0.05, what="three renewals")
    finally:
        lease_keeper.forget(held)
    assert keeper_connections == ["default"]


@pytest.fixture
def refusing_database() -> Iterator[Any]:
    """Switches new connections to the test database off and on; on at the end."""
    name = connection.settings_dict["NAME"]
    admin = psycopg.connect(database_url({**connection.settings_dict, "NAME": "postgres"}))
    admin.autocommit = True

    def allow(allowed: bool) -> None:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(allowed).lower()}')

    yield allow
    allow(True)
    admin.close()


def test_failed_renewals_back_off_and_log_one_line_per_streak(
    refusing_database: Any, caplog: pytest.LogCaptureFixture
) -> None:
    step = only_step(services.enqueue("demo.noop", {}).task)
    held = claim(step, lease_seconds=3)
    lease_keeper.watch([held])
    try:
        with caplog.at_level(logging.INFO, logger="tasks_app.engine.runner"):
            wait_for(lambda: _keeper_session() is not None, timeout=10, what="the keeper to renew")
            # Its session is cut and no new one is let in: every renewal fails.
            refusing_database(False)
            with psycopg.connect(
                database_url({**connection.settings_dict, "NAME": "postgres"}), autocommit=True
            ) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", [_keeper_session()])
            outage_started = time.monotonic()
            wait_for(lambda: _failures() >= 5, timeout=15, what="five failed renewals")
            # Backoff: five tries took at least 0.05 + 0.1 + 0.2 + 0.25 s, not a few ms.
            assert time.monotonic() - outage_started >= 0.6
            refusing_database(True)
            wait_for(
                lambda: "lease renewals work again" in caplog.text,
                timeout=15,
                what=lambda: "renewals to work again\n" + caplog.text,
            )
    finally:
        lease_keeper.forget(held)

    lines = [r for r in caplog.records if r.name == "tasks_app.engine.runner"]
    assert [r.getMessage().split(" (")[0].split(" after")[0] for r in lines] == [
        f"lease renewal failed for step {step.pk}",
        "lease renewals work again",
    ]
    assert all(r.exc_info is None for r in lines)  # one line each, no traceback
    failures = int(lines[1].getMessage().split("after ")[1].split(" failure")[0])
    assert 5 <= failures <= 25


def _failures() -> int:
    streak = lease_keeper._failing
    return streak.count if streak else 0


def _keeper_session() -> int | None:
    """The server pid of the lease keeper's session (named after this process), if open:
    the one session of this process that is not this thread's."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = "
            "current_setting('application_name') AND pid <> pg_backend_pid() "
            "AND datname = current_database() ORDER BY backend_start DESC LIMIT 1"
        )
        row = cursor.fetchone()
    return int(row[0]) if row else None


# --- idle worker processes give their connections back --------------------------------------


@pytest.fixture
def short_lived_connection() -> Iterator[Any]:
    """This thread's connection, open, kept for one second (``CONN_MAX_AGE``)."""
    wrapper = connections["default"]
    saved = wrapper.settings_dict["CONN_MAX_AGE"]
    wrapper.settings_dict["CONN_MAX_AGE"] = 1
    wrapper.ensure_connection()
    yield wrapper.connection
    wrapper.settings_dict["CONN_MAX_AGE"] = saved


def test_an_idle_process_gives_its_connection_back_and_the_next_task_reconnects(
    short_lived_connection: Any,
) -> None:
    closer = IdleCloser()
    closer.rest()
    wait_for(lambda: short_lived_connection.closed, timeout=10, what="the idle connection to close")
    assert closer.closed == 1
    # The next task: Django drops the closed connection and opens a new one.
    closer.busy()
    close_old_connections()
    assert services.enqueue("demo.noop", {"after": "idle"}).created


def test_a_process_that_gets_another_task_in_time_keeps_its_connection(
    short_lived_connection: Any,
) -> None:
    closer = IdleCloser()
    closer.rest()
    closer.busy()  # a task started before the connection was idle for long
    started = time.monotonic()
    wait_for(lambda: time.monotonic() - started > 2, timeout=5, interval=0.2)
    assert not short_lived_connection.closed
    assert closer.closed == 0
