"""The probes: /healthz answers while the process runs; /readyz says whether it can work
(database, broker, migrations, sweeper), without a login and without secrets."""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db.models import F
from django.test import Client

from tasks_app import services
from tasks_app.models import Heartbeat
from tasks_app.observability import probes
from tests.settings_support import PRODUCTION, load_settings


def test_healthz_answers_without_a_login_or_the_database(client: Client) -> None:
    response = client.get("/healthz")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})
    assert response["Cache-Control"] == "no-store"


def test_readyz_is_ready_when_everything_answers_and_the_sweeper_ran(
    client: Client, db: None
) -> None:
    services.sweep()
    response = client.get("/readyz")

    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["status"] == "ready"
    assert {name: check["ok"] for name, check in body["checks"].items()} == {
        "database": True,
        "migrations": True,
        "broker": True,
        "broker_writes": True,
        "sweeper": True,
        "crash_isolation": True,
    }


def test_readyz_fails_when_the_sweeper_never_ran_or_fell_silent(
    client: Client, db: None, settings: Any
) -> None:
    never = client.get("/readyz")
    assert never.status_code == 503
    assert never.json()["checks"]["sweeper"] == {**never.json()["checks"]["sweeper"], "ok": False}
    assert never.json()["checks"]["sweeper"]["detail"] == "never ran"

    services.sweep()
    Heartbeat.objects.filter(name="sweeper").update(seen_at=F("seen_at") - timedelta(seconds=61))
    settings.TASKS_SWEEPER_SILENT_SECONDS = 60
    late = client.get("/readyz").json()
    assert late["status"] == "not ready"
    assert late["checks"]["sweeper"]["ok"] is False
    assert late["checks"]["sweeper"]["detail"].startswith("last ran 6")


def test_readyz_fails_when_the_broker_is_down_and_names_no_address(
    client: Client, db: None, settings: Any
) -> None:
    services.sweep()
    # Nothing listens on port 1.
    settings.REDIS_URL = "redis://:hunter2@127.0.0.1:1/0"
    response = client.get("/readyz")

    assert response.status_code == 503
    broker = response.json()["checks"]["broker"]
    assert broker["ok"] is False and broker["detail"].startswith("failed: ")
    assert "hunter2" not in response.content.decode()
    assert "127.0.0.1" not in response.content.decode()


READYZ = (
    "from django.test import Client; import json; "
    "response = Client(HTTP_HOST='10.1.2.3').get('/readyz'); "
    "print(response.status_code, json.dumps(response.json()))"
)


def test_readyz_fails_when_the_database_is_down_and_names_no_address() -> None:
    result = load_settings(READYZ, DATABASE_URL="postgres://probe:s3cret@127.0.0.1:1/nothing")
    assert result.returncode == 0, result.stderr
    status, body = result.stdout.split(" ", 1)
    assert status == "503"
    assert '"database": {"ok": false, "detail": "failed: OperationalError"' in body
    assert "s3cret" not in body and "127.0.0.1" not in body


def test_readyz_fails_while_migrations_are_not_applied(tmp_path: Path) -> None:
    # An embedded database nobody migrated.
    result = load_settings(READYZ, DATABASE_URL="", TASKS_VAR_DIR=str(tmp_path / "var"))
    assert result.returncode == 0, result.stderr
    status, body = result.stdout.split(" ", 1)
    assert status == "503"
    assert '"migrations": {"ok": false, "detail": "' in body
    assert "migration(s) not applied" in body


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_the_probes_answer_a_production_process_called_by_address_over_http(path: str) -> None:
    """A probe calls by the pod's address, inside the network, over plain HTTP: neither the
    allowed hosts nor the HTTPS redirect stand in its way."""
    result = load_settings(
        "from django.test import Client; "
        f"print(Client(HTTP_HOST='10.1.2.3').get('{path}').status_code)",
        **{**PRODUCTION, "DATABASE_URL": "postgres://probe@127.0.0.1:1/nothing"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ("200" if path == "/healthz" else "503")


def test_the_probes_take_only_get(client: Client) -> None:
    assert client.post("/healthz").status_code == 405


def test_a_failed_readyz_is_no_error_line_and_a_change_of_readiness_is_one_line(
    client: Client, db: None, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prober asks every few seconds: Django's ERROR line per 503 would be one a probe.
    The web process says once that it is not ready, and why, and once that it is again."""
    monkeypatch.setattr(probes, "readiness", probes.Readiness())  # this process, fresh
    caplog.set_level(logging.INFO)

    answers = [client.get("/readyz").status_code for _ in range(3)]  # the sweeper never ran
    services.sweep()
    answers += [client.get("/readyz").status_code for _ in range(2)]

    assert answers == [503, 503, 503, 200, 200]
    assert not [r for r in caplog.records if r.name == "django.request"], caplog.text
    assert [(r.levelname, r.name, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "tasks_app.observability.probes", "not ready: sweeper (never ran)"),
        ("INFO", "tasks_app.observability.probes", "ready again"),
    ]


def test_other_refusals_are_still_logged_by_django(
    client: Client, db: None, caplog: pytest.LogCaptureFixture
) -> None:
    client.get("/tasks/")  # a page, logged out: a redirect, nothing logged
    client.post("/healthz")
    assert [(r.name, r.getMessage()) for r in caplog.records if r.name == "django.request"] == [
        ("django.request", "Method Not Allowed: /healthz")
    ]
