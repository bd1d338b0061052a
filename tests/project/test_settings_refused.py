"""Settings a process cannot start with are named all at once: one short list on standard
error (one JSON object in a JSON log), no traceback, exit status 3, from every process the
Procfile runs and before gunicorn starts a worker."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from honcho.environ import parse_procfile

from tests.e2e_support import ROOT
from tests.settings_support import PRODUCTION, clean_env, load_settings

# Production with nothing set but a bad lease and a fake remote: everything it needs, and
# each kind of refusal (missing, malformed, unsafe), in the order the settings read them.
BROKEN = {
    "DJANGO_PRODUCTION": "1",
    "DJANGO_SECRET_KEY": "",
    "DATABASE_URL": "",
    "REDIS_URL": "",
    "TASKS_LEASE_SECONDS": "soon",
    "PUBLISH_URL": "http://127.0.0.1:8000/fake/publish/",
    "MAIL_URL": "",
}
REFUSED = [
    "DJANGO_PRODUCTION is set: DJANGO_SECRET_KEY is required",
    "DJANGO_PRODUCTION is set: DJANGO_ALLOWED_HOSTS is required",
    "DJANGO_PRODUCTION is set: DATABASE_URL is required (without it this process would use "
    "the embedded SQLite database under var/, which no other process shares)",
    "DJANGO_PRODUCTION is set: REDIS_URL is required (without it this process would use the "
    "embedded file-system broker under var/, which no other process shares)",
    "TASKS_LEASE_SECONDS must be an integer, not 'soon'",
    "DJANGO_PRODUCTION is set: PUBLISH_URL points at the demo's fake remote "
    "(http://127.0.0.1:8000/fake/publish/); the publish_article workflow needs the real service",
    "DJANGO_PRODUCTION is set: MAIL_URL is required (the ticket_reply workflow calls it)",
]
LISTED = ["not starting: 7 settings to fix in the environment:", *(f"  - {m}" for m in REFUSED)]


def test_production_names_every_refused_setting_at_once_without_a_traceback(
    tmp_path: Path,
) -> None:
    var = tmp_path / "embedded"  # tests/conftest.py makes tmp_path/var
    result = load_settings(**BROKEN, TASKS_VAR_DIR=str(var))
    assert result.returncode == 3
    assert result.stderr.splitlines() == LISTED
    assert result.stdout == ""
    assert not var.exists()  # nothing written for the embedded mode it refused


def test_in_a_json_log_the_list_is_one_json_object() -> None:
    result = load_settings(**BROKEN, TASKS_LOG_FORMAT="json")
    assert result.returncode == 3
    [line] = result.stderr.splitlines()
    entry = json.loads(line)
    assert entry["level"] == "CRITICAL"
    assert entry["message"] == "not starting: 7 settings to fix in the environment"
    assert entry["settings"] == REFUSED


def test_malformed_settings_outside_production_are_listed_together_too() -> None:
    result = load_settings(DJANGO_DEBUG="maybe", TASKS_LOG_FORMAT="yaml", TASKS_SWEEP_SECONDS="0")
    assert result.returncode == 3
    assert result.stderr.splitlines() == [
        "not starting: 3 settings to fix in the environment:",
        "  - DJANGO_DEBUG must be a boolean (1/0, true/false), not 'maybe'",
        "  - TASKS_LOG_FORMAT must be one of text, json, not 'yaml'",
        "  - TASKS_SWEEP_SECONDS must be at least 1, not 0",
    ]


def run_procfile_line(name: str, env: dict[str, str]) -> tuple[int, str]:
    """The Procfile's ``name`` line run as a Procfile runner does, to its end (it is
    expected to stop at once): its status and everything it wrote."""
    line = parse_procfile((ROOT / "Procfile").read_text()).processes[name]
    done = subprocess.run(
        ["sh", "-c", line],
        cwd=ROOT,
        env=clean_env(
            **env, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        ),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("name", ["release", "web", "worker", "maintenance", "beat"])
def test_every_procfile_process_stops_with_the_list_alone(name: str, tmp_path: Path) -> None:
    """gunicorn reads the settings in its master, before a worker starts: no worker fails
    with a traceback of its own, and gunicorn writes no line of its own."""
    production = {key: value for key, value in PRODUCTION.items() if key != "DJANGO_PRODUCTION"}
    env = {
        **production,
        "DJANGO_SECRET_KEY": "",
        "PUBLISH_URL": "",
        "TASKS_LEASE_SECONDS": "0",
        "PORT": "0",
        "TASKS_VAR_DIR": str(tmp_path / "var"),
    }
    status, output = run_procfile_line(name, env)
    assert status == 3, output
    assert output.splitlines() == [
        "not starting: 3 settings to fix in the environment:",
        "  - DJANGO_PRODUCTION is set: DJANGO_SECRET_KEY is required",
        "  - TASKS_LEASE_SECONDS must be at least 1, not 0",
        "  - DJANGO_PRODUCTION is set: PUBLISH_URL is required (the publish_article workflow "
        "calls it)",
    ], output


def test_the_deployment_guide_shows_the_list_as_production_writes_it() -> None:
    guide = (ROOT / "docs" / "deployment.md").read_text()
    shown = re.search(r"```text\n(not starting: .*?)```", guide, re.DOTALL)
    assert shown is not None, "the guide's Settings section shows a refused start"
    result = load_settings(**{**PRODUCTION, "DJANGO_SECRET_KEY": "", "TASKS_LEASE_SECONDS": "soon"})
    assert result.returncode == 3
    assert result.stderr == shown.group(1)
