"""The README's API example, run as pasted against a live console: the same command lines,
with only the console's address changed to the test server's. It makes a token for the
demo's on-call user, lists the dead letters' causes, and proposes a redrive that waits for
a person."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from tasks_app.models import PlanStatus, ProposedPlan
from tests.docs_support import ROOT, blocks_of, commands
from tests.e2e_support import database_url
from tests.factories import dead_task

pytestmark = pytest.mark.django_db(transaction=True)

ADDRESS = "export CONSOLE=http://127.0.0.1:8000"


def readme_example() -> list[str]:
    """The command lines of the README block this test runs (its directive names it)."""
    found = [
        block
        for block in blocks_of("README.md", (ROOT / "README.md").read_text())
        if "tests/api/test_readme_api.py" in block.directive
    ]
    assert len(found) == 1
    return commands(found[0])


def test_the_readme_curl_example_works_as_pasted(live_server: Any, django_user_model: Any) -> None:
    from tests.conftest import _user

    _user("oncall", "oncall")
    dead = dead_task()
    lines = readme_example()
    assert lines[0] == ADDRESS
    script = "\n".join([f"export CONSOLE={live_server.url}", *lines[1:]])
    env = {
        **os.environ,
        "DATABASE_URL": database_url(connection.settings_dict),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # curl writes each answer as it came, without a newline between them.
    decoder = json.JSONDecoder()
    groups, end = decoder.raw_decode(done.stdout)
    plan, _ = decoder.raw_decode(done.stdout[end:].lstrip())
    assert groups["items"] if isinstance(groups, dict) else groups
    assert plan["status"] == "proposed"
    assert plan["task_ids"] == [dead.pk]
    assert plan["proposed_by"] == "oncall via triage-bot"
    assert ProposedPlan.objects.get(pk=plan["id"]).status == PlanStatus.PROPOSED
