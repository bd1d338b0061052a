"""``TASKS_LOG_FORMAT=json``: every line a process writes is one JSON object. The web,
worker and beat lines of the Procfile, run as written from start to a warm shutdown, write
nothing else: no Celery banner, no "Warm shutdown" text, no warning as plain text, gunicorn's
own and access lines included."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from honcho.environ import parse_procfile

from tests.conftest import BROKER_PREFIX
from tests.e2e_support import ROOT, database_url, spare_port, wait_for
from tests.settings_support import PRODUCTION, clean_env, load_settings


def entries(output: str) -> list[dict[str, Any]]:
    """Each line of ``output`` read as JSON; a line that is not an object fails the test."""
    read = []
    for line in output.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}\n{output}") from None
        assert isinstance(entry, dict), line
        read.append(entry)
    return read


def test_a_warning_is_a_json_line_of_the_log() -> None:
    result = load_settings(
        "import warnings; warnings.warn('a deprecated call', DeprecationWarning, stacklevel=1)",
        TASKS_LOG_FORMAT="json",
        PYTHONWARNINGS="always",
    )
    assert result.returncode == 0, result.stderr
    [entry] = entries(result.stderr)
    assert entry["logger"] == "py.warnings"
    assert entry["level"] == "WARNING"
    assert "DeprecationWarning: a deprecated call" in entry["message"]


def run_until(
    name: str, env: dict[str, str], log: Path, ready: Callable[[str], object]
) -> list[dict[str, Any]]:
    """The Procfile's ``name`` line, as a Procfile runner runs it, until ``ready(output)``;
    then SIGTERM (a warm shutdown) and its whole output, read as JSON lines."""
    line = parse_procfile((ROOT / "Procfile").read_text()).processes[name]
    with log.open("wb") as out:
        process = subprocess.Popen(
            # bash runs the line's one command in its own place: SIGTERM reaches it.
            ["bash", "-c", line],
            cwd=ROOT,
            env=clean_env(
                **{
                    **{k: v for k, v in PRODUCTION.items() if k != "DJANGO_PRODUCTION"},
                    **env,
                    "TASKS_LOG_FORMAT": "json",
                    "PYTHONUNBUFFERED": "1",
                    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                }
            ),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output() -> str:
        return log.read_text(errors="replace")

    try:
        wait_for(
            lambda: ready(output()) or process.poll() is not None,
            timeout=90,
            what=lambda: f"{name} to be ready\n{output()}",
        )
        assert process.poll() is None, output()
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode in (0, -signal.SIGTERM), output()
    return entries(output())


def messages(read: list[dict[str, Any]]) -> list[str]:
    return [str(entry["message"]) for entry in read]


def services(tmp_path: Path) -> dict[str, str]:
    return {
        "DATABASE_URL": database_url(connection.settings_dict),
        "REDIS_URL": settings.REDIS_URL,
        "TASKS_BROKER_PREFIX": BROKER_PREFIX,
        "TASKS_VAR_DIR": str(tmp_path / "var"),
    }


@pytest.mark.e2e
@pytest.mark.timeout(180)
@pytest.mark.django_db(transaction=True)
def test_a_worker_writes_json_lines_alone_from_start_to_warm_shutdown(tmp_path: Path) -> None:
    read = run_until(
        "worker",
        {**services(tmp_path), "CELERY_WORKER_CONCURRENCY": "1"},
        tmp_path / "worker.log",
        lambda output: re.search(r'"message": "worker-\d+@\S+ ready\."', output),
    )
    said = messages(read)
    assert "worker: warm shutdown (SIGTERM)" in said, said
    assert not [m for m in said if "heartbeat: not reporting" in m], said


@pytest.mark.e2e
@pytest.mark.timeout(180)
@pytest.mark.django_db(transaction=True)
def test_beat_writes_json_lines_alone(tmp_path: Path) -> None:
    read = run_until(
        "beat",
        {**services(tmp_path), "TASKS_SWEEP_SECONDS": "3600"},
        tmp_path / "beat.log",
        lambda output: "beat: Starting..." in output,
    )
    said = messages(read)
    assert "beat: Starting..." in said
    assert [m for m in said if m.startswith("beat: stopped;")], said


@pytest.mark.e2e
@pytest.mark.timeout(180)
@pytest.mark.django_db(transaction=True)
def test_the_web_process_writes_json_lines_alone_access_log_included(tmp_path: Path) -> None:
    port = spare_port()

    def answers(output: str) -> bool:
        url = f"http://127.0.0.1:{port}/healthz"
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as page:
            return int(page.status) == 200
        return False

    read = run_until(
        "web",
        {
            **services(tmp_path),
            "PORT": str(port),
            "WEB_CONCURRENCY": "1",
            "DJANGO_STATIC_ROOT": str(tmp_path / "static"),
        },
        tmp_path / "web.log",
        answers,
    )
    loggers = {str(entry["logger"]) for entry in read}
    assert {"gunicorn.error", "gunicorn.access"} <= loggers, read
    assert [m for m in messages(read) if "GET /healthz" in m], read
