"""End to end: worker nodes started from the Procfile's lines on one host each report under
a name of their own (two step workers and the maintenance worker: three rows, three live),
a SIGKILLed one shows silent within two heartbeat intervals while the others stay live,
and a node started under a name a live node reports under refuses to start.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db import connection
from honcho.environ import parse_procfile

from tasks_app.engine import presence
from tests.e2e_support import ROOT, Worker, database_url, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(180),
    pytest.mark.django_db(transaction=True),
]

HEARTBEAT = 1


def node_env(folder: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        # The Procfile's lines as they are, outside production (no real remotes here).
        "DJANGO_PRODUCTION": "0",
        "DATABASE_URL": database_url(connection.settings_dict),
        "REDIS_URL": django_settings.REDIS_URL or "",
        "TASKS_BROKER_PREFIX": os.environ.get("TASKS_BROKER_PREFIX", ""),
        "TASKS_VAR_DIR": str(folder / "var"),
        "TASKS_HEARTBEAT_SECONDS": str(HEARTBEAT),
        "TASKS_WORKER_SILENT_SECONDS": str(2 * HEARTBEAT),
        "PYTHONUNBUFFERED": "1",
    }


class ProcfileNode:
    """One Procfile line run through a shell, as a Procfile runner runs it."""

    def __init__(self, name: str, env: dict[str, str], log: Path) -> None:
        self.log = log
        self._out = log.open("wb")
        line = parse_procfile((ROOT / "Procfile").read_text()).processes[name]
        # bash runs a line's one command in its own place (Debian's sh stays its parent,
        # so stop() returned while the worker still shut down, and it went on taking the
        # next tests' messages).
        self.process = subprocess.Popen(
            ["bash", "-c", line],
            cwd=ROOT,
            env=env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._out.close()


@pytest.fixture
def nodes(tmp_path: Path, settings: Any) -> Iterator[dict[str, ProcfileNode]]:
    # The console reads the nodes with the settings the nodes run with.
    settings.TASKS_HEARTBEAT_SECONDS = HEARTBEAT
    settings.TASKS_WORKER_SILENT_SECONDS = 2 * HEARTBEAT
    env = node_env(tmp_path)
    started = {
        name: ProcfileNode(line, env, tmp_path / f"{name}.log")
        for name, line in [("a", "worker"), ("b", "worker"), ("m", "maintenance")]
    }
    try:
        yield started
    finally:
        for node in started.values():
            node.stop()


def node_name(node: ProcfileNode) -> str:
    found = wait_for(
        lambda: re.search(r"(\S+@\S+) ready\.", node.output()),
        timeout=90,
        what=lambda: "the node to be ready\n" + node.output()[-3000:],
    )
    return found.group(1)


def states() -> dict[str, str]:
    return {row.name: row.state for row in presence.workers()}


def test_procfile_nodes_on_one_host_each_report_and_a_killed_one_goes_silent(
    nodes: dict[str, ProcfileNode],
) -> None:
    names = {key: node_name(node) for key, node in nodes.items()}
    assert len(set(names.values())) == 3, names
    assert names["m"].startswith("maintenance-")
    assert names["a"].startswith("worker-") and names["b"].startswith("worker-")
    wait_for(
        lambda: all(states().get(name) == "live" for name in names.values()),
        timeout=30,
        what=lambda: f"three live nodes, saw {states()}",
    )

    nodes["a"].kill()
    killed_at = time.monotonic()
    wait_for(
        lambda: states().get(names["a"]) == "silent",
        timeout=30,
        interval=0.1,
        what=lambda: f"the killed node to show silent, saw {states()}",
    )
    silent_after = time.monotonic() - killed_at
    # Within two heartbeat intervals (and the polling's slack).
    assert silent_after <= 2 * HEARTBEAT + 1.0, silent_after
    after = states()
    assert after[names["b"]] == "live" and after[names["m"]] == "live", after


def test_a_node_started_under_a_live_nodes_name_refuses_to_start(
    nodes: dict[str, ProcfileNode], tmp_path: Path
) -> None:
    taken = node_name(nodes["a"])
    wait_for(lambda: states().get(taken) == "live", timeout=30, what="the first node live")

    twin = Worker(
        ["--queues", "default", "--hostname", taken, "--loglevel", "INFO"],
        env=node_env(tmp_path),
        log_path=tmp_path / "twin.log",
    )
    try:
        status = twin.process.wait(timeout=90)
    finally:
        twin.stop()
    assert status != 0
    assert f"not starting: worker node name {taken} is taken" in twin.output()
    assert states()[taken] == "live"
