"""Beat's schedule file: the deployment's own, under its var folder or where
``TASKS_BEAT_SCHEDULE_FILE`` says, as the Procfile's beat line runs it; never a path that
every deployment on a host shares."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery.beat import Service
from honcho.environ import parse_procfile

from config.celery import app
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


@pytest.fixture
def stop_handler() -> Iterator[None]:
    """Beat's SIGTERM and SIGINT handlers installed by a test, the runner's put back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def beat_service(tmp_path: Path) -> Service:
    service = Service(
        app=app,
        schedule_filename=str(tmp_path / "celerybeat-schedule"),
        scheduler_cls=app.conf.beat_scheduler,  # as `celery beat` makes it
    )
    app.Beat(quiet=True).install_sync_handler(service)
    return service


def stop(service: Service) -> None:
    handler = signal.getsignal(signal.SIGTERM)
    assert callable(handler)
    with pytest.raises(SystemExit):
        handler(signal.SIGTERM, None)


def test_a_signal_while_beat_opens_its_schedule_stops_it_without_making_another(
    tmp_path: Path, stop_handler: None, caplog: pytest.LogCaptureFixture
) -> None:
    # Celery's handler asked the service for its scheduler, which built one inside the
    # first's opening of its schedule file; the process exited 1 with a traceback.
    service = beat_service(tmp_path)
    with caplog.at_level(logging.INFO):
        stop(service)
    assert "scheduler" not in service.__dict__
    assert not list(tmp_path.glob("celerybeat-schedule*"))
    assert (
        "beat: stopped; messages sent since it started: none (stopped while opening its schedule)"
    ) in caplog.messages


def test_a_signal_after_beat_opened_its_schedule_saves_and_closes_it(
    tmp_path: Path, stop_handler: None, caplog: pytest.LogCaptureFixture
) -> None:
    service = beat_service(tmp_path)
    assert service.scheduler.schedule  # made, and its schedule file open
    with caplog.at_level(logging.INFO):
        stop(service)
    assert list(tmp_path.glob("celerybeat-schedule*"))
    assert "beat: stopped; messages sent since it started: none" in caplog.messages
