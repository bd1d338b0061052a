from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def load_settings(code: str = "print('ok')", **env: str) -> subprocess.CompletedProcess[str]:
    """Set Django up in a fresh interpreter with ``env``, then run ``code``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "TASKS_"))}
    return subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        cwd=ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": "config.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DJANGO_ALLOWED_HOSTS": "example.com"}, "DJANGO_SECRET_KEY is required"),
        ({"DJANGO_SECRET_KEY": "x" * 60}, "DJANGO_ALLOWED_HOSTS is required"),
    ],
)
def test_production_refuses_to_start_without_a_secret_or_hosts(
    env: dict[str, str], message: str
) -> None:
    result = load_settings(DJANGO_PRODUCTION="1", **env)
    assert result.returncode != 0
    assert message in result.stderr


def test_production_starts_with_a_secret_and_hosts() -> None:
    result = load_settings(
        DJANGO_PRODUCTION="1", DJANGO_SECRET_KEY="x" * 60, DJANGO_ALLOWED_HOSTS="example.com"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


FAKES_SERVED = (
    "from django.urls import Resolver404, resolve\n"
    "try:\n    resolve('/fake/publish/'); print('served')\n"
    "except Resolver404:\n    print('not served')"
)


@pytest.mark.parametrize(
    ("env", "served"),
    [
        ({}, "served"),
        (
            {
                "DJANGO_PRODUCTION": "1",
                "DJANGO_SECRET_KEY": "x" * 60,
                "DJANGO_ALLOWED_HOSTS": "example.com",
            },
            "not served",
        ),
        ({"TASKS_FAKE_REMOTES": "0"}, "not served"),
    ],
)
def test_the_fake_remotes_are_served_only_outside_production(
    env: dict[str, str], served: str
) -> None:
    result = load_settings(FAKES_SERVED, **env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == served


@pytest.mark.parametrize(
    ("name", "value"),
    [("TASKS_LEASE_SECONDS", "soon"), ("TASKS_LEASE_SECONDS", "0"), ("DJANGO_DEBUG", "maybe")],
)
def test_a_bad_setting_fails_loudly_naming_the_variable(name: str, value: str) -> None:
    result = load_settings(**{name: value})
    assert result.returncode != 0
    assert name in result.stderr


def test_the_maintenance_queue_name_is_reserved() -> None:
    result = load_settings(TASKS_QUEUES="default,maintenance")
    assert result.returncode != 0
    assert "maintenance" in result.stderr


def test_a_worker_without_q_consumes_every_queue_and_the_sweeper_has_its_own() -> None:
    from django.conf import settings

    queues = {queue.name for queue in settings.CELERY_TASK_QUEUES}
    assert queues == {*settings.TASKS_QUEUES, "maintenance"}
    assert settings.CELERY_TASK_ROUTES["tasks_app.tasks.sweep"]["queue"] == "maintenance"
    beat: dict[str, Any] = settings.CELERY_BEAT_SCHEDULE["sweep"]
    assert beat["options"]["queue"] == "maintenance"
    assert settings.CELERY_TASK_ACKS_LATE and settings.CELERY_TASK_REJECT_ON_WORKER_LOST
    assert settings.CELERY_WORKER_PREFETCH_MULTIPLIER == 1
    assert settings.CELERY_ACCEPT_CONTENT == ["json"]
    visibility = settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"]
    assert isinstance(visibility, int) and visibility > settings.TASKS_LEASE_SECONDS
