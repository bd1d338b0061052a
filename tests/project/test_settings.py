"""Settings: what production refuses to start without, the embedded default, and the
Procfile's lines as the settings read them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from honcho.environ import parse_procfile

from tests.e2e_support import ROOT
from tests.settings_support import PRODUCTION, clean_env, load_settings


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


def test_production_starts_with_a_secret_hosts_and_the_real_remotes() -> None:
    result = load_settings(**PRODUCTION)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@pytest.mark.parametrize(
    ("name", "embedded"),
    [
        ("DATABASE_URL", "the embedded SQLite database"),
        ("REDIS_URL", "the embedded file-system broker"),
    ],
)
def test_production_refuses_to_start_on_the_embedded_database_or_broker(
    tmp_path: Path, name: str, embedded: str
) -> None:
    var = tmp_path / "embedded"  # tests/conftest.py makes tmp_path/var
    result = load_settings(**{**PRODUCTION, name: ""}, TASKS_VAR_DIR=str(var))
    assert result.returncode != 0
    assert (
        f"DJANGO_PRODUCTION is set: {name} is required "
        f"(without it this process would use {embedded} under var/"
    ) in result.stderr
    assert not var.exists()


def test_production_refuses_a_database_that_is_not_postgresql(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite3'}"
    result = load_settings(**{**PRODUCTION, "DATABASE_URL": url})
    assert result.returncode != 0
    assert (
        "DJANGO_PRODUCTION is set: DATABASE_URL must name a PostgreSQL database "
        "(postgres://…), not sqlite3"
    ) in result.stderr


@pytest.mark.parametrize(
    ("name", "workflow"), [("PUBLISH_URL", "publish_article"), ("MAIL_URL", "ticket_reply")]
)
def test_production_refuses_to_start_without_a_remote_the_shipped_workflows_call(
    name: str, workflow: str
) -> None:
    result = load_settings(**{**PRODUCTION, name: ""})
    assert result.returncode != 0
    assert f"{name} is required (the {workflow} workflow calls it)" in result.stderr


@pytest.mark.parametrize(
    ("name", "url"),
    [
        ("PUBLISH_URL", "http://127.0.0.1:8000/fake/publish/"),
        ("PUBLISH_URL", "https://console.example.com/fake/publish/"),
        ("MAIL_URL", "https://console.example.com/fake/mail/?to=ops"),
        ("MAIL_URL", "https://console.example.com/fake"),
    ],
)
def test_production_refuses_to_start_with_a_remote_pointing_at_the_fakes(
    name: str, url: str
) -> None:
    result = load_settings(**{**PRODUCTION, name: url})
    assert result.returncode != 0
    assert f"{name} points at the demo's fake remote ({url})" in result.stderr


def test_a_real_remote_whose_path_only_starts_like_the_fakes_is_accepted() -> None:
    result = load_settings(**{**PRODUCTION, "PUBLISH_URL": "https://cms.example.com/fakery/"})
    assert result.returncode == 0, result.stderr


def test_production_refuses_to_start_with_the_fake_remotes_on() -> None:
    result = load_settings(**PRODUCTION, TASKS_FAKE_REMOTES="1")
    assert result.returncode != 0
    assert "DJANGO_PRODUCTION is set: TASKS_FAKE_REMOTES must be off" in result.stderr


@pytest.mark.parametrize(
    "url", ["publish.example.com/api/", "ftp://publish.example.com/", "https:///api"]
)
def test_a_remote_that_is_not_an_http_url_fails_loudly_naming_the_variable(url: str) -> None:
    result = load_settings(PUBLISH_URL=url)
    assert result.returncode != 0
    assert f"PUBLISH_URL must be an http(s) URL with a host, not {url!r}" in result.stderr


FAKES_SERVED = (
    "from django.urls import Resolver404, resolve\n"
    "try:\n    resolve('/fake/publish/'); print('served')\n"
    "except Resolver404:\n    print('not served')"
)


EMBEDDED = {"DATABASE_URL": ""}
POSTGRES = {"DATABASE_URL": "postgres://u@127.0.0.1:5432/x"}


@pytest.mark.parametrize(
    ("env", "served"),
    [
        (EMBEDDED, "served"),
        ({**EMBEDDED, "TASKS_FAKE_REMOTES": "0"}, "not served"),
        (POSTGRES, "not served"),
        ({**POSTGRES, "TASKS_FAKE_REMOTES": "1"}, "served"),
        (PRODUCTION, "not served"),
    ],
)
def test_the_fake_remotes_are_served_only_in_the_embedded_demo_unless_asked_for(
    env: dict[str, str], served: str
) -> None:
    result = load_settings(FAKES_SERVED, **env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == served


REMOTE_TOKENS = (
    "from django.conf import settings as s; "
    "print(s.PUBLISH_TOKEN == s.FAKE_REMOTES_TOKEN != '', repr(s.MAIL_TOKEN))"
)


def test_the_demo_workers_send_the_fakes_their_token_and_a_real_remote_only_its_own() -> None:
    demo = load_settings(REMOTE_TOKENS, **EMBEDDED, MAIL_URL="https://mail.example.com/api/")
    assert demo.returncode == 0, demo.stderr
    assert demo.stdout.split() == ["True", "''"]

    own = load_settings(REMOTE_TOKENS, **EMBEDDED, MAIL_TOKEN="m-1", PUBLISH_TOKEN="p-1")
    assert own.returncode == 0, own.stderr
    assert own.stdout.split() == ["False", "'m-1'"]


def test_production_refuses_to_start_with_debug_on() -> None:
    result = load_settings(**PRODUCTION, DJANGO_DEBUG="1")
    assert result.returncode != 0
    assert "DJANGO_PRODUCTION is set: DJANGO_DEBUG must be off" in result.stderr


def run_procfile_line(name: str, env: dict[str, str], *, timeout: float = 90) -> tuple[int, str]:
    """Run the Procfile's ``name`` line with ``env`` as a Procfile runner does (through a
    shell), with this interpreter's ``python``, ``gunicorn`` and ``celery``; returns its
    exit status and its output. A process still running at ``timeout`` is killed (-9)."""
    process = subprocess.Popen(
        ["sh", "-c", parse_procfile((ROOT / "Procfile").read_text()).processes[name]],
        cwd=ROOT,
        env=clean_env(
            **env, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        output, _ = process.communicate()
    return process.returncode, output


PROCFILE_PROCESSES = ["release", "web", "worker", "maintenance", "beat"]


@pytest.mark.parametrize("name", PROCFILE_PROCESSES)
@pytest.mark.parametrize(
    ("unset", "message"),
    [
        ("DJANGO_SECRET_KEY", "DJANGO_SECRET_KEY is required"),
        ("PUBLISH_URL", "PUBLISH_URL is required"),
    ],
)
def test_every_procfile_process_refuses_to_start_on_development_defaults(
    name: str, unset: str, message: str
) -> None:
    # DJANGO_PRODUCTION is not set: the Procfile's processes are production's.
    env = {key: value for key, value in PRODUCTION.items() if key != "DJANGO_PRODUCTION"}
    status, output = run_procfile_line(name, {**env, unset: ""})
    assert status not in (0, -9), output
    assert f"DJANGO_PRODUCTION is set: {message}" in output


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DJANGO_DEBUG": "1"}, "DJANGO_DEBUG must be off"),
        ({"TASKS_FAKE_REMOTES": "1"}, "TASKS_FAKE_REMOTES must be off"),
        ({"MAIL_URL": "http://127.0.0.1:8000/fake/mail/"}, "MAIL_URL points at the demo's fake"),
        ({"DJANGO_ALLOWED_HOSTS": ""}, "DJANGO_ALLOWED_HOSTS is required"),
    ],
)
def test_the_procfile_web_process_refuses_each_unsafe_default(
    env: dict[str, str], message: str
) -> None:
    production = {key: value for key, value in PRODUCTION.items() if key != "DJANGO_PRODUCTION"}
    status, output = run_procfile_line("web", {**production, **env})
    assert status not in (0, -9), output
    assert f"DJANGO_PRODUCTION is set: {message}" in output


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


def test_celery_reads_every_celery_setting_of_django() -> None:
    from django.conf import settings

    from config.celery import app

    names = [name for name in dir(settings) if name.startswith("CELERY_")]
    assert "CELERY_TASK_ACKS_LATE" in names
    for name in names:
        key = name.removeprefix("CELERY_").lower()
        assert app.conf[key] == getattr(settings, name), key
    # Celery's own defaults fill what Django's settings do not set.
    assert "CELERY_BROKER_POOL_LIMIT" not in names
    assert app.conf.broker_pool_limit == 10


REDIS = "redis://127.0.0.1:6379/0"


@pytest.mark.parametrize("lease", ["3600", "7200"])
def test_a_lease_the_broker_would_redeliver_during_is_refused(lease: str) -> None:
    result = load_settings(REDIS_URL=REDIS, TASKS_LEASE_SECONDS=lease)
    assert result.returncode != 0
    assert (
        "TASKS_LEASE_SECONDS must be shorter than the broker's visibility timeout (3600 s), "
        f"not {lease}"
    ) in result.stderr


def test_a_lease_just_inside_the_visibility_timeout_is_accepted() -> None:
    result = load_settings(REDIS_URL=REDIS, TASKS_LEASE_SECONDS="3599")
    assert result.returncode == 0, result.stderr


def test_the_file_system_broker_redelivers_nothing_so_any_lease_goes() -> None:
    result = load_settings(REDIS_URL="", DATABASE_URL="", TASKS_LEASE_SECONDS="7200")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("database_url", "redis_url", "made"),
    [
        ("", "", True),  # the SQLite file and the broker's folders
        ("postgres://u@127.0.0.1:5432/x", "", True),  # the broker's folders
        ("", REDIS, True),  # the SQLite file
        ("postgres://u@127.0.0.1:5432/x", REDIS, False),
    ],
)
def test_var_is_made_only_for_the_embedded_database_or_broker(
    tmp_path: Path, database_url: str, redis_url: str, made: bool
) -> None:
    var = tmp_path / "embedded"  # tests/conftest.py makes tmp_path/var
    result = load_settings(DATABASE_URL=database_url, REDIS_URL=redis_url, TASKS_VAR_DIR=str(var))
    assert result.returncode == 0, result.stderr
    assert var.exists() is made
    assert (var / "broker" / "queue").is_dir() is (made and not redis_url)


def test_production_on_postgresql_and_redis_writes_nothing_under_var(tmp_path: Path) -> None:
    var = tmp_path / "embedded"  # tests/conftest.py makes tmp_path/var
    result = load_settings(**PRODUCTION, TASKS_VAR_DIR=str(var))
    assert result.returncode == 0, result.stderr
    assert not var.exists()


def test_beat_makes_the_folder_of_its_schedule_file_itself(tmp_path: Path) -> None:
    from config.celery import app
    from tasks_app.integrations.beat import Scheduler

    schedule = tmp_path / "beat" / "celerybeat-schedule"
    scheduler = Scheduler(app=app, schedule_filename=str(schedule))
    try:
        assert "sweep" in scheduler.schedule
    finally:
        scheduler.close()
    assert list(schedule.parent.glob("celerybeat-schedule*"))


@pytest.mark.django_db
def test_the_release_line_leaves_what_a_production_web_process_serves(tmp_path: Path) -> None:
    """The Procfile's release line, run as written with production settings, applies the
    migrations and collects the hashed static files the pages link: without them the admin
    login answers 500 (no manifest entry for its stylesheet). Production runs on
    PostgreSQL only: the test database, migrated already, stands for the deployment's."""
    from django.db import connection

    from tests.e2e_support import database_url

    production = {
        **PRODUCTION,
        "DATABASE_URL": database_url(connection.settings_dict),
        "TASKS_VAR_DIR": str(tmp_path / "var"),
        "DJANGO_STATIC_ROOT": str(tmp_path / "static"),
    }
    status, output = run_procfile_line("release", production, timeout=180)
    assert status == 0, output
    assert (tmp_path / "static" / "staticfiles.json").exists()

    pages = load_settings(
        "from django.test import Client; "
        "client = Client(HTTP_HOST='example.com', raise_request_exception=False); "
        "print(*(f'{path} {client.get(path, secure=True).status_code}' "
        "for path in ('/admin/login/', '/accounts/login/')))",
        **production,
    )
    assert pages.returncode == 0, pages.stderr
    assert pages.stdout.split() == ["/admin/login/", "200", "/accounts/login/", "200"], (
        pages.stdout + pages.stderr
    )


