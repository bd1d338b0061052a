"""The web process as the Procfile runs it: ``/healthz`` answers at once while every thread
waits on the database (its own lane, ``tasks_app.integrations.web_server``), and each
thread's kept connection, dropped by the server, is replaced before a request uses it.

The database "hangs" for the requests by a lock another session holds; the test releases
it once the server shows every request waiting on it (polled, never slept)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from tasks_app.integrations.web_server import is_probe
from tests.e2e_support import database_url, wait_for
from tests.web_server_support import every_thread_serves_one as serve_one_each
from tests.web_server_support import timed, waiting_on_locks, web_process

THREADS = 2


def test_it_tells_a_liveness_probe_from_other_requests() -> None:
    assert is_probe(b"GET /healthz HTTP/1.1\r\n")
    assert is_probe(b"HEAD /healthz?x=1 HTTP")
    assert not is_probe(b"GET /healthzz HTTP/1.1")
    assert not is_probe(b"GET /readyz HTTP/1.1\r\n")
    assert not is_probe(b"POST /healthz HTTP/1.1")
    assert not is_probe(b"GET /tasks/ HTTP/1.1\r\n")
    assert not is_probe(b"")


@pytest.fixture
def web(transactional_db: None, tmp_path: Path) -> Iterator[str]:
    env = {
        **os.environ,
        "DATABASE_URL": database_url(connection.settings_dict),
        "REDIS_URL": settings.REDIS_URL or "",
        # Requests wait on the held table longer than the test takes.
        "TASKS_WEB_STATEMENT_TIMEOUT_MS": "20000",
    }
    with web_process(env, tmp_path / "web.log", threads=THREADS) as url:
        yield url


def cookie_of(user: User) -> str:
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_healthz_answers_at_once_while_every_thread_waits_on_the_database(
    web: str, oncall: User
) -> None:
    cookie = cookie_of(oncall)
    dsn, name = database_url(connection.settings_dict), connection.settings_dict["NAME"]
    with futures.ThreadPoolExecutor(max_workers=THREADS * 2) as pool:
        with psycopg.connect(dsn) as other:
            other.execute("LOCK TABLE tasks_app_task IN ACCESS EXCLUSIVE MODE NOWAIT")
            pages = [
                pool.submit(timed, f"{web}/", cookie=cookie, timeout=60) for _ in range(THREADS * 2)
            ]
            wait_for(
                lambda: waiting_on_locks(dsn, name) >= THREADS, timeout=30, what="busy threads"
            )
            probes = [timed(f"{web}/healthz", timeout=10) for _ in range(5)]
            other.rollback()
        answered = [page.result() for page in pages]

    assert all(code == 200 and seconds < 1 for code, seconds in probes), probes
    assert all(code == 200 for code, _ in answered), answered


@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_each_threads_kept_connection_dropped_by_the_server_costs_no_request(
    web: str, oncall: User
) -> None:
    cookie = cookie_of(oncall)
    dsn, name = database_url(connection.settings_dict), connection.settings_dict["NAME"]

    def every_thread_serves_one() -> list[tuple[int, float]]:
        return serve_one_each(web, cookie=cookie, threads=THREADS, dsn=dsn, database=name)

    assert [code for code, _ in every_thread_serves_one()] == [200] * THREADS
    with psycopg.connect(database_url(connection.settings_dict), autocommit=True) as admin:
        dropped = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
            [connection.settings_dict["NAME"]],
        ).fetchone()
    connection.close()  # this process's session went with the others
    assert dropped is not None and dropped[0] >= THREADS

    assert [code for code, _ in every_thread_serves_one()] == [200] * THREADS
