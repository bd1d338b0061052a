"""The Makefile's ``run`` target: what it hands the processes it starts.

``make run`` is run for real, on a virtualenv of the test's own whose ``python`` answers
the set-up steps (migrate, seed) without doing them and, asked to start the processes,
loads the settings with the environment make gives them and prints what they would read.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.e2e_support import ROOT
from tests.settings_support import clean_env

SHOW = (
    "import django; django.setup(); from django.conf import settings as s; "
    "print(s.CONSOLE_BASE_URL); print(s.PUBLISH_URL)"
)


def fake_venv(folder: Path) -> Path:
    """A virtualenv make takes as installed: its stamp newer than pyproject.toml."""
    venv = folder / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    # Starting the processes (scripts/dev_processes.py, honcho) shows the settings instead.
    python.write_text(
        "#!/bin/sh\n"
        f'[ "$1" = scripts/dev_processes.py ] && exec "{sys.executable}" -c "{SHOW}"\n'
        "exit 0\n"
    )
    python.chmod(0o755)
    stamp = venv / ".installed-stamp"
    stamp.touch()
    newer = (ROOT / "pyproject.toml").stat().st_mtime + 60
    os.utime(stamp, (newer, newer))
    return venv


def make_run(tmp_path: Path, *args: str, **env: str) -> list[str]:
    venv = fake_venv(tmp_path)
    base = clean_env(TASKS_VAR_DIR=str(tmp_path / "var"), DATABASE_URL="", **env)
    for name in ("CONSOLE_BASE_URL", "PUBLISH_URL", "MAIL_URL", "PORT", "HOST"):
        if name not in env:
            base.pop(name, None)
    done = subprocess.run(
        ["make", "--no-print-directory", "run", f"VENV={venv}", *args],
        cwd=ROOT,
        env=base,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip().splitlines()[-2:]


def test_make_run_on_another_port_links_mail_to_that_port(tmp_path: Path) -> None:
    assert make_run(tmp_path, "PORT=8270") == [
        "http://127.0.0.1:8270",
        "http://127.0.0.1:8270/fake/publish/",
    ]


def test_make_run_keeps_a_console_address_set_in_the_environment(tmp_path: Path) -> None:
    shown = make_run(tmp_path, "PORT=8270", CONSOLE_BASE_URL="https://console.example.com")
    assert shown[0] == "https://console.example.com"


def test_make_reset_removes_the_embedded_state_and_keeps_the_virtualenv(tmp_path: Path) -> None:
    venv = fake_venv(tmp_path)
    var = tmp_path / "var"
    for name in ("db.sqlite3", "broker/in/message", "mail/notice.eml", "celerybeat-schedule"):
        (var / name).parent.mkdir(parents=True, exist_ok=True)
        (var / name).write_text("state")
    done = subprocess.run(
        ["make", "--no-print-directory", "reset", f"VENV={venv}"],
        cwd=ROOT,
        env=clean_env(TASKS_VAR_DIR=str(var)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert not var.exists()
    assert (venv / "bin" / "python").exists()
    assert (venv / ".installed-stamp").exists()
    assert f"{venv} kept" in done.stdout


def test_make_help_names_reset_and_says_it_keeps_the_virtualenv() -> None:
    done = subprocess.run(
        ["make", "--no-print-directory", "help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    reset = [line for line in done.stdout.splitlines() if line.startswith("make reset")]
    assert reset and "keeps .venv" in reset[0]