def test_the_embedded_mode_passes_its_system_checks_without_a_warning(tmp_path: Path) -> None:
    """SQLite ignores an index's included columns; every management command of the demo
    would say so."""
    result = load_settings(
        "from django.core.management import call_command; call_command('check')",
        DATABASE_URL="",
        TASKS_VAR_DIR=str(tmp_path / "var"),
    )
    assert result.returncode == 0, result.stderr
    assert "WARNINGS" not in result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_the_bulk_limit_is_the_core_s_and_its_earlier_name_is_still_read() -> None:
    show = "from tasks_app import services; print(services.bulk_limit())"
    assert load_settings(show).stdout.strip() == "1000"
    assert load_settings(show, CONSOLE_BULK_LIMIT="40").stdout.strip() == "40"
    assert load_settings(show, CONSOLE_BULK_LIMIT="40", TASKS_BULK_LIMIT="7").stdout.strip() == "7"


def test_mail_goes_out_by_smtp_in_production_and_to_files_elsewhere(tmp_path: Path) -> None:
    show = "from django.conf import settings; print(settings.MAILERS['default']['BACKEND'])"
    assert load_settings(show, **PRODUCTION).stdout.strip().endswith("smtp.EmailBackend")
    assert (
        load_settings(show, EMAIL_HOST="mail.example.com")
        .stdout.strip()
        .endswith("smtp.EmailBackend")
    )
    files = load_settings(
        "from console import mailbox; print(mailbox.folder())", EMAIL_FILE_PATH=str(tmp_path)
    )
    assert files.stdout.strip() == str(tmp_path)
