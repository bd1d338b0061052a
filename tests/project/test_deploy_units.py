"""One host under systemd (docs/deployment.md, "One host"): the units in ``deploy/systemd``
and ``deploy/run-process``, which runs one Procfile line as its own process.

Each unit runs one Procfile line through ``deploy/run-process`` from the release folder,
stops with SIGTERM to its main process alone (``KillMode=mixed``: a Celery worker's pool
processes are not signalled, so it shuts down warm) and a kill only after a grace longer
than a warm shutdown, and is started again whenever it exits. The drill that rolls each
process of such a host under load is ``tests/chaos/test_rolling_restarts.py``."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from honcho.environ import parse_procfile

from tests.e2e_support import ROOT, spare_port, wait_for
from tests.settings_support import PRODUCTION, clean_env
from tests.web_server_support import answers

UNITS = ROOT / "deploy" / "systemd"
RUN_PROCESS = ROOT / "deploy" / "run-process"
RELEASE_FOLDER = "/srv/task-console/current"
ENV_FILE = "/etc/task-console/task-console.env"
TARGET = "task-console.target"
# The unit of each Procfile line that keeps running, and the release's.
LONG_RUNNING = {
    "task-console-web@.service": "web",
    "task-console-worker@.service": "worker",
    "task-console-maintenance.service": "maintenance",
    "task-console-beat.service": "beat",
}
RELEASE = "task-console-release.service"
# gunicorn's graceful timeout (its default, which the Procfile's web line keeps), and the
# longest a shipped step waits on its remote (REMOTE_TIMEOUT_SECONDS' default).
GUNICORN_GRACEFUL_SECONDS = 30
LONGEST_SHIPPED_STEP_SECONDS = 10

Unit = dict[str, dict[str, list[str]]]


def read_unit(path: Path) -> Unit:
    """A unit file's sections, each key with every value it is given (systemd lets a key
    such as ``Environment`` repeat); comments and blank lines left out."""
    unit: Unit = defaultdict(lambda: defaultdict(list))
    section = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        unit[section][key.strip()].append(value.strip())
    return unit


def one(unit: Unit, section: str, key: str) -> str:
    values = unit[section][key]
    assert len(values) == 1, f"[{section}] {key}: {values}"
    return values[0]


def seconds(value: str) -> float:
    assert value.isdigit(), f"a plain number of seconds, not {value!r}"
    return float(value)


def test_the_units_are_the_ones_the_guide_names() -> None:
    assert sorted(path.name for path in UNITS.iterdir()) == sorted([TARGET, RELEASE, *LONG_RUNNING])


@pytest.mark.parametrize("name", sorted(LONG_RUNNING))
def test_each_process_stops_warm_alone_and_comes_back(name: str) -> None:
    unit = read_unit(UNITS / name)
    service = unit["Service"]
    assert one(unit, "Service", "KillMode") == "mixed"
    assert service["KillSignal"] in ([], ["SIGTERM"])
    assert one(unit, "Service", "Restart") == "always"
    assert one(unit, "Service", "WorkingDirectory") == RELEASE_FOLDER
    assert one(unit, "Service", "EnvironmentFile") == ENV_FILE
    assert f"PATH={RELEASE_FOLDER}/.venv/bin:/usr/local/bin:/usr/bin:/bin" in service["Environment"]
    # Started once the release has run, and with it refused if it failed.
    assert one(unit, "Unit", "Requires") == RELEASE
    assert one(unit, "Unit", "After") == RELEASE
    assert one(unit, "Unit", "PartOf") == TARGET
    assert one(unit, "Install", "WantedBy") == TARGET


@pytest.mark.parametrize("name", sorted([*LONG_RUNNING, RELEASE]))
def test_each_unit_runs_its_procfile_line_through_run_process(name: str) -> None:
    command = one(read_unit(UNITS / name), "Service", "ExecStart").split()
    if name == "task-console-web@.service":
        # The instance is the port, over any PORT the env file sets.
        assert command[:2] == ["/usr/bin/env", "PORT=%i"]
        command = command[2:]
    assert command[0] == f"{RELEASE_FOLDER}/deploy/run-process"
    assert command[1:] == [LONG_RUNNING.get(name, "release")]
    assert command[1] in parse_procfile((ROOT / "Procfile").read_text()).processes
    assert os.access(RUN_PROCESS, os.X_OK)


def test_the_grace_outlasts_a_warm_shutdown() -> None:
    def grace(name: str) -> float:
        return seconds(one(read_unit(UNITS / name), "Service", "TimeoutStopSec"))

    # A stopping worker finishes the step each pool process runs: the longest shipped step
    # waits on its remote, with room to record its outcome.
    assert grace("task-console-worker@.service") >= 6 * LONGEST_SHIPPED_STEP_SECONDS
    assert grace("task-console-web@.service") > GUNICORN_GRACEFUL_SECONDS
    assert grace("task-console-maintenance.service") > LONGEST_SHIPPED_STEP_SECONDS
    assert grace("task-console-beat.service") > 0


def test_the_release_runs_once_before_the_others_and_stays_done() -> None:
    unit = read_unit(UNITS / RELEASE)
    assert one(unit, "Service", "Type") == "oneshot"
    # Active after it exits, so restarting one process does not run migrations again.
    assert one(unit, "Service", "RemainAfterExit") == "yes"
    assert one(unit, "Service", "WorkingDirectory") == RELEASE_FOLDER
    assert one(unit, "Service", "EnvironmentFile") == ENV_FILE
    assert not unit["Service"]["Restart"]
    assert one(unit, "Install", "WantedBy") == TARGET


def test_the_target_starts_with_the_machine() -> None:
    assert one(read_unit(UNITS / TARGET), "Install", "WantedBy") == "multi-user.target"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_finds_nothing_wrong_with_the_units(tmp_path: Path) -> None:
    """``systemd-analyze verify`` on copies that name this checkout as the release folder
    and an env file in ``tmp_path`` (the real paths exist only on a host set up as the
    guide says), with one instance of each template."""
    (tmp_path / "current").symlink_to(ROOT)
    (tmp_path / "task-console.env").write_text("DJANGO_PRODUCTION=1\n")
    names = []
    for path in UNITS.iterdir():
        text = path.read_text().replace(RELEASE_FOLDER, str(tmp_path / "current"))
        text = text.replace(ENV_FILE, str(tmp_path / "task-console.env"))
        name = path.name.replace("web@.", "web@8000.").replace("worker@.", "worker@1.")
        (tmp_path / name).write_text(text)
        names.append(name)
    verified = subprocess.run(
        ["systemd-analyze", "verify", *names],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    ours = [line for line in verified.stderr.splitlines() if str(tmp_path) in line]
    assert verified.returncode == 0 and not ours, verified.stderr


# --- deploy/run-process ------------------------------------------------------------------


def run_process(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(RUN_PROCESS), *args],
        cwd="/",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_run_process_refuses_a_name_the_procfile_lacks_and_a_missing_env_file(
    tmp_path: Path,
) -> None:
    unknown = run_process("webserver", env=clean_env())
    assert unknown.returncode == 2
    assert "has no process 'webserver' (it has release, web, worker" in unknown.stderr
    missing = run_process("-e", str(tmp_path / "prod.env"), "web", env=clean_env())
    assert missing.returncode == 2
    assert "cannot read the env file" in missing.stderr


@pytest.mark.e2e
def test_run_process_becomes_the_server_with_the_environment_over_the_env_file(
    tmp_path: Path,
) -> None:
    """The web line run through ``deploy/run-process`` from another folder: the env file
    gives its settings and a PORT, the environment's PORT wins; the process started is
    gunicorn's master itself, which SIGTERM alone stops."""
    from_file, from_env = spare_port(), spare_port()
    env_file = tmp_path / "prod.env"
    settings = {**PRODUCTION, "PORT": str(from_file), "WEB_CONCURRENCY": "1"}
    env_file.write_text("".join(f"{name}={value}\n" for name, value in settings.items()))
    env = clean_env(
        PORT=str(from_env), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    )
    log = tmp_path / "web.log"
    with log.open("wb") as output:
        web = subprocess.Popen(
            [str(RUN_PROCESS), "-e", str(env_file), "web"],
            cwd=tmp_path,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(
            lambda: answers(f"http://127.0.0.1:{from_env}"),
            timeout=60,
            what=lambda: f"the web process on PORT {from_env}\n{log.read_text()[-3000:]}",
        )
        assert not answers(f"http://127.0.0.1:{from_file}")
        command = Path(f"/proc/{web.pid}/cmdline").read_bytes().split(b"\0")
        assert any(word.endswith(b"gunicorn") for word in command[:2]), command
        web.send_signal(signal.SIGTERM)
        assert web.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        if web.poll() is None:
            os.killpg(web.pid, signal.SIGKILL)
            web.wait()
