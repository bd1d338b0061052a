"""Beat's schedule file: the deployment's own, under its var folder or where
``TASKS_BEAT_SCHEDULE_FILE`` says, as the Procfile's beat line runs it; never a path that
every deployment on a host shares."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from honcho.environ import parse_procfile

from tests.e2e_support import ROOT, wait_for
from tests.settings_support import PRODUCTION, clean_env, load_settings

SHOW = "from django.conf import settings; print(settings.CELERY_BEAT_SCHEDULE_FILENAME)"


def test_the_schedule_file_is_under_the_var_folder_unless_a_setting_names_one(
    tmp_path: Path,
) -> None:
    var = tmp_path / "var"
    default = load_settings(SHOW, **PRODUCTION, TASKS_VAR_DIR=str(var))
    assert default.stdout.strip() == str(var / "celerybeat-schedule"), default.stderr
    named = tmp_path / "beat" / "schedule"
    chosen = load_settings(SHOW, **PRODUCTION, TASKS_BEAT_SCHEDULE_FILE=str(named))
    assert chosen.stdout.strip() == str(named), chosen.stderr


def test_the_procfile_beat_keeps_its_schedule_in_the_deployments_var_folder(
    tmp_path: Path,
) -> None:
    var = tmp_path / "var"
    line = parse_procfile((ROOT / "Procfile").read_text()).processes["beat"]
    log = (tmp_path / "beat.log").open("wb")
    beat = subprocess.Popen(
        # bash runs the line's one command in its own place: the signal below reaches beat.
        ["bash", "-c", line],
        cwd=ROOT,
        env=clean_env(
            **{key: value for key, value in PRODUCTION.items() if key != "DJANGO_PRODUCTION"},
            TASKS_VAR_DIR=str(var),
            # Its own keys, and no sweep due before it is stopped.
            TASKS_BROKER_PREFIX=f"beat-schedule-{uuid.uuid4().hex[:8]}:",
            TASKS_SWEEP_SECONDS="3600",
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        ),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )

    def output() -> str:
        return (tmp_path / "beat.log").read_text(errors="replace")

    try:
        wait_for(
            lambda: "beat: Starting..." in output() or beat.poll() is not None,
            timeout=60,
            what=lambda: "beat to start\n" + output(),
        )
        wait_for(
            lambda: list(var.glob("celerybeat-schedule*")) or beat.poll() is not None,
            timeout=30,
            what=lambda: f"beat to write its schedule under {var}\n" + output(),
        )
    finally:
        if beat.poll() is None:
            os.kill(beat.pid, signal.SIGTERM)
        try:
            beat.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(beat.pid, signal.SIGKILL)
            beat.wait()
        log.close()
    assert list(var.glob("celerybeat-schedule*")), output()
    assert beat.returncode in (0, -signal.SIGTERM), output()
