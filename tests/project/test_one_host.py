"""One host, tried out with honcho: the ``Procfile`` run exactly as docs/deployment.md shows
it (its "One host" section, the honcho block): ``release`` runs alone and exits, then web,
worker, maintenance and beat run together in production mode until stopped, and the
console does its work. The systemd units of that section are checked by
``tests/project/test_deploy_units.py``."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from tasks_app import services
from tasks_app.models import Task, TaskStatus
from tests.conftest import BROKER_PREFIX
from tests.e2e_support import ROOT, database_url, spare_port, wait_for
from tests.settings_support import clean_env

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(240),
    pytest.mark.django_db(transaction=True),
]

HONCHO = str(Path(sys.executable).with_name("honcho"))
LONG_RUNNING = ["web", "worker", "maintenance", "beat"]


def documented_commands(env_file: Path) -> list[list[str]]:
    """The honcho commands of the guide's "One host" section, in order, each split at
    ``&&``, with the project's honcho and ``env_file`` for the guide's ``prod.env``."""
    guide = (ROOT / "docs" / "deployment.md").read_text()
    section = guide.split("\n## One host\n", 1)[1].split("\n## ", 1)[0]
    block = next(
        (b for b in re.finditer(r"```sh\n(.*?)```", section, re.DOTALL) if "\nhoncho " in b[1]),
        None,
    )
    assert block is not None, "the One host section shows honcho's commands in a sh block"
    commands = [
        shlex.split(part)
        for line in block.group(1).splitlines()
        if line.startswith("honcho ")
        for part in line.split("&&")
    ]
    return [
        [
            HONCHO if word == "honcho" else str(env_file) if word == "prod.env" else word
            for word in c
        ]
        for c in commands
    ]


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as refused:
        return refused.code
    except OSError:
        return 0


def test_the_procfile_runs_on_one_host_as_the_guide_says(tmp_path: Path) -> None:
    port = spare_port()
    env_file = tmp_path / "prod.env"
    env_file.write_text(
        "\n".join(
            f"{name}={value}"
            for name, value in {
                "DJANGO_SECRET_KEY": "one-host-" + "x" * 60,
                "DJANGO_ALLOWED_HOSTS": "example.com",
                "DATABASE_URL": database_url(connection.settings_dict),
                "REDIS_URL": settings.REDIS_URL,
                "TASKS_BROKER_PREFIX": BROKER_PREFIX,
                "PUBLISH_URL": "https://publish.invalid/",
                "MAIL_URL": "https://mail.invalid/",
                "DJANGO_STATIC_ROOT": str(tmp_path / "static"),
                "PORT": str(port),
                "WEB_CONCURRENCY": "1",
                "CELERY_WORKER_CONCURRENCY": "1",
                "TASKS_SWEEP_SECONDS": "1",
            }.items()
        )
        + "\n"
    )
    commands = documented_commands(env_file)
    assert [c[c.index("start") + 1 :] for c in commands] == [["release"], LONG_RUNNING]
    env = clean_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")

    release = subprocess.run(
        commands[0], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert release.returncode == 0, release.stdout + release.stderr
    assert "release.1 stopped (rc=0)" in release.stdout, release.stdout
    assert (tmp_path / "static" / "staticfiles.json").exists()

    log_path = tmp_path / "honcho.log"
    with log_path.open("wb") as log:
        honcho = subprocess.Popen(
            commands[1],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def tail() -> str:
        return "honcho's output (last lines):\n" + "\n".join(
            log_path.read_text(errors="replace").splitlines()[-60:]
        )

    try:
        # Ready: the web process answers, the migrations are applied and a sweep ran, which
        # takes beat sending it and the maintenance worker running it.
        wait_for(
            lambda: status(f"http://127.0.0.1:{port}/readyz") == 200,
            timeout=120,
            interval=0.5,
            what=lambda: "the console to be ready\n" + tail(),
        )
        task = services.enqueue("demo.noop", {}, idempotency_key="one-host", actor="test:e2e").task
        wait_for(
            lambda: Task.objects.filter(pk=task.pk, status=TaskStatus.SUCCEEDED).exists(),
            timeout=60,
            what=lambda: "the step worker to run the task\n" + tail(),
        )
    finally:
        honcho.send_signal(signal.SIGTERM)
        try:
            honcho.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(honcho.pid, signal.SIGKILL)
            honcho.wait()
            raise
    output = log_path.read_text(errors="replace")
    for name in LONG_RUNNING:
        assert re.search(rf"{name}\.1 +\| ", output), f"{name} wrote nothing\n{output}"
        assert f"{name}.1 stopped" in output, output
    # Started once each, and none stopped before honcho was told to stop them all.
    assert output.count(" started (pid=") == len(LONG_RUNNING), output
    assert output.index("SIGTERM received") < min(
        output.index(f"{name}.1 stopped") for name in LONG_RUNNING
    ), output
    assert "beat: stopped" in output, output
